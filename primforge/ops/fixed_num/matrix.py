"""Fixed-number connectivity: every neuron on one side has exactly ``k`` partners.

:class:`FixedNum` is the pytree for a ``(n_pre, n_post)`` matrix stored as ``(m, k)``
indices and weights (``per='pre'`` stores ``W``, ``per='post'`` stores ``W.T``); ``@``
maps onto the kernels of :mod:`primforge.ops.fixed_num.api`.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from primforge.ops import _scaffold
from primforge.ops.fixed_num import api as _fixed_num_kernels
from primforge.ops.fixed_num.api import (
    binary_fixed_num_mm,
    binary_fixed_num_mm_p,
    binary_fixed_num_mv,
    binary_fixed_num_mv_p,
    check_structure_args,
    fixed_num_mm,
    fixed_num_mm_p,
    fixed_num_mv,
    fixed_num_mv_p,
    safe_indices,
)
from primforge.ops.packed import PackedEvents, as_events
from primforge.utils import dataclass, field

__all__ = [
    "FixedNum",
    "FixedNumStructureError",
    "binary_fixed_num_mm",
    "binary_fixed_num_mm_p",
    "binary_fixed_num_mv",
    "binary_fixed_num_mv_p",
    "fixed_num",
    "fixed_num_mm",
    "fixed_num_mm_p",
    "fixed_num_mv",
    "fixed_num_mv_p",
]

KERNELS = _fixed_num_kernels.KERNELS  # (binary, matrix) -> kernel


class FixedNumStructureError(ValueError):
    """A fixed-number matrix's ``indices`` do not fit its shape.

    Example:
        >>> issubclass(FixedNumStructureError, ValueError)
        True
    """


# ----------------------------------------------------------------------------- the matrix class
def _problems(indices: np.ndarray, n: int) -> str | None:
    if indices.size == 0:
        return None
    bad = np.flatnonzero(((indices < 0) | (indices >= n)).ravel())
    if not bad.size:
        return None
    r, c = np.unravel_index(int(bad[0]), indices.shape)
    return (f"indices must lie in [0, {n}), but indices[{r}, {c}] = {int(indices[r, c])} "
            f"({bad.size} entr{'y' if bad.size == 1 else 'ies'} out of range)")


@dataclass
class FixedNum:
    """A ``(n_pre, n_post)`` matrix where each neuron on one side has exactly ``k`` partners.

    Attributes:
        weights: ``(rows, k)`` (one per synapse) or ``(1,)`` (shared).
        indices: ``(rows, k)`` integers. ``per='pre'``: rows are presynaptic neurons and
            ``indices[i]`` are the ``k`` targets of ``i`` (in ``[0, n_post)``);
            ``per='post'``: rows are postsynaptic neurons and ``indices[j]`` are the ``k``
            sources of ``j`` (in ``[0, n_pre)``).
        shape: ``(n_pre, n_post)``; static.
        per: ``'pre'`` or ``'post'``; static.

    ``W @ x`` and ``x @ W`` accept vectors and matrices; bool or integer ``x`` are binary
    events. With ``per='pre'``, ``spikes @ W`` only visits the rows of firing neurons.
    Build from concrete arrays with :meth:`from_indices` (validates the indices once) or
    draw random connectivity with :func:`fixed_num`.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> W = FixedNum.from_indices([[1, 2], [0, 2]], 0.5, shape=(2, 3))
        >>> W.todense().tolist()
        [[0.0, 0.5, 0.5], [0.5, 0.0, 0.5]]
        >>> jnp.array([True, False]) @ W
        Array([0. , 0.5, 0.5], dtype=float32)
        >>> W.T.per, (W.T @ jnp.array([True, False])).tolist()
        ('post', [0.0, 0.5, 0.5])
        >>> V = W.with_data(jnp.ones((2, 2)))
        >>> jax.grad(lambda w: (jnp.array([1., 2.]) @ V.with_data(w)).sum())(V.weights)
        Array([[1., 1.],
               [2., 2.]], dtype=float32)
    """

    weights: jax.Array
    indices: jax.Array
    shape: tuple[int, int] = field(static=True)
    per: str = field(static=True, default="pre")

    def __post_init__(self):
        if self.per not in ("pre", "post"):
            raise ValueError(f"FixedNum: 'per' must be 'pre' or 'post', got {self.per!r}")
        object.__setattr__(self, "shape", _scaffold.check_shape(self.shape, "FixedNum"))
        _scaffold.check_int32(self.indices, "FixedNum", "indices")
        weights = self.weights
        if not hasattr(weights, "shape") or jnp.ndim(weights) == 0:
            weights = _scaffold.float_weights(weights)
        object.__setattr__(self, "weights", weights)
        check_structure_args("FixedNum", self.weights, self.indices, self._stored_shape)

    @property
    def _stored_shape(self) -> tuple[int, int]:
        n_pre, n_post = self.shape
        return (n_pre, n_post) if self.per == "pre" else (n_post, n_pre)

    @property
    def k(self) -> int:
        """Partners per neuron (columns of ``indices``).

        Example:
            >>> import jax.numpy as jnp
            >>> from primforge.ops import FixedNum
            >>> W = FixedNum.from_indices([[1, 2], [0, 2]], 0.5, shape=(2, 3))
            >>> W.k
            2
        """
        return int(self.indices.shape[1])

    @property
    def homogeneous(self) -> bool:
        """Whether every synapse shares one weight (``weights.shape == (1,)``).

        Example:
            >>> import jax.numpy as jnp
            >>> from primforge.ops import FixedNum
            >>> W = FixedNum.from_indices([[1, 2], [0, 2]], 0.5, shape=(2, 3))
            >>> W.homogeneous
            True
        """
        return jnp.ndim(self.weights) == 1

    @property
    def dtype(self):
        """Dtype of the weights.

        Example:
            >>> import jax.numpy as jnp
            >>> from primforge.ops import FixedNum
            >>> W = FixedNum.from_indices([[1, 2], [0, 2]], 0.5, shape=(2, 3))
            >>> W.dtype
            dtype('float32')
        """
        return self.weights.dtype

    @classmethod
    def from_indices(cls, indices: Any, weights: Any = 1.0, *, shape: tuple[int, int],
                     per: str = "pre", dtype=None) -> FixedNum:
        """Build from concrete arrays, checking once that every index is in range.

        Args:
            indices: ``(rows, k)`` integers (see the class docstring for ``per``).
            weights: a scalar (shared) or ``(rows, k)`` array (one per synapse).
            shape: ``(n_pre, n_post)``.
            per: ``'pre'`` (``k`` targets per presynaptic neuron) or ``'post'``.
            dtype: weight dtype (default: that of ``weights``, float32 for Python numbers).

        Raises:
            FixedNumStructureError: an index lies outside ``[0, n_post)`` (``per='pre'``)
                or ``[0, n_pre)`` (``per='post'``).

        Example:
            >>> FixedNum.from_indices([[0, 5]], 1.0, shape=(1, 3))
            Traceback (most recent call last):
            ...
            primforge.ops.fixed_num.matrix.FixedNumStructureError: FixedNum: indices must lie
            in [0, 3), but indices[0, 1] = 5 (1 entry out of range)
        """
        ind = np.asarray(indices)
        if ind.ndim == 2 and ind.size and not np.issubdtype(ind.dtype, np.integer):
            raise TypeError(f"FixedNum: 'indices' must be an integer array, got {ind.dtype}")
        if ind.ndim == 2 and ind.size == 0:
            ind = ind.astype(np.int32)
        w = np.asarray(weights)
        if dtype is not None:
            w = w.astype(dtype)
        elif not np.issubdtype(w.dtype, np.floating) or isinstance(weights, float):
            w = w.astype(np.float32)
        # device_put, not jnp.asarray: the same dtypes without a compiled copy per shape
        obj = cls(jax.device_put(w.reshape(1) if w.ndim == 0 else w), jax.device_put(ind),
                  shape=shape, per=per)
        problem = _problems(ind, obj._stored_shape[1])
        if problem:
            raise FixedNumStructureError("FixedNum: " + problem)
        return obj

    def with_data(self, weights: Any) -> FixedNum:
        """The same structure with new weights (``(rows, k)``, ``(1,)`` or a scalar).

        Example:
            >>> import jax.numpy as jnp
            >>> from primforge.ops import FixedNum
            >>> W = FixedNum.from_indices([[1, 2], [0, 2]], 0.5, shape=(2, 3))
            >>> W.with_data(jnp.array([[1., 2.], [3., 4.]])).todense().tolist()
            [[0.0, 1.0, 2.0], [3.0, 0.0, 4.0]]
        """
        return FixedNum(_scaffold.float_weights(weights), self.indices, shape=self.shape,
                        per=self.per)

    @property
    def T(self) -> FixedNum:
        """The transpose ``(n_post, n_pre)``: the same arrays with ``per`` flipped.

        Example:
            >>> import jax.numpy as jnp
            >>> from primforge.ops import FixedNum
            >>> W = FixedNum.from_indices([[1, 2], [0, 2]], 0.5, shape=(2, 3))
            >>> W.T.shape, W.T.per
            ((3, 2), 'post')
        """
        return FixedNum(self.weights, self.indices, shape=(self.shape[1], self.shape[0]),
                        per="post" if self.per == "pre" else "pre")

    def todense(self) -> jax.Array:
        """The dense ``(n_pre, n_post)`` array (traceable; masked entries are left out).

        Example:
            >>> FixedNum.from_indices([[1], [1]], 2.0, shape=(2, 2), per='post').todense().tolist()
            [[0.0, 0.0], [2.0, 2.0]]
        """
        return _dense(self.weights, self.indices, self._stored_shape, self.homogeneous,
                      self.per == "pre")

    def _product(self, x, *, transpose_w: bool, backend):
        """``W @ x`` (``transpose_w=False``) or ``W.T @ x`` for a vector or matrix ``x``."""
        # W = A (per='pre') or A.T (per='post'); W @ x uses A.T exactly when per='post'.
        transpose = (self.per == "post") != transpose_w
        if isinstance(x, PackedEvents) and x.words.ndim == 1:  # read packed in the kernel
            return binary_fixed_num_mv(self.weights, self.indices, x,
                                       shape=self._stored_shape, transpose=transpose,
                                       backend=backend)
        x = jnp.asarray(as_events(x))
        binary = not jnp.issubdtype(x.dtype, jnp.inexact)
        if x.ndim not in (1, 2):
            raise ValueError(
                f"FixedNum @ operand must be a vector or a matrix, got shape {x.shape}")
        fn = {(False, 1): fixed_num_mv, (True, 1): binary_fixed_num_mv,
              (False, 2): fixed_num_mm, (True, 2): binary_fixed_num_mm}[(binary, x.ndim)]
        return fn(self.weights, self.indices, x, shape=self._stored_shape, transpose=transpose,
                  backend=backend)

    def matmul(self, x: Any, *, backend: str | None = None) -> jax.Array:
        """``self @ x`` with an explicit backend choice.

        Example:
            >>> import jax.numpy as jnp
            >>> from primforge.ops import FixedNum
            >>> W = FixedNum.from_indices([[1, 2], [0, 2]], 0.5, shape=(2, 3))
            >>> W.matmul(jnp.array([1., 1., 1.]), backend='jax').tolist()
            [1.0, 1.0]
        """
        return self._product(x, transpose_w=False, backend=backend)

    def rmatmul(self, x: Any, *, backend: str | None = None) -> jax.Array:
        """``x @ self`` with an explicit backend choice (vector or ``(cols, n_pre)`` matrix).

        Example:
            >>> import jax.numpy as jnp
            >>> from primforge.ops import FixedNum
            >>> W = FixedNum.from_indices([[1, 2], [0, 2]], 0.5, shape=(2, 3))
            >>> W.rmatmul(jnp.array([True, False]), backend='jax').tolist()
            [0.0, 0.5, 0.5]
        """
        if isinstance(x, PackedEvents) and x.words.ndim == 1:
            return self._product(x, transpose_w=True, backend=backend)
        x = jnp.asarray(as_events(x))
        if x.ndim == 2:
            return self._product(x.T, transpose_w=True, backend=backend).T
        return self._product(x, transpose_w=True, backend=backend)

    __array_ufunc__ = None  # make NumPy's ``ndarray @ W`` defer to ``__rmatmul__``

    def __matmul__(self, x: Any) -> jax.Array:
        return self.matmul(x)

    def __rmatmul__(self, x: Any) -> jax.Array:
        return self.rmatmul(x)


@functools.partial(jax.jit, static_argnums=(2, 3, 4))
def _dense(weights, indices, shape: tuple[int, int], homogeneous: bool, per_pre: bool):
    """The dense array of stored rows ``shape``, transposed unless ``per_pre`` (one
    compiled program a shape)."""
    m, n = shape
    safe, _ = safe_indices(indices, n)
    rows = jnp.broadcast_to(jnp.arange(m)[:, None], indices.shape)
    vals = jnp.broadcast_to(weights[0] if homogeneous else weights, indices.shape)
    a = jnp.zeros((m, n), weights.dtype).at[rows, safe].add(vals, mode="drop")
    return a if per_pre else a.T


def _draw_partners(rng, rows: int, pool: int, k: int, replace: bool) -> np.ndarray:
    """``(rows, k)`` partners in ``[0, pool)``: with repeats, or ``k`` distinct ones per row."""
    if k == 0 or rows == 0:
        return np.zeros((rows, k), np.int32)
    if replace:
        return rng.integers(0, pool, size=(rows, k))
    # k distinct values per row: the k smallest of ``pool`` random keys per row, in
    # blocks of rows to bound memory (``argpartition`` is O(pool) per row).
    ind = np.empty((rows, k), np.int64)
    block = max(1, 4_000_000 // max(pool, 1))
    for r0 in range(0, rows, block):
        keys = rng.random((min(block, rows - r0), pool))
        ind[r0:r0 + block] = np.argpartition(keys, k - 1, axis=1)[:, :k]
    ind.sort(axis=1)
    return ind


def fixed_num(n_pre: int, n_post: int, k: int, *, per: str = "pre", weight: Any = 1.0,
              seed: int | np.random.Generator = 0, replace: bool = False,
              allow_self_connections: bool = True, dtype=jnp.float32) -> FixedNum:
    """Random fixed-number connectivity: each neuron on the ``per`` side gets ``k`` partners.

    Args:
        n_pre: number of presynaptic neurons (rows).
        n_post: number of postsynaptic neurons (columns).
        k: partners per neuron.
        per: ``'pre'`` (``k`` targets per presynaptic neuron) or ``'post'`` (``k`` sources
            per postsynaptic neuron).
        weight: a number (one shared weight) or ``weight(rng, shape)`` returning one weight
            per synapse.
        seed: integer seed or a ``numpy.random.Generator``.
        replace: draw partners with replacement (repeats allowed); without replacement
            ``k`` may not exceed the number of candidates.
        allow_self_connections: when False, neuron ``i`` is never its own partner (square
            matrices only).
        dtype: weight dtype.

    Example:
        >>> W = fixed_num(100, 50, 5, seed=0)
        >>> W.indices.shape, W.homogeneous, bool((W.todense() != 0).sum(axis=1).min() == 5)
        ((100, 5), True, True)
    """
    if per not in ("pre", "post"):
        raise ValueError(f"fixed_num: 'per' must be 'pre' or 'post', got {per!r}")
    n_pre, n_post, k = int(n_pre), int(n_post), int(k)
    if min(n_pre, n_post, k) < 0:
        raise ValueError(f"fixed_num: sizes and k must be non-negative, got {(n_pre, n_post, k)}")
    n_pre, n_post = _scaffold.check_shape((n_pre, n_post), "fixed_num", int32=True)
    k = _scaffold.check_count(k, "fixed_num", "k")
    rows, cands = (n_pre, n_post) if per == "pre" else (n_post, n_pre)
    self_free = not allow_self_connections
    if self_free and n_pre != n_post:
        raise ValueError("fixed_num: allow_self_connections=False needs n_pre == n_post")
    pool = cands - (1 if self_free else 0)
    if not replace and k > pool:
        raise ValueError(f"fixed_num: k = {k} exceeds the {pool} candidate partners; "
                         f"use replace=True or a smaller k")
    if replace and k > 0 and pool <= 0:
        raise ValueError("fixed_num: no candidate partners to draw from")
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    ind = _draw_partners(rng, rows, pool, k, replace)
    if self_free and ind.size:
        ind = ind + (ind >= np.arange(rows)[:, None])  # skip the diagonal
    ind = ind.astype(np.int32)
    if callable(weight):
        w = np.asarray(weight(rng, (rows, k)), dtype=dtype)
        if w.shape != (rows, k):
            raise ValueError(f"fixed_num: weight(rng, shape) must return shape {(rows, k)}, "
                             f"got {w.shape}")
    else:
        w = np.full((1,), weight, dtype=dtype)
    return FixedNum.from_indices(ind, w, shape=(n_pre, n_post), per=per)
