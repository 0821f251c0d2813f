"""Numba CPU kernels for just-in-time connectivity (imported only when one is generated).

Each kernel ``kernel(theta, seed, table, x, out)`` regenerates the rows of ``W`` from the
seed (uint32 arithmetic done in int64 with explicit masking); ``W.T @ x`` generates only
the rows whose input is non-zero.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from primforge.ops import _spikes
from primforge.ops._prefetch import event_words
from primforge.ops.jitconn.generator import (
    FEW_FLIPS,
    FLIP,
    GAMMA_SALT,
    MASK,
    MIX_1,
    MIX_2,
    ROW_SALT,
    SEED_SALT,
)

_M2_LO = MIX_2 & 0xFFFF  # MIX_1 < 2**31: x * MIX_1 fits in int64 for x < 2**32; MIX_2 does not
_M2_HI = MIX_2 >> 16


@functools.cache
def _helpers():
    import numba

    @numba.njit(inline="always", nogil=True)
    def mul_m2(x):  # (x * MIX_2) mod 2**32 without exceeding int64
        return (x * _M2_LO + (((x * _M2_HI) & 0xFFFF) << 16)) & MASK

    @numba.njit(inline="always", nogil=True)
    def mix(x):
        x = x ^ (x >> 16)
        x = (x * MIX_1) & MASK
        x = x ^ (x >> 15)
        x = mul_m2(x)
        return x ^ (x >> 16)

    @numba.njit(inline="always", nogil=True)
    def popcount(x):  # set bits of a uint32 value
        x = x - ((x >> 1) & 0x55555555)
        x = (x & 0x33333333) + ((x >> 2) & 0x33333333)
        x = (x + (x >> 4)) & 0x0F0F0F0F
        return ((x * 0x01010101) & MASK) >> 24

    @numba.njit(inline="always", nogil=True)
    def seed_keys(seed):  # the keys of the rows' starts and increments
        return mix((seed & MASK) ^ SEED_SALT), mix((seed & MASK) ^ GAMMA_SALT)

    @numba.njit(inline="always", nogil=True)
    def row_stream(keys, i):
        """Row ``i``'s first draw argument, increment and synapse step (3 increments)."""
        h = mix(i ^ ROW_SALT)
        start = mix((h + keys[0]) & MASK)
        gamma = mix(h ^ keys[1]) | 1
        if popcount(gamma ^ (gamma >> 1)) < FEW_FLIPS:
            gamma ^= FLIP
        return start, gamma, (3 * gamma) & MASK

    @numba.njit(inline="always", nogil=True)
    def unit(h):  # odd multiples of 2**-24 in (0, 1): exact in float32
        return ((h >> 9) * 2 + 1) * 5.9604644775390625e-08

    @numba.njit(inline="always", nogil=True)
    def skip(u, table, guide, shift):
        g = guide[u >> shift]  # every threshold before g exceeds the bucket's largest draw
        while table[g] > u:  # table[-1] == 0 ends this walk
            g += 1
        return g

    return mix, seed_keys, row_stream, unit, skip


def helpers():
    """The generator's Numba functions ``(mix, seed_keys, row_stream, unit, skip)``.

    For kernels of other families that regenerate the same rows (compiled on first use).

    Example:
        >>> mix = helpers()[0]
        >>> mix(0), mix(1) == mix(1)
        (0, True)
    """
    return _helpers()


def guide_table(table: np.ndarray) -> tuple[np.ndarray, int]:
    """A guide into ``table``: the start of the search for each bucket of top draw bits.

    With ``bits`` about ``log2(len(table)) + 3`` (at most 16: 256 KiB of int32) the walk
    from the guide to the exact gap ends at its first comparison in most buckets, so its
    loop branch is well predicted; no floating point is involved.
    """
    k_max = table.size - 1
    bits = min(16, max(8, int(k_max).bit_length() + 3))
    shift = 32 - bits
    tops = (np.arange(1, 2**bits + 1, dtype=np.int64) << shift) - 1  # largest draw per bucket
    neg = -table[:-1].astype(np.int64)  # ascending
    guide = np.searchsorted(neg, -tops, side="left").astype(np.int32)
    return guide, shift


@functools.cache
def column_walk(prob: float):
    """``(row_cursor, next_column)``: the walk along one row's columns for ``prob``, inlined.

    Every kernel that regenerates rows of ``W`` lists their columns with these two, so all
    see the same columns, in order::

        j, ctr, gamma, step = row_cursor(keys, i)  # before the first column: j = -1
        while True:
            j, ctr = next_column(j, ctr, step, table)
            if j >= n:  # past the row's last column (or a block's end)
                break
            ...  # column j; its synapse's weight: weight(th, ctr, gamma)

    ``ctr`` is the draw argument of the current synapse's gap: synapse ``s`` of the row
    draws with the counters ``3s`` (its gap), ``3s + 1`` and ``3s + 2`` (its weight), i.e.
    ``mix(start + gamma * c)`` mod 2**32, and the walk advances ``ctr`` by one addition of
    ``step = 3 gamma`` per synapse instead of a multiplication per draw. The guide into the
    threshold table is a constant of the compiled kernels; ``table`` is their argument.

    Example:
        >>> import numpy as np
        >>> from primforge.ops.jitconn.api import jitc_todense
        >>> from primforge.ops.jitconn.generator import threshold_table
        >>> row_cursor, next_column = column_walk(0.5)
        >>> seed_keys, table = helpers()[1], threshold_table(0.5)
        >>> j, ctr, _, step = row_cursor(seed_keys(7), 1)
        >>> cols = []
        >>> while True:
        ...     j, ctr = next_column(j, ctr, step, table)
        ...     if j >= 6:
        ...         break
        ...     cols.append(j)
        >>> cols == np.flatnonzero(jitc_todense(7, (2, 6), 0.5)[1]).tolist()
        True
    """
    import numba

    from primforge.ops.jitconn.generator import threshold_table

    GUIDE, SHIFT = guide_table(threshold_table(prob))
    mix, _, row_stream, _, skip = _helpers()

    @numba.njit(inline="always", nogil=True)
    def row_cursor(keys, i):
        start, gamma, step = row_stream(keys, i)
        return -1, (start - step) & MASK, gamma, step  # one synapse before the first

    @numba.njit(inline="always", nogil=True)
    def next_column(j, ctr, step, table):
        ctr = (ctr + step) & MASK
        return j + 1 + skip(mix(ctr), table, GUIDE, SHIFT), ctr

    return row_cursor, next_column


@functools.cache
def weight_helpers(kind: str):
    """``(weight, params)`` of one weight kind: a synapse's weight and the parameters read
    once per call (the kind is a constant that Numba folds into the kernels inlining them)."""
    import numba

    mix, _, _, unit, _ = _helpers()
    KIND = {"homo": 0, "uniform": 1, "normal": 2}[kind]
    TWO_PI = 2.0 * math.pi

    # ``ctr``: the draw argument of the synapse's gap (see column_walk); its weight draws
    # with the next two counters.
    @numba.njit(inline="always", nogil=True)
    def weight(th, ctr, gamma):
        # ``th``: the weight parameters as a tuple of float64 scalars, read once per call
        # (reading them from the array at every synapse cost several times more).
        if KIND == 0:
            return th[0]
        u1 = unit(mix((ctr + gamma) & MASK))
        if KIND == 1:
            return th[0] + (th[1] - th[0]) * u1
        u2 = unit(mix((ctr + 2 * gamma) & MASK))
        z = math.sqrt(-2.0 * math.log(u1)) * math.cos(TWO_PI * u2)
        return th[0] + th[1] * z

    @numba.njit(inline="always", nogil=True)
    def params(theta):
        if KIND == 0:
            return (float(theta[0]), 0.0)
        return (float(theta[0]), float(theta[1]))

    return weight, params


@functools.cache
def kernel(binary: bool, matrix: bool, transpose: bool, kind: str, prob: float,
           blocked: tuple[int, int] | None = None):
    """The njit kernel for one variant (compiled lazily per dtype).

    ``blocked``: the shape of the whole matrix when the product uses a block of it; the
    seed array then holds ``(seed, first row, first column)`` and the input and output
    have the block's lengths.

    Long by design: the njit bodies close over this variant's constants (guide table,
    weight kind, direction), which Numba folds into the compiled code; split into
    functions they would become runtime arguments.
    """
    import numba

    row_cursor, next_column = column_walk(prob)
    seed_keys = _helpers()[1]
    BINARY = binary
    KIND = {"homo": 0, "uniform": 1, "normal": 2}[kind]
    BLOCKED = blocked is not None
    M_ALL, N_ALL = blocked if BLOCKED else (0, 0)

    @numba.njit(inline="always", nogil=True)
    def signed(v):  # the uint32 bits of an int32 start, read back signed
        v = np.int64(v)
        return v - np.int64(1 << 32) if v >= np.int64(1 << 31) else v

    @numba.njit(inline="always", nogil=True)
    def window(seed, h, w):
        """``(r0, c0, stop, row_begin, row_end)``: the block's first row and column (either
        may be negative), the column where each row's generation stops, and the block's
        rows ``row_begin .. row_end - 1`` that lie inside the matrix."""
        if BLOCKED:
            r0 = signed(seed[1])
            c0 = max(min(signed(seed[2]), np.int64(N_ALL)), -np.int64(w))
            stop = c0 + min(np.int64(w), N_ALL - c0)
            row_end = max(np.int64(0), min(np.int64(h), M_ALL - r0))
            row_begin = min(max(np.int64(0), -r0), row_end)
            return r0, c0, stop, row_begin, row_end
        return np.int64(0), np.int64(0), np.int64(w), np.int64(0), np.int64(h)

    weight, params = weight_helpers(kind)

    if not matrix and not transpose:

        @numba.njit(nogil=True)
        def jitc_mv(theta, seed, table, x, out):
            m = out.shape[0]
            r0, c0, stop, row_begin, row_end = window(seed, m, x.shape[0])
            keys = seed_keys(seed[0])
            th = params(theta)
            out[:row_begin] = 0
            for i in range(row_begin, row_end):
                j, ctr, gamma, step = row_cursor(keys, r0 + i)
                count = 0  # shared weight, binary events: an exact integer count
                acc = 0.0
                while True:
                    j, ctr = next_column(j, ctr, step, table)
                    if j >= stop:
                        break
                    if not BLOCKED or j >= c0:  # a block's columns only
                        xv = x[j - c0]
                        if KIND == 0:  # shared weight: no branch, applied once per row below
                            if BINARY:
                                count += 1 if xv != 0 else 0
                            else:
                                acc += xv
                        elif xv != 0:  # a random weight is drawn only where it is needed
                            w = weight(th, ctr, gamma)
                            acc += w if BINARY else w * xv
                if KIND == 0 and BINARY:
                    acc = float(count)
                out[i] = acc * theta[0] if KIND == 0 else acc
            out[row_end:] = 0

        return jitc_mv

    if not matrix:

        words = event_words()

        @numba.njit(nogil=True)
        def jitc_t_mv(theta, seed, table, x, out):
            r0, c0, stop, row_begin, row_end = window(seed, x.shape[0], out.shape[0])
            keys = seed_keys(seed[0])
            th = params(theta)
            out[:] = 0
            x_words, n_words = words(x)  # a zero word: 8 bytes of silent events skipped
            size = x.itemsize
            for b in range(n_words + 1):
                if b < n_words and x_words[b] == 0:
                    continue
                lo = 8 * b // size
                if lo >= row_end:  # past the block's last row
                    break
                hi = min(8 * (b + 1) // size if b < n_words else x.shape[0], row_end)
                for i in range(max(lo, row_begin), hi):
                    xi = x[i]
                    if xi == 0:
                        continue
                    j, ctr, gamma, step = row_cursor(keys, r0 + i)
                    while True:
                        j, ctr = next_column(j, ctr, step, table)
                        if j >= stop:
                            break
                        if not BLOCKED or j >= c0:
                            w = weight(th, ctr, gamma)
                            if BINARY:
                                out[j - c0] += w
                            else:
                                out[j - c0] += w * xi

        return jitc_t_mv

    if not transpose:

        @numba.njit(nogil=True)
        def jitc_mm(theta, seed, table, x, out):
            n, kcols = x.shape
            r0, c0, stop, row_begin, row_end = window(seed, out.shape[0], n)
            keys = seed_keys(seed[0])
            th = params(theta)
            out[:] = 0
            for i in range(row_begin, row_end):
                j, ctr, gamma, step = row_cursor(keys, r0 + i)
                while True:
                    j, ctr = next_column(j, ctr, step, table)
                    if j >= stop:
                        break
                    if not BLOCKED or j >= c0:
                        w = 1.0 if KIND == 0 else weight(th, ctr, gamma)  # shared: once per row
                        for c in range(kcols):
                            xv = x[j - c0, c]
                            if BINARY:
                                if xv != 0:
                                    out[i, c] += w
                            else:
                                out[i, c] += w * xv
                if KIND == 0:
                    for c in range(kcols):
                        out[i, c] *= theta[0]

        return jitc_mm

    @numba.njit(nogil=True)
    def jitc_t_mm(theta, seed, table, x, out):
        kcols = x.shape[1]
        r0, c0, stop, row_begin, row_end = window(seed, x.shape[0], out.shape[0])
        keys = seed_keys(seed[0])
        th = params(theta)
        out[:] = 0
        act = np.empty(kcols, np.int64)  # the columns of x that fire in row i
        for i in range(row_begin, row_end):
            na = 0
            for c in range(kcols):
                if x[i, c] != 0:
                    act[na] = c
                    na += 1
            if na == 0:
                continue
            j, ctr, gamma, step = row_cursor(keys, r0 + i)
            while True:
                j, ctr = next_column(j, ctr, step, table)
                if j >= stop:
                    break
                if not BLOCKED or j >= c0:
                    w = weight(th, ctr, gamma)
                    for t in range(na):
                        c = act[t]
                        if BINARY:
                            out[j - c0, c] += w
                        else:
                            out[j - c0, c] += w * x[i, c]

    return jitc_t_mm


@functools.cache
def spikes_kernel(matrix: bool, kind: str, prob: float, n_rows: int):
    """The njit product ``W.T @ e`` with a spike list: ``kernel(theta, seed, table, spikes,
    count, out)``.

    Each listed row of ``W`` is generated, the same synapses and weights as in
    :func:`kernel` (rows in the listed order: a sorted list of distinct rows adds in the
    order of the bool product), so the work follows the spikes. A listed row outside
    ``[0, n_rows)`` or a count outside ``[0, len(spikes)]`` fills ``out`` with NaN. With
    ``matrix``: ``spikes`` ``(lists, length)``, ``count`` ``(lists,)``, row ``b`` of
    ``out`` from list ``b``.
    """
    import numba

    row_cursor, next_column = column_walk(prob)
    seed_keys = _helpers()[1]
    weight, params = weight_helpers(kind)
    M = n_rows

    list_ok = _spikes.numba_list_ok()

    @numba.njit(inline="always", nogil=True)
    def one(theta, seed, table, spikes, count, out):
        n = out.shape[0]
        out[:] = 0
        if not list_ok(spikes, count, M):
            out[:] = np.nan
            return
        keys = seed_keys(seed[0])
        th = params(theta)
        for s in range(count[0]):
            j, ctr, gamma, step = row_cursor(keys, np.int64(spikes[s]))
            while True:
                j, ctr = next_column(j, ctr, step, table)
                if j >= n:
                    break
                out[j] += weight(th, ctr, gamma)

    if not matrix:

        @numba.njit(nogil=True)
        def jitc_t_mv_spikes(theta, seed, table, spikes, count, out):
            one(theta, seed, table, spikes, count, out)

        return jitc_t_mv_spikes

    @numba.njit(nogil=True)
    def jitc_t_mm_spikes(theta, seed, table, spikes, count, out):
        for b in range(spikes.shape[0]):
            one(theta, seed, table, spikes[b], count[b:b + 1], out[b])

    return jitc_t_mm_spikes
