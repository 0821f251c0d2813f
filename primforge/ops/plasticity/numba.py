"""Numba CPU kernels for the plasticity updates (imported only when one is generated).

Each kernel writes into the weights' own buffer (``input_output_aliases={0: 0}``) and
changes only the synapses an event touches; the variant is fixed by closure constants.
With a column index, each call that fires a column first counts every column's stored
entries, so a firing column's list holds exactly its synapses. A malformed structure, or an
index from another structure, fills the output with NaN, never an out-of-bounds access.
"""

from __future__ import annotations

import functools

import numpy as np


def _clamp(lo, hi):
    """An inlined ``clamp(w)`` for optional bounds (``None`` = no bound)."""
    import numba

    has_lo, has_hi = lo is not None, hi is not None
    LO = lo if has_lo else 0.0
    HI = hi if has_hi else 0.0

    @numba.njit(inline="always", nogil=True)
    def clamp(w):
        if has_lo and w < LO:
            return LO
        if has_hi and w > HI:
            return HI
        return w

    return clamp


@functools.cache
def compressed_kernel(on_rows: bool, masked: bool, lo, hi):
    """``kernel(data, indices, indptr, spikes, trace, out)`` (``out`` is ``data``): compressed rows.

    Long by design: the two njit bodies close over the variant's constants (bounds, masking),
    which Numba folds into the compiled loop; as separate functions they would become
    runtime arguments.
    """
    import numba

    from primforge.ops.csr.numba import _indptr_checker

    indptr_ok = _indptr_checker()
    clamp = _clamp(lo, hi)
    MASKED = masked

    if on_rows:

        @numba.njit(nogil=True)
        def on_rows_kernel(data, indices, indptr, spikes, trace, out):
            m = spikes.shape[0]
            n = trace.shape[0]
            nnz = indices.shape[0]
            ok = indptr_ok(indptr, m, nnz)
            if ok:
                for i in range(m):
                    if spikes[i] != 0:
                        for k in range(indptr[i], indptr[i + 1]):
                            j = indices[k]
                            if j < 0 or j >= n:
                                if MASKED:
                                    continue
                                ok = False
                                break
                            out[k] = clamp(out[k] + trace[j])
                        if not ok:
                            break
            if not ok:
                out[:] = np.nan

        return on_rows_kernel

    @numba.njit(nogil=True)
    def on_cols_kernel(data, indices, indptr, spikes, trace, out):
        m = trace.shape[0]
        n = spikes.shape[0]
        nnz = indices.shape[0]
        if not indptr_ok(indptr, m, nnz):
            out[:] = np.nan
            return
        hit = np.zeros(n + 1, np.uint8)  # per column, and a 0 where a bad index points
        count = 0
        for j in range(n):
            h = 1 if spikes[j] != 0 else 0
            hit[j] = h
            count += h
        if count == 0:
            return
        un = np.uint64(n)
        ok = True
        if count * 25 <= n:
            # Few spiking columns: a scan whose rare update branch predicts well.
            for i in range(m):
                ti = trace[i]
                for k in range(indptr[i], indptr[i + 1]):
                    u = np.uint64(indices[k])  # a negative index wraps: out of range too
                    if u >= un:
                        if MASKED:
                            continue
                        ok = False
                        break
                    if hit[u]:
                        out[k] = clamp(out[k] + ti)
                if not ok:
                    break
        else:
            # Many: one pass that updates with a select (no branch on the spikes, which
            # would mispredict often).
            bad = 0
            for i in range(m):
                ti = trace[i]
                for k in range(indptr[i], indptr[i + 1]):
                    u = np.uint64(indices[k])
                    inside = u < un
                    bad += 0 if inside else 1
                    w = data[k]
                    out[k] = clamp(w + ti) if hit[u if inside else un] else w
            ok = MASKED or bad == 0
        if not ok:
            out[:] = np.nan

    return on_cols_kernel


@functools.cache
def indexed_kernel(masked: bool, lo, hi):
    """``kernel(data, indices, indptr, spikes, trace, colptr, perm, rows, out)``: update on
    columns (``out`` is ``data``)."""
    import numba

    from primforge.ops.csr.numba import _indptr_checker

    indptr_ok = _indptr_checker()
    clamp = _clamp(lo, hi)
    MASKED = masked

    @numba.njit(nogil=True)
    def on_cols_indexed(data, indices, indptr, spikes, trace, colptr, perm, rows, out):
        m = trace.shape[0]
        n = spikes.shape[0]
        nnz = indices.shape[0]
        ok = indptr_ok(indptr, m, nnz) and indptr_ok(colptr, n, nnz)  # the same check
        if ok:
            nnz = indptr[m]  # entries past it are padding, left out of the index
        if ok and not MASKED and colptr[n] != nnz:
            # Entries with an out-of-range column are left out of the index (after
            # colptr[n]); unmasked, they are a structural error once any column fires.
            for j in range(n):
                if spikes[j] != 0:
                    ok = False
                    break
        um, unnz, un = np.uint64(m), np.uint64(nnz), np.uint64(n)
        fired = False
        for j in range(n):
            if spikes[j] != 0:
                fired = True
                break
        if ok and fired:
            # Each firing column must list as many entries as the structure holds in it:
            # with the read-back below (distinct positions of that column), its list is then
            # exactly its synapses, not a part of them (an index of another structure).
            counts = np.zeros(n + 1, np.int32)
            for p in range(nnz):
                u = np.uint64(indices[p])
                counts[min(u, un)] += 1
            for j in range(n):
                if spikes[j] != 0 and counts[j] != colptr[j + 1] - colptr[j]:
                    ok = False
                    break
        if ok and fired:
            for j in range(n):
                if spikes[j] == 0:
                    continue
                prev = -1
                for q in range(colptr[j], colptr[j + 1]):
                    p = perm[q]
                    r = rows[q]
                    # p > prev >= -1 also rules out a negative position.
                    if (p <= prev or np.uint64(p) >= unnz or np.uint64(r) >= um
                            or p < indptr[r] or p >= indptr[r + 1] or indices[p] != j):
                        ok = False
                        break
                    prev = p
                    out[p] = clamp(out[p] + trace[r])
                if not ok:
                    break
        if not ok:
            out[:] = np.nan

    return on_cols_indexed


@functools.cache
def dense_kernel(on_rows: bool, lo, hi):
    """``kernel(weights, spikes, trace, out)``, dense ``(m, n)`` weights; ``out`` is ``weights``."""
    import numba

    clamp = _clamp(lo, hi)

    if on_rows:

        @numba.njit(nogil=True)
        def dense_rows(weights, spikes, trace, out):
            m, n = weights.shape
            for i in range(m):
                if spikes[i] != 0:
                    for j in range(n):
                        out[i, j] = clamp(out[i, j] + trace[j])

        return dense_rows

    @numba.njit(nogil=True)
    def dense_cols(weights, spikes, trace, out):
        m, n = weights.shape
        active = np.empty(n, np.int64)
        count = 0
        for j in range(n):
            if spikes[j] != 0:
                active[count] = j
                count += 1
        if count:
            for i in range(m):
                ti = trace[i]
                for a in range(count):
                    j = active[a]
                    out[i, j] = clamp(out[i, j] + ti)

    return dense_cols


@functools.cache
def fixed_rows_kernel(on_rows: bool, lo, hi):
    """``kernel(weights, indices, spikes, trace, out)``: fixed-number ``(m, k)`` rows, an
    entry with a column outside ``[0, n)`` skipped (``out`` is ``weights``)."""
    import numba

    clamp = _clamp(lo, hi)

    if on_rows:

        @numba.njit(nogil=True)
        def fixed_rows(weights, indices, spikes, trace, out):
            m, k = indices.shape
            un = np.uint64(trace.shape[0])
            for i in range(m):
                if spikes[i] != 0:
                    for e in range(k):
                        u = np.uint64(indices[i, e])  # a negative index wraps: outside too
                        if u < un:
                            out[i, e] = clamp(out[i, e] + trace[u])

        return fixed_rows

    @numba.njit(nogil=True)
    def fixed_cols(weights, indices, spikes, trace, out):
        m, k = indices.shape
        n = spikes.shape[0]
        hit = np.zeros(n + 1, np.uint8)  # per column, and a 0 where a bad index points
        count = 0
        for j in range(n):
            h = 1 if spikes[j] != 0 else 0
            hit[j] = h
            count += h
        if count == 0:
            return
        un = np.uint64(n)
        for i in range(m):
            ti = trace[i]
            for e in range(k):
                u = np.uint64(indices[i, e])
                if hit[min(u, un)]:
                    out[i, e] = clamp(out[i, e] + ti)

    return fixed_cols
