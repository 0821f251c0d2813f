"""Selected rows of a CSR matrix as a dense array, row blocks for devices, its diagonal.

Design:
    * :func:`csr_slice_rows` with a concrete structure (a matrix built outside ``jit`` or
      captured by it) gathers each selected row's entries, padded to the longest row, and
      scatters them into the dense result: O(selected rows x longest row), differentiable
      and batchable through JAX. With a traced structure it is the product ``S @ W``, ``S``
      the one-hot selection matrix, computed as the event-driven ``W.T @ S.T`` of
      :func:`binary_csrmm`, whose transformations and structure poisoning (NaN for a
      malformed matrix) carry over. A row outside ``[0, rows)`` raises when the rows are
      concrete and gives a NaN row under ``jit``.
    * :func:`diag_add` computes ``W + diag(d)`` and inserts the diagonal entries ``W`` does
      not store, so the structure changes: it is planned from concrete index arrays once
      (:func:`csr_diag_position`), and the values, for any weights and diagonal, follow
      from the plan with one scatter (:func:`csr_diag_add`, traceable and linear).
    * Outside ``jit`` the array work of each function is one jitted program (compiled once
      a shape), not a program for each ``jax.numpy`` step; the concrete structure's checks
      and plans stay in NumPy.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from primforge._compat import Tracer
from primforge.ops import _scaffold
from primforge.ops.csr import api as _kernels
from primforge.ops.csr import structure as _common

__all__ = ["CSRRowBlocks", "csr_diag_add", "csr_diag_position", "csr_row_blocks",
           "csr_slice_rows", "diag_add"]


def _row_selector(row_indices: Any, m: int, who: str):
    rows = row_indices if isinstance(row_indices, (jax.Array, Tracer)) else np.asarray(
        row_indices)
    if rows.ndim > 1:
        raise ValueError(f"{who}: 'row_indices' must be a scalar or 1-D, got shape {rows.shape}")
    if not np.issubdtype(rows.dtype, np.integer):
        raise TypeError(f"{who}: 'row_indices' must be integers, got dtype {rows.dtype}")
    if not isinstance(rows, Tracer):
        bad = np.flatnonzero((np.asarray(rows).ravel() < 0) | (np.asarray(rows).ravel() >= m))
        if bad.size:
            k = int(bad[0])
            raise IndexError(f"{who}: 'row_indices' must lie in [0, {m}) for {m} rows, got "
                             f"{int(np.asarray(rows).ravel()[k])} at position {k}")
    return rows


def _concrete_structure(data, indices, indptr, m: int, n: int, who: str) -> bool:
    """Whether the structure is concrete (then checked here, as the kernels would)."""
    if isinstance(indices, Tracer) or isinstance(indptr, Tracer):
        return False
    _common.check_csr_args(who, _scaffold.float_weights(data, who=who, name="data"), indices,
                           indptr, (m, n))
    _common.validate_concrete(indices, indptr, (m, n), who)
    return True


@functools.partial(jax.jit, static_argnames=("m", "n", "longest", "scalar"))
def _gather_rows(w, indices, indptr, rows, *, m: int, n: int, longest: int, scalar: bool):
    """Rows of a concrete structure in O(selected rows x longest row): gather, then scatter
    (``longest``, the longest row's entries, read off the structure before; a row outside
    ``[0, m)`` gives NaN)."""
    rows = jnp.atleast_1d(rows)
    safe = jnp.clip(rows, 0, indptr.shape[0] - 2)
    start, stop = indptr[safe], indptr[safe + 1]
    pos = start[:, None] + jnp.arange(longest, dtype=start.dtype)  # (s, longest)
    live = pos < stop[:, None]
    pos = jnp.where(live, pos, 0)
    if w.shape == (1,):  # a shared weight: one per entry
        w = jnp.broadcast_to(w, (max(indices.shape[0], 1),))
    vals = jnp.where(live, w[pos], 0)
    cols = indices[pos] if indices.shape[0] else jnp.zeros(pos.shape, jnp.int32)
    out = jnp.zeros((rows.shape[0], n), vals.dtype)
    out = out.at[jnp.arange(rows.shape[0])[:, None], cols].add(vals)
    out = _nan_outside(out, rows, m)
    return out[0] if scalar else out


def _nan_outside(out, rows, m: int):
    """``out`` with the rows whose index lies outside ``[0, m)`` set to NaN."""
    valid = (rows >= 0) & (rows < m)
    return jnp.where(valid[:, None], out, jnp.nan)


def csr_slice_rows(data: Any, indices: Any, indptr: Any, row_indices: Any, *,
                   shape: tuple[int, int], backend: str | None = None) -> jax.Array:
    """The rows ``row_indices`` of a CSR matrix, as a dense array.

    Args:
        data: weights ``(nnz,)``, or a scalar / ``(1,)`` shared by every entry.
        indices: column of each stored entry, ``(nnz,)``.
        indptr: ``(rows + 1,)`` row offsets.
        row_indices: an integer (one row) or a 1-D integer array (rows may repeat).
        shape: ``(rows, cols)`` of the matrix.
        backend: a backend of :func:`binary_csrmm` to compute with that product even when
            the structure is concrete (default: the gather for a concrete structure, else
            the product's default backend).

    Returns:
        ``(len(row_indices), cols)`` (``(cols,)`` for one row), dtype of ``data``;
        duplicate stored entries add up. A row out of range raises ``IndexError`` when
        ``row_indices`` is concrete and gives a row of NaN when it is traced.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> data, indices, indptr = jnp.array([1., 2., 3.]), jnp.array([0, 2, 1]), \\
        ...     jnp.array([0, 2, 3])
        >>> csr_slice_rows(data, indices, indptr, jnp.array([1, 0]), shape=(2, 3))
        Array([[0., 3., 0.],
               [1., 0., 2.]], dtype=float32)
        >>> jax.grad(lambda d: csr_slice_rows(d, indices, indptr, 1, shape=(2, 3)).sum())(data)
        Array([0., 0., 1.], dtype=float32)
    """
    who = "csr_slice_rows"
    m, n = _scaffold.check_shape(shape, who)
    rows = _row_selector(row_indices, m, who)
    scalar = rows.ndim == 0
    if backend is None and _concrete_structure(data, indices, indptr, m, n, who):
        longest = int(np.diff(np.asarray(indptr)).max(initial=0))
        w = _scaffold.float_weights(data, who=who, name="data")
        indices, indptr = (a if isinstance(a, jax.Array) else np.asarray(a)
                           for a in (indices, indptr))
        return _gather_rows(w, indices, indptr, rows, m=m, n=n, longest=longest,
                            scalar=scalar)
    rows = jnp.atleast_1d(rows)
    select = rows[None, :] == jnp.arange(m, dtype=rows.dtype)[:, None]  # (m, s) one-hot
    out = _kernels.binary_csrmm(data, indices, indptr, select, shape=(m, n),
                                transpose=True, backend=backend).T
    out = _nan_outside(out, rows, m)
    return out[0] if scalar else out


def csr_diag_position(indptr: Any, indices: Any, *, shape: tuple[int, int]):
    """Plan ``W + diag(d)`` for a CSR structure: where the entries go, where the diagonal is.

    The pattern of the result is the union of ``W``'s and the main diagonal
    ``(i, i), i < min(shape)``; a missing diagonal entry is inserted in its row after the
    stored entries of smaller column (its sorted place when the row is sorted). When a row
    stores ``(i, i)`` more than once, the diagonal is added to the first.

    Args:
        indptr: concrete ``(rows + 1,)`` row offsets.
        indices: concrete column of each stored entry, ``(nnz,)``.
        shape: ``(rows, cols)``.

    Returns:
        NumPy int32 arrays ``(new_indptr, new_indices, old_to_new, diag_dest)``: the new
        structure, the new place of each old entry and the place of each diagonal entry.
        Padding past ``indptr[-1]`` is left out of the new structure (its place is past
        the end).

    Example:
        >>> import numpy as np
        >>> plan = csr_diag_position(np.array([0, 1, 2]), np.array([1, 1]), shape=(2, 2))
        >>> [a.tolist() for a in plan]
        [[0, 2, 3], [0, 1, 1], [1, 2], [0, 2]]
    """
    who = "csr_diag_position"
    m, n = _scaffold.check_shape(shape, who)
    for name, a in (("indptr", indptr), ("indices", indices)):
        if isinstance(a, Tracer):
            raise TypeError(f"{who}: {name!r} must be concrete (the result's number of entries "
                            f"depends on its values); plan outside jit, then use csr_diag_add")
    indptr = np.asarray(indptr)
    indices = np.asarray(indices)
    _common.check_csr_args(who, np.zeros(indices.shape, np.float32), indices, indptr, (m, n))
    _common.validate_concrete(indices, indptr, (m, n), who)
    stored = indices.shape[0]
    indices = indices[:int(indptr[-1])]  # padding past indptr[-1] is left out of the result
    nnz, k = indices.shape[0], min(m, n)
    rows = np.repeat(np.arange(m), np.diff(indptr))
    local = np.arange(nnz) - indptr[rows]
    on_diag = indices == rows
    first = np.full(m, -1, np.int64)  # first stored diagonal entry of each row
    hits = np.flatnonzero(on_diag)
    first[rows[hits][::-1]] = hits[::-1]
    missing = np.flatnonzero(first[:k] < 0)
    below = np.bincount(rows[indices < rows], minlength=m)  # entries left of the diagonal
    # Sort key within a row: old entry j at 2j + 1, an inserted one at 2 * (entries before it).
    all_rows = np.concatenate([rows, missing])
    slots = np.concatenate([2 * local + 1, 2 * below[missing]])
    order = np.lexsort((slots, all_rows))
    where = np.empty_like(order)
    where[order] = np.arange(order.size)
    new_indices = np.concatenate([indices, missing])[order].astype(np.int32)
    new_indptr = np.zeros(m + 1, np.int64)
    np.cumsum(np.bincount(all_rows, minlength=m), out=new_indptr[1:])
    diag_dest = np.empty(k, np.int64)
    present = first[:k] >= 0
    diag_dest[present] = where[first[:k][present]]
    diag_dest[missing] = where[nnz:]
    # A padding entry goes to a place of its own past the end: dropped by csr_diag_add.
    old_to_new = np.concatenate([where[:nnz], new_indices.size + np.arange(stored - nnz)])
    return (new_indptr.astype(np.int32), new_indices, old_to_new.astype(np.int32),
            diag_dest.astype(np.int32))


def csr_diag_add(csr_value: Any, positions: tuple, diag_value: Any) -> jax.Array:
    """The weights of ``W + diag(d)`` on the structure a :func:`csr_diag_position` plan gives.

    Linear in both ``csr_value`` and ``diag_value``; traceable (``jit``, ``grad``, ``vmap``).

    Args:
        csr_value: ``W``'s weights ``(nnz,)``, or a scalar / ``(1,)`` shared by every entry.
        positions: the plan returned by :func:`csr_diag_position`.
        diag_value: ``(min(rows, cols),)`` values added to the diagonal.

    Returns:
        The ``(len(new_indices),)`` weights of the result.

    Example:
        >>> import numpy as np, jax.numpy as jnp
        >>> plan = csr_diag_position(np.array([0, 1, 2]), np.array([1, 1]), shape=(2, 2))
        >>> csr_diag_add(jnp.array([5., 6.]), plan, jnp.array([1., 2.]))
        Array([1., 5., 8.], dtype=float32)
    """
    who = "csr_diag_add"
    _, new_indices, old_to_new, diag_dest = positions
    nnz, k = old_to_new.shape[0], diag_dest.shape[0]
    w = _scaffold.float_weights(csr_value, who=who, name="csr_value")
    if w.shape not in ((nnz,), (1,)):
        raise ValueError(f"{who}: 'csr_value' must have shape ({nnz},) (one weight per stored "
                         f"entry of the planned matrix) or (1,), got {w.shape}")
    d = diag_value if isinstance(diag_value, (jax.Array, Tracer)) else np.asarray(diag_value)
    if d.shape != (k,):
        raise ValueError(f"{who}: 'diag_value' must have shape (min(rows, cols),) = ({k},), "
                         f"got {d.shape}")
    return _diag_values(w, d, old_to_new, diag_dest, size=int(new_indices.shape[0]))


@functools.partial(jax.jit, static_argnames="size")
def _diag_values(w, d, old_to_new, diag_dest, *, size: int):
    """The ``size`` weights of a planned ``W + diag(d)`` (one compiled program a shape)."""
    nnz = old_to_new.shape[0]
    if w.shape == (1,) and nnz != 1:
        w = jnp.broadcast_to(w, (nnz,))
    dtype = jnp.result_type(w, d)
    out = jnp.zeros((size,), dtype)
    out = out.at[old_to_new].set(w.astype(dtype), unique_indices=True, mode="drop")
    return out.at[diag_dest].add(d.astype(dtype))


def diag_add(data: Any, indices: Any, indptr: Any, diag: Any, *, shape: tuple[int, int]):
    """``W + diag(d)`` for a CSR ``W``, inserting the diagonal entries it does not store.

    Args:
        data: weights ``(nnz,)``, or a scalar / ``(1,)`` shared by every entry.
        indices: concrete column of each stored entry, ``(nnz,)``.
        indptr: concrete ``(rows + 1,)`` row offsets.
        diag: ``(min(rows, cols),)`` values added to the diagonal.
        shape: ``(rows, cols)``.

    Returns:
        ``(new_data, new_indices, new_indptr)`` of the result (same shape). ``data`` and
        ``diag`` may be traced (for ``grad``); the structure must be concrete (see
        :func:`csr_diag_position` to plan once and reuse under ``jit``).

    Example:
        >>> import numpy as np, jax.numpy as jnp
        >>> d, i, p = diag_add(jnp.array([5., 6.]), np.array([1, 1]), np.array([0, 1, 2]),
        ...                    jnp.array([1., 2.]), shape=(2, 2))
        >>> d.tolist(), i.tolist(), p.tolist()
        ([1.0, 5.0, 8.0], [0, 1, 1], [0, 2, 3])
    """
    plan = csr_diag_position(indptr, indices, shape=shape)
    return csr_diag_add(data, plan, diag), jax.device_put(plan[1]), jax.device_put(plan[0])


class CSRRowBlocks(NamedTuple):
    """Row blocks of a CSR matrix, stacked on a leading block axis (see :func:`csr_row_blocks`).

    Attributes:
        data: ``(blocks, length)`` weights, zero on the padding (``(blocks, 1)`` when shared).
        indices: ``(blocks, length)`` columns, zero on the padding.
        indptr: ``(blocks, rows_per_block + 1)`` offsets local to each block.
        block_shape: ``(rows_per_block, cols)``, the ``shape`` of one block's products.

    Example:
        >>> import numpy as np
        >>> CSRRowBlocks(np.zeros((2, 1)), np.zeros((2, 1)), np.zeros((2, 2)), (1, 3)).block_shape
        (1, 3)
    """

    data: np.ndarray
    indices: np.ndarray
    indptr: np.ndarray
    block_shape: tuple[int, int]


def csr_row_blocks(W, num_blocks: int) -> CSRRowBlocks:
    """Split a concrete :class:`CSR` into ``num_blocks`` contiguous row blocks.

    Block ``b`` holds rows ``b * r : (b + 1) * r``, ``r = ceil(rows / num_blocks)``; the last
    blocks get empty rows where ``rows`` does not divide evenly. Every block's ``data`` and
    ``indices`` are padded to the longest block's entry count (padding past its
    ``indptr[-1]``, which the products ignore), so the stacked arrays can be placed on a mesh
    axis with ``jax.device_put`` and each device runs the CSR products on its own block
    inside ``jax.shard_map`` (docs/distributed.md, "Splitting a CSR by rows"). The rows of
    ``W @ x`` come out blocked (``blocks * r`` of them); ``x @ W`` takes ``x`` padded to
    ``blocks * r`` rows and sums the blocks' partial outputs (``jax.lax.psum``).

    Args:
        W: a :class:`CSR` with concrete arrays (built outside ``jit``).
        num_blocks: the number of blocks, e.g. the size of the mesh axis.

    Returns:
        A :class:`CSRRowBlocks` of NumPy arrays.

    Example:
        >>> import numpy as np
        >>> from primforge.ops import CSR, csrmv
        >>> W = CSR.from_dense(np.array([[1., 0., 2.], [0., 0., 0.], [0., 3., 0.]]))
        >>> blocks = csr_row_blocks(W, 2)
        >>> blocks.data.shape, blocks.indptr.tolist(), blocks.block_shape
        ((2, 2), [[0, 2, 2], [0, 1, 1]], (2, 3))
        >>> x = np.ones(3, np.float32)
        >>> [csrmv(d, i, p, x, shape=blocks.block_shape).tolist()
        ...  for d, i, p in zip(blocks.data, blocks.indices, blocks.indptr)]
        [[3.0, 0.0], [3.0, 0.0]]
    """
    who = "csr_row_blocks"
    if getattr(W, "_TRANSPOSED", True) or not hasattr(W, "indptr"):  # a CSR, not a CSC
        raise TypeError(f"{who}: 'W' must be a CSR matrix, got {type(W).__name__}")
    if isinstance(num_blocks, bool) or not isinstance(num_blocks, (int, np.integer)) \
            or not 1 <= num_blocks < 2**31 - 1:
        raise ValueError(f"{who}: 'num_blocks' must be a positive integer below 2**31 - 1, "
                         f"got {num_blocks!r}")
    m, n = W.shape
    data, indices, indptr = (np.asarray(a) for a in (W.data, W.indices, W.indptr))
    _common.validate_concrete(indices, indptr, (m, n), who)
    homo = W.homogeneous
    r = -(-m // num_blocks) if m else 0
    ends = np.minimum(np.arange(num_blocks + 1) * r, m)
    starts = indptr[ends]  # global entry offset of each block boundary
    length = max(1, int(np.max(np.diff(starts))) if num_blocks else 1)
    out_data = np.zeros((num_blocks, 1 if homo else length), data.dtype)
    out_idx = np.zeros((num_blocks, length), indices.dtype)
    out_ptr = np.zeros((num_blocks, r + 1), indptr.dtype)
    for b in range(num_blocks):
        lo, hi = int(starts[b]), int(starts[b + 1])
        rows = indptr[ends[b]:ends[b + 1] + 1] - lo
        out_ptr[b, :rows.size] = rows
        out_ptr[b, rows.size:] = hi - lo  # empty rows past the matrix's last
        out_idx[b, :hi - lo] = indices[lo:hi]
        if homo:
            out_data[b] = data[0]
        else:
            out_data[b, :hi - lo] = data[lo:hi]
    return CSRRowBlocks(out_data, out_idx, out_ptr, (r, n))
