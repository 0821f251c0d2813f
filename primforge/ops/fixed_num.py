"""Fixed-number connectivity: every neuron on one side has exactly ``k`` partners.

Design:
    * Storage is an ``(m, k)`` integer array ``indices`` plus weights, either one shared
      weight (shape ``(1,)``, a scalar is accepted) or one per entry (shape ``(m, k)``).
      Row ``i`` describes the ``k`` partners of neuron ``i``: the stored matrix ``A`` of
      shape ``(m, n)`` has ``A[i, indices[i, j]] += weights[i, j]`` (repeated partners add).
    * Four :class:`~primforge.XLACustomKernel` objects compute ``A @ x`` (gather ``k``
      inputs per row) or, with ``transpose=True``, ``A.T @ x`` (scatter the ``k`` entries of
      each row whose input is non-zero: event-driven), for float (``fixed_num_mv``,
      ``fixed_num_mm``) and binary (``binary_fixed_num_mv``, ``binary_fixed_num_mm``) inputs.
    * :class:`FixedNum` is the user-facing pytree for a ``(n_pre, n_post)`` matrix ``W``:
      ``per='pre'`` stores ``A = W`` (each presynaptic neuron has ``k`` targets, so
      ``spikes @ W`` is the event-driven direction) and ``per='post'`` stores ``A = W.T``
      (each postsynaptic neuron has ``k`` sources, so ``spikes @ W`` gathers ``k`` inputs per
      target). ``@`` on either side maps onto the two kernel directions.
    * Validation happens once, when the structure is built from concrete arrays
      (:meth:`FixedNum.from_indices`, :func:`fixed_num`): indices outside ``[0, n)`` raise
      :class:`FixedNumStructureError`. In the hot path every backend *masks* an index
      outside ``[0, n)``: the entry is skipped and no memory outside the arrays is touched;
      there is no extra validation pass over the stored entries.
    * Backends: ``jax`` (reference, every platform; GPU/TPU default), ``numba`` (CPU
      default, :mod:`primforge.ops._numba_fixed_num`) and ``pallas`` (opt-in; Triton on the
      GPU, interpreted on the CPU, :mod:`primforge.ops._pallas_fixed_num`).
    * Autodiff, batching and benchmarking follow the CSR kernels: bilinear in weights and
      input (JVP is two calls; transposes are the flipped float kernel, one unit-weight call
      for a shared weight, a gather for per-entry weights); ``vmap`` over the input alone is
      one matrix call, other batching is a ``lax.map``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from primforge import _compat
from primforge.kernel.kernel import XLACustomKernel
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

KERNELS: dict[tuple[bool, bool], XLACustomKernel] = {}  # (binary, matrix) -> kernel


class FixedNumStructureError(ValueError):
    """A fixed-number matrix's ``indices`` do not fit its shape.

    Example:
        >>> issubclass(FixedNumStructureError, ValueError)
        True
    """


def _name(binary: bool, matrix: bool) -> str:
    return ("binary_" if binary else "") + ("fixed_num_mm" if matrix else "fixed_num_mv")


def _is_shared(weights) -> bool:
    return jnp.ndim(weights) == 1


def _safe_indices(indices, n: int):
    """``indices`` with every entry outside ``[0, n)`` replaced by ``n`` (dropped/filled)."""
    ok = (indices >= 0) & (indices < n)
    return jnp.where(ok, indices, n), ok


# ----------------------------------------------------------------------------- jax reference
def _jax_generator(binary: bool, matrix: bool):
    def generate(*, ins, outs, shape, transpose, **_):
        _m, n = shape
        dtype = outs[0].dtype
        shared = len(ins[0].shape) == 1

        def kernel(weights, indices, x):
            ev = (x != 0).astype(dtype) if binary else x.astype(dtype)
            w = weights.astype(dtype)
            w = w[0] if shared else (w[..., None] if matrix else w)
            if transpose:  # out[indices[i, j]] += w_ij x[i]
                safe, _ = _safe_indices(indices, outs[0].shape[0])
                src = ev[:, None, :] if matrix else ev[:, None]
                contrib = jnp.broadcast_to(w * src, indices.shape + tuple(ev.shape[1:]))
                return jnp.zeros(outs[0].shape, dtype).at[safe].add(contrib, mode="drop")
            safe, _ = _safe_indices(indices, n)  # out[i] = sum_j w_ij x[indices[i, j]]
            got = ev.at[safe].get(mode="fill", fill_value=0)
            return jnp.sum(w * got, axis=1).astype(dtype)

        return kernel

    return generate


def _numba_generator(binary: bool, matrix: bool):
    def generate(*, ins, transpose, **_):
        from primforge.ops import _numba_fixed_num

        make = _numba_fixed_num.mm_kernel if matrix else _numba_fixed_num.mv_kernel
        return make(binary, bool(transpose), len(ins[0].shape) == 1)

    return generate


def _pallas_generator(binary: bool, matrix: bool):
    def generate(**kw):
        from primforge.ops import _pallas_fixed_num

        return _pallas_fixed_num.generator(binary, matrix, _jax_generator(binary, matrix))(**kw)

    return generate


# ----------------------------------------------------------------------------- shape rule
def _check_shape(shape, who):
    try:
        m, n = (int(s) for s in shape)
    except (TypeError, ValueError):
        raise TypeError(f"{who}: 'shape' must be a pair of ints (rows, cols), got {shape!r}") from None
    if m < 0 or n < 0:
        raise ValueError(f"{who}: 'shape' must be non-negative, got {shape!r}")
    return m, n


def _check_structure_args(who, weights, indices, shape):
    m, _n = shape
    ishape = tuple(jnp.shape(indices))
    if len(ishape) != 2:
        raise ValueError(f"{who}: 'indices' must be 2-D (rows, k), got shape {ishape}")
    if not jnp.issubdtype(jnp.result_type(indices), jnp.integer):
        raise TypeError(f"{who}: 'indices' must be an integer array, got {jnp.result_type(indices)}")
    if ishape[0] != m:
        raise ValueError(
            f"{who}: 'indices' must have {m} rows (shape ({m}, k)) for the stored shape "
            f"{tuple(shape)}, got {ishape}"
        )
    if not jnp.issubdtype(jnp.result_type(weights), jnp.floating):
        raise TypeError(f"{who}: 'weights' must be floating point, got {jnp.result_type(weights)}")
    wshape = tuple(jnp.shape(weights))
    if wshape != (1,) and wshape != ishape:
        raise ValueError(
            f"{who}: 'weights' must have shape {ishape} (one per entry, like 'indices': the "
            f"same k) or (1,) (one shared weight), got {wshape}"
        )


def _shape_rule(binary: bool, matrix: bool):
    who = _name(binary, matrix)

    def rule(weights, indices, x, *, shape, transpose, **_):
        m, n = _check_shape(shape, who)
        _check_structure_args(who, weights, indices, (m, n))
        rows_in, rows_out = (m, n) if transpose else (n, m)
        want = 2 if matrix else 1
        if len(x.shape) != want or x.shape[0] != rows_in:
            what = f"({rows_in}, cols)" if matrix else f"({rows_in},)"
            op = "A.T @ x" if transpose else "A @ x"
            raise ValueError(
                f"{who}: for {op} with A of shape {(m, n)} the input must have shape {what}, "
                f"got {tuple(x.shape)}"
            )
        if not binary and not jnp.issubdtype(x.dtype, jnp.floating):
            raise TypeError(
                f"{who}: the input must be floating point, got {x.dtype}; use binary_{who} "
                f"for bool or integer events"
            )
        return jax.ShapeDtypeStruct((rows_out,) + tuple(x.shape[1:]), weights.dtype)

    return rule


# ----------------------------------------------------------------------------- rules
def _call(binary, matrix, weights, indices, x, *, shape, transpose, backend=None):
    return KERNELS[(binary, matrix)](weights, indices, x, shape=shape, transpose=transpose,
                                     backend=backend)


def _jvp_rule(binary: bool, matrix: bool):
    def jvp(primals, tangents, *, outs, backend=None, shape, transpose, **_):
        weights, indices, x = primals
        d_w, _, d_x = tangents
        kw = {"shape": shape, "transpose": transpose, "backend": backend}
        y = _call(binary, matrix, weights, indices, x, **kw)
        t = None
        if type(d_w) is not _compat.Zero:
            t = _call(binary, matrix, d_w, indices, x, **kw)
        if type(d_x) is not _compat.Zero:
            tx = _call(False, matrix, weights, indices, d_x.astype(weights.dtype), **kw)
            t = tx if t is None else t + tx
        return [y], [t]

    return jvp


def _weight_cotangent(binary, matrix, ct, wdtype, wshape, indices, x, *, shape, transpose,
                      backend):
    """d<ct, A x>/d weights for a shared or a per-entry weight."""
    _m, n = shape
    ct, x = jnp.asarray(ct), jnp.asarray(x)
    if len(wshape) == 1:  # <ct, (w P) x> = w <ct, P x>: one more event-driven call
        px = _call(binary, matrix, jnp.ones((1,), wdtype), indices, x, shape=shape,
                   transpose=transpose, backend=backend)
        return jnp.sum(ct * px).reshape(1).astype(wdtype)
    ev = (x != 0).astype(ct.dtype) if binary else x.astype(ct.dtype)
    if transpose:  # y[indices[i, j]] += w_ij x[i]
        safe, _ = _safe_indices(indices, ct.shape[0])
        a = ev[:, None, :] if matrix else ev[:, None]
        b = ct.at[safe].get(mode="fill", fill_value=0)
    else:  # y[i] += w_ij x[indices[i, j]]
        safe, _ = _safe_indices(indices, n)
        a = ct[:, None, :] if matrix else ct[:, None]
        b = ev.at[safe].get(mode="fill", fill_value=0)
    g = jnp.sum(a * b, axis=-1) if matrix else a * b
    return g.astype(wdtype)


def _transpose_rule(binary: bool, matrix: bool):
    def transpose_rule(cts, weights, indices, x, *, outs, backend=None, shape, transpose, **_):
        (ct,) = cts
        if type(ct) is _compat.Zero:
            return [None, None, None]
        if _compat.is_undefined_primal(indices):
            raise ValueError("fixed-number products are not linear in 'indices'")
        if _compat.is_undefined_primal(x):
            if _compat.is_undefined_primal(weights):
                raise ValueError("fixed-number products are bilinear: transpose w.r.t. weights "
                                 "or x, not both")
            ct_x = _call(False, matrix, weights, indices, jnp.asarray(ct).astype(weights.dtype),
                         shape=shape, transpose=not transpose, backend=backend)
            return [None, None, ct_x.astype(x.aval.dtype)]
        if _compat.is_undefined_primal(weights):
            ct_w = _weight_cotangent(binary, matrix, ct, weights.aval.dtype, weights.aval.shape,
                                     indices, x, shape=shape, transpose=transpose,
                                     backend=backend)
            return [ct_w, None, None]
        return [None, None, None]

    return transpose_rule


def _batching_rule(binary: bool, matrix: bool):
    def batch(args, axes, *, outs, backend=None, shape, transpose, **_):
        weights, indices, x = args
        ax_w, ax_i, ax_x = axes
        if ax_w is None and ax_i is None:
            # Only the input is batched: the batch becomes extra columns of one matrix call.
            xb = jnp.moveaxis(x, ax_x, 1)
            size = xb.shape[1]
            flat = xb.reshape(xb.shape[0], -1)
            y = _call(binary, True, weights, indices, flat, shape=shape, transpose=transpose,
                      backend=backend)
            return [y.reshape((y.shape[0], size) + tuple(xb.shape[2:]))], [1]
        moved = [a if ax is None else jnp.moveaxis(a, ax, 0) for a, ax in zip(args, axes)]
        mapped = [ax is not None for ax in axes]

        def one(sliced):
            it = iter(sliced)
            full = [next(it) if mp else a for a, mp in zip(moved, mapped)]
            return _call(binary, matrix, *full, shape=shape, transpose=transpose,
                         backend=backend)

        y = jax.lax.map(one, [a for a, mp in zip(moved, mapped) if mp])
        return [y], [0]

    return batch


def _make_kernel(binary: bool, matrix: bool) -> XLACustomKernel:
    kernel = XLACustomKernel("primforge.ops." + _name(binary, matrix), doc=__doc__, replace=True)
    gen = _jax_generator(binary, matrix)
    for platform in ("cpu", "gpu", "tpu"):
        kernel.def_kernel("jax", platform, gen)
    kernel.def_numba_kernel(_numba_generator(binary, matrix), asdefault=True)
    kernel.def_abstract_eval(_shape_rule(binary, matrix))
    kernel.def_jvp_rule(_jvp_rule(binary, matrix))
    kernel.def_transpose_rule(_transpose_rule(binary, matrix))
    kernel.def_batching_rule(_batching_rule(binary, matrix))
    # Pallas (Triton) on the GPU, and the same kernel bodies interpreted on the CPU; opt-in.
    kernel.def_pallas_kernel("gpu", _pallas_generator(binary, matrix))
    kernel.def_pallas_kernel("cpu", _pallas_generator(binary, matrix))
    kernel.def_tags("fixed_num", "sparse", "event" if binary else "float",
                    "matmat" if matrix else "matvec")
    KERNELS[(binary, matrix)] = kernel
    return kernel


fixed_num_mv_p = _make_kernel(binary=False, matrix=False)
binary_fixed_num_mv_p = _make_kernel(binary=True, matrix=False)
fixed_num_mm_p = _make_kernel(binary=False, matrix=True)
binary_fixed_num_mm_p = _make_kernel(binary=True, matrix=True)


# ----------------------------------------------------------------------------- public calls
def _prepare_weights(weights):
    weights = jnp.asarray(weights)
    if weights.ndim == 0:
        weights = weights.reshape(1)
    if not jnp.issubdtype(weights.dtype, jnp.floating):
        weights = weights.astype(jnp.result_type(float))
    return weights


def _public(binary: bool, matrix: bool):
    who = _name(binary, matrix)

    def call(weights, indices, x, *, shape, transpose=False, backend=None):
        shape = _check_shape(shape, who)
        weights = _prepare_weights(weights)
        x = jnp.asarray(x)
        if not binary:
            if not jnp.issubdtype(x.dtype, jnp.floating):
                x = x.astype(weights.dtype)
            elif x.dtype != weights.dtype:
                x = x.astype(jnp.promote_types(x.dtype, weights.dtype))
                weights = weights.astype(x.dtype)
        return _call(binary, matrix, weights, jnp.asarray(indices), x, shape=shape,
                     transpose=bool(transpose), backend=backend)

    return call


def fixed_num_mv(weights: Any, indices: Any, vector: Any, *, shape: tuple[int, int],
                 transpose: bool = False, backend: str | None = None) -> jax.Array:
    """``A @ v`` (or ``A.T @ v``) for a fixed-number matrix ``A`` and a float vector.

    Args:
        weights: one weight per entry, shape ``(m, k)`` like ``indices``, or a scalar /
            ``(1,)`` shared by every entry.
        indices: ``(m, k)`` integers: row ``i`` of ``A`` has entries in columns
            ``indices[i, :]`` (repeats add up). An index outside ``[0, n)`` is masked (the
            entry is skipped, never read or written); validate once with
            :meth:`FixedNum.from_indices`.
        vector: float vector of length ``n`` (``m`` when ``transpose``).
        shape: ``(m, n)`` of the stored matrix ``A``.
        transpose: compute ``A.T @ x`` (scatter; only rows with a non-zero input cost work).
        backend: 'numba' (CPU default), 'jax' (reference; GPU/TPU default) or 'pallas'
            (Triton on the GPU, interpreted on the CPU; opt-in).

    Returns:
        The product, dtype of ``weights``.

    Example:
        >>> import jax.numpy as jnp
        >>> # A = [[1, 0, 2], [0, 3, 4]]: k = 2 entries per row
        >>> fixed_num_mv(jnp.array([[1., 2.], [3., 4.]]), jnp.array([[0, 2], [1, 2]]),
        ...              jnp.array([1., 1., 1.]), shape=(2, 3))
        Array([3., 7.], dtype=float32)
    """
    return _public(False, False)(weights, indices, vector, shape=shape, transpose=transpose,
                                 backend=backend)


def binary_fixed_num_mv(weights: Any, indices: Any, events: Any, *, shape: tuple[int, int],
                        transpose: bool = False, backend: str | None = None) -> jax.Array:
    """``A @ (e != 0)`` (or ``A.T @ (e != 0)``) for binary events (bool, int or float).

    Args:
        weights: one weight per entry, shape ``(m, k)`` like ``indices``, or a scalar /
            ``(1,)`` shared by every entry.
        indices: ``(m, k)`` integers: row ``i`` of ``A`` has entries in columns
            ``indices[i, :]`` (repeats add up). An index outside ``[0, n)`` is masked (the
            entry is skipped, never read or written); validate once with
            :meth:`FixedNum.from_indices`.
        events: bool or numeric events (non-zero = active), length ``n``
            (``m`` when ``transpose``).
        shape: ``(m, n)`` of the stored matrix ``A``.
        transpose: compute ``A.T @ x`` (scatter; only rows with a non-zero input cost work).
        backend: 'numba' (CPU default), 'jax' (reference; GPU/TPU default) or 'pallas'
            (Triton on the GPU, interpreted on the CPU; opt-in).

    Returns:
        The product, dtype of ``weights``.

    Example:
        >>> import jax.numpy as jnp
        >>> # row 1 fires: its k = 2 targets get the shared weight 0.5
        >>> binary_fixed_num_mv(0.5, jnp.array([[0, 2], [1, 2]]), jnp.array([False, True]),
        ...                     shape=(2, 3), transpose=True)
        Array([0. , 0.5, 0.5], dtype=float32)
    """
    return _public(True, False)(weights, indices, events, shape=shape, transpose=transpose,
                                backend=backend)


def fixed_num_mm(weights: Any, indices: Any, matrix: Any, *, shape: tuple[int, int],
                 transpose: bool = False, backend: str | None = None) -> jax.Array:
    """``A @ B`` (or ``A.T @ B``) for a fixed-number matrix ``A`` and a float matrix ``B``.

    Args:
        weights: one weight per entry, shape ``(m, k)`` like ``indices``, or a scalar /
            ``(1,)`` shared by every entry.
        indices: ``(m, k)`` integers: row ``i`` of ``A`` has entries in columns
            ``indices[i, :]`` (repeats add up). An index outside ``[0, n)`` is masked (the
            entry is skipped, never read or written); validate once with
            :meth:`FixedNum.from_indices`.
        matrix: float ``(n, cols)`` (``(m, cols)`` when ``transpose``).
        shape: ``(m, n)`` of the stored matrix ``A``.
        transpose: compute ``A.T @ x`` (scatter; only rows with a non-zero input cost work).
        backend: 'numba' (CPU default), 'jax' (reference; GPU/TPU default) or 'pallas'
            (Triton on the GPU, interpreted on the CPU; opt-in).

    Returns:
        The product, dtype of ``weights``.

    Example:
        >>> import jax.numpy as jnp
        >>> fixed_num_mm(1.0, jnp.array([[0, 2], [1, 2]]), jnp.ones((3, 2)), shape=(2, 3))
        Array([[2., 2.],
               [2., 2.]], dtype=float32)
    """
    return _public(False, True)(weights, indices, matrix, shape=shape, transpose=transpose,
                                backend=backend)


def binary_fixed_num_mm(weights: Any, indices: Any, events: Any, *, shape: tuple[int, int],
                        transpose: bool = False, backend: str | None = None) -> jax.Array:
    """``A @ E`` (or ``A.T @ E``) for a matrix of binary events (one event vector per column).

    Args:
        weights: one weight per entry, shape ``(m, k)`` like ``indices``, or a scalar /
            ``(1,)`` shared by every entry.
        indices: ``(m, k)`` integers: row ``i`` of ``A`` has entries in columns
            ``indices[i, :]`` (repeats add up). An index outside ``[0, n)`` is masked (the
            entry is skipped, never read or written); validate once with
            :meth:`FixedNum.from_indices`.
        events: bool or numeric ``(n, cols)`` (``(m, cols)`` when ``transpose``).
        shape: ``(m, n)`` of the stored matrix ``A``.
        transpose: compute ``A.T @ x`` (scatter; only rows with a non-zero input cost work).
        backend: 'numba' (CPU default), 'jax' (reference; GPU/TPU default) or 'pallas'
            (Triton on the GPU, interpreted on the CPU; opt-in).

    Returns:
        The product, dtype of ``weights``.

    Example:
        >>> import jax.numpy as jnp
        >>> binary_fixed_num_mm(1.0, jnp.array([[0, 2], [1, 2]]),
        ...                     jnp.array([[True, False], [True, True]]), shape=(2, 3),
        ...                     transpose=True)
        Array([[1., 0.],
               [1., 1.],
               [2., 1.]], dtype=float32)
    """
    return _public(True, True)(weights, indices, events, shape=shape, transpose=transpose,
                               backend=backend)


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
        object.__setattr__(self, "shape", _check_shape(self.shape, "FixedNum"))
        weights = self.weights
        if not hasattr(weights, "shape") or jnp.ndim(weights) == 0:
            weights = _prepare_weights(weights)
        object.__setattr__(self, "weights", weights)
        _check_structure_args("FixedNum", self.weights, self.indices, self._stored_shape)

    @property
    def _stored_shape(self) -> tuple[int, int]:
        n_pre, n_post = self.shape
        return (n_pre, n_post) if self.per == "pre" else (n_post, n_pre)

    @property
    def k(self) -> int:
        """Partners per neuron (columns of ``indices``)."""
        return int(self.indices.shape[1])

    @property
    def homogeneous(self) -> bool:
        """Whether every synapse shares one weight (``weights.shape == (1,)``)."""
        return jnp.ndim(self.weights) == 1

    @property
    def dtype(self):
        """Dtype of the weights."""
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
            primforge.ops.fixed_num.FixedNumStructureError: FixedNum: indices must lie in [0, 3), but indices[0, 1] = 5 (1 entry out of range)
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
        obj = cls(jnp.asarray(w.reshape(1) if w.ndim == 0 else w), jnp.asarray(ind),
                  shape=shape, per=per)
        problem = _problems(ind, obj._stored_shape[1])
        if problem:
            raise FixedNumStructureError("FixedNum: " + problem)
        return obj

    def with_data(self, weights: Any) -> FixedNum:
        """The same structure with new weights (``(rows, k)``, ``(1,)`` or a scalar)."""
        return FixedNum(_prepare_weights(weights), self.indices, shape=self.shape, per=self.per)

    @property
    def T(self) -> FixedNum:
        """The transpose ``(n_post, n_pre)``: the same arrays with ``per`` flipped."""
        return FixedNum(self.weights, self.indices, shape=(self.shape[1], self.shape[0]),
                        per="post" if self.per == "pre" else "pre")

    def todense(self) -> jax.Array:
        """The dense ``(n_pre, n_post)`` array (traceable; masked entries are left out).

        Example:
            >>> FixedNum.from_indices([[1], [1]], 2.0, shape=(2, 2), per='post').todense().tolist()
            [[0.0, 0.0], [2.0, 2.0]]
        """
        m, n = self._stored_shape
        safe, _ = _safe_indices(self.indices, n)
        rows = jnp.broadcast_to(jnp.arange(m)[:, None], self.indices.shape)
        vals = jnp.broadcast_to(self.weights if not self.homogeneous else self.weights[0],
                                self.indices.shape)
        a = jnp.zeros((m, n), self.weights.dtype).at[rows, safe].add(vals, mode="drop")
        return a if self.per == "pre" else a.T

    def _product(self, x, *, transpose_w: bool, backend):
        """``W @ x`` (``transpose_w=False``) or ``W.T @ x`` for a vector or matrix ``x``."""
        x = jnp.asarray(x)
        binary = not jnp.issubdtype(x.dtype, jnp.inexact)
        if x.ndim not in (1, 2):
            raise ValueError(f"FixedNum @ operand must be a vector or a matrix, got shape {x.shape}")
        fn = {(False, 1): fixed_num_mv, (True, 1): binary_fixed_num_mv,
              (False, 2): fixed_num_mm, (True, 2): binary_fixed_num_mm}[(binary, x.ndim)]
        # W = A (per='pre') or A.T (per='post'); W @ x uses A.T exactly when per='post'.
        transpose = (self.per == "post") != transpose_w
        return fn(self.weights, self.indices, x, shape=self._stored_shape, transpose=transpose,
                  backend=backend)

    def matmul(self, x: Any, *, backend: str | None = None) -> jax.Array:
        """``self @ x`` with an explicit backend choice."""
        return self._product(x, transpose_w=False, backend=backend)

    def rmatmul(self, x: Any, *, backend: str | None = None) -> jax.Array:
        """``x @ self`` with an explicit backend choice (vector or ``(cols, n_pre)`` matrix)."""
        x = jnp.asarray(x)
        if x.ndim == 2:
            return self._product(x.T, transpose_w=True, backend=backend).T
        return self._product(x, transpose_w=True, backend=backend)

    __array_ufunc__ = None  # make NumPy's ``ndarray @ W`` defer to ``__rmatmul__``

    def __matmul__(self, x: Any) -> jax.Array:
        return self.matmul(x)

    def __rmatmul__(self, x: Any) -> jax.Array:
        return self.rmatmul(x)


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
    if k == 0 or rows == 0:
        ind = np.zeros((rows, k), np.int32)
    elif replace:
        ind = rng.integers(0, pool, size=(rows, k))
    else:
        # k distinct values per row: the k smallest of ``pool`` random keys per row, in
        # blocks of rows to bound memory (``argpartition`` is O(pool) per row).
        ind = np.empty((rows, k), np.int64)
        block = max(1, 4_000_000 // max(pool, 1))
        for r0 in range(0, rows, block):
            keys = rng.random((min(block, rows - r0), pool))
            ind[r0:r0 + block] = np.argpartition(keys, k - 1, axis=1)[:, :k]
        ind.sort(axis=1)
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


# ----------------------------------------------------------------------------- benchmark hooks
_BENCH_CASES = ((1000, 20, False, True), (1000, 20, True, False), (5000, 50, True, True),
                (5000, 50, False, False))  # (n, k, transpose, shared weight)
_BENCH_RATE = 0.05
_BENCH_COLS = 8


def _benchmark_data(binary: bool, matrix: bool):
    def configs(*, platform: str) -> list:
        del platform
        from primforge.bench import BenchmarkConfig

        out = []
        for i, (n, k, transpose, shared) in enumerate(_BENCH_CASES):
            rs = np.random.RandomState(4321 + i)
            ind = rs.randint(0, n, size=(n, k)).astype(np.int32)
            w = (np.array([0.5], np.float32) if shared
                 else rs.standard_normal((n, k)).astype(np.float32))
            xshape = (n, _BENCH_COLS) if matrix else (n,)
            active = rs.random_sample(xshape) < _BENCH_RATE
            x = active if binary else np.where(active, rs.standard_normal(xshape), 0).astype(np.float32)
            params = {"n": n, "k": k, "rate": _BENCH_RATE, "transpose": transpose,
                      "weight": "shared" if shared else "per-synapse"}
            out.append(BenchmarkConfig(args=(w, ind, x),
                                       kwargs={"shape": (n, n), "transpose": transpose},
                                       params=params))
        return out

    return configs


for (_binary, _matrix), _public_fn in {
    (False, False): fixed_num_mv,
    (True, False): binary_fixed_num_mv,
    (False, True): fixed_num_mm,
    (True, True): binary_fixed_num_mm,
}.items():
    KERNELS[(_binary, _matrix)].def_call(_public_fn)
    KERNELS[(_binary, _matrix)].def_benchmark_data(_benchmark_data(_binary, _matrix))
del _binary, _matrix, _public_fn
