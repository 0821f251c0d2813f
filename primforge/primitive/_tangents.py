"""Tangent helpers shared by the derived rules and the per-input JVPs.

A zero tangent is a symbolic ``Zero`` or a ``float0`` array (integer inputs and outputs);
these functions make both JVP builders treat such tangents alike.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from primforge._compat import Zero, float0

__all__ = ["is_float", "is_symbolic_zero", "zero_tangent_like"]


def is_float(dtype: Any) -> bool:
    """Whether values of ``dtype`` have tangents (floating or complex)."""
    return jax.dtypes.issubdtype(dtype, np.inexact)


def is_symbolic_zero(t: Any) -> bool:
    """Whether the tangent ``t`` is known to be zero (a symbolic ``Zero`` or ``float0``)."""
    return type(t) is Zero or getattr(t, "dtype", None) == float0


def zero_tangent_like(x: Any) -> Zero:
    """A symbolic zero tangent for the value ``x`` (``float0``-typed for integers)."""
    return Zero(jax.typeof(x).to_tangent_aval())
