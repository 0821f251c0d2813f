"""Dense-matrix event products: ``W @ x`` and ``x @ W`` that skip inactive inputs.

Design:
    * Four :class:`~primforge.XLACustomKernel` objects take a dense ``(m, n)`` weight matrix
      ``W`` and an input ``x``: ``densemv`` / ``densemm`` (float input; zeros are skipped)
      and ``binary_densemv`` / ``binary_densemm`` (binary events: an entry counts when it
      is non-zero). ``transpose=False`` computes ``W @ x``; ``transpose=True`` computes
      ``W.T @ x``, the same as ``x @ W``, where rows of ``W`` are event sources.
    * Backends: ``jax`` (reference: a ``jnp`` matmul, every platform, the GPU/TPU default)
      and ``numba`` (CPU default): ``x @ W`` adds only the rows of active events (unit-stride,
      vectorised); ``W @ x`` reads only the columns of active events. Work is proportional
      to the number of active events times the other dimension.
    * Autodiff: bilinear in ``W`` and ``x``. The JVP is two kernel calls; the cotangent of
      ``x`` is the float kernel with ``transpose`` flipped; of ``W``, an outer product (a
      dense matmul for matrix inputs). For binary kernels the derivative with respect to
      float-valued events is that of ``W @ x`` (straight-through); bool events have none.
    * Batching: ``vmap`` over ``x`` alone is one matrix call (the batch becomes columns);
      other batching (e.g. of ``W``) maps the kernel with ``lax.map``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from primforge import _compat
from primforge.kernel.kernel import XLACustomKernel

__all__ = [
    "binary_densemm",
    "binary_densemm_p",
    "binary_densemv",
    "binary_densemv_p",
    "densemm",
    "densemm_p",
    "densemv",
    "densemv_p",
]

KERNELS: dict[tuple[bool, bool], XLACustomKernel] = {}  # (binary, matrix) -> kernel


def _name(binary: bool, matrix: bool) -> str:
    return ("binary_" if binary else "") + ("densemm" if matrix else "densemv")


def _jax_generator(binary: bool, matrix: bool):
    def generate(*, outs, transpose, **_):
        dtype = outs[0].dtype

        def kernel(weights, x):
            ev = (x != 0).astype(dtype) if binary else x.astype(dtype)
            w = weights.astype(dtype)
            y = (w.T if transpose else w) @ ev
            return y.astype(dtype)

        return kernel

    return generate


def _numba_generator(binary: bool, matrix: bool):
    def generate(*, transpose, **_):
        from primforge.ops import _numba_dense_event

        make = _numba_dense_event.mm_kernel if matrix else _numba_dense_event.mv_kernel
        return make(binary, bool(transpose))

    return generate


def _shape_rule(binary: bool, matrix: bool):
    who = _name(binary, matrix)

    def rule(weights, x, *, transpose, **_):
        if len(weights.shape) != 2:
            raise ValueError(f"{who}: 'weights' must be a 2-D (m, n) matrix, got shape "
                             f"{tuple(weights.shape)}")
        if not jnp.issubdtype(weights.dtype, jnp.floating):
            raise TypeError(f"{who}: 'weights' must be floating point, got {weights.dtype}")
        m, n = weights.shape
        rows_in, rows_out = (m, n) if transpose else (n, m)
        want = 2 if matrix else 1
        if len(x.shape) != want or x.shape[0] != rows_in:
            what = f"({rows_in}, cols)" if matrix else f"({rows_in},)"
            op = "x @ W" if transpose else "W @ x"
            raise ValueError(f"{who}: for {op} with W of shape {(m, n)} the input must have "
                             f"shape {what}, got {tuple(x.shape)}")
        if not binary and not jnp.issubdtype(x.dtype, jnp.floating):
            raise TypeError(f"{who}: the input must be floating point, got {x.dtype}; use "
                            f"binary_{who} for bool or integer events")
        return jax.ShapeDtypeStruct((rows_out,) + tuple(x.shape[1:]), weights.dtype)

    return rule


def _call(binary, matrix, weights, x, *, transpose, backend=None):
    return KERNELS[(binary, matrix)](weights, x, transpose=transpose, backend=backend)


def _jvp_rule(binary: bool, matrix: bool):
    def jvp(primals, tangents, *, outs, backend=None, transpose, **_):
        weights, x = primals
        d_w, d_x = tangents
        y = _call(binary, matrix, weights, x, transpose=transpose, backend=backend)
        t = None
        if type(d_w) is not _compat.Zero:
            t = _call(binary, matrix, d_w, x, transpose=transpose, backend=backend)
        if type(d_x) is not _compat.Zero:
            tx = _call(False, matrix, weights, d_x.astype(weights.dtype), transpose=transpose,
                       backend=backend)
            t = tx if t is None else t + tx
        return [y], [t]

    return jvp


def _transpose_rule(binary: bool, matrix: bool):
    def transpose_rule(cts, weights, x, *, outs, backend=None, transpose, **_):
        (ct,) = cts
        if type(ct) is _compat.Zero:
            return [None, None]
        ct = jnp.asarray(ct)
        if _compat.is_undefined_primal(x):
            if _compat.is_undefined_primal(weights):
                raise ValueError("dense event products are bilinear: transpose w.r.t. weights "
                                 "or x, not both")
            ct_x = _call(False, matrix, weights, ct.astype(weights.dtype),
                         transpose=not transpose, backend=backend)
            return [None, ct_x.astype(x.aval.dtype)]
        if _compat.is_undefined_primal(weights):
            ev = (x != 0).astype(ct.dtype) if binary else jnp.asarray(x).astype(ct.dtype)
            a, b = (ev, ct) if transpose else (ct, ev)  # dW = a b^T
            g = a @ b.T if matrix else jnp.outer(a, b)
            return [g.astype(weights.aval.dtype), None]
        return [None, None]

    return transpose_rule


def _batching_rule(binary: bool, matrix: bool):
    def batch(args, axes, *, outs, backend=None, transpose, **_):
        weights, x = args
        ax_w, ax_x = axes
        if ax_w is None:
            xb = jnp.moveaxis(x, ax_x, 1)
            size = xb.shape[1]
            flat = xb.reshape(xb.shape[0], -1)
            y = _call(binary, True, weights, flat, transpose=transpose, backend=backend)
            return [y.reshape((y.shape[0], size) + tuple(xb.shape[2:]))], [1]
        ws = jnp.moveaxis(weights, ax_w, 0)
        if ax_x is None:
            y = jax.lax.map(lambda w: _call(binary, matrix, w, x, transpose=transpose,
                                            backend=backend), ws)
        else:
            xs = jnp.moveaxis(x, ax_x, 0)
            y = jax.lax.map(lambda a: _call(binary, matrix, a[0], a[1], transpose=transpose,
                                            backend=backend), (ws, xs))
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
    kernel.def_tags("dense", "event" if binary else "float", "matmat" if matrix else "matvec")
    KERNELS[(binary, matrix)] = kernel
    return kernel


densemv_p = _make_kernel(binary=False, matrix=False)
binary_densemv_p = _make_kernel(binary=True, matrix=False)
densemm_p = _make_kernel(binary=False, matrix=True)
binary_densemm_p = _make_kernel(binary=True, matrix=True)


def _public(binary: bool, matrix: bool):
    def call(weights, x, *, transpose=False, backend=None):
        weights = jnp.asarray(weights)
        if not jnp.issubdtype(weights.dtype, jnp.floating):
            weights = weights.astype(jnp.result_type(float))
        x = jnp.asarray(x)
        if not binary:
            if not jnp.issubdtype(x.dtype, jnp.floating):
                x = x.astype(weights.dtype)
            elif x.dtype != weights.dtype:
                x = x.astype(jnp.promote_types(x.dtype, weights.dtype))
                weights = weights.astype(x.dtype)
        return _call(binary, matrix, weights, x, transpose=bool(transpose), backend=backend)

    return call


def densemv(weights: Any, vector: Any, *, transpose: bool = False,
            backend: str | None = None) -> jax.Array:
    """``W @ v`` (or ``v @ W`` with ``transpose``) skipping the zero entries of ``v``.

    Args:
        weights: dense ``(m, n)`` float matrix ``W``.
        vector: float vector of length ``n`` (``m`` when ``transpose``).
        transpose: compute ``W.T @ v`` (= ``v @ W``): only rows of ``W`` with ``v[i] != 0``
            are read.
        backend: 'numba' (CPU default) or 'jax' (reference; GPU/TPU default).

    Returns:
        The product, dtype of ``weights``.

    Example:
        >>> import jax.numpy as jnp
        >>> densemv(jnp.array([[1., 2.], [3., 4.]]), jnp.array([0., 2.]), transpose=True)
        Array([6., 8.], dtype=float32)
    """
    return _public(False, False)(weights, vector, transpose=transpose, backend=backend)


def binary_densemv(weights: Any, events: Any, *, transpose: bool = False,
                   backend: str | None = None) -> jax.Array:
    """``W @ (e != 0)`` (or ``(e != 0) @ W``): the summed columns (rows) of active events.

    Args:
        weights: dense ``(m, n)`` float matrix ``W``.
        events: bool or numeric (non-zero = active) vector of length ``n`` (``m`` when
            ``transpose``).
        transpose: compute ``W.T @ e`` (= ``e @ W``), the event-driven direction for
            ``W`` of shape ``(n_pre, n_post)``.
        backend: 'numba' (CPU default) or 'jax'.

    Returns:
        The product, dtype of ``weights``.

    Example:
        >>> import jax.numpy as jnp
        >>> binary_densemv(jnp.array([[1., 2.], [3., 4.]]), jnp.array([True, False]))
        Array([1., 3.], dtype=float32)
    """
    return _public(True, False)(weights, events, transpose=transpose, backend=backend)


def densemm(weights: Any, matrix: Any, *, transpose: bool = False,
            backend: str | None = None) -> jax.Array:
    """``W @ B`` (or ``W.T @ B``) skipping the zero entries of the float matrix ``B``.

    Args:
        weights: dense ``(m, n)`` float matrix ``W``.
        matrix: float ``(n, cols)`` (``(m, cols)`` when ``transpose``).
        transpose: compute ``W.T @ B``.
        backend: 'numba' (CPU default) or 'jax'.

    Returns:
        The product, dtype of ``weights``.

    Example:
        >>> import jax.numpy as jnp
        >>> densemm(jnp.array([[1., 2.], [3., 4.]]), jnp.array([[1., 0.], [0., 0.]]))
        Array([[1., 0.],
               [3., 0.]], dtype=float32)
    """
    return _public(False, True)(weights, matrix, transpose=transpose, backend=backend)


def binary_densemm(weights: Any, events: Any, *, transpose: bool = False,
                   backend: str | None = None) -> jax.Array:
    """``W @ E`` (or ``W.T @ E``) for a matrix of binary events (one event vector per column).

    Args:
        weights: dense ``(m, n)`` float matrix ``W``.
        events: bool or numeric ``(n, cols)`` (``(m, cols)`` when ``transpose``).
        transpose: compute ``W.T @ E``.
        backend: 'numba' (CPU default) or 'jax'.

    Returns:
        The product, dtype of ``weights``.

    Example:
        >>> import jax.numpy as jnp
        >>> binary_densemm(jnp.array([[1., 2.], [3., 4.]]), jnp.array([[True], [True]]),
        ...                transpose=True)
        Array([[4.],
               [6.]], dtype=float32)
    """
    return _public(True, True)(weights, events, transpose=transpose, backend=backend)


# ----------------------------------------------------------------------------- benchmark hooks
_BENCH_CASES = ((500, True), (500, False), (2000, True), (2000, False))  # (n, transpose)
_BENCH_RATE = 0.05
_BENCH_COLS = 8


def _benchmark_data(binary: bool, matrix: bool):
    def configs(*, platform: str) -> list:
        del platform
        from primforge.bench import BenchmarkConfig

        out = []
        for i, (n, transpose) in enumerate(_BENCH_CASES):
            rs = np.random.RandomState(777 + i)
            w = rs.standard_normal((n, n)).astype(np.float32)
            xshape = (n, _BENCH_COLS) if matrix else (n,)
            active = rs.random_sample(xshape) < _BENCH_RATE
            x = active if binary else np.where(active, rs.standard_normal(xshape), 0).astype(np.float32)
            out.append(BenchmarkConfig(args=(w, x), kwargs={"transpose": transpose},
                                       params={"n": n, "rate": _BENCH_RATE,
                                               "transpose": transpose}))
        return out

    return configs


for (_binary, _matrix), _public_fn in {
    (False, False): densemv,
    (True, False): binary_densemv,
    (False, True): densemm,
    (True, True): binary_densemm,
}.items():
    KERNELS[(_binary, _matrix)].def_call(_public_fn)
    KERNELS[(_binary, _matrix)].def_benchmark_data(_benchmark_data(_binary, _matrix))
del _binary, _matrix, _public_fn
