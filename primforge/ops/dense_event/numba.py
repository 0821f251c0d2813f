"""Numba CPU kernels for dense-matrix event products (imported lazily).

Convention ``kernel(weights, x, out)``; ``W.T @ x`` adds only the rows of active events,
``W @ x`` reads only the columns of active events (or, over 1/16 active, every column).
"""

from __future__ import annotations

import functools

# Reassociation and contraction only: no flag that assumes finite values, so NaN and inf
# inputs and weights propagate as in the 'jax' reference (and x != 0 holds for NaN).
_FAST = {"reassoc", "contract", "nsz", "arcp"}


@functools.cache
def mv_kernel(binary: bool, transpose: bool):
    """The njit matrix-vector kernel for one variant (compiled lazily per dtype)."""
    import numba
    import numpy as np

    BINARY = binary

    if transpose:

        @numba.njit(nogil=True, fastmath=_FAST)
        def dense_t_mv(weights, x, out):
            m, n = weights.shape
            out[:] = 0
            for i in range(m):
                xi = x[i]
                if xi != 0:
                    if BINARY:
                        for j in range(n):
                            out[j] += weights[i, j]
                    else:
                        for j in range(n):
                            out[j] += weights[i, j] * xi

        return dense_t_mv

    @numba.njit(nogil=True, fastmath=_FAST)
    def dense_mv(weights, x, out):
        m, n = weights.shape
        active = np.empty(n, np.int64)
        na = 0
        for j in range(n):
            if x[j] != 0:
                active[na] = j
                na += 1
        if na * 16 > n:
            # Dense enough (over 1/16 active) that a unit-stride, vectorised dot over every
            # column costs less than gathering the active ones.
            v = np.empty(n, out.dtype)
            for j in range(n):
                v[j] = (1.0 if x[j] != 0 else 0.0) if BINARY else x[j]
            for i in range(m):
                z = out.dtype.type(0)
                s = z  # accumulate in the weights' dtype: packed SIMD FMAs
                for j in range(n):  # a select: an inactive input's weight never enters
                    s += weights[i, j] * v[j] if v[j] != 0 else z
                out[i] = s
            return
        for i in range(m):
            s = 0.0
            for a in range(na):
                j = active[a]
                if BINARY:
                    s += weights[i, j]
                else:
                    s += weights[i, j] * x[j]
            out[i] = s

    return dense_mv


@functools.cache
def mm_kernel(binary: bool, transpose: bool):
    """The njit matrix-matrix kernel for one variant (compiled lazily per dtype)."""
    import numba
    import numpy as np

    BINARY = binary

    if transpose:

        @numba.njit(nogil=True, fastmath=_FAST)
        def dense_t_mm(weights, x, out):
            m, n = weights.shape
            cols = x.shape[1]
            # Accumulate column c of the result as a contiguous row acc[c, :]: every active
            # (i, c) adds the unit-stride row W[i, :] (vectorised); one transposed copy at
            # the end. Rows of x without an active entry are never read from W.
            acc = np.zeros((cols, n), out.dtype)
            for i in range(m):
                for c in range(cols):
                    xc = x[i, c]
                    if xc != 0:
                        if BINARY:
                            for j in range(n):
                                acc[c, j] += weights[i, j]
                        else:
                            for j in range(n):
                                acc[c, j] += weights[i, j] * xc
            for j in range(n):
                for c in range(cols):
                    out[j, c] = acc[c, j]

        return dense_t_mm

    @numba.njit(nogil=True, fastmath=_FAST)
    def dense_mm(weights, x, out):
        m, n = weights.shape
        cols = x.shape[1]
        # Per column of x: the list of its active rows, and whether it is dense enough
        # (over 1/16 active, as in the vector kernel) for a unit-stride dot with a
        # contiguous copy of the column instead of gathering the active entries. Each row
        # of W is then read once (cache-hot) for every column.
        active = np.empty((cols, n), np.int64)
        count = np.zeros(cols, np.int64)
        for j in range(n):
            for c in range(cols):
                if x[j, c] != 0:
                    active[c, count[c]] = j
                    count[c] += 1
        dense = np.empty(cols, np.bool_)
        vt = np.zeros((cols, n), out.dtype)
        for c in range(cols):
            dense[c] = count[c] * 16 > n
            if dense[c]:
                for j in range(n):
                    vt[c, j] = (1.0 if x[j, c] != 0 else 0.0) if BINARY else x[j, c]
        for i in range(m):
            for c in range(cols):
                if dense[c]:
                    z = out.dtype.type(0)
                    s = z  # the weights' dtype: packed FMAs
                    for j in range(n):  # a select, as in the vector kernel
                        s += weights[i, j] * vt[c, j] if vt[c, j] != 0 else z
                    out[i, c] = s
                else:
                    t = 0.0
                    for a in range(count[c]):
                        j = active[c, a]
                        if BINARY:
                            t += weights[i, j]
                        else:
                            t += weights[i, j] * x[j, c]
                    out[i, c] = t

    return dense_mm


@functools.cache
def spikes_mv_kernel(transpose: bool):
    """The njit product with a spike list: ``kernel(weights, spikes, count, out)``.

    With ``transpose`` the listed rows of ``W`` are added (work: spikes times columns);
    else each row of ``W`` sums its listed columns (work: rows times spikes). A listed index
    outside the sources or a count outside ``[0, len(spikes)]`` fills ``out`` with NaN.
    """
    import numba
    import numpy as np

    TRANSPOSE = transpose

    from primforge.ops import _spikes


    list_ok = _spikes.numba_list_ok()

    @numba.njit(nogil=True)
    def dense_mv_spikes(weights, spikes, count, out):
        m, n = weights.shape
        size = m if TRANSPOSE else n
        out[:] = 0
        c = count[0]
        if not list_ok(spikes, count, size):
            out[:] = np.nan
            return
        if TRANSPOSE:
            for s in range(c):
                row = weights[spikes[s]]
                for j in range(n):
                    out[j] += row[j]
            return
        for i in range(m):
            row = weights[i]
            acc = 0.0
            for s in range(c):
                acc += row[spikes[s]]
            out[i] = acc

    return dense_mv_spikes


@functools.cache
def spikes_mm_kernel(transpose: bool):
    """:func:`spikes_mv_kernel` for several lists: ``spikes`` ``(lists, length)``,
    ``count`` ``(lists,)``, row ``b`` of ``out`` from list ``b``."""
    import numba

    one = spikes_mv_kernel(transpose)

    @numba.njit(nogil=True)
    def dense_mm_spikes(weights, spikes, count, out):
        for b in range(spikes.shape[0]):
            one(weights, spikes[b], count[b:b + 1], out[b])

    return dense_mm_spikes
