"""The gradient of a CSR product w.r.t. its per-synapse weights, as one kernel.

``d<ct, W x>/d w_k = ct[row_k] . ev[col_k]`` (``ev[row_k] . ct[col_k]`` for ``W.T @ x``),
``ev`` being ``x`` or ``x != 0``; a malformed structure gives NaN everywhere.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from primforge import _compat
from primforge.kernel.kernel import XLACustomKernel
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


def _jax_generator(*, outs, binary, transpose, matrix, **_):
    return _reference(binary, transpose, matrix, outs[0].dtype)


def _numba_generator(*, ins, binary, transpose, matrix, **_):
    from primforge.ops.csr import numba as _numba_csr

    wide = np.dtype(ins[0].dtype).itemsize > 4
    return _numba_csr.weight_grad_kernel(binary, transpose, matrix, wide)


def _parallel_generator(**kw):
    from primforge.ops.csr import numba as _numba_csr

    return _numba_csr.parallel_weight_grad_generator(**kw)


def _shape_rule(indices, indptr, ct, x, *, binary, transpose, matrix, dtype):
    del indptr, ct, x, binary, transpose, matrix
    return jax.ShapeDtypeStruct((indices.shape[0],), np.dtype(dtype))


def _jvp_rule(primals, tangents, *, outs, backend=None, binary, transpose, matrix, dtype, **_):
    indices, indptr, ct, x = primals
    y = weight_grad_p(indices, indptr, ct, x, binary=binary, transpose=transpose,
                      matrix=matrix, dtype=dtype, backend=backend)
    ref = _reference(binary, transpose, matrix, np.dtype(dtype))
    zero = lambda p, t: jnp.zeros_like(p) if type(t) is _compat.Zero else t
    d_ct, d_x = zero(ct, tangents[2]), zero(x, tangents[3])
    if binary:
        _, t = jax.jvp(lambda c: ref(indices, indptr, c, x), (ct,), (d_ct,))
    else:
        _, t = jax.jvp(lambda c, v: ref(indices, indptr, c, v), (ct, x), (d_ct, d_x))
    return [y], [t]


weight_grad_p = XLACustomKernel("primforge.ops.csr_weight_grad", doc=__doc__, replace=True)
for _platform in ("cpu", "gpu", "tpu"):
    weight_grad_p.def_kernel("jax", _platform, _jax_generator)
weight_grad_p.def_numba_kernel(_numba_generator, asdefault=True)
# Opt-in, as for the products: rows of W @ x's gradient over Numba's threads.
weight_grad_p.def_kernel("numba_parallel", "cpu", _parallel_generator)
weight_grad_p.def_abstract_eval(_shape_rule)
weight_grad_p.def_jvp_rule(_jvp_rule)
weight_grad_p.def_tags("sparse", "gradient")
weight_grad_p.def_sharding_rule(_sharding.csr_weight_grad_rule)
del _platform


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
    backend = backend if backend in (None, "jax", "numba", "numba_parallel") else None
    return weight_grad_p(jnp.asarray(indices), jnp.asarray(indptr), jnp.asarray(ct),
                         jnp.asarray(x), binary=bool(binary), transpose=bool(transpose),
                         matrix=bool(matrix), dtype=np.dtype(dtype).name, backend=backend)


# ----------------------------------------------------------------------------- benchmark hooks
def _call(indices, indptr, ct, x, *, binary, transpose, matrix, backend=None):
    """The kernel as ``primforge check`` / ``bench`` drive it (dtype of the cotangent)."""
    return weight_grad(binary, matrix, ct, x, indices, indptr, transpose=transpose,
                       dtype=np.asarray(ct).dtype, backend=backend)


weight_grad_p.def_call(_call)
weight_grad_p.def_benchmark_data(
    _scaffold.lazy_benchmark_data("primforge.ops.csr.bench", "weight_grad"))
