"""Numba CPU kernels for fixed-number connectivity products (imported lazily).

The stored matrix ``A`` has shape ``(m, n)``: row ``i`` holds ``k`` entries with columns
``indices[i, :]`` and weights ``weights[i, :]`` (or one shared ``weights[0]``). Every kernel
follows the numba backend's convention ``kernel(weights, indices, x, out)`` and fills
``out`` in place; the variant (binary or float input, shared or per-entry weight, ``A @ x``
or ``A.T @ x``, vector or matrix) is fixed by closure constants.

* ``A.T @ x`` (``transpose=True``) visits only the rows ``i`` with ``x[i] != 0`` and
  scatters their ``k`` entries: work is (number of events) x ``k``.
* ``A @ x`` gathers ``k`` inputs per row, branch-free (inactive and masked entries are
  multiplied by zero) so that the loop vectorises.

Out-of-range column indices are *masked*: such an entry is skipped (it contributes
nothing and receives no gradient), so no kernel ever reads or writes out of bounds. The
structure is validated once, when a :class:`~primforge.ops.FixedNum` is built from
concrete arrays, so the hot loops carry only a range test per entry.
"""

from __future__ import annotations

import functools


@functools.cache
def mv_kernel(binary: bool, transpose: bool, homo: bool):
    """The njit matrix-vector kernel for one variant (compiled lazily per dtype)."""
    import numba

    BINARY, HOMO = binary, homo

    if transpose:

        @numba.njit(nogil=True, fastmath=True)
        def fixed_t_mv(weights, indices, x, out):
            m, k = indices.shape
            n = out.shape[0]
            out[:] = 0
            w0 = weights.ravel()[0] if HOMO and weights.size else 0
            for i in range(m):
                xi = x[i]
                if xi != 0:
                    if HOMO:
                        v = w0 if BINARY else w0 * xi
                        for j in range(k):
                            t = indices[i, j]
                            if t >= 0 and t < n:
                                out[t] += v
                    else:
                        for j in range(k):
                            t = indices[i, j]
                            if t >= 0 and t < n:
                                if BINARY:
                                    out[t] += weights[i, j]
                                else:
                                    out[t] += weights[i, j] * xi

        return fixed_t_mv

    @numba.njit(nogil=True, fastmath=True)
    def fixed_mv(weights, indices, x, out):
        m, k = indices.shape
        n = x.shape[0]
        if n == 0:
            out[:] = 0
            return
        w0 = weights.ravel()[0] if HOMO and weights.size else 0
        for i in range(m):
            # Branch-free: an out-of-range index reads x[0] and is multiplied by 0, so the
            # loop has no data-dependent exit and vectorises (gathers).
            s = 0.0  # accumulate in float64
            for j in range(k):
                t = indices[i, j]
                inside = (t >= 0) & (t < n)
                xt = x[t if inside else 0]
                if BINARY:
                    v = 1.0 if (xt != 0) & inside else 0.0
                else:
                    v = xt if inside else 0.0
                s += v if HOMO else weights[i, j] * v
            out[i] = s * w0 if HOMO else s

    return fixed_mv


@functools.cache
def mm_kernel(binary: bool, transpose: bool, homo: bool):
    """The njit matrix-matrix kernel for one variant (compiled lazily per dtype)."""
    import numba
    import numpy as np

    BINARY, HOMO = binary, homo

    if transpose:

        @numba.njit(nogil=True, fastmath=True)
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

    @numba.njit(nogil=True, fastmath=True)
    def fixed_mm(weights, indices, x, out):
        m, k = indices.shape
        n, cols = x.shape
        out[:] = 0
        w0 = weights.ravel()[0] if HOMO and weights.size else 0
        for i in range(m):
            for j in range(k):
                t = indices[i, j]
                if t >= 0 and t < n:
                    w = w0 if HOMO else weights[i, j]
                    for c in range(cols):
                        if BINARY:
                            if x[t, c] != 0:
                                out[i, c] += w
                        else:
                            out[i, c] += w * x[t, c]

    return fixed_mm
