"""Numba kernels of the CSR products whose events arrive as a spike list, and the kernel
that builds a spike list from a bool vector (one pass, in order).

The list kernels visit only the listed sources; a count outside ``[0, len(spikes)]`` or a
malformed structure gives NaN everywhere, as in :mod:`primforge.ops.csr.numba`.
"""

from __future__ import annotations

import functools

import numpy as np

from primforge.ops.csr.numba import _indptr_checker, _row_scatter, _unsigned


@functools.cache
def indexed_mv_kernel(transpose: bool, homo: bool, wide: bool, n_cols: int):
    """The njit product with a spike list: ``kernel(data, indices, indptr, spikes, count, out)``.

    With ``transpose`` the listed rows are scattered into ``out`` (work: spikes times row
    length; ``n_cols`` unused); else each row sums its weights times the count of its
    columns in the list (a table of ``n_cols`` counts). A listed index outside the sources,
    a count outside ``[0, len(spikes)]`` or a malformed structure fill ``out`` with NaN.
    """
    import numba

    HOMO, N = homo, n_cols
    indptr_ok = _indptr_checker()
    U = _unsigned(wide)

    if transpose:
        scatter = _row_scatter(True, homo, wide)

        @numba.njit(nogil=True)
        def csr_t_mv_indexed(data, indices, indptr, spikes, count, out):
            m = indptr.shape[0] - 1
            out[:] = 0
            c = count[0]
            if c < 0 or c > spikes.shape[0] or not indptr_ok(indptr, m, indices.shape[0]):
                out[:] = np.nan
                return
            w0 = data[0] if HOMO else 1.0
            for s in range(c):
                i = spikes[s]
                if i < 0 or i >= m or not scatter(out, data, indices, indptr[i], indptr[i + 1],
                                             w0, 1.0):
                    out[:] = np.nan
                    return

        return csr_t_mv_indexed

    @numba.njit(nogil=True)
    def csr_mv_indexed(data, indices, indptr, spikes, count, out):
        m = out.shape[0]
        out[:] = 0
        c = count[0]
        if c < 0 or c > spikes.shape[0] or not indptr_ok(indptr, m, indices.shape[0]):
            out[:] = np.nan
            return
        times = np.zeros(N, out.dtype)
        un = U(N)
        for s in range(c):
            j = spikes[s]
            if j < 0 or j >= N:
                out[:] = np.nan
                return
            times[j] += 1
        for i in range(m):
            acc = 0.0
            for k in range(indptr[i], indptr[i + 1]):
                j = U(indices[k])
                if j >= un:
                    out[:] = np.nan
                    return
                t = times[j]
                if t != 0:
                    acc += t * (data[0] if HOMO else data[k])
            out[i] = acc

    return csr_mv_indexed


@functools.cache
def spike_list_kernel():
    """The njit compaction ``kernel(events, idx, count)``: the first active positions of
    ``events`` into ``idx`` (zeros after them), and the number of active entries."""
    import numba

    @numba.njit(nogil=True)
    def spike_list(events, idx, count):
        cap = idx.shape[0]
        idx[:] = 0
        c = 0
        for i in range(events.shape[0]):
            if events[i] != 0:
                if c < cap:
                    idx[c] = i
                c += 1
        count[0] = c

    return spike_list


@functools.cache
def indexed_mm_kernel(transpose: bool, homo: bool, wide: bool, n_cols: int):
    """:func:`indexed_mv_kernel` over several lists: ``kernel(data, indices, indptr, spikes,
    counts, out)`` with ``spikes`` ``(B, L)``, ``counts`` ``(B,)`` and ``out`` ``(B, len)``,
    row ``b`` the product with list ``b`` (NaN in that row alone for a bad list)."""
    import numba

    mv = indexed_mv_kernel(transpose, homo, wide, n_cols)

    @numba.njit(nogil=True)
    def csr_mm_indexed(data, indices, indptr, spikes, counts, out):
        for b in range(spikes.shape[0]):
            mv(data, indices, indptr, spikes[b], counts[b:b + 1], out[b])

    return csr_mm_indexed
