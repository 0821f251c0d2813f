"""The gradient of a fixed-number product w.r.t. its per-entry weights, as one kernel.

``d<ct, A x>/d w[i, j] = ct[i] . ev[t]`` (``ev[i] . ct[t]`` for ``A.T @ x``) with
``t = indices[i, j]``; a masked slot has gradient 0.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from primforge import _compat
from primforge.kernel.kernel import XLACustomKernel
from primforge.ops import _scaffold, _sharding

__all__ = ["weight_grad"]


def _reference(binary, transpose, matrix, dtype):
    def kernel(indices, ct, x):
        ev = (x != 0).astype(dtype) if binary else x.astype(dtype)
        by_row, by_col = (ev, ct.astype(dtype)) if transpose else (ct.astype(dtype), ev)
        n = by_col.shape[0]
        safe = jnp.where((indices >= 0) & (indices < n), indices, n)
        a = by_row[:, None, :] if matrix else by_row[:, None]
        b = _scaffold.take_fill(by_col, safe)
        g = jnp.sum(a * b, axis=-1) if matrix else a * b
        return g.astype(dtype)

    return kernel


def _jax_generator(*, outs, binary, transpose, matrix, **_):
    return _reference(binary, transpose, matrix, outs[0].dtype)


def _numba_generator(*, binary, transpose, matrix, **_):
    from primforge.ops.fixed_num import numba as _numba_fixed_num

    return _numba_fixed_num.weight_grad_kernel(binary, transpose, matrix)


def _parallel_generator(*, outs, binary, transpose, matrix, **_):
    """``numba_parallel``: the rows over Numba's threads (vector inputs; matrices serial)."""
    from primforge.backends.numba import numba_kernel
    from primforge.ops.csr import numba as _numba_csr
    from primforge.ops.fixed_num import numba as _numba_fixed_num

    if matrix:
        return numba_kernel(_numba_fixed_num.weight_grad_kernel(binary, transpose, True),
                            outs=list(outs))
    _numba_csr.parallel_threading_layer()
    fn = _numba_fixed_num.weight_grad_kernel(binary, transpose, False, parallel=True)
    return numba_kernel(fn, outs=list(outs), name=f"{fn.__name__}_parallel")


def _shape_rule(indices, ct, x, *, binary, transpose, matrix, dtype):
    del ct, x, binary, transpose, matrix
    return jax.ShapeDtypeStruct(tuple(indices.shape), np.dtype(dtype))


def _jvp_rule(primals, tangents, *, outs, backend=None, binary, transpose, matrix, dtype, **_):
    indices, ct, x = primals
    y = weight_grad_p(indices, ct, x, binary=binary, transpose=transpose, matrix=matrix,
                      dtype=dtype, backend=backend)
    ref = _reference(binary, transpose, matrix, np.dtype(dtype))
    zero = lambda p, t: jnp.zeros_like(p) if type(t) is _compat.Zero else t
    d_ct, d_x = zero(ct, tangents[1]), zero(x, tangents[2])
    if binary:
        _, t = jax.jvp(lambda c: ref(indices, c, x), (ct,), (d_ct,))
    else:
        _, t = jax.jvp(lambda c, v: ref(indices, c, v), (ct, x), (d_ct, d_x))
    return [y], [t]


weight_grad_p = XLACustomKernel("primforge.ops.fixed_num_weight_grad", doc=__doc__, replace=True)
for _platform in ("cpu", "gpu", "tpu"):
    weight_grad_p.def_kernel("jax", _platform, _jax_generator)
weight_grad_p.def_numba_kernel(_numba_generator, asdefault=True)
weight_grad_p.def_kernel("numba_parallel", "cpu", _parallel_generator)
weight_grad_p.def_abstract_eval(_shape_rule)
weight_grad_p.def_jvp_rule(_jvp_rule)
weight_grad_p.def_tags("sparse", "gradient")
weight_grad_p.def_sharding_rule(_sharding.fixed_num_weight_grad_rule)
del _platform


def weight_grad(binary, matrix, ct, x, indices, *, transpose, dtype, backend=None):
    """``d<ct, A x>/d weights`` for per-entry weights, shape ``indices.shape``.

    Example:
        >>> import jax.numpy as jnp
        >>> # A = [[w00 at col 0, w01 at col 2], [w10 at col 1, masked slot]]; y = A @ x
        >>> weight_grad(False, False, jnp.array([1., 2.]), jnp.array([3., 4., 5.]),
        ...             jnp.array([[0, 2], [1, 9]]), transpose=False, dtype='float32')
        Array([[3., 5.],
               [8., 0.]], dtype=float32)
    """
    backend = backend if backend in (None, "jax", "numba", "numba_parallel") else None
    return weight_grad_p(jnp.asarray(indices), jnp.asarray(ct), jnp.asarray(x),
                         binary=bool(binary), transpose=bool(transpose), matrix=bool(matrix),
                         dtype=np.dtype(dtype).name, backend=backend)


# ----------------------------------------------------------------------------- benchmark hooks
def _call(indices, ct, x, *, binary, transpose, matrix, backend=None):
    """The kernel as ``primforge check`` / ``bench`` drive it (dtype of the cotangent)."""
    return weight_grad(binary, matrix, ct, x, indices, transpose=transpose,
                       dtype=np.asarray(ct).dtype, backend=backend)


weight_grad_p.def_call(_call)
weight_grad_p.def_benchmark_data(
    _scaffold.lazy_benchmark_data("primforge.ops.fixed_num.bench", "weight_grad"))
