"""Numba CPU kernels for dense-matrix event products (imported lazily).

Convention ``kernel(weights, x, out)``; ``weights`` is the dense ``(m, n)`` matrix ``W``.

* ``W.T @ x`` (``transpose=True``, i.e. ``x @ W``): for every row ``i`` with ``x[i] != 0``
  add the contiguous row ``W[i, :]`` (scaled by ``x[i]`` for float events) into ``out``;
  inactive rows are never read. The inner loop is a unit-stride add that vectorises.
* ``W @ x``: first list the active entries of ``x`` (one pass over ``x``), then every row
  sums ``W[i, j]`` over the active ``j`` only: inactive columns of ``W`` are never read.
  When more than 1/16 of ``x`` is active, a unit-stride dot over every column (accumulated
  in the weights' dtype, vectorised) is faster than the strided gather, and is used instead.
* Matrix inputs (one event vector per column): ``W.T @ X`` skips rows of ``X`` with no
  active entry and, per row, loops over the active columns only; ``W @ X`` skips rows of
  ``X`` (columns of ``W``) with no active entry.
"""

from __future__ import annotations

import functools


@functools.cache
def mv_kernel(binary: bool, transpose: bool):
    """The njit matrix-vector kernel for one variant (compiled lazily per dtype)."""
    import numba
    import numpy as np

    BINARY = binary

    if transpose:

        @numba.njit(nogil=True, fastmath=True)
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

    @numba.njit(nogil=True, fastmath=True)
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
            # column beats gathering the active ones (measured at n = 8000).
            v = np.empty(n, out.dtype)
            for j in range(n):
                v[j] = (1.0 if x[j] != 0 else 0.0) if BINARY else x[j]
            for i in range(m):
                s = v[0] * 0  # accumulate in the weights' dtype: packed SIMD FMAs
                for j in range(n):
                    s += weights[i, j] * v[j]
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

        @numba.njit(nogil=True, fastmath=True)
        def dense_t_mm(weights, x, out):
            m, n = weights.shape
            cols = x.shape[1]
            out[:] = 0
            active = np.empty(cols, np.int64)
            for i in range(m):
                na = 0
                for c in range(cols):
                    if x[i, c] != 0:
                        active[na] = c
                        na += 1
                if na == 0:
                    continue
                for j in range(n):
                    w = weights[i, j]
                    for a in range(na):
                        c = active[a]
                        if BINARY:
                            out[j, c] += w
                        else:
                            out[j, c] += w * x[i, c]

        return dense_t_mm

    @numba.njit(nogil=True, fastmath=True)
    def dense_mm(weights, x, out):
        m, n = weights.shape
        cols = x.shape[1]
        out[:] = 0
        rows = np.empty(n, np.int64)  # rows of x (columns of W) with any active entry
        nr = 0
        for j in range(n):
            for c in range(cols):
                if x[j, c] != 0:
                    rows[nr] = j
                    nr += 1
                    break
        for i in range(m):
            for r in range(nr):
                j = rows[r]
                w = weights[i, j]
                for c in range(cols):
                    if BINARY:
                        if x[j, c] != 0:
                            out[i, c] += w
                    else:
                        out[i, c] += w * x[j, c]

    return dense_mm
