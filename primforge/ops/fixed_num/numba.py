"""Numba CPU kernels for fixed-number connectivity products (imported lazily).

Each kernel ``kernel(weights, indices, x, out)`` fills ``out`` in place; the variant is
fixed by closure constants. Out-of-range column indices are masked (skipped).
"""

from __future__ import annotations

import functools

# Reassociation and contraction only: no flag that assumes finite values, so NaN and inf
# inputs and weights propagate as in the 'jax' reference (and x != 0 holds for NaN).
_FAST = {"reassoc", "contract", "nsz", "arcp"}


@functools.cache
def _row_scatter(binary: bool, homo: bool):
    """An njit ``scatter(out, weights, cols, i, w0, xi)``: row ``i`` of ``A.T @ x`` (its
    entries ``cols``, weight ``w0`` or their own, times ``xi`` for float inputs) added into
    ``out``, each column masked by one unsigned compare (a negative index wraps to a huge
    value), so the loop has no branch on either bound."""
    import numba
    import numpy as np

    BINARY, HOMO = binary, homo

    @numba.njit(inline="always", nogil=True, fastmath=_FAST)
    def scatter(out, weights, cols, i, w0, xi):
        un = np.uint64(out.shape[0])
        if HOMO:
            v = w0 if BINARY else w0 * xi
            for j in range(cols.shape[0]):
                t = np.uint64(cols[j])
                if t < un:
                    out[t] += v
        else:
            ws = weights[i]
            for j in range(cols.shape[0]):
                t = np.uint64(cols[j])
                if t < un:
                    if BINARY:
                        out[t] += ws[j]
                    else:
                        out[t] += ws[j] * xi

    return scatter


@functools.cache
def mv_kernel(binary: bool, transpose: bool, homo: bool, parallel: bool = False,
              packed_n: int | None = None):
    """The njit matrix-vector kernel for one variant (compiled lazily per dtype).

    ``parallel``: the rows of ``A @ x`` over Numba's threads (each thread owns whole output
    rows: the same sums as the serial kernel); ``A.T @ x`` scatters into shared outputs and
    stays serial. ``packed_n`` (binary ``A @ x`` only): ``x`` holds that many events
    bit-packed in ``uint32`` words, read into the gather's 0/1 table.
    """
    import numba
    import numpy as np

    BINARY, HOMO = binary, homo
    PACKED, N_PACKED = packed_n is not None, packed_n or 0
    if PACKED:
        from primforge.ops.csr import numba as _numba_csr

        table = _numba_csr._packed_table(N_PACKED)
    rows_of = numba.prange if parallel else range

    if transpose:
        scatter = _row_scatter(binary, homo)

        @numba.njit(nogil=True, fastmath=_FAST)
        def fixed_t_mv(weights, indices, x, out):
            m = indices.shape[0]
            out[:] = 0
            w0 = weights.ravel()[0] if HOMO and weights.size else out.dtype.type(0)
            # The rows that fire, listed first without a branch per row; then each one's
            # entries (no branch on x[i] in the inner loop).
            rows = np.empty(m, np.int64)
            na = 0
            for i in range(m):
                rows[na] = i
                na += x[i] != 0
            for a in range(na):
                i = rows[a]
                scatter(out, weights, indices[i], i, w0, x[i])

        return fixed_t_mv

    @numba.njit(nogil=True, fastmath=_FAST, parallel=parallel)
    def fixed_mv(weights, indices, x, out):
        m, k = indices.shape
        n = N_PACKED if PACKED else x.shape[0]
        if n == 0:
            out[:] = 0
            return
        w0 = weights.ravel()[0] if HOMO and weights.size else out.dtype.type(0)
        # The input (binary: 0/1 bytes, a table that stays in L1) with one trailing 0 where
        # masked slots point: each slot is then one unsigned clamp and one load, with no
        # branch (a negative index wraps to a huge one and is clamped too).
        if PACKED:
            pad = table(x)  # 0.0/1.0: the same sums and selects as the 0/1 bytes
        else:
            pad = np.zeros(n + 1, np.uint8 if BINARY else x.dtype)
            for t in range(n):
                pad[t] = (x[t] != 0) if BINARY else x[t]
        un = np.uint64(n)
        for i in rows_of(m):
            row = indices[i]
            s = 0.0  # accumulate in float64
            if HOMO:
                for j in range(k):
                    s += pad[min(np.uint64(row[j]), un)]
                out[i] = s * w0
            else:
                ws = weights[i]
                for j in range(k):
                    if BINARY:  # a select: an inactive event's weight never enters
                        s += ws[j] if pad[min(np.uint64(row[j]), un)] != 0 else 0.0
                    else:
                        s += ws[j] * pad[min(np.uint64(row[j]), un)]
                out[i] = s

    return fixed_mv


@functools.cache
def packed_mv_kernel(transpose: bool, homo: bool, n_events: int):
    """The binary matrix-vector kernel reading ``n_events`` bit-packed events:
    ``kernel(weights, indices, words, out)``, ``words`` ``uint32``, event ``i`` bit
    ``i % 32`` of word ``i // 32`` (bits past ``n_events`` ignored).

    The same sums in the same order as :func:`mv_kernel` on the unpacked events: with
    ``transpose`` each set bit scatters its row's ``k`` entries (a zero word skips 32 rows
    at once); else the gather reads a 0/1 table built from the words.
    """
    if not transpose:
        return mv_kernel(True, False, homo, packed_n=n_events)
    import numba
    import numpy as np

    from primforge.ops.csr import numba as _numba_csr

    trailing_zeros = _numba_csr._trailing_zeros()
    HOMO, N = homo, n_events
    one = np.uint32(1)

    scatter = _row_scatter(True, homo)

    @numba.njit(nogil=True, fastmath=_FAST)
    def fixed_t_mv_packed(weights, indices, words, out):
        out[:] = 0
        w0 = weights.ravel()[0] if HOMO and weights.size else out.dtype.type(0)
        for wi in range(words.shape[0]):
            bits = np.uint32(words[wi])
            while bits != 0:  # the set bits, lowest first: rows in increasing order
                i = wi * 32 + trailing_zeros(bits)
                if i >= N:
                    break
                scatter(out, weights, indices[i], i, w0, 1.0)
                bits &= bits - one

    return fixed_t_mv_packed


@functools.cache
def mm_kernel(binary: bool, transpose: bool, homo: bool):
    """The njit matrix-matrix kernel for one variant (compiled lazily per dtype)."""
    import numba
    import numpy as np

    BINARY, HOMO = binary, homo

    if transpose:

        @numba.njit(nogil=True, fastmath=_FAST)
        def fixed_t_mm(weights, indices, x, out):
            m, k = indices.shape
            n = out.shape[0]
            cols = x.shape[1]
            out[:] = 0
            w0 = weights.ravel()[0] if HOMO and weights.size else 0
            active = np.empty(cols, np.int64)
            for i in range(m):
                na = 0  # the columns of x that fire in row i
                for c in range(cols):
                    if x[i, c] != 0:
                        active[na] = c
                        na += 1
                if na == 0:
                    continue
                for j in range(k):
                    t = indices[i, j]
                    if t >= 0 and t < n:
                        w = w0 if HOMO else weights[i, j]
                        for a in range(na):
                            c = active[a]
                            if BINARY:
                                out[t, c] += w
                            else:
                                out[t, c] += w * x[i, c]

        return fixed_t_mm

    @numba.njit(nogil=True, fastmath=_FAST)
    def fixed_mm(weights, indices, x, out):
        m, k = indices.shape
        n, cols = x.shape
        out[:] = 0
        w0 = weights.ravel()[0] if HOMO and weights.size else 0
        for i in range(m):
            for j in range(k):
                t = indices[i, j]
                if t >= 0 and t < n:
                    w = 1 if HOMO else weights[i, j]  # a shared weight: applied per row
                    for c in range(cols):
                        if BINARY:
                            if x[t, c] != 0:
                                out[i, c] += w
                        else:
                            out[i, c] += w * x[t, c]
            if HOMO:
                for c in range(cols):
                    out[i, c] *= w0

    return fixed_mm


@functools.cache
def weight_grad_kernel(binary: bool, transpose: bool, matrix: bool, parallel: bool = False):
    """The njit gradient of ``<ct, A x>`` w.r.t. per-entry weights, in one pass.

    ``kernel(indices, ct, x, out)`` writes the ``(m, k)`` array ``out[i, j] = ct[i] .
    ev[t]`` (``ev[i] . ct[t]`` for ``A.T @ x``) with ``t = indices[i, j]`` and ``ev`` being
    ``x`` or ``x != 0``; a masked slot (``t`` outside ``[0, n)``) gets 0. For ``A.T @ x``
    the rows of silent sources are zero-filled without reading their indices (event-driven,
    like the product); ``A @ x`` reads every slot, branch-free. ``parallel``: the rows over
    Numba's threads (each row's slots are written by one thread only; the same values as
    the serial kernel), for vector inputs; the matrix kernel stays serial.
    """
    import numba
    import numpy as np

    BINARY, TRANSPOSE, MATRIX = binary, transpose, matrix
    if matrix:
        parallel = False
    rows_of = numba.prange if parallel else range

    @numba.njit(nogil=True, fastmath=_FAST, parallel=parallel)
    def fixed_weight_grad(indices, ct, x, out):
        by_row, by_col = (x, ct) if TRANSPOSE else (ct, x)
        m, k = indices.shape
        n = by_col.shape[0]
        if n == 0:
            out[:] = 0
            return
        if MATRIX:
            cols = by_row.shape[1]
            active = np.empty(cols, np.int64)
        else:
            # The gathered side as a float array with one trailing 0 where masked slots
            # point: the slot loop is a branch-free gather and multiply.
            pad = np.zeros(n + 1, out.dtype)
            un = np.uint64(n)
            for t in range(n):
                v = by_col[t]
                pad[t] = (1.0 if v != 0 else 0.0) if (BINARY and not TRANSPOSE) else v
        for i in rows_of(m):
            if MATRIX:
                na = 0  # the columns that contribute in row i
                for c in range(cols):
                    if by_row[i, c] != 0 or not TRANSPOSE:  # A.T @ x: active sources
                        active[na] = c
                        na += 1
                if na == 0:
                    out[i, :] = 0
                    continue
                for j in range(k):
                    t = indices[i, j]
                    inside = (t >= 0) & (t < n)
                    tt = t if inside else 0
                    s = 0.0
                    for a in range(na):
                        c = active[a]
                        if BINARY and TRANSPOSE:
                            s += by_col[tt, c]
                        elif BINARY:
                            s += by_row[i, c] if by_col[tt, c] != 0 else 0.0
                        else:
                            s += by_row[i, c] * by_col[tt, c]
                    out[i, j] = s if inside else 0.0
                continue
            ri = by_row[i]
            if TRANSPOSE and ri == 0:
                out[i, :] = 0  # a silent source: its slots are not read
                continue
            one = pad[n] + 1  # 1 in the output's dtype
            r = one if BINARY and TRANSPOSE else ri
            row, dst = indices[i], out[i]
            for j in range(k):
                u = np.uint64(row[j])  # a negative index wraps to a huge one: masked too
                dst[j] = r * pad[min(u, un)]

    return fixed_weight_grad


@functools.cache
def spikes_mv_kernel(transpose: bool, homo: bool, n_cols: int):
    """The njit product with a spike list: ``kernel(weights, indices, spikes, count, out)``.

    With ``transpose`` each listed row scatters its ``k`` entries (work: spikes times
    ``k``; ``n_cols`` unused); else each row sums its weights times the count of its
    columns in the list (a table of ``n_cols`` counts). Masked slots are skipped; a listed
    index outside the sources or a count outside ``[0, len(spikes)]`` fills ``out`` with NaN.
    """
    import numba
    import numpy as np

    HOMO, N = homo, n_cols

    if transpose:

        from primforge.ops import _spikes


        list_ok = _spikes.numba_list_ok()

        @numba.njit(nogil=True)
        def fixed_t_mv_spikes(weights, indices, spikes, count, out):
            m, k = indices.shape
            n = out.shape[0]
            out[:] = 0
            c = count[0]
            if not list_ok(spikes, count, m):
                out[:] = np.nan
                return
            w0 = weights.ravel()[0] if HOMO and weights.size else out.dtype.type(0)
            un = np.uint64(n)
            for s in range(c):
                i = spikes[s]
                cols = indices[i]
                if HOMO:
                    for j in range(k):
                        t = np.uint64(cols[j])  # a negative index wraps: masked too
                        if t < un:
                            out[t] += w0
                else:
                    ws = weights[i]
                    for j in range(k):
                        t = np.uint64(cols[j])
                        if t < un:
                            out[t] += ws[j]

        return fixed_t_mv_spikes

    @numba.njit(nogil=True)
    def fixed_mv_spikes(weights, indices, spikes, count, out):
        m, k = indices.shape
        out[:] = 0
        c = count[0]
        if c < 0 or c > spikes.shape[0]:
            out[:] = np.nan
            return
        times = np.zeros(N + 1, out.dtype)  # one trailing 0 where masked slots point
        for s in range(c):
            j = spikes[s]
            if j < 0 or j >= N:
                out[:] = np.nan
                return
            times[j] += 1
        w0 = weights.ravel()[0] if HOMO and weights.size else out.dtype.type(0)
        un = np.uint64(N)
        for i in range(m):
            row = indices[i]
            acc = 0.0
            if HOMO:
                for j in range(k):
                    acc += times[min(np.uint64(row[j]), un)]
                out[i] = acc * w0 if acc != 0 else 0.0
            else:
                ws = weights[i]
                for j in range(k):
                    t = times[min(np.uint64(row[j]), un)]
                    if t != 0:  # a weight of a silent column never enters
                        acc += t * ws[j]
                out[i] = acc

    return fixed_mv_spikes


@functools.cache
def spikes_mm_kernel(transpose: bool, homo: bool, n_cols: int):
    """:func:`spikes_mv_kernel` for several lists: ``spikes`` ``(lists, length)``,
    ``count`` ``(lists,)``, row ``b`` of ``out`` from list ``b``."""
    import numba

    one = spikes_mv_kernel(transpose, homo, n_cols)

    @numba.njit(nogil=True)
    def fixed_mm_spikes(weights, indices, spikes, count, out):
        for b in range(spikes.shape[0]):
            one(weights, indices, spikes[b], count[b:b + 1], out[b])

    return fixed_mm_spikes
