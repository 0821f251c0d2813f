"""Pallas backend: kernels written with ``jax.experimental.pallas`` on GPU, TPU and CPU.

The generator returns a function built on ``pl.pallas_call`` and should pass
``interpret=(platform == 'cpu')``; on 'cpu' every ``pallas_call`` must be interpreted.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax

from primforge.backends import _common, _contract

NAME = "pallas"
PLATFORMS = ("cpu", "gpu", "tpu")
EXTRA = "pallas"


@functools.cache
def is_available(platform: str | None = None) -> bool:
    """Whether ``jax.experimental.pallas`` is found here (and serves ``platform``).

    Example:
        >>> is_available(), is_available('cpu')
        (True, True)
    """
    if platform is not None and platform not in PLATFORMS:
        return False
    return _common.package_installed("jax.experimental.pallas")


def _sub_jaxprs(value):
    values = value if isinstance(value, (tuple, list)) else (value,)
    for v in values:
        if hasattr(v, "eqns"):
            yield v
        elif hasattr(getattr(v, "jaxpr", None), "eqns"):
            yield v.jaxpr


def _pallas_eqns(jaxpr) -> list:
    """Every ``pallas_call`` equation in a jaxpr, including those nested in jit/cond/scan."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "pallas_call":
            found.append(eqn)
            continue
        for v in eqn.params.values():
            for sub in _sub_jaxprs(v):
                found.extend(_pallas_eqns(sub))
    return found


def _check_interpreted(product, ins, name: str) -> None:
    closed = jax.make_jaxpr(product)(*ins)
    for eqn in _pallas_eqns(closed.jaxpr):
        if not eqn.params.get("interpret", False):
            raise ValueError(
                f"kernel {name!r}: on 'cpu' the Pallas kernel must run in interpret mode. The "
                f"generator receives `platform`; pass "
                f"pl.pallas_call(..., interpret=(platform == 'cpu'))."
            )


def make_callable(
    product: Callable[..., Any],
    *,
    ins: Sequence[jax.ShapeDtypeStruct],
    outs: Sequence[jax.ShapeDtypeStruct],
    platform: str,
    name: str,
    **options: Any,
) -> Callable[..., tuple[jax.Array, ...]]:
    """Wrap a function built on ``pl.pallas_call`` so it returns a tuple of outputs.

    Args:
        product: the generator's return value, a function of the input arrays.
        ins: input structs. outs: output structs.
        platform: 'cpu' (interpret mode required), 'gpu' or 'tpu'.
        name: the kernel's name, for error messages.
        **options: none (``batch=()`` only).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from jax.experimental import pallas as pl
        >>> def body(x_ref, o_ref):
        ...     o_ref[...] = x_ref[...] + 1.0
        >>> s = jax.ShapeDtypeStruct((4,), jnp.float32)
        >>> prod = pl.pallas_call(body, out_shape=s, interpret=True)
        >>> make_callable(prod, ins=[s], outs=[s], platform='cpu', name='inc')(jnp.zeros(4))
        (Array([1., 1., 1., 1.], dtype=float32),)
    """
    _common.check_request(NAME, PLATFORMS, EXTRA, is_available, platform=platform,
                          kernel=name, options=options,
                          needs="jax.experimental.pallas (it ships with jax)")
    call = _contract.traceable(product, backend=NAME, name=name,
                               expected="a function built on pl.pallas_call")
    if platform == "cpu":
        _check_interpreted(product, ins, name)
    return call


class PallasBackend(_contract.BackendBase):
    """The Pallas backend as the registry holds it: this module's hooks, bound once."""

    NAME, PLATFORMS, EXTRA = NAME, PLATFORMS, EXTRA
    is_available = staticmethod(is_available)
    make_callable = staticmethod(make_callable)


#: This module's backend: :func:`primforge.backends.get_backend` registers it on first use.
BACKEND = PallasBackend()
