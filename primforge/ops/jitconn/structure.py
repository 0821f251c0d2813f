"""The arguments that define a just-in-time matrix, checked: its weight parameters and its
seed (shared by the jitc products, their spike-index form and the delayed product)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from primforge.ops import _scaffold
from primforge.ops.jitconn.generator import WEIGHT_KINDS, check_kind


def weight_params(weight, weight_kind, who):
    """``weight`` as the float vector of ``weight_kind``'s parameters, or a clear error."""
    check_kind(weight_kind, who)
    theta = _scaffold.float_weights(weight, scalar_as_vector=False, who=who, name="weight")
    want = WEIGHT_KINDS[weight_kind]
    if theta.size != want or theta.ndim > 1:
        what = {"homo": "a scalar", "uniform": "a pair (low, high)",
                "normal": "a pair (mean, std)"}[weight_kind]
        raise ValueError(f"{who}: 'weight' must be {what} for weight_kind={weight_kind!r}, got "
                         f"shape {tuple(theta.shape)}")
    return theta.reshape(want)


def seed_word(seed, who):
    """``seed`` as a ``uint32[1]`` (a Python or NumPy integer taken modulo 2**32)."""
    s = seed if isinstance(seed, jax.Array) or hasattr(seed, "aval") else np.asarray(seed)
    if not jnp.issubdtype(s.dtype, jnp.integer) or s.size != 1:
        raise TypeError(f"{who}: 'seed' must be one integer, got {getattr(s, 'dtype', s)}"
                        f"{list(getattr(s, 'shape', ()))}")
    if isinstance(s, np.ndarray):
        return jnp.asarray(np.asarray(int(s.reshape(())) % 2**32, np.uint32).reshape(1))
    return s.reshape(1).astype(jnp.uint32)
