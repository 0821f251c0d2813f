"""A matrix that carries an index of its synapses by stored column, for column-side updates.

:func:`with_column_index` returns a :class:`ColumnIndexed`: the matrix and, in one pytree,
the positions of its entries column by column, so an update driven by the other side
visits only the synapses of the neurons that fired. The kernels check the pair on every
call (a stale or malformed index gives NaN, never a wrong update).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from primforge.ops.csr import structure as _common
from primforge.ops.csr.matrix import CSC, CSR
from primforge.ops.fixed_num.matrix import FixedNum
from primforge.utils import dataclass

__all__ = ["ColumnIndexed", "with_column_index"]

_FORMATS = (CSR, CSC, FixedNum)


def _stored(matrix) -> tuple[jax.Array, jax.Array, tuple[int, int]]:
    """``(indices, indptr, (rows, cols))`` of the stored compressed rows of ``matrix``
    (a ``FixedNum``'s indices keep their ``(rows, k)`` shape: :func:`_build` reads them flat)."""
    if isinstance(matrix, FixedNum):
        rows, k = matrix.indices.shape
        indptr = jax.device_put(np.arange(rows + 1, dtype=matrix.indices.dtype) * k)
        return matrix.indices, indptr, matrix._stored_shape
    return matrix.indices, matrix.indptr, matrix._csr_shape


@functools.partial(jax.jit, static_argnums=2)
def _build(indices, indptr, shape) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(colptr, perm, rows)`` of stored compressed rows (jax.numpy, traceable)."""
    _, n = shape
    indices = indices.reshape(-1)
    nnz = indices.shape[0]
    valid = (indices >= 0) & (indices < n) & _common.live_entries(indptr, nnz)
    key = jnp.where(valid, indices, n).astype(jnp.int32)  # out-of-range, padding: last
    perm = jnp.argsort(key, stable=True).astype(jnp.int32)
    counts = jnp.zeros((n + 1,), jnp.int32).at[key].add(1)
    colptr = jnp.concatenate([jnp.zeros((1,), jnp.int32),
                              jnp.cumsum(counts[:n], dtype=jnp.int32)])
    rows = _common.row_ids(indptr, nnz)[perm] if nnz else jnp.zeros((0,), jnp.int32)
    return colptr, perm, rows


@dataclass
class ColumnIndexed:
    """A ``CSR``, ``CSC`` or ``FixedNum`` matrix together with an index of its stored columns.

    Made by :func:`with_column_index`. It behaves as its matrix (``@`` both ways, ``shape``,
    ``todense()``, ``with_data``, ``T``), and it makes the plasticity update on the side not
    stored as rows event-driven: :func:`update_on_post` on a column-indexed ``CSR``, or
    :func:`update_on_pre` on a column-indexed ``CSC``, touches only the synapses of the
    neurons that fired instead of reading every stored column index. The updates return a
    ``ColumnIndexed`` again, with the same index.

    Attributes:
        matrix: the :class:`CSR`, :class:`CSC` or :class:`FixedNum`.
        colptr: ``(cols + 1,)`` int32: the entries of stored column ``j`` are listed in
            ``perm[colptr[j]:colptr[j + 1]]``.
        perm: ``(nnz,)`` int32 positions of the stored entries, column by column.
        rows: ``(nnz,)`` int32: ``rows[q]`` is the stored row of entry ``perm[q]``.

    Building one from arrays checks them against the matrix (concrete arrays only; under
    ``jit`` use :func:`with_column_index`).

    Example:
        >>> import jax.numpy as jnp
        >>> from primforge import ops
        >>> W = ops.with_column_index(ops.CSR.from_dense([[1., 0.], [2., 3.]]))
        >>> W.colptr.tolist(), W.perm.tolist(), W.rows.tolist()
        ([0, 2, 3], [0, 1, 2], [0, 1, 1])
        >>> (jnp.array([True, True]) @ W).tolist()
        [3.0, 3.0]
    """

    matrix: Any
    colptr: jax.Array
    perm: jax.Array
    rows: jax.Array

    __array_ufunc__ = None  # ``ndarray @ W`` defers to ``W.__rmatmul__``

    def __post_init__(self):
        if not isinstance(self.matrix, _FORMATS):
            raise TypeError(f"ColumnIndexed: 'matrix' must be a CSR, CSC or FixedNum, got "
                            f"{type(self.matrix).__name__}")
        arrays = (self.colptr, self.perm, self.rows)
        if not all(map(_common._is_concrete, (*arrays, *_stored(self.matrix)[:2]))):
            raise TypeError("ColumnIndexed: the index cannot be checked against the matrix "
                            "under a transformation; build it with ops.with_column_index(W)")
        want = _build(*_stored(self.matrix))
        for name, got, ref in zip(("colptr", "perm", "rows"), arrays, want):
            got = np.asarray(got)
            if got.shape != ref.shape or not np.array_equal(got, np.asarray(ref)):
                raise ValueError(f"ColumnIndexed: {name!r} is not the column index of this "
                                 f"matrix; build it with ops.with_column_index(W)")
            object.__setattr__(self, name, jnp.asarray(got, jnp.int32))

    @classmethod
    def _unchecked(cls, matrix, colptr, perm, rows) -> ColumnIndexed:
        obj = object.__new__(cls)
        for name, value in (("matrix", matrix), ("colptr", colptr), ("perm", perm),
                            ("rows", rows)):
            object.__setattr__(obj, name, value)
        return obj

    @property
    def index(self) -> tuple[jax.Array, jax.Array, jax.Array]:
        """``(colptr, perm, rows)``.

        Example:
            >>> import jax.numpy as jnp
            >>> from primforge import ops
            >>> W = ops.with_column_index(ops.CSR.from_dense([[1., 0.], [2., 3.]]))
            >>> [a.tolist() for a in W.index]
            [[0, 2, 3], [0, 1, 2], [0, 1, 1]]
        """
        return self.colptr, self.perm, self.rows

    @property
    def shape(self) -> tuple[int, int]:
        """``(n_pre, n_post)``, that of the matrix.

        Example:
            >>> import jax.numpy as jnp
            >>> from primforge import ops
            >>> W = ops.with_column_index(ops.CSR.from_dense([[1., 0.], [2., 3.]]))
            >>> W.shape
            (2, 2)
        """
        return self.matrix.shape

    @property
    def dtype(self):
        """Dtype of the weights.

        Example:
            >>> import jax.numpy as jnp
            >>> from primforge import ops
            >>> W = ops.with_column_index(ops.CSR.from_dense([[1., 0.], [2., 3.]]))
            >>> W.dtype
            dtype('float32')
        """
        return self.matrix.dtype

    @property
    def homogeneous(self) -> bool:
        """Whether every synapse shares one weight.

        Example:
            >>> import jax.numpy as jnp
            >>> from primforge import ops
            >>> W = ops.with_column_index(ops.CSR.from_dense([[1., 0.], [2., 3.]]))
            >>> W.homogeneous
            False
        """
        return self.matrix.homogeneous

    def _rewrap(self, matrix) -> ColumnIndexed:
        return self._unchecked(matrix, self.colptr, self.perm, self.rows)

    def with_data(self, data: Any) -> ColumnIndexed:
        """The same structure and index with new weights.

        Example:
            >>> from primforge import ops
            >>> W = ops.with_column_index(ops.CSR.from_dense([[1., 0.], [2., 3.]]))
            >>> W.with_data([4., 5., 6.]).todense().tolist()
            [[4.0, 0.0], [5.0, 6.0]]
        """
        return self._rewrap(self.matrix.with_data(data))

    @property
    def T(self) -> ColumnIndexed:
        """The transpose: the matrix's transpose (the same stored arrays) and the same index.

        Example:
            >>> import jax.numpy as jnp
            >>> from primforge import ops
            >>> W = ops.with_column_index(ops.CSR.from_dense([[1., 0.], [2., 3.]]))
            >>> W.T.todense().tolist()
            [[1.0, 2.0], [0.0, 3.0]]
        """
        return self._rewrap(self.matrix.T)

    def todense(self) -> jax.Array:
        """The dense ``(n_pre, n_post)`` array (traceable).

        Example:
            >>> import jax.numpy as jnp
            >>> from primforge import ops
            >>> W = ops.with_column_index(ops.CSR.from_dense([[1., 0.], [2., 3.]]))
            >>> W.todense().tolist()
            [[1.0, 0.0], [2.0, 3.0]]
        """
        return self.matrix.todense()

    def matmul(self, x: Any, *, backend: str | None = None) -> jax.Array:
        """``self @ x`` with an explicit backend choice.

        Example:
            >>> import jax.numpy as jnp
            >>> from primforge import ops
            >>> W = ops.with_column_index(ops.CSR.from_dense([[1., 0.], [2., 3.]]))
            >>> W.matmul(jnp.array([1., 1.]), backend='jax').tolist()
            [1.0, 5.0]
        """
        return self.matrix.matmul(x, backend=backend)

    def rmatmul(self, x: Any, *, backend: str | None = None) -> jax.Array:
        """``x @ self`` with an explicit backend choice.

        Example:
            >>> import jax.numpy as jnp
            >>> from primforge import ops
            >>> W = ops.with_column_index(ops.CSR.from_dense([[1., 0.], [2., 3.]]))
            >>> W.rmatmul(jnp.array([True, True]), backend='jax').tolist()
            [3.0, 3.0]
        """
        return self.matrix.rmatmul(x, backend=backend)

    def __matmul__(self, x: Any) -> jax.Array:
        return self.matrix.matmul(x)

    def __rmatmul__(self, x: Any) -> jax.Array:
        return self.matrix.rmatmul(x)


def with_column_index(W: Any) -> ColumnIndexed:
    """``W`` with an index of its synapses by stored column (see :class:`ColumnIndexed`).

    Build it once, outside the simulation loop, and keep using the returned matrix: the
    plasticity updates return it with its index. Costs one stable sort of the stored entries
    and ``2 * nnz + cols + 1`` int32 numbers; works on concrete arrays and under ``jit``.
    Out-of-range column indices (masked ``FixedNum`` slots) are left out of the index.

    Args:
        W: a :class:`CSR`, :class:`CSC` or :class:`FixedNum` (a :class:`ColumnIndexed` is
            returned as it is).

    Returns:
        A :class:`ColumnIndexed` holding ``W`` and its index.

    Raises:
        TypeError: ``W`` is not one of those formats.

    Example:
        >>> import jax.numpy as jnp
        >>> from primforge import ops
        >>> W = ops.with_column_index(ops.CSR.from_dense([[1., 0., 2.], [0., 3., 4.]]))
        >>> new = ops.update_on_post(W, jnp.array([False, False, True]), jnp.array([.5, -1.]))
        >>> type(new).__name__, new.todense().tolist()
        ('ColumnIndexed', [[1.0, 0.0, 2.5], [0.0, 3.0, 3.0]])
    """
    if isinstance(W, ColumnIndexed):
        return W
    if not isinstance(W, _FORMATS):
        raise TypeError(f"with_column_index: 'W' must be a CSR, CSC or FixedNum, got "
                        f"{type(W).__name__}")
    return ColumnIndexed._unchecked(W, *_build(*_stored(W)))
