"""The sampled dense-dense product: ``(A @ B)[i, j]`` at the stored entries of a CSR matrix.

Design:
    * For stored entry ``k`` at ``(i, j)`` the value is ``A[i, :] . B[:, j]``: the gradient
      of a sparse layer's loss w.r.t. its per-synapse weights is this product of the
      output cotangent and the input, and it runs as that gradient's kernel
      (:func:`primforge.ops.csr.grad.weight_grad`: one Numba pass over the stored entries
      on CPU, jax.numpy elsewhere); ``jit``, ``vmap`` and derivatives of any order follow
      from that kernel's rules.
    * A malformed structure (``indptr`` not non-decreasing from 0 to nnz, a column out of
      range) raises when the index arrays are concrete and gives NaN everywhere under
      ``jit``, never a gather from a wrapped index.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from primforge.ops import _scaffold
from primforge.ops.csr import grad as _grad
from primforge.ops.csr import structure as _common

__all__ = ["csr_sddmm"]


def csr_sddmm(a: Any, b: Any, indices: Any, indptr: Any, *, shape: tuple[int, int],
              backend: str | None = None) -> jax.Array:
    """``(a @ b)`` sampled at the stored entries of a CSR structure, in CSR order.

    Args:
        a: ``(rows, k)`` dense matrix.
        b: ``(k, cols)`` dense matrix.
        indices: column of each stored entry, ``(nnz,)``.
        indptr: ``(rows + 1,)`` row offsets.
        shape: ``(rows, cols)`` of the sampling pattern.
        backend: ``'numba'`` (CPU default), ``'numba_parallel'`` or ``'jax'``.

    Returns:
        ``(nnz,)`` values, entry ``k`` at ``(i, j)`` being ``a[i] @ b[:, j]``: the ``data``
        of a CSR with these ``indices`` and ``indptr``.

    Example:
        >>> import jax.numpy as jnp
        >>> a, b = jnp.array([[1., 2.], [3., 4.]]), jnp.array([[1., 0., 1.], [0., 1., 1.]])
        >>> csr_sddmm(a, b, jnp.array([0, 2, 1]), jnp.array([0, 2, 3]), shape=(2, 3))
        Array([1., 3., 4.], dtype=float32)
    """
    who = "csr_sddmm"
    m, n = _scaffold.check_shape(shape, who)
    a, b = jnp.asarray(a), jnp.asarray(b)
    if a.ndim != 2 or b.ndim != 2 or a.shape[0] != m or b.shape[1] != n or \
            a.shape[1] != b.shape[0]:
        raise ValueError(f"{who}: 'a' must be (rows, k) and 'b' (k, cols) for shape {(m, n)}, "
                         f"got {a.shape} and {b.shape}")
    indices = _scaffold.index_array(indices, who, "indices")
    indptr = _scaffold.index_array(indptr, who, "indptr")
    _common.check_csr_args(who, jnp.zeros(indices.shape, jnp.float32), indices, indptr, (m, n))
    _common.validate_concrete(indices, indptr, (m, n), who)
    # Captured (constant) index arrays would have XLA fold the row ids while compiling.
    indices, indptr = jax.lax.optimization_barrier((indices, indptr))
    dtype = jnp.result_type(a, b)
    if not jnp.issubdtype(dtype, jnp.floating):
        dtype = jnp.result_type(float)
    return _grad.weight_grad(False, True, a.astype(dtype), b.astype(dtype).T, indices, indptr,
                             transpose=False, dtype=dtype, backend=backend)
