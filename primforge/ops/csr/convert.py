"""Conversions between the COO, CSR and CSC index arrays of a sparse matrix.

Design:
    * Structure only: integer arrays in, integer arrays out. Conversions that reorder the
      stored entries also return the permutation ``perm`` that carries a value array along
      (``data[perm]`` is in the new order); entries that share a row (or column) keep their
      relative order, and duplicates are kept as they are.
    * NumPy in, NumPy out (computed with NumPy); a JAX array in gives JAX arrays out,
      computed with ``jax.numpy``, so the functions also run under ``jit`` (every output
      shape follows from the input shapes and ``shape``).
    * Coordinates (``indices``) come back as int32; ``indptr`` and ``perm`` as int32 too,
      int64 only for NumPy input with more than ``2**31 - 1`` entries. A ``shape`` at or
      past ``2**31 - 1`` raises (its coordinates would not fit), whatever
      ``jax_enable_x64``.
    * Bad input raises, naming the argument: a float or non-1-D index array (``TypeError``
      / ``ValueError``), an ``indptr`` that is not non-decreasing from 0 to nnz or an index
      outside the shape (:class:`~primforge.ops.CSRStructureError`). Concrete values are
      checked at once; traced ones when the compiled function runs (a host callback), so a
      bad index is never wrapped into a plausible one.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from primforge._compat import Tracer
from primforge.ops import _scaffold
from primforge.ops.csr.structure import CSRStructureError
from primforge.ops.csr.structure import row_ids as _row_ids

__all__ = [
    "coo2csr",
    "coo_to_csc_index",
    "csc_to_csr_index",
    "csr_to_coo_index",
    "csr_to_csc_index",
]


def _is_jax(*arrays) -> bool:
    return any(isinstance(a, (jax.Array, Tracer)) for a in arrays)


def _index(x: Any, who: str, name: str):
    """``x`` as a 1-D integer array (NumPy or JAX, as given); checks ndim and dtype."""
    arr = x if isinstance(x, (jax.Array, Tracer)) else np.asarray(x)
    if arr.ndim != 1:
        raise ValueError(f"{who}: {name!r} must be a 1-D integer array, got shape {arr.shape}")
    if not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"{who}: {name!r} must be an integer array, got dtype {arr.dtype}")
    return arr


def _indptr_problems(name: str, indptr: np.ndarray, nnz: int) -> list[str]:
    found = []
    if indptr[0] != 0:
        found.append(f"{name}[0] must be 0, got {int(indptr[0])}")
    if indptr[-1] != nnz:
        found.append(f"{name}[-1] must equal the number of entries {nnz}, got {int(indptr[-1])}")
    drops = np.flatnonzero(np.diff(indptr) < 0)
    if drops.size:
        i = int(drops[0])
        found.append(f"{name} must be non-decreasing, but {name}[{i}] = {int(indptr[i])} > "
                     f"{name}[{i + 1}] = {int(indptr[i + 1])}")
    return found


def _range_problems(name: str, idx: np.ndarray, bound: int, what: str) -> list[str]:
    bad = np.flatnonzero((idx < 0) | (idx >= bound))
    if not bad.size:
        return []
    k = int(bad[0])
    msg = (f"{name} must lie in [0, {bound}) for {bound} {what}, but {name}[{k}] = "
           f"{int(idx[k])} ({bad.size} out of range)")
    return [msg]


def _check(who: str, checks: list[tuple]) -> None:
    """Run ``checks`` (``(kind, name, array, bound_or_nnz, what)``) now or at run time."""
    def problems(*arrays):
        found = []
        for (kind, name, _, bound, what), a in zip(checks, arrays, strict=True):
            a = np.asarray(a)
            if kind == "indptr":
                found += _indptr_problems(name, a, bound)
            elif a.size:
                found += _range_problems(name, a, bound, what)
        if found:
            raise CSRStructureError(f"{who}: " + "; ".join(found))

    arrays = [c[2] for c in checks]
    if any(isinstance(a, Tracer) for a in arrays):
        jax.debug.callback(problems, *arrays)
    else:
        problems(*arrays)


def _offset_dtype(nnz: int, use_numpy: bool):
    return np.int64 if use_numpy and nnz > np.iinfo(np.int32).max else np.int32


def _coo_sort(major, minor, n_major: int, use_numpy: bool):
    """Group the entries by ``major`` (stable): ``(indptr, minor reordered, perm)``."""
    nnz = major.shape[0]
    off = _offset_dtype(nnz, use_numpy)
    if use_numpy:
        perm = np.argsort(major, kind="stable").astype(off)
        counts = np.bincount(major.astype(np.int64), minlength=n_major)
        indptr = np.zeros(n_major + 1, off)
        np.cumsum(counts, out=indptr[1:])
        return indptr, np.asarray(minor[perm], np.int32), perm
    return _coo_sort_jax(major, minor, n_major)


@functools.partial(jax.jit, static_argnums=2)
def _coo_sort_jax(major, minor, n_major: int):
    """:func:`_coo_sort` in jax.numpy, int32 offsets (one compiled program a shape)."""
    perm = jnp.argsort(major, stable=True).astype(jnp.int32)
    counts = jnp.bincount(major, length=n_major).astype(jnp.int32)
    indptr = jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(counts, dtype=jnp.int32)])
    return indptr, minor[perm].astype(jnp.int32), perm


def _coo_args(who: str, rows: Any, cols: Any, row_name: str, col_name: str,
              shape: tuple[int, int]):
    """Checked COO arguments: ``(m, n, rows, cols)``, each index in range, equal lengths."""
    m, n = _scaffold.check_shape(shape, who, int32=True)
    rows, cols = _index(rows, who, row_name), _index(cols, who, col_name)
    if rows.shape != cols.shape:
        raise ValueError(f"{who}: {row_name!r} and {col_name!r} must have the same length, "
                         f"got {rows.shape[0]} and {cols.shape[0]}")
    _check(who, [("range", row_name, rows, m, "rows"), ("range", col_name, cols, n, "columns")])
    return m, n, rows, cols


def coo2csr(row_ids: Any, col_ids: Any, *, shape: tuple[int, int]):
    """CSR index arrays of a matrix given in COO form, and the permutation to CSR order.

    Args:
        row_ids: row of each entry, ``(nnz,)`` integers.
        col_ids: column of each entry, ``(nnz,)`` integers.
        shape: ``(rows, cols)`` of the matrix.

    Returns:
        ``(indptr, indices, order)``: ``indptr`` ``(rows + 1,)``, ``indices`` (the columns
        grouped by row; within a row in their COO order) and ``order``, with
        ``data[order]`` the COO values in CSR order. NumPy input gives NumPy arrays.

    Example:
        >>> import numpy as np
        >>> indptr, indices, order = coo2csr(np.array([0, 2, 1, 0]), np.array([1, 0, 2, 3]),
        ...                                  shape=(3, 4))
        >>> indptr.tolist(), indices.tolist(), order.tolist()
        ([0, 2, 3, 4], [1, 3, 2, 0], [0, 3, 2, 1])
    """
    m, _, row_ids, col_ids = _coo_args("coo2csr", row_ids, col_ids, "row_ids", "col_ids",
                                       shape)
    return _coo_sort(row_ids, col_ids, m, not _is_jax(row_ids, col_ids))


def coo_to_csc_index(pre_ids: Any, indices: Any, *, shape: tuple[int, int]):
    """CSC index arrays of a matrix given in COO form, and the permutation to CSC order.

    Args:
        pre_ids: row of each entry, ``(nnz,)`` integers.
        indices: column of each entry, ``(nnz,)`` integers.
        shape: ``(rows, cols)`` of the matrix.

    Returns:
        ``(csc_indptr, csc_indices, perm)``: ``csc_indptr`` ``(cols + 1,)``, the rows
        grouped by column, and ``perm`` with ``data[perm]`` the values in CSC order.

    Example:
        >>> import numpy as np
        >>> ptr, rows, perm = coo_to_csc_index(np.array([0, 0, 1, 2]), np.array([0, 2, 1, 0]),
        ...                                    shape=(3, 3))
        >>> ptr.tolist(), rows.tolist(), perm.tolist()
        ([0, 2, 3, 4], [0, 2, 1, 0], [0, 3, 2, 1])
    """
    _, n, pre_ids, indices = _coo_args("coo_to_csc_index", pre_ids, indices, "pre_ids",
                                       "indices", shape)
    return _coo_sort(indices, pre_ids, n, not _is_jax(pre_ids, indices))


def _rows_of(indptr, nnz: int, use_numpy: bool):
    if use_numpy:
        return np.repeat(np.arange(indptr.shape[0] - 1, dtype=np.int32), np.diff(indptr))
    return _row_ids(indptr, nnz)


def csr_to_coo_index(indptr: Any, indices: Any):
    """COO index arrays (row and column of every stored entry) of a CSR structure.

    Args:
        indptr: ``(rows + 1,)`` row offsets.
        indices: column of each stored entry, ``(nnz,)``.

    Returns:
        ``(row_ids, col_ids)``: ``row_ids`` int32 ``(nnz,)`` and ``col_ids``, ``indices``
        itself. The entries keep their CSR order (no permutation is needed).

    Example:
        >>> import numpy as np
        >>> rows, cols = csr_to_coo_index(np.array([0, 2, 2, 3]), np.array([0, 3, 1]))
        >>> rows.tolist(), cols.tolist()
        ([0, 0, 2], [0, 3, 1])
    """
    who = "csr_to_coo_index"
    indptr, indices = _index(indptr, who, "indptr"), _index(indices, who, "indices")
    if indptr.shape[0] < 1:
        raise ValueError(f"{who}: 'indptr' must have rows + 1 >= 1 entries, got none")
    nnz = indices.shape[0]
    _check(who, [("indptr", "indptr", indptr, nnz, "")])
    return _rows_of(indptr, nnz, not _is_jax(indptr, indices)), indices


def csr_to_csc_index(csr_indptr: Any, csr_indices: Any, *, shape: tuple[int, int],
                     include_perm: bool = True):
    """CSC index arrays of a CSR structure, and the permutation from CSR to CSC order.

    Args:
        csr_indptr: ``(rows + 1,)`` row offsets.
        csr_indices: column of each stored entry, ``(nnz,)``.
        shape: ``(rows, cols)`` of the matrix.
        include_perm: return the permutation (else ``None`` in its place).

    Returns:
        ``(csc_indptr, csc_indices, perm)``: ``(cols + 1,)`` column offsets, the row of
        each entry grouped by column, and ``perm`` with ``data[perm]`` the CSR values in
        CSC order. :func:`csc_to_csr_index` is the inverse.

    Example:
        >>> import numpy as np
        >>> ptr, rows, perm = csr_to_csc_index(np.array([0, 2, 3]), np.array([2, 0, 2]),
        ...                                    shape=(2, 3))
        >>> ptr.tolist(), rows.tolist(), perm.tolist()
        ([0, 1, 1, 3], [0, 0, 1], [1, 0, 2])
    """
    who = "csr_to_csc_index"
    m, n = _scaffold.check_shape(shape, who, int32=True)
    csr_indptr = _index(csr_indptr, who, "csr_indptr")
    csr_indices = _index(csr_indices, who, "csr_indices")
    if csr_indptr.shape[0] != m + 1:
        raise ValueError(f"{who}: 'csr_indptr' must have shape (rows + 1,) = ({m + 1},) for "
                         f"shape {(m, n)}, got {csr_indptr.shape}")
    nnz = csr_indices.shape[0]
    _check(who, [("indptr", "csr_indptr", csr_indptr, nnz, ""),
                 ("range", "csr_indices", csr_indices, n, "columns")])
    use_numpy = not _is_jax(csr_indptr, csr_indices)
    rows = _rows_of(csr_indptr, nnz, use_numpy)
    ptr, idx, perm = _coo_sort(csr_indices, rows, n, use_numpy)
    return ptr, idx, (perm if include_perm else None)


def csc_to_csr_index(csc_indptr: Any, csc_indices: Any, *, shape: tuple[int, int],
                     include_perm: bool = True):
    """CSR index arrays of a CSC structure, and the permutation from CSC to CSR order.

    Args:
        csc_indptr: ``(cols + 1,)`` column offsets.
        csc_indices: row of each stored entry, ``(nnz,)``.
        shape: ``(rows, cols)`` of the matrix.
        include_perm: return the permutation (else ``None`` in its place).

    Returns:
        ``(csr_indptr, csr_indices, perm)``, ``data[perm]`` being the CSC values in CSR
        order; the inverse of :func:`csr_to_csc_index`.

    Example:
        >>> import numpy as np
        >>> ptr, cols, perm = csc_to_csr_index(np.array([0, 1, 1, 3]), np.array([0, 0, 1]),
        ...                                    shape=(2, 3))
        >>> ptr.tolist(), cols.tolist(), perm.tolist()
        ([0, 2, 3], [0, 2, 2], [0, 1, 2])
    """
    who = "csc_to_csr_index"
    m, n = _scaffold.check_shape(shape, who, int32=True)
    csc_indptr = _index(csc_indptr, who, "csc_indptr")
    csc_indices = _index(csc_indices, who, "csc_indices")
    if csc_indptr.shape[0] != n + 1:
        raise ValueError(f"{who}: 'csc_indptr' must have shape (cols + 1,) = ({n + 1},) for "
                         f"shape {(m, n)}, got {csc_indptr.shape}")
    nnz = csc_indices.shape[0]
    _check(who, [("indptr", "csc_indptr", csc_indptr, nnz, ""),
                 ("range", "csc_indices", csc_indices, m, "rows")])
    use_numpy = not _is_jax(csc_indptr, csc_indices)
    cols = _rows_of(csc_indptr, nnz, use_numpy)
    ptr, idx, perm = _coo_sort(csc_indices, cols, m, use_numpy)
    return ptr, idx, (perm if include_perm else None)
