"""The gradient of a CSR product w.r.t. its per-synapse weights, as one kernel.

``d<ct, W x>/d w_k = ct[row_k] . ev[col_k]`` (``ev[row_k] . ct[col_k]`` for ``W.T @ x``),
``ev`` being ``x`` or ``x != 0``; a malformed structure gives NaN everywhere.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from primforge.ops import _scaffold, _sharding
from primforge.ops.csr import structure as _common

__all__ = ["weight_grad"]


def _reference(binary, transpose, matrix, dtype):
    def kernel(indices, indptr, ct, x):
        nnz = indices.shape[0]
        ev = (x != 0).astype(dtype) if binary else x.astype(dtype)
        by_row, by_col = (ev, ct.astype(dtype)) if transpose else (ct.astype(dtype), ev)
        rows = _common.row_ids(indptr, nnz)
        a = _scaffold.take_fill(by_row, rows)
        b = _scaffold.take_fill(by_col, indices, jnp.nan)
        g = jnp.sum(a * b, axis=-1) if matrix else a * b
        g = jnp.where(_common.live_entries(indptr, nnz), g, 0)  # the padding has no weight
        ok = _common.structure_ok(indices, indptr, by_col.shape[0])
        return jnp.where(ok, g, jnp.nan).astype(dtype)

    return kernel


def _numba_generator(*, ins, binary, transpose, matrix, **_):
    from primforge.ops.csr import numba as _numba_csr

    wide = np.dtype(ins[0].dtype).itemsize > 4
    return _numba_csr.weight_grad_kernel(binary, transpose, matrix, wide)


def _parallel_generator(**kw):
    from primforge.ops.csr import numba as _numba_csr

    return _numba_csr.parallel_weight_grad_generator(**kw)


weight_grad_p = _scaffold.weight_grad_kernel(
    "primforge.ops.csr_weight_grad", _reference, numba=_numba_generator,
    parallel=_parallel_generator, sharding=_sharding.csr_weight_grad_rule,
    bench="primforge.ops.csr.bench", doc=__doc__)


def weight_grad(binary, matrix, ct, x, indices, indptr, *, transpose, dtype, backend=None):
    """``d<ct, W x>/d data`` for per-synapse weights, shape ``(nnz,)`` (NaN if malformed).

    Example:
        >>> import jax.numpy as jnp
        >>> # W = [[w0, 0, w1], [0, w2, 0]]; y = W @ x
        >>> weight_grad(False, False, jnp.array([1., 2.]), jnp.array([3., 4., 5.]),
        ...             jnp.array([0, 2, 1]), jnp.array([0, 2, 3]), transpose=False,
        ...             dtype='float32')
        Array([3., 5., 8.], dtype=float32)
    """
    return weight_grad_p.call(indices, indptr, ct, x, binary=binary, transpose=transpose,
                              matrix=matrix, dtype=dtype, backend=backend)
