"""Numba kernels of the per-synapse weight gradient of the CSR products: one pass over
the stored entries (``W @ x``: each row gathers its inputs, on Numba's threads for the
``numba_parallel`` backend; ``W.T @ x``: only the rows of active events), the structure
check folded in (a malformed structure gives NaN).
"""

from __future__ import annotations

import functools

import numpy as np

from primforge.ops.csr.numba import (
    _REASSOC,
    _event_table,
    _indptr_checker,
    _unsigned,
    parallel_threading_layer,
)


@functools.cache
def weight_grad_kernel(binary: bool, transpose: bool, matrix: bool, wide: bool = False):
    """The njit gradient of ``<ct, W x>`` w.r.t. per-synapse weights, in one pass.

    ``kernel(indices, indptr, ct, x, out)`` writes ``out[k] = ct[row_k] . ev[col_k]``
    (``ev[row_k] . ct[col_k]`` for ``W.T @ x``), ``ev`` being ``x`` or ``x != 0``. The
    column check is folded into the pass (clamp + count, as in :func:`_gather_mv`), so a
    malformed structure costs nothing extra until it is found, and then poisons ``out``.
    For ``W.T @ x`` with a vector ``x`` the rows of silent sources are zero-filled without
    reading their columns: like the event-driven product, only visited entries are checked.
    """
    import numba

    if not transpose:
        return _gather_weight_grad(binary, matrix, wide)
    BINARY, TRANSPOSE, MATRIX = binary, transpose, matrix
    indptr_ok = _indptr_checker()

    @numba.njit(nogil=True, fastmath=_REASSOC)
    def csr_weight_grad(indices, indptr, ct, x, out):
        by_row, by_col = (x, ct) if TRANSPOSE else (ct, x)
        m = by_row.shape[0]
        n = by_col.shape[0]
        nnz = indices.shape[0]
        if not indptr_ok(indptr, m, nnz) or (n == 0 and indptr[m] > 0):
            out[:] = np.nan
            return
        out[indptr[m]:] = 0.0  # the padding past indptr[m] has no weight to differentiate
        un = np.uint64(n)
        nbad = 0
        for i in range(m):
            if TRANSPOSE and not MATRIX and by_row[i] == 0:
                # A silent source row (event-driven, as the product): zeros, and neither its
                # columns nor ``ct`` are read, so its entries are not checked either.
                out[indptr[i]:indptr[i + 1]] = 0.0
                continue
            for k in range(indptr[i], indptr[i + 1]):
                u = np.uint64(indices[k])
                inside = u < un
                j = u if inside else np.uint64(0)
                nbad += 0 if inside else 1
                if MATRIX:
                    s = 0.0
                    for c in range(by_row.shape[1]):
                        if BINARY and TRANSPOSE:
                            s += by_col[j, c] if by_row[i, c] != 0 else 0.0
                        elif BINARY:
                            s += by_row[i, c] if by_col[j, c] != 0 else 0.0
                        else:
                            s += by_row[i, c] * by_col[j, c]
                    out[k] = s
                elif BINARY and TRANSPOSE:
                    out[k] = by_col[j] if by_row[i] != 0 else 0.0
                elif BINARY:
                    out[k] = by_row[i] if by_col[j] != 0 else 0.0
                else:
                    out[k] = by_row[i] * by_col[j]
        if nbad:
            out[:] = np.nan

    return csr_weight_grad


@functools.cache
def _gather_weight_grad(binary: bool, matrix: bool, wide: bool, parallel: bool = False):
    """The per-synapse weight gradient of ``W @ x``: ``out[k] = ct[row_k] . ev[col_k]``.

    One branch-free pass over the stored entries: ``ev`` is first copied into a float
    table with a zero row appended (:func:`_event_table`), each entry is then one clamped
    gather and one multiply (the clamp and the count of bad columns are vector min/compare
    instructions, as in :func:`_gather_mv`), with ``ct[row]`` held in a register per row.
    ``parallel``: rows over threads (each row's entries are written by one thread only;
    the same values as the serial kernel).
    """
    import numba

    MATRIX = matrix
    U = _unsigned(wide)
    indptr_ok = _indptr_checker()
    table = _event_table(binary, matrix)
    rows = numba.prange if parallel else range

    @numba.njit(nogil=True, fastmath=_REASSOC, parallel=parallel)
    def csr_gather_weight_grad(indices, indptr, ct, x, out):
        m = ct.shape[0]
        n = x.shape[0]
        nnz = indices.shape[0]
        if not indptr_ok(indptr, m, nnz) or (n == 0 and indptr[m] > 0):
            out[:] = np.nan
            return
        out[indptr[m]:] = 0.0  # the padding past indptr[m] has no weight to differentiate
        t = table(x)
        un = U(n)
        nbad = 0
        for i in rows(m):
            bad = 0
            # Row views (indptr is checked): zero-based loops over contiguous slices
            # vectorise; indexing the whole arrays from indptr[i] does not.
            lo, hi = indptr[i], indptr[i + 1]
            cols = indices[lo:hi]
            dst = out[lo:hi]
            if MATRIX:
                for k in range(hi - lo):
                    u = U(cols[k])
                    bad += u >= un
                    j = min(u, un)
                    s = 0.0
                    for c in range(ct.shape[1]):
                        s += ct[i, c] * t[j, c]
                    dst[k] = s
            else:
                ci = ct[i]
                for k in range(hi - lo):
                    u = U(cols[k])
                    bad += u >= un
                    dst[k] = ci * t[min(u, un)]
            nbad += bad
        if nbad:
            out[:] = np.nan

    return csr_gather_weight_grad


def parallel_weight_grad_generator(*, ins, outs, binary, transpose, matrix, **_):
    """Kernel generator of the ``numba_parallel`` backend of the per-synapse weight gradient.

    The gradient of ``W @ x`` spreads its rows over Numba's threads; that of ``W.T @ x``
    (event-driven) is the serial kernel.
    """
    from primforge.backends.numba import numba_kernel

    wide = np.dtype(ins[0].dtype).itemsize > 4
    if transpose:
        fn = weight_grad_kernel(binary, True, matrix, wide)
        return numba_kernel(fn, outs=list(outs))
    parallel_threading_layer()
    fn = _gather_weight_grad(binary, matrix, wide, parallel=True)
    return numba_kernel(fn, outs=list(outs), name=f"{fn.__name__}_parallel")
