"""The gradient of a fixed-number product w.r.t. its per-entry weights, as one kernel.

``d<ct, A x>/d w[i, j] = ct[i] . ev[t]`` (``ev[i] . ct[t]`` for ``A.T @ x``) with
``t = indices[i, j]``; a masked slot has gradient 0.
"""

from __future__ import annotations

import jax.numpy as jnp

from primforge.ops import _scaffold, _sharding
from primforge.ops.csr import grad as _csr_grad

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


weight_grad_p = _csr_grad.build_weight_grad(
    "primforge.ops.fixed_num_weight_grad", _reference, numba=_numba_generator,
    parallel=_parallel_generator, sharding=_sharding.fixed_num_weight_grad_rule,
    bench="primforge.ops.fixed_num.bench", doc=__doc__)


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
    return weight_grad_p.call(indices, ct, x, binary=binary, transpose=transpose,
                              matrix=matrix, dtype=dtype, backend=backend)
