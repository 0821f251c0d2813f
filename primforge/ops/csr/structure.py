"""Shared pieces of the CSR operators: argument checks, row ids, structural validation.

Shape checks run at trace time; structural checks raise when the arrays are concrete and
run as an opt-in runtime check under ``jit``.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from primforge._compat import Tracer
from primforge.ops._pallas_common import check_float_weights
from primforge.ops._scaffold import check_shape as check_shape_param

__all__ = [
    "CSRStructureError",
    "check_csr_args",
    "check_float_weights",
    "check_shape_param",
    "clip_to",
    "indptr_ok",
    "is_homogeneous",
    "live_entries",
    "row_ids",
    "structure_ok",
    "validate_concrete",
    "validate_runtime",
]


class CSRStructureError(ValueError):
    """A CSR matrix's ``indices`` or ``indptr`` are inconsistent with its shape.

    Example:
        >>> issubclass(CSRStructureError, ValueError)
        True
    """


def check_csr_args(who: str, data, indices, indptr, shape: Sequence[int]) -> bool:
    """Check the CSR arrays' shapes and dtypes (trace time); return True when homogeneous."""
    m, _ = shape
    if jnp.ndim(indices) != 1:
        raise ValueError(f"{who}: 'indices' must be 1-D (nnz,), got shape {jnp.shape(indices)}")
    if jnp.ndim(indptr) != 1 or jnp.shape(indptr)[0] != m + 1:
        raise ValueError(
            f"{who}: 'indptr' must have shape (rows + 1,) = ({m + 1},) for shape {tuple(shape)}, "
            f"got {jnp.shape(indptr)}"
        )
    for name, arr in (("indices", indices), ("indptr", indptr)):
        if not jnp.issubdtype(jnp.result_type(arr), jnp.integer):
            raise TypeError(f"{who}: '{name}' must be an integer array, got {jnp.result_type(arr)}")
    nnz = jnp.shape(indices)[0]
    if not jnp.issubdtype(jnp.result_type(data), jnp.floating):
        raise TypeError(
            f"{who}: 'data' (the weights) must be floating point, got {jnp.result_type(data)}")
    dshape = tuple(jnp.shape(data))
    if dshape == (1,):
        return is_homogeneous(data, indices)
    if dshape != (nnz,):
        raise ValueError(
            f"{who}: 'data' must have shape (nnz,) = ({nnz},) (one weight per synapse) or (1,) "
            f"(one shared weight), got {dshape}"
        )
    return False


def is_homogeneous(data, indices) -> bool:
    """Whether ``data`` is one weight shared by every stored entry (from shapes alone).

    ``data`` of shape ``(1,)`` is shared unless there is exactly one stored entry, where
    both readings agree and it is called heterogeneous.

    Example:
        >>> import numpy as np
        >>> is_homogeneous(np.ones(1), np.zeros(5)), is_homogeneous(np.ones(5), np.zeros(5))
        (True, False)
    """
    return tuple(jnp.shape(data)) == (1,) and jnp.shape(indices)[0] != 1


def clip_to(w: jax.Array, lo: float | None, hi: float | None) -> jax.Array:
    """``w`` clipped to ``[lo, hi]`` in its own dtype; ``None`` leaves that side open.

    Example:
        >>> import jax.numpy as jnp
        >>> clip_to(jnp.array([-1., .5, 2.]), 0., None).tolist()
        [0.0, 0.5, 2.0]
    """
    if lo is not None:
        w = jnp.maximum(w, jnp.asarray(lo, w.dtype))
    if hi is not None:
        w = jnp.minimum(w, jnp.asarray(hi, w.dtype))
    return w


@functools.partial(jax.jit, static_argnums=1)
def row_ids(indptr: jax.Array, nnz: int) -> jax.Array:
    """Row index of every stored entry, from ``indptr`` in O(nnz + rows) (jax.numpy).

    Entry ``k`` belongs to row ``i`` when ``indptr[i] <= k < indptr[i + 1]``: the row is the
    number of row ends at or before ``k``. Padding entries (``k >= indptr[-1]``) get row
    ``rows``, one past the last: scatters and segment sums with ``mode="drop"`` skip them.

    Example:
        >>> import jax.numpy as jnp
        >>> row_ids(jnp.array([0, 2, 2, 3]), 5)
        Array([0, 0, 2, 3, 3], dtype=int32)
    """
    marks = jnp.zeros((nnz,), jnp.int32).at[indptr[1:]].add(1, mode="drop")
    return jnp.cumsum(marks, dtype=jnp.int32)


def indptr_ok(indptr: jax.Array, nnz: int) -> jax.Array:
    """Traceable boolean scalar: does ``indptr`` run non-decreasingly from 0 to at most ``nnz``?

    ``nnz`` is the length of ``indices``; entries from ``indptr[-1]`` on are padding.

    Example:
        >>> import jax.numpy as jnp
        >>> bool(indptr_ok(jnp.array([0, 2, 2, 3]), 4)), bool(indptr_ok(jnp.array([0, 2, 1]), 2))
        (True, False)
    """
    return (indptr[0] == 0) & (indptr[-1] <= nnz) & jnp.all(indptr[1:] >= indptr[:-1])


@functools.partial(jax.jit, static_argnums=1)
def live_entries(indptr: jax.Array, nnz: int) -> jax.Array:
    """Boolean ``(nnz,)`` mask of the stored entries, False on the padding past ``indptr[-1]``.

    Example:
        >>> import jax.numpy as jnp
        >>> live_entries(jnp.array([0, 1, 2]), 4).tolist()
        [True, True, False, False]
    """
    return jnp.arange(nnz) < indptr[-1]


def structure_ok(indices: jax.Array, indptr: jax.Array, n_cols: int) -> jax.Array:
    """Traceable boolean scalar: is the (indices, indptr) pair a valid CSR structure?

    Example:
        >>> import jax.numpy as jnp
        >>> bool(structure_ok(jnp.array([0, 3]), jnp.array([0, 1, 2]), 4))
        True
        >>> bool(structure_ok(jnp.array([0, 4]), jnp.array([0, 1, 2]), 4))
        False
    """
    nnz = indices.shape[0]
    ok = indptr_ok(indptr, nnz)
    if nnz:
        inside = (indices >= 0) & (indices < n_cols)
        ok = ok & jnp.all(inside | ~live_entries(indptr, nnz))
    return ok


def _problems(indices: np.ndarray, indptr: np.ndarray, shape: tuple[int, int]) -> list[str]:
    _m, n = shape
    nnz = indices.shape[0]
    found = []
    if indptr[0] != 0:
        found.append(f"indptr[0] must be 0, got {int(indptr[0])}")
    if indptr[-1] > nnz:
        found.append(
            f"indptr[-1] must be at most len(indices) = {nnz} (entries past it are padding), "
            f"got {int(indptr[-1])}")
    drops = np.flatnonzero(np.diff(indptr) < 0)
    if drops.size:
        i = int(drops[0])
        found.append(
            f"indptr must be non-decreasing, but indptr[{i}] = {int(indptr[i])} > "
            f"indptr[{i + 1}] = {int(indptr[i + 1])} ({drops.size} decreasing step(s))"
        )
    indices = indices[:max(0, min(int(indptr[-1]), nnz))]  # the padding is never read
    if indices.size:
        bad = np.flatnonzero((indices < 0) | (indices >= n))
        if bad.size:
            k = int(bad[0])
            found.append(
                f"indices must lie in [0, {n}) for {n} columns, but indices[{k}] = "
                f"{int(indices[k])} ({bad.size} entr{'y' if bad.size == 1 else 'ies'} out of range)"
            )
    return found


def _is_concrete(x) -> bool:
    return not isinstance(x, Tracer)


def validate_concrete(indices, indptr, shape: tuple[int, int], who: str = "CSR") -> None:
    """Raise :class:`CSRStructureError` if concrete ``indices``/``indptr`` are malformed.

    Does nothing when either array is a tracer (use :func:`validate_runtime` there).

    Example:
        >>> import numpy as np
        >>> validate_concrete(np.array([0, 5]), np.array([0, 1, 2]), (2, 3))
        Traceback (most recent call last):
        ...
        primforge.ops.csr.structure.CSRStructureError: CSR: indices must lie in [0, 3)
        for 3 columns, but indices[1] = 5 (1 entry out of range)
    """
    if not (_is_concrete(indices) and _is_concrete(indptr)):
        return
    found = _problems(np.asarray(indices), np.asarray(indptr), shape)
    if found:
        raise CSRStructureError(f"{who}: " + "; ".join(found))


def validate_runtime(indices, indptr, shape: tuple[int, int], who: str = "CSR") -> None:
    """Check the structure when the computation runs, even under ``jit``.

    Concrete arrays are checked at once. Traced arrays get a host callback that raises a
    :class:`CSRStructureError` when the compiled function runs (JAX reports it as a runtime
    error whose message contains the problem).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> @jax.jit
        ... def f(indices, indptr):
        ...     validate_runtime(indices, indptr, (2, 3))
        ...     return indptr
        >>> f(jnp.array([0, 2]), jnp.array([0, 1, 2])).tolist()
        [0, 1, 2]
    """
    if _is_concrete(indices) and _is_concrete(indptr):
        validate_concrete(indices, indptr, shape, who)
        return

    def check(idx, ptr):
        found = _problems(np.asarray(idx), np.asarray(ptr), shape)
        if found:
            raise CSRStructureError(f"{who}: " + "; ".join(found))

    jax.debug.callback(check, indices, indptr)
