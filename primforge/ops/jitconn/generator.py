"""The counter-based generator behind the just-in-time connectivity products.

Its constants, defined once, and its ``jax.numpy`` functions (uint32, wrapping), traced by
the ``jax`` and ``pallas`` backends; the Numba kernels compute the same integers.
"""

from __future__ import annotations

import fractions
import functools
import math
from typing import Any

import jax.numpy as jnp
import numpy as np

__all__ = [
    "DELAY_SALT",
    "FEW_FLIPS",
    "FLIP",
    "GAMMA_SALT",
    "MASK",
    "MAX_TABLE",
    "MIX_1",
    "MIX_2",
    "ROW_SALT",
    "SEED_SALT",
    "WEIGHT_KINDS",
    "cached_table",
    "check_kind",
    "check_prob",
    "delay_draws",
    "draw",
    "gap",
    "mix32",
    "next_column",
    "popcount32",
    "row_streams",
    "threshold_table",
    "unit",
    "weights",
]

WEIGHT_KINDS = {"homo": 1, "uniform": 2, "normal": 2}  # kind -> number of parameters
# The generator's constants (the only place they are written).
SEED_SALT = 0x3C6EF372  # seed -> key of the rows' starts
GAMMA_SALT = 0xA54FF53A  # seed -> key of the rows' increments
ROW_SALT = 0x85EBCA6B  # row index -> its hash
MIX_1 = 0x7FEB352D  # the finaliser's two multipliers
MIX_2 = 0x846CA68B
FLIP = 0xAAAAAAAA  # toggles every other bit of an increment with few bit flips ...
FEW_FLIPS = 12  # ... i.e. fewer than this many adjacent-bit changes
MASK = 0xFFFFFFFF  # the generator works in 32-bit words
DELAY_SALT = 0x510E527F  # seed -> key of the rows' delay streams (see delay_draws)
MAX_TABLE = 2**23  # thresholds; prob >= ~2.7e-6


def check_kind(kind: Any, who: str) -> None:
    """Raise a clear error unless ``kind`` is one of :data:`WEIGHT_KINDS`."""
    if kind not in WEIGHT_KINDS:
        raise ValueError(
            f"{who}: 'weight_kind' must be one of {sorted(WEIGHT_KINDS)}, got {kind!r}")


def check_prob(prob: Any, who: str) -> float:
    """``prob`` as a float in ``(0, 1]``, or a clear error."""
    try:
        p = float(prob)
    except (TypeError, ValueError):
        raise TypeError(f"{who}: 'prob' must be a float in (0, 1], got {prob!r}") from None
    if not 0.0 < p <= 1.0:
        raise ValueError(f"{who}: 'prob' must be in (0, 1], got {prob!r}")
    return p


def _floor_power(p: float, k: int) -> int:
    """``floor((1 - p)**k * 2**32)`` exactly, for the float ``p`` (a dyadic rational)."""
    q = 1 - fractions.Fraction(p)
    num, b = q.numerator, q.denominator.bit_length() - 1  # 1 - p = num / 2**b
    if b * k <= 4096:  # small enough to compute the rational itself
        return (num**k << 32) >> (b * k)
    prec = max(256, 2 * b)
    while True:  # q**k * 2**prec bracketed by powers rounded down and up
        lo = hi = 1 << prec
        base_lo = base_hi = num << (prec - b)
        e = k
        while e:
            if e & 1:
                lo, hi = (lo * base_lo) >> prec, -((-hi * base_hi) >> prec)
            e >>= 1
            if e:
                base_lo, base_hi = (base_lo * base_lo) >> prec, -((-base_hi * base_hi) >> prec)
        lo, hi = lo >> (prec - 32), hi >> (prec - 32)
        if lo == hi:
            return lo
        prec *= 2


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
    # Within about 5e-5 of (1 - p)**k * 2**32 (|k log(1 - p)| <= 22.2): the floor is right
    # unless the value lies that close to an integer; those few are computed exactly.
    t = np.exp(ks * logq) * 2.0**32
    near = np.flatnonzero(np.abs(t - np.round(t)) < 2e-4)
    t = np.floor(t)
    t[near] = [float(_floor_power(p, int(k) + 1)) for k in near]
    t = t[t >= 1.0]
    out = np.zeros(t.size + 1, np.uint32)  # the trailing 0 ends every search
    out[:-1] = np.minimum(t, 2.0**32 - 1).astype(np.uint32)
    out.setflags(write=False)
    return out


def threshold_table(prob: float) -> np.ndarray:
    """The gap thresholds of connection probability ``prob`` (read-only uint32 array).

    Entry ``k - 1`` is ``floor((1 - prob)**k * 2**32)`` for ``k = 1 .. K`` (every
    non-zero one), followed by a 0; ``1 - prob`` is exact (``prob`` is a float, i.e. a
    dyadic rational) and so is every entry. A gap of ``g`` columns follows a draw ``d``
    when exactly ``g`` entries exceed ``d``.

    Example:
        >>> t = threshold_table(0.5)
        >>> [int(v) for v in t[:3]], int(t[10]), int(t[-2]), int(t[-1]), t.size
        ([2147483648, 1073741824, 536870912], 2097152, 1, 0, 33)
    """
    return cached_table(check_prob(prob, "threshold_table"))


def mix32(x):
    """The 32-bit integer finaliser of the generator, on uint32 arrays (wrapping)."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(MIX_1)
    x = x ^ (x >> 15)
    x = x * jnp.uint32(MIX_2)
    return x ^ (x >> 16)


def popcount32(x):
    """The number of set bits of each uint32 (plain shifts, masks and one multiplication)."""
    x = x - ((x >> 1) & jnp.uint32(0x55555555))
    x = (x & jnp.uint32(0x33333333)) + ((x >> 2) & jnp.uint32(0x33333333))
    x = (x + (x >> 4)) & jnp.uint32(0x0F0F0F0F)
    return (x * jnp.uint32(0x01010101)) >> 24


def row_streams(seed, rows):
    """The streams ``(start, gamma)`` of ``rows`` (int) for the uint32 ``seed`` (scalar).

    ``h = mix(row ^ ROW_SALT)``; ``start = mix(h + mix(seed ^ SEED_SALT))``; ``gamma =
    mix(h ^ mix(seed ^ GAMMA_SALT)) | 1``, xor ``FLIP`` when it has fewer than
    ``FEW_FLIPS`` adjacent-bit changes (an increment with long runs of equal bits would
    feed the finaliser inputs that differ in few bits).
    """
    h = mix32(rows.astype(jnp.uint32) ^ jnp.uint32(ROW_SALT))
    start = mix32(h + mix32(seed ^ jnp.uint32(SEED_SALT)))
    gamma = mix32(h ^ mix32(seed ^ jnp.uint32(GAMMA_SALT))) | jnp.uint32(1)
    few = popcount32(gamma ^ (gamma >> 1)) < jnp.uint32(FEW_FLIPS)
    return start, jnp.where(few, gamma ^ jnp.uint32(FLIP), gamma)


def draw(stream, c):
    """Draw ``c`` (uint32 scalar) of every row of ``stream = (start, gamma)``."""
    start, gamma = stream
    return mix32(start + c * gamma)


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


def weights(theta, stream, s, kind: str, dtype):
    """The weight of synapse ``s`` (uint32 scalar) of every row of ``stream``, in ``dtype``."""
    if kind == "homo":
        return jnp.broadcast_to(theta[0], stream[0].shape).astype(dtype)
    three = jnp.uint32(3)
    u1 = unit(draw(stream, three * s + jnp.uint32(1))).astype(dtype)
    if kind == "uniform":
        return theta[0] + (theta[1] - theta[0]) * u1
    u2 = unit(draw(stream, three * s + jnp.uint32(2))).astype(dtype)
    z = jnp.sqrt(-2 * jnp.log(u1)) * jnp.cos((2 * np.pi) * u2)
    return theta[0] + theta[1] * z


def delay_draws(seed, rows, gamma, cols, dmin: int, span: int):
    """The delays of synapses ``(rows, cols)`` in ``[dmin, dmin + span)`` (int32).

    Row ``i`` has a delay stream ``mix(h + mix(seed ^ DELAY_SALT))`` (``h`` the row's hash,
    as in :func:`row_streams`) advanced by the row's own ``gamma``; the synapse in column
    ``j`` draws ``u = mix(dstart + j * gamma)`` and maps it to ``dmin + floor(u * span /
    2**32)`` (multiply-shift: each delay has ``floor`` or ``ceil`` of ``2**32 / span``
    draws, a bias below ``span / 2**32``). ``span`` is a static int in ``[1, 2**16]``: the
    product is split in 16-bit halves so that it stays in uint32. The delays do not touch
    the connectivity or weight draws: a delayed product has the same synapses and weights.

    Example:
        >>> import jax.numpy as jnp
        >>> rows, cols = jnp.arange(3), jnp.array([0, 5, 9])
        >>> _, gamma = row_streams(jnp.uint32(7), rows)
        >>> d = delay_draws(jnp.uint32(7), rows, gamma, cols, 1, 4)
        >>> bool(((d >= 1) & (d <= 4)).all()), d.dtype
        (True, dtype('int32'))
    """
    h = mix32(rows.astype(jnp.uint32) ^ jnp.uint32(ROW_SALT))
    dstart = mix32(h + mix32(seed ^ jnp.uint32(DELAY_SALT)))
    u = mix32(dstart + cols.astype(jnp.uint32) * gamma)
    span_u = jnp.uint32(span)
    hi = (u >> 16) * span_u
    lo = (u & jnp.uint32(0xFFFF)) * span_u
    return (((hi + (lo >> 16)) >> 16).astype(jnp.int32) + jnp.int32(dmin))
