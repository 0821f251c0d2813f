"""CSR and CSC sparse matrices as JAX pytrees, with ``@`` dispatching to the CSR kernels.

:class:`CSC` holds the CSR of its transpose, so ``W.T`` moves no data; bool or integer
operands are binary events.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from primforge.ops import _scaffold
from primforge.ops.csr import api as _kernels
from primforge.ops.csr import slicing as _slicing
from primforge.ops.csr import structure as _common
from primforge.ops.packed import PackedEvents, as_events
from primforge.utils import dataclass, field

__all__ = ["CSC", "CSR"]


def _is_event(x: jax.Array) -> bool:
    return not jnp.issubdtype(x.dtype, jnp.inexact)


def _product(mat, x: jax.Array, *, transpose: bool, backend: str | None) -> jax.Array:
    """``A @ x`` (``transpose=False``) or ``A.T @ x`` where A is the stored CSR."""
    if isinstance(x, PackedEvents) and x.words.ndim == 1:  # read packed in the kernel
        indices, indptr = _structure(mat)
        return _kernels.binary_csrmv(mat.data, indices, indptr, x, shape=mat._csr_shape,
                                     transpose=transpose, backend=backend)
    x = jnp.asarray(as_events(x))
    fn = {
        (True, 1): _kernels.binary_csrmv,
        (False, 1): _kernels.csrmv,
        (True, 2): _kernels.binary_csrmm,
        (False, 2): _kernels.csrmm,
    }.get((_is_event(x), x.ndim))
    if fn is None:
        raise ValueError(
            f"sparse @ operand must be a vector or a matrix, got shape {x.shape}"
        )
    indices, indptr = _structure(mat)
    return fn(mat.data, indices, indptr, x, shape=mat._csr_shape, transpose=transpose,
              backend=backend)


def _structure(mat) -> tuple[jax.Array, jax.Array]:
    """The matrix's index arrays, kept opaque to XLA's constant folding.

    A matrix captured by a jitted function (not passed as an argument) makes its index
    arrays compile-time constants; XLA then evaluates every index computation of the
    product and its gradient (row ids, structure checks) while compiling, which takes tens
    of seconds for millions of non-zeros. An optimization barrier leaves those to run
    time, as when the matrix is an argument.
    """
    who = type(mat).__name__
    indices = _scaffold.index_array(mat.indices, who, "indices")
    indptr = _scaffold.index_array(mat.indptr, who, "indptr")
    return tuple(jax.lax.optimization_barrier((indices, indptr)))


class _Compressed:
    """Behaviour shared by :class:`CSR` and :class:`CSC` (``_TRANSPOSED`` tells which)."""

    _TRANSPOSED = False
    # Make NumPy's ``ndarray @ W`` defer to ``W.__rmatmul__``.
    __array_ufunc__ = None
    data: jax.Array
    indices: jax.Array
    indptr: jax.Array
    shape: tuple[int, int]

    def __post_init__(self):
        who = type(self).__name__
        shape = _common.check_shape_param(self.shape, who)
        object.__setattr__(self, "shape", shape)
        for name in ("indices", "indptr"):
            _scaffold.check_int32(getattr(self, name), who, name)
        data = self.data
        if not hasattr(data, "shape"):
            data = jnp.asarray(data)
        if jnp.ndim(data) == 0:
            data = jnp.reshape(data, (1,))
        object.__setattr__(self, "data", data)
        _common.check_csr_args(who, self.data, self.indices, self.indptr, self._csr_shape)
        _common.validate_concrete(self.indices, self.indptr, self._csr_shape, who)

    @property
    def _csr_shape(self) -> tuple[int, int]:
        m, n = self.shape
        return (n, m) if self._TRANSPOSED else (m, n)

    @property
    def nnz(self) -> int:
        """Number of stored entries (synapses).

        Example:
            >>> import jax.numpy as jnp
            >>> from primforge.ops import CSR
            >>> W = CSR.from_dense([[0., 2.], [3., 0.]])
            >>> W.nnz
            2
        """
        return int(self.indices.shape[0])

    @property
    def dtype(self):
        """Dtype of the weights.

        Example:
            >>> import jax.numpy as jnp
            >>> from primforge.ops import CSR
            >>> W = CSR.from_dense([[0., 2.], [3., 0.]])
            >>> W.dtype
            dtype('float32')
        """
        return self.data.dtype

    @property
    def homogeneous(self) -> bool:
        """Whether all stored entries share one weight (``data.shape == (1,)``).

        Example:
            >>> import jax.numpy as jnp
            >>> from primforge.ops import CSR
            >>> W = CSR.from_dense([[0., 2.], [3., 0.]])
            >>> W.homogeneous, W.with_data(1.0).homogeneous
            (False, True)
        """
        return tuple(self.data.shape) == (1,) and self.nnz != 1

    @classmethod
    def _unchecked(cls, data, indices, indptr, shape):
        # For views of an already validated matrix: skip the O(nnz) structure check.
        obj = object.__new__(cls)
        for name, value in (("data", data), ("indices", indices), ("indptr", indptr),
                            ("shape", shape)):
            object.__setattr__(obj, name, value)
        return obj

    def with_data(self, data: Any):
        """The same structure with new weights (shape ``(nnz,)``, ``(1,)`` or a scalar).

        Example:
            >>> from primforge.ops import CSR
            >>> CSR.from_dense([[0., 2.], [3., 0.]]).with_data(1.0).homogeneous
            True
        """
        data = jnp.asarray(data)
        if data.ndim == 0:
            data = data.reshape(1)
        _common.check_csr_args(type(self).__name__, data, self.indices, self.indptr,
                               self._csr_shape)
        return self._unchecked(data, self.indices, self.indptr, self.shape)

    def check(self):
        """Check the structure, also at run time under ``jit``; returns ``self``.

        Concrete arrays are checked at once. Under ``jit`` a host callback raises
        :class:`~primforge.ops.CSRStructureError` (surfacing as a JAX runtime error that
        quotes it) when the compiled function runs.

        Example:
            >>> import jax.numpy as jnp
            >>> from primforge.ops import CSR
            >>> W = CSR.from_dense([[0., 2.], [3., 0.]])
            >>> W.check() is W
            True
        """
        _common.validate_runtime(self.indices, self.indptr, self._csr_shape, type(self).__name__)
        return self

    def matmul(self, x: Any, *, backend: str | None = None) -> jax.Array:
        """``self @ x`` with an explicit backend choice.

        Example:
            >>> import jax.numpy as jnp
            >>> from primforge.ops import CSR
            >>> W = CSR.from_dense([[0., 2.], [3., 0.]])
            >>> W.matmul(jnp.array([True, False]), backend='jax').tolist()
            [0.0, 3.0]
        """
        return _product(self, x, transpose=self._TRANSPOSED, backend=backend)

    def rmatmul(self, x: Any, *, backend: str | None = None) -> jax.Array:
        """``x @ self`` with an explicit backend choice (vector or ``(k, rows)`` matrix).

        Example:
            >>> import jax.numpy as jnp
            >>> from primforge.ops import CSR
            >>> W = CSR.from_dense([[0., 2.], [3., 0.]])
            >>> W.rmatmul(jnp.array([True, False]), backend='jax').tolist()
            [0.0, 2.0]
        """
        if isinstance(x, PackedEvents) and x.words.ndim == 1:
            return _product(self, x, transpose=not self._TRANSPOSED, backend=backend)
        x = jnp.asarray(as_events(x))
        if x.ndim == 2:
            return _product(self, x.T, transpose=not self._TRANSPOSED, backend=backend).T
        return _product(self, x, transpose=not self._TRANSPOSED, backend=backend)

    def __matmul__(self, x: Any) -> jax.Array:
        return self.matmul(x)

    def __rmatmul__(self, x: Any) -> jax.Array:
        return self.rmatmul(x)

    def _dense_of_stored(self, transpose: bool = False) -> jax.Array:
        return _dense(self.data, self.indices, self.indptr, self._csr_shape, transpose)


@functools.partial(jax.jit, static_argnums=(3, 4))
def _dense(data, indices, indptr, shape: tuple[int, int], transpose: bool) -> jax.Array:
    """The dense ``shape`` array of stored compressed rows, or its transpose (one compiled
    program a shape)."""
    nnz = indices.shape[0]
    rows = _common.row_ids(indptr, nnz)
    vals = jnp.broadcast_to(data, (nnz,))
    dense = jnp.zeros(shape, data.dtype).at[rows, indices].add(vals)
    return dense.T if transpose else dense


def _from_dense_arrays(dense, homogeneous: bool):
    d = np.asarray(dense)
    if d.ndim != 2:
        raise ValueError(f"from_dense: expected a 2-D array, got shape {d.shape}")
    rows, cols = np.nonzero(d)
    indptr = np.zeros(d.shape[0] + 1, np.int32)
    np.cumsum(np.bincount(rows, minlength=d.shape[0]), out=indptr[1:])
    values = d[rows, cols]
    if not np.issubdtype(values.dtype, np.floating):
        values = values.astype(np.float32)
    if homogeneous:
        uniq = np.unique(values)
        if uniq.size > 1:
            raise ValueError(
                f"from_dense(homogeneous=True): the non-zero entries take {uniq.size} "
                f"different values; a homogeneous matrix has one shared weight"
            )
        values = uniq[:1] if uniq.size else np.zeros(1, values.dtype)
    return tuple(jax.device_put(a) for a in (values, cols.astype(np.int32), indptr))


def _row_index(mat, index) -> np.ndarray:
    """``index`` of ``slice_rows`` as a checked 1-D integer array (structure concrete)."""
    who = f"{type(mat).__name__}.slice_rows"
    m = mat.shape[0]
    for name, a in (("indices", mat.indices), ("indptr", mat.indptr), ("index", index)):
        if not _common._is_concrete(a):
            raise TypeError(f"{who}: {name!r} must be concrete (the result's size depends "
                            f"on it); use csr_slice_rows under jit")
    rows = np.atleast_1d(np.asarray(index))
    if rows.ndim == 1 and rows.size == 0:
        rows = rows.astype(np.int64)  # an empty list: no rows (NumPy reads it as float)
    if rows.ndim != 1 or not np.issubdtype(rows.dtype, np.integer):
        raise TypeError(f"{who}: 'index' must be an int or a 1-D integer array, got "
                        f"{rows.dtype} of shape {rows.shape}")
    if rows.size and (rows.min() < 0 or rows.max() >= m):
        raise IndexError(f"{who}: 'index' must lie in [0, {m}) for {m} rows, got "
                         f"{int(rows.min() if rows.min() < 0 else rows.max())}")
    return rows


@dataclass
class CSR(_Compressed):
    """A sparse ``(rows, cols)`` matrix in compressed sparse row form, as a JAX pytree.

    Attributes:
        data: weights, ``(nnz,)`` (one per entry) or ``(1,)`` (shared; a scalar is accepted).
        indices: column of each stored entry, ``(nnz,)`` integers.
        indptr: ``(rows + 1,)`` offsets: row ``i`` holds entries ``indptr[i]:indptr[i+1]``.
        shape: ``(rows, cols)``; static.

    ``W @ x`` and ``x @ W`` accept vectors and matrices; bool or integer ``x`` are binary
    events. Rows are the event sources in ``x @ W`` (``W.T @ x``), the event-driven
    direction of the numba kernels.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> W = CSR.from_dense(jnp.array([[1., 0., 2.], [0., 3., 0.]]))
        >>> W @ jnp.array([1., 1., 1.])
        Array([3., 3.], dtype=float32)
        >>> jnp.array([False, True]) @ W        # spikes of the 2 rows
        Array([0., 3., 0.], dtype=float32)
        >>> W.T.shape, W.T.todense().tolist()
        ((3, 2), [[1.0, 0.0], [0.0, 3.0], [2.0, 0.0]])
        >>> jax.grad(lambda w: (jnp.array([1., 2.]) @ W.with_data(w)).sum())(W.data)
        Array([1., 1., 2.], dtype=float32)
    """

    data: jax.Array
    indices: jax.Array
    indptr: jax.Array
    shape: tuple[int, int] = field(static=True)

    _TRANSPOSED = False

    @classmethod
    def from_dense(cls, dense: Any, *, homogeneous: bool = False) -> CSR:
        """Build from a concrete dense array, storing its non-zero entries.

        Args:
            dense: 2-D array (NumPy or concrete JAX).
            homogeneous: store one shared weight (all non-zeros must be equal).

        Example:
            >>> CSR.from_dense([[0., 2.], [2., 0.]], homogeneous=True).data
            Array([2.], dtype=float32)
        """
        d = np.asarray(dense)
        return cls(*_from_dense_arrays(d, homogeneous), shape=d.shape)

    def todense(self) -> jax.Array:
        """The dense ``(rows, cols)`` array (traceable).

        Example:
            >>> CSR.from_dense([[0., 2.], [3., 0.]]).todense().tolist()
            [[0.0, 2.0], [3.0, 0.0]]
        """
        return self._dense_of_stored()

    def slice_rows(self, index: Any) -> CSR:
        """``W[index, :]`` as a new :class:`CSR` (structure and ``index`` concrete).

        ``index`` is an int or a 1-D integer array (rows may repeat); the weights may be
        traced (the result is differentiable w.r.t. them). For a dense result, traceable
        rows and ``vmap``, use :func:`~primforge.ops.csr_slice_rows`.

        Example:
            >>> W = CSR.from_dense([[0., 2.], [3., 0.], [4., 5.]])
            >>> W.slice_rows([2, 0]).todense().tolist()
            [[4.0, 5.0], [0.0, 2.0]]
        """
        _m, n = self.shape
        rows = _row_index(self, index)
        ptr = np.asarray(self.indptr)
        starts, lengths = ptr[rows], ptr[rows + 1] - ptr[rows]
        new_indptr = np.zeros(rows.size + 1, np.int32)
        np.cumsum(lengths, out=new_indptr[1:])
        pos = np.repeat(starts - new_indptr[:-1], lengths) + np.arange(new_indptr[-1])
        data = self.data if self.homogeneous else self.data[pos]
        return CSR._unchecked(data, jnp.asarray(np.asarray(self.indices)[pos]),
                              jnp.asarray(new_indptr), (int(rows.size), n))

    def diag_add(self, diag: Any) -> CSR:
        """``W + diag(diag)`` as a new :class:`CSR`, inserting missing diagonal entries.

        The structure must be concrete; ``diag`` (``(min(shape),)``) and the weights may be
        traced. See :func:`~primforge.ops.diag_add`.

        Example:
            >>> W = CSR.from_dense([[0., 2.], [3., 0.]])
            >>> W.diag_add(jnp.array([1., 1.])).todense().tolist()
            [[1.0, 2.0], [3.0, 1.0]]
        """
        data, indices, indptr = _slicing.diag_add(self.data, self.indices, self.indptr, diag,
                                                  shape=self.shape)
        return CSR._unchecked(data, indices, indptr, self.shape)

    @property
    def T(self) -> CSC:
        """The transpose, as a :class:`CSC` sharing these arrays (no copy).

        Example:
            >>> import jax.numpy as jnp
            >>> from primforge.ops import CSR
            >>> W = CSR.from_dense([[0., 2.], [3., 0.]])
            >>> type(W.T).__name__, W.T.todense().tolist()
            ('CSC', [[0.0, 3.0], [2.0, 0.0]])
        """
        return CSC._unchecked(self.data, self.indices, self.indptr, (self.shape[1], self.shape[0]))


@dataclass
class CSC(_Compressed):
    """A sparse ``(rows, cols)`` matrix in compressed sparse column form, as a JAX pytree.

    The arrays are those of the CSR form of its transpose: ``indptr`` has ``cols + 1``
    entries and ``indices`` holds row numbers. ``CSR.T`` returns one, and ``CSC.T`` returns
    the :class:`CSR` again. ``W @ x`` for a CSC ``W`` is the event-driven direction.

    Example:
        >>> import jax.numpy as jnp
        >>> W = CSC.from_dense(jnp.array([[1., 0.], [0., 3.], [2., 0.]]))
        >>> W @ jnp.array([True, False])
        Array([1., 0., 2.], dtype=float32)
    """

    data: jax.Array
    indices: jax.Array
    indptr: jax.Array
    shape: tuple[int, int] = field(static=True)

    _TRANSPOSED = True

    @classmethod
    def from_dense(cls, dense: Any, *, homogeneous: bool = False) -> CSC:
        """Build from a concrete dense array, storing its non-zero entries.

        Example:
            >>> CSC.from_dense([[0., 2.], [3., 0.]]).indptr.tolist()
            [0, 1, 2]
        """
        d = np.asarray(dense)
        return cls(*_from_dense_arrays(d.T, homogeneous), shape=d.shape)

    def todense(self) -> jax.Array:
        """The dense ``(rows, cols)`` array (traceable).

        Example:
            >>> CSC.from_dense([[0., 2.], [3., 0.]]).todense().tolist()
            [[0.0, 2.0], [3.0, 0.0]]
        """
        return self._dense_of_stored(transpose=True)

    def slice_rows(self, index: Any) -> CSC:
        """``W[index, :]`` as a new :class:`CSC` (structure and ``index`` concrete).

        ``index`` is an int or a 1-D integer array (rows may repeat); the weights may be
        traced (the result is differentiable w.r.t. them). Each column keeps its entries
        in the selected rows, ordered by their position in ``index``.

        Example:
            >>> W = CSC.from_dense([[0., 2.], [3., 0.], [4., 5.]])
            >>> W.slice_rows([2, 0, 2]).todense().tolist()
            [[4.0, 5.0], [0.0, 2.0], [4.0, 5.0]]
        """
        rows = _row_index(self, index)
        ptr = np.asarray(self.indptr)
        stored = np.asarray(self.indices)[: ptr[-1]]  # the row of each entry, column-major
        order = np.argsort(rows, kind="stable")
        by_row = rows[order]
        lo = np.searchsorted(by_row, stored, "left")
        reps = np.searchsorted(by_row, stored, "right") - lo  # how often each entry's row
        entry = np.repeat(np.arange(stored.size), reps)
        first = np.repeat(np.cumsum(reps) - reps, reps)
        pos = order[np.repeat(lo, reps) + np.arange(entry.size) - first]  # its new row
        col = np.repeat(np.arange(ptr.size - 1), np.diff(ptr))[entry]
        keep = np.lexsort((pos, col))  # column by column, rows ascending
        entry, pos = entry[keep], pos[keep]
        new_indptr = np.zeros(ptr.size, np.int32)
        np.cumsum(np.bincount(col, minlength=ptr.size - 1), out=new_indptr[1:])
        data = self.data if self.homogeneous else self.data[entry]
        return CSC._unchecked(data, jnp.asarray(pos.astype(np.int32)),
                              jnp.asarray(new_indptr), (int(rows.size), self.shape[1]))

    @property
    def T(self) -> CSR:
        """The transpose, as a :class:`CSR` sharing these arrays (no copy).

        Example:
            >>> from primforge.ops import CSC
            >>> W = CSC.from_dense([[0., 2.], [3., 0.]])
            >>> type(W.T).__name__, W.T.todense().tolist()
            ('CSR', [[0.0, 3.0], [2.0, 0.0]])
        """
        return CSR._unchecked(self.data, self.indices, self.indptr, (self.shape[1], self.shape[0]))
