"""The counter-based generator behind the just-in-time connectivity products.

Design:
    * The generator is stated exactly in the design note of :mod:`primforge.ops.jitconn`:
      a 32-bit integer hash of the seed, the row and a counter; gaps between columns read
      off a threshold table with integer comparisons only; weights as float functions of
      the same draws.
    * Everything here is plain ``jax.numpy`` on uint32 (the ``jax`` and ``pallas``
      backends trace these functions); :func:`primforge.ops.jitconn.jitc_todense` is the
      independent NumPy loop over the same definition.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax.numpy as jnp
import numpy as np

__all__ = [
    "GOLDEN",
    "MAX_TABLE",
    "MIX_1",
    "MIX_2",
    "ROW_SALT",
    "SEED_SALT",
    "WEIGHT_KINDS",
    "cached_table",
    "check_kind",
    "check_prob",
    "draw",
    "gap",
    "mix32",
    "next_column",
    "row_keys",
    "threshold_table",
    "unit",
    "weights",
]

WEIGHT_KINDS = {"homo": 1, "uniform": 2, "normal": 2}  # kind -> number of parameters
SEED_SALT = 0x3C6EF372
ROW_SALT = 0x85EBCA6B
GOLDEN = 0x9E3779B9
MIX_1 = 0x7FEB352D
MIX_2 = 0x846CA68B
MAX_TABLE = 2**23  # thresholds; prob >= ~2.7e-6


def check_kind(kind: Any, who: str) -> None:
    """Raise a clear error unless ``kind`` is one of :data:`WEIGHT_KINDS`."""
    if kind not in WEIGHT_KINDS:
        raise ValueError(f"{who}: 'weight_kind' must be one of {sorted(WEIGHT_KINDS)}, got {kind!r}")


def check_prob(prob: Any, who: str) -> float:
    """``prob`` as a float in ``(0, 1]``, or a clear error."""
    try:
        p = float(prob)
    except (TypeError, ValueError):
        raise TypeError(f"{who}: 'prob' must be a float in (0, 1], got {prob!r}") from None
    if not 0.0 < p <= 1.0:
        raise ValueError(f"{who}: 'prob' must be in (0, 1], got {prob!r}")
    return p


@functools.lru_cache(maxsize=64)
def cached_table(p: float) -> np.ndarray:
    """The threshold table of ``prob = p`` (checked), cached; see :func:`threshold_table`."""
    if p >= 1.0:
        return np.zeros(1, np.uint32)
    logq = math.log1p(-p)
    k_max = int(32 * math.log(2) / -logq) + 2
    if k_max > MAX_TABLE:
        raise ValueError(
            f"jitc: 'prob' = {p} is too small: its threshold table would hold {k_max} entries "
            f"(at most {MAX_TABLE}, i.e. prob >= {22.2 / MAX_TABLE:.1e}); store the matrix as "
            f"CSR instead"
        )
    ks = np.arange(1, k_max + 1, dtype=np.float64)
    t = np.floor(np.exp(ks * logq) * 2.0**32)
    t = t[t >= 1.0]
    out = np.zeros(t.size + 1, np.uint32)  # the trailing 0 ends every search
    out[:-1] = np.minimum(t, 2.0**32 - 1).astype(np.uint32)
    out.setflags(write=False)
    return out


def threshold_table(prob: float) -> np.ndarray:
    """The gap thresholds of connection probability ``prob`` (read-only uint32 array).

    Entry ``k - 1`` is ``floor((1 - prob)**k * 2**32)`` for ``k = 1 .. K`` (every
    non-zero one), followed by a 0. A gap of ``g`` columns follows a draw ``d`` when
    exactly ``g`` entries exceed ``d``.

    Example:
        >>> t = threshold_table(0.5)
        >>> [int(v) for v in t[:3]], int(t[-1]), t.size
        ([2147483648, 1073741824, 536870912], 0, 33)
    """
    return cached_table(check_prob(prob, "threshold_table"))


def mix32(x):
    """The 32-bit integer finaliser of the generator, on uint32 arrays (wrapping)."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(MIX_1)
    x = x ^ (x >> 15)
    x = x * jnp.uint32(MIX_2)
    return x ^ (x >> 16)


def row_keys(seed, rows):
    """Per-row keys ``r_i`` for uint32 ``seed`` (scalar) and int ``rows``."""
    key = mix32(seed ^ jnp.uint32(SEED_SALT))
    return mix32(key + mix32(rows.astype(jnp.uint32) ^ jnp.uint32(ROW_SALT)))


def draw(keys, c):
    """Draw ``c`` (uint32 scalar) of every row key."""
    return mix32(keys + (c + jnp.uint32(1)) * jnp.uint32(GOLDEN))


def unit(h):
    """A uint32 draw as a float32 in (0, 1): an odd multiple of 2**-24 (exact)."""
    odd = ((h >> 9) * jnp.uint32(2) + jnp.uint32(1)).astype(jnp.int32)
    return odd.astype(jnp.float32) * jnp.float32(2.0**-24)


def gap(u, load, k_max: int):
    """Number of thresholds above ``u``: a fixed-length binary search through ``load``."""
    lo = jnp.zeros(u.shape, jnp.int32)
    hi = jnp.full(u.shape, k_max, jnp.int32)
    for _ in range(int(k_max).bit_length()):
        mid = (lo + hi) // 2
        le = load(mid) <= u
        hi = jnp.where(le, mid, hi)
        lo = jnp.where(le, lo, mid + 1)
    return lo


def next_column(j, alive, u, load, k_max: int, n: int):
    """Advance each live row to its next column; a row dies at the first column >= n."""
    g = gap(u, load, k_max)
    fits = alive & (g < n - 1 - j)
    return jnp.where(fits, j + 1 + g, j), fits


def weights(theta, keys, s, kind: str, dtype):
    """The weight of synapse ``s`` (uint32 scalar) of every row, in ``dtype``."""
    if kind == "homo":
        return jnp.broadcast_to(theta[0], keys.shape).astype(dtype)
    three = jnp.uint32(3)
    u1 = unit(draw(keys, three * s + jnp.uint32(1))).astype(dtype)
    if kind == "uniform":
        return theta[0] + (theta[1] - theta[0]) * u1
    u2 = unit(draw(keys, three * s + jnp.uint32(2))).astype(dtype)
    z = jnp.sqrt(-2 * jnp.log(u1)) * jnp.cos((2 * np.pi) * u2)
    return theta[0] + theta[1] * z
