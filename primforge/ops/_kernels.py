"""The four CSR product kernels and their transformation rules.

Design:
    * Four :class:`~primforge.XLACustomKernel` objects: ``csrmv`` / ``csrmm`` (float input)
      and ``binary_csrmv`` / ``binary_csrmm`` (binary events: an entry counts when it is
      non-zero, its value is ignored). Each takes ``(data, indices, indptr, x)`` and the
      static params ``shape`` (of ``W``) and ``transpose`` (compute ``W.T @ x``). One shared
      weight (``data.shape == (1,)``) or one weight per synapse is read from ``data``'s shape.
    * Backends: ``jax`` (reference, every platform; the GPU/TPU default), ``numba`` (CPU
      default, event-driven, see :mod:`primforge.ops._numba_csr`), and two opt-in GPU
      backends, each with a CPU twin that runs the same kernel bodies here: ``pallas``
      (Triton; interpreted on CPU, :mod:`primforge.ops._pallas_csr`) and ``cuda_raw`` (CUDA
      C++; the C++ twin on CPU, :mod:`primforge.ops._cuda_csr`). The GPU kernels have not
      run on a GPU yet, hence not defaults.
    * Autodiff: the product is bilinear in ``data`` and ``x``. The JVP is two kernel calls;
      the transpose w.r.t. ``x`` is the float kernel with ``transpose`` flipped; w.r.t. a
      shared weight it is one more kernel call with unit weight (event-driven again), and
      w.r.t. per-synapse weights a gather over the stored entries. For binary kernels the
      derivative w.r.t. float-valued events is that of ``W @ x`` (exact on 0/1 inputs, a
      straight-through estimator elsewhere); bool events have no tangent.
    * Batching: ``vmap`` over ``x`` alone turns a matvec into one matmat call (the batch
      becomes the columns) and a matmat into a wider matmat; any other batching (e.g. of
      the weights) maps the kernel over the batch with ``lax.map``.
    * Benchmarking: each kernel's call function is its public product (``csrmv`` ...), and
      its benchmark data is four small deterministic cases (``n`` = 200 and 1000, ``p`` =
      0.05, 5% active inputs, both directions, one shared weight), so ``primforge bench`` /
      ``check`` / ``autotune`` can compare the numba backend with the jax reference quickly.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from primforge import _compat
from primforge.kernel.kernel import XLACustomKernel
from primforge.ops import _common, _csr_grad, _numba_csr

__all__ = [
    "binary_csrmm",
    "binary_csrmm_p",
    "binary_csrmv",
    "binary_csrmv_p",
    "csrmm",
    "csrmm_p",
    "csrmv",
    "csrmv_p",
]

KERNELS: dict[tuple[bool, bool], XLACustomKernel] = {}  # (binary, matrix) -> kernel


def _pallas_generator(binary: bool, matrix: bool):
    def generate(**kw):
        from primforge.ops import _pallas_csr

        return _pallas_csr.generator(binary, matrix, _jax_generator(binary, matrix))(**kw)

    return generate


# ----------------------------------------------------------------------------- jax reference
def _jax_generator(binary: bool, matrix: bool):
    def generate(*, ins, outs, shape, transpose, **_):
        m, n = shape
        dtype = outs[0].dtype
        homo = _common.is_homogeneous(ins[0], ins[1])

        def kernel(data, indices, indptr, x):
            nnz = indices.shape[0]
            ev = (x != 0).astype(dtype) if binary else x.astype(dtype)
            rows = _common.row_ids(indptr, nnz)
            w = data[0] if homo else (data[:, None] if matrix else data)
            if transpose:
                # out[indices[k]] += w_k * x[row_k]
                contrib = ev[rows] if homo else w * ev[rows]
                y = jnp.zeros(outs[0].shape, dtype).at[indices].add(contrib, mode="drop")
            else:
                # out[row_k] += w_k * x[indices[k]]
                got = ev.at[indices].get(mode="fill", fill_value=0)
                contrib = got if homo else w * got
                y = jax.ops.segment_sum(contrib, rows, num_segments=m)
            if homo:
                y = y * w
            ok = _common.structure_ok(indices, indptr, n)
            return jnp.where(ok, y, jnp.nan).astype(dtype)

        return kernel

    return generate


def _numba_generator(binary: bool, matrix: bool):
    def generate(*, ins, transpose, **_):
        from primforge.ops import _numba_csr

        homo = _common.is_homogeneous(ins[0], ins[1])
        make = _numba_csr.mm_kernel if matrix else _numba_csr.mv_kernel
        return make(binary, bool(transpose), homo)

    return generate


def _cuda_generator(binary: bool, matrix: bool):
    def generate(*, platform, **kw):
        from primforge.ops import _cuda_csr

        return _cuda_csr.generator(binary, matrix, platform)(**kw)

    return generate


# ----------------------------------------------------------------------------- shape rule
def _shape_rule(binary: bool, matrix: bool):
    kind = ("binary_" if binary else "") + ("csrmm" if matrix else "csrmv")

    def rule(data, indices, indptr, x, *, shape, transpose, **_):
        m, n = _common.check_shape_param(shape, kind)
        _common.check_csr_args(kind, data, indices, indptr, (m, n))
        rows_in, rows_out = (m, n) if transpose else (n, m)
        want = 2 if matrix else 1
        if len(x.shape) != want or x.shape[0] != rows_in:
            what = f"({rows_in}, k)" if matrix else f"({rows_in},)"
            op = "W.T @ x" if transpose else "W @ x"
            raise ValueError(
                f"{kind}: for {op} with W of shape {(m, n)} the input must have shape {what}, "
                f"got {tuple(x.shape)}"
            )
        if not binary and not jnp.issubdtype(x.dtype, jnp.floating):
            raise TypeError(
                f"{kind}: the input must be floating point, got {x.dtype}; use binary_{kind} "
                f"for bool or integer events"
            )
        return jax.ShapeDtypeStruct((rows_out,) + tuple(x.shape[1:]), data.dtype)

    return rule


# ----------------------------------------------------------------------------- rules
def _call(binary, matrix, data, indices, indptr, x, *, shape, transpose, backend=None):
    return KERNELS[(binary, matrix)](
        data, indices, indptr, x, shape=shape, transpose=transpose, backend=backend
    )


def _jvp_rule(binary: bool, matrix: bool):
    def jvp(primals, tangents, *, outs, backend=None, shape, transpose, **_):
        data, indices, indptr, x = primals
        d_data, _, _, d_x = tangents
        kw = {"shape": shape, "transpose": transpose, "backend": backend}
        y = _call(binary, matrix, data, indices, indptr, x, **kw)
        t = None
        if type(d_data) is not _compat.Zero:
            t = _call(binary, matrix, d_data, indices, indptr, x, **kw)
        if type(d_x) is not _compat.Zero:
            tx = _call(False, matrix, data, indices, indptr, d_x.astype(data.dtype), **kw)
            t = tx if t is None else t + tx
        return [y], [t]

    return jvp


def _weight_cotangent(binary, matrix, ct, data, indices, indptr, x, *, shape, transpose, backend):
    """d<ct, W x>/d data, for the shared-weight and per-synapse layouts."""
    ct, x = jnp.asarray(ct), jnp.asarray(x)
    if _common.is_homogeneous(data.aval, indices):
        # <ct, (w P) x> = w <ct, P x>: one more event-driven kernel call with unit weight.
        ones = jnp.ones((1,), data.aval.dtype)
        px = _call(binary, matrix, ones, indices, indptr, x, shape=shape, transpose=transpose,
                   backend=backend)
        return jnp.sum(ct * px).reshape(1).astype(data.aval.dtype)
    # One pass over the stored entries, the structure check folded in (numba on the CPU).
    return _csr_grad.weight_grad(binary, matrix, ct, x, indices, indptr, transpose=transpose,
                                 dtype=data.aval.dtype, backend=backend)


def _transpose_rule(binary: bool, matrix: bool):
    def transpose_rule(cts, data, indices, indptr, x, *, outs, backend=None, shape, transpose, **_):
        (ct,) = cts
        if type(ct) is _compat.Zero:
            return [None, None, None, None]
        if _compat.is_undefined_primal(indices) or _compat.is_undefined_primal(indptr):
            raise ValueError("CSR products are not linear in 'indices' or 'indptr'")
        if _compat.is_undefined_primal(x):
            if _compat.is_undefined_primal(data):
                raise ValueError("CSR products are bilinear: transpose w.r.t. data or x, not both")
            ct_x = _call(False, matrix, data, indices, indptr, ct, shape=shape,
                         transpose=not transpose, backend=backend)
            return [None, None, None, ct_x.astype(x.aval.dtype)]
        if _compat.is_undefined_primal(data):
            ct_w = _weight_cotangent(binary, matrix, ct, data, indices, indptr, x, shape=shape,
                                     transpose=transpose, backend=backend)
            return [ct_w, None, None, None]
        return [None, None, None, None]

    return transpose_rule


def _batching_rule(binary: bool, matrix: bool):
    def batch(args, axes, *, outs, backend=None, shape, transpose, **_):
        data, indices, indptr, x = args
        ax_d, ax_i, ax_p, ax_x = axes
        if ax_d is None and ax_i is None and ax_p is None:
            # Only the input is batched: the batch becomes extra columns of one matmat call.
            xb = jnp.moveaxis(x, ax_x, 1)  # (rows_in, batch) or (rows_in, batch, k)
            size = xb.shape[1]
            # Explicit sizes: a reshape with -1 is undefined when a dimension is zero.
            flat = xb.reshape(xb.shape[0], math.prod(xb.shape[1:]))
            y = _call(binary, True, data, indices, indptr, flat, shape=shape,
                      transpose=transpose, backend=backend)
            y = y.reshape((y.shape[0], size) + tuple(xb.shape[2:]))
            return [y], [1]
        # Batched weights or structure: one kernel call per batch element.
        size = next(a.shape[ax] for a, ax in zip(args, axes) if ax is not None)
        moved = [a if ax is None else jnp.moveaxis(a, ax, 0) for a, ax in zip(args, axes)]
        mapped = [ax is not None for ax in axes]

        def one(sliced):
            it = iter(sliced)
            full = [next(it) if mp else a for a, mp in zip(moved, mapped)]
            return _call(binary, matrix, *full, shape=shape, transpose=transpose,
                         backend=backend)

        y = jax.lax.map(one, [a for a, mp in zip(moved, mapped) if mp])
        assert y.shape[0] == size
        return [y], [0]

    return batch


def _make_kernel(binary: bool, matrix: bool) -> XLACustomKernel:
    name = "primforge.ops." + ("binary_" if binary else "") + ("csrmm" if matrix else "csrmv")
    kernel = XLACustomKernel(name, doc=__doc__, replace=True)
    gen = _jax_generator(binary, matrix)
    for platform in ("cpu", "gpu", "tpu"):
        kernel.def_kernel("jax", platform, gen)
    kernel.def_numba_kernel(_numba_generator(binary, matrix), asdefault=True)
    # Opt-in: W @ x with rows spread over Numba's threads (tbb/omp layer only).
    kernel.def_kernel("numba_parallel", "cpu", _numba_csr.parallel_generator(binary, matrix))
    kernel.def_cuda_raw_kernel(_cuda_generator(binary, matrix), platform="gpu")
    kernel.def_cuda_raw_kernel(_cuda_generator(binary, matrix), platform="cpu")
    kernel.def_abstract_eval(_shape_rule(binary, matrix))
    kernel.def_jvp_rule(_jvp_rule(binary, matrix))
    kernel.def_transpose_rule(_transpose_rule(binary, matrix))
    kernel.def_batching_rule(_batching_rule(binary, matrix))
    kernel.def_tags("csr", "sparse", "event" if binary else "float", "matmat" if matrix else "matvec")
    # Pallas (Triton) on the GPU, and the same kernels interpreted on the CPU; opt-in on both.
    kernel.def_pallas_kernel("gpu", _pallas_generator(binary, matrix))
    kernel.def_pallas_kernel("cpu", _pallas_generator(binary, matrix))
    KERNELS[(binary, matrix)] = kernel
    return kernel


csrmv_p = _make_kernel(binary=False, matrix=False)
binary_csrmv_p = _make_kernel(binary=True, matrix=False)
csrmm_p = _make_kernel(binary=False, matrix=True)
binary_csrmm_p = _make_kernel(binary=True, matrix=True)


# ----------------------------------------------------------------------------- public calls
def _prepare(who, data, indices, indptr, x, shape, binary):
    shape = _common.check_shape_param(shape, who)
    data = jnp.asarray(data)
    if data.ndim == 0:
        data = data.reshape(1)
    if not jnp.issubdtype(data.dtype, jnp.floating):
        data = data.astype(jnp.result_type(float))
    x = jnp.asarray(x)
    if not binary and not jnp.issubdtype(x.dtype, jnp.floating):
        x = x.astype(data.dtype)
    elif not binary and x.dtype != data.dtype:
        x = x.astype(jnp.promote_types(x.dtype, data.dtype))
        data = data.astype(x.dtype)
    return data, jnp.asarray(indices), jnp.asarray(indptr), x, shape


def _public(binary: bool, matrix: bool):
    def call(data: Any, indices: Any, indptr: Any, x: Any, *, shape: tuple[int, int],
             transpose: bool = False, backend: str | None = None) -> jax.Array:
        who = ("binary_" if binary else "") + ("csrmm" if matrix else "csrmv")
        data, indices, indptr, x, shape = _prepare(who, data, indices, indptr, x, shape, binary)
        return _call(binary, matrix, data, indices, indptr, x, shape=shape,
                     transpose=bool(transpose), backend=backend)

    return call


def csrmv(data: Any, indices: Any, indptr: Any, vector: Any, *, shape: tuple[int, int],
          transpose: bool = False, backend: str | None = None) -> jax.Array:
    """Sparse matrix times dense float vector: ``W @ v`` (or ``W.T @ v`` with ``transpose``).

    Args:
        data: weights, shape ``(nnz,)``, or a scalar / ``(1,)`` shared by every entry.
        indices: column of each stored entry, shape ``(nnz,)``.
        indptr: row offsets, shape ``(rows + 1,)``.
        vector: float vector of length ``cols`` (``rows`` when ``transpose``).
        shape: ``(rows, cols)`` of ``W``.
        transpose: compute ``W.T @ vector`` (the same as ``vector @ W``).
        backend: force a backend ('numba', 'jax', 'pallas', 'cuda_raw'); default: numba on CPU,
            jax on GPU and TPU.

    Returns:
        The product, dtype of ``data``. NaN everywhere if the structure is malformed.

    Example:
        >>> import jax.numpy as jnp
        >>> # W = [[1, 0, 2], [0, 3, 0]]
        >>> csrmv(jnp.array([1., 2., 3.]), jnp.array([0, 2, 1]), jnp.array([0, 2, 3]),
        ...       jnp.array([1., 1., 1.]), shape=(2, 3))
        Array([3., 3.], dtype=float32)
    """
    return _public(False, False)(data, indices, indptr, vector, shape=shape,
                                 transpose=transpose, backend=backend)


def binary_csrmv(data: Any, indices: Any, indptr: Any, events: Any, *, shape: tuple[int, int],
                 transpose: bool = False, backend: str | None = None) -> jax.Array:
    """Sparse matrix times binary event vector: ``W @ (e != 0)`` (or ``W.T @ (e != 0)``).

    With ``transpose=True`` (rows of ``W`` are the event sources) the numba kernel only
    visits the rows of active events: work proportional to the number of events.

    Args:
        data: weights, shape ``(nnz,)``, or a scalar / ``(1,)`` shared by every entry.
        indices: column of each stored entry, shape ``(nnz,)``.
        indptr: row offsets, shape ``(rows + 1,)``.
        events: bool (or numeric, non-zero = active) vector of length ``cols``
            (``rows`` when ``transpose``).
        shape: ``(rows, cols)`` of ``W``.
        transpose: compute ``W.T @ events`` (the same as ``events @ W``).
        backend: force a backend ('numba', 'jax', 'pallas', 'cuda_raw'); default: numba on CPU,
            jax on GPU and TPU.

    Returns:
        The summed weights of active events, dtype of ``data``.

    Example:
        >>> import jax.numpy as jnp
        >>> # W = [[1, 0, 2], [0, 3, 0]]; row 1 is active
        >>> binary_csrmv(jnp.array([1., 2., 3.]), jnp.array([0, 2, 1]), jnp.array([0, 2, 3]),
        ...              jnp.array([False, True]), shape=(2, 3), transpose=True)
        Array([0., 3., 0.], dtype=float32)
    """
    return _public(True, False)(data, indices, indptr, events, shape=shape,
                                transpose=transpose, backend=backend)


def csrmm(data: Any, indices: Any, indptr: Any, matrix: Any, *, shape: tuple[int, int],
          transpose: bool = False, backend: str | None = None) -> jax.Array:
    """Sparse matrix times dense float matrix: ``W @ B`` (or ``W.T @ B`` with ``transpose``).

    Args:
        data: weights, shape ``(nnz,)``, or a scalar / ``(1,)`` shared by every entry.
        indices: column of each stored entry, shape ``(nnz,)``.
        indptr: row offsets, shape ``(rows + 1,)``.
        matrix: float matrix of shape ``(cols, k)`` (``(rows, k)`` when ``transpose``).
        shape: ``(rows, cols)`` of ``W``.
        transpose: compute ``W.T @ matrix``.
        backend: force a backend ('numba', 'jax', 'pallas', 'cuda_raw'); default: numba on CPU,
            jax on GPU and TPU.

    Returns:
        The ``(rows, k)`` (or ``(cols, k)``) product, dtype of ``data``.

    Example:
        >>> import jax.numpy as jnp
        >>> csrmm(jnp.array([1., 2., 3.]), jnp.array([0, 2, 1]), jnp.array([0, 2, 3]),
        ...       jnp.ones((3, 2)), shape=(2, 3))
        Array([[3., 3.],
               [3., 3.]], dtype=float32)
    """
    return _public(False, True)(data, indices, indptr, matrix, shape=shape,
                                transpose=transpose, backend=backend)


def binary_csrmm(data: Any, indices: Any, indptr: Any, events: Any, *, shape: tuple[int, int],
                 transpose: bool = False, backend: str | None = None) -> jax.Array:
    """Sparse matrix times a matrix of binary events (one event vector per column).

    Args:
        data: weights, shape ``(nnz,)``, or a scalar / ``(1,)`` shared by every entry.
        indices: column of each stored entry, shape ``(nnz,)``.
        indptr: row offsets, shape ``(rows + 1,)``.
        events: bool (or numeric, non-zero = active) matrix ``(cols, k)`` (``(rows, k)``
            when ``transpose``).
        shape: ``(rows, cols)`` of ``W``.
        transpose: compute ``W.T @ events``.
        backend: force a backend ('numba', 'jax', 'pallas', 'cuda_raw'); default: numba on CPU,
            jax on GPU and TPU.

    Returns:
        The ``(rows, k)`` (or ``(cols, k)``) product, dtype of ``data``.

    Example:
        >>> import jax.numpy as jnp
        >>> binary_csrmm(jnp.array([1., 2., 3.]), jnp.array([0, 2, 1]), jnp.array([0, 2, 3]),
        ...              jnp.array([[True, False], [True, True]]), shape=(2, 3), transpose=True)
        Array([[1., 0.],
               [3., 3.],
               [2., 0.]], dtype=float32)
    """
    return _public(True, True)(data, indices, indptr, events, shape=shape,
                               transpose=transpose, backend=backend)


# ----------------------------------------------------------------------------- benchmark hooks
# Each kernel gets a call function (the public one above, used by ``kernel.call`` and
# ``kernel.benchmark``) and a few small deterministic configs, so that ``primforge bench``
# and ``primforge check`` can time every backend and compare it with the 'jax' reference.
_BENCH_PROB = 0.05  # connection probability
_BENCH_RATE = 0.05  # fraction of active (non-zero) entries in the input
_BENCH_COLS = 8  # columns of the input for the matmat kernels


def _bench_csr(rs, n: int, prob: float):
    """A random ``n x n`` CSR structure (sorted columns) with per-synapse float32 weights."""
    mask = rs.random_sample((n, n)) < prob
    rows, cols = np.nonzero(mask)
    indptr = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(np.bincount(rows, minlength=n), out=indptr[1:])
    data = rs.standard_normal(cols.size).astype(np.float32)
    return data, cols.astype(np.int32), indptr


def _bench_input(rs, shape, rate: float, binary: bool):
    active = rs.random_sample(shape) < rate
    if binary:
        return active
    return np.where(active, rs.standard_normal(shape), 0.0).astype(np.float32)


# (n, transpose, shared weight): both sizes and directions, and one shared-weight case.
_BENCH_CASES = ((200, False, False), (200, True, True), (1000, False, False), (1000, True, False))


def _benchmark_data(binary: bool, matrix: bool):
    def configs(*, platform: str) -> list:
        del platform  # the same small cases everywhere
        from primforge.bench import BenchmarkConfig

        out = []
        for i, (n, transpose, shared) in enumerate(_BENCH_CASES):
            rs = np.random.RandomState(1234 + i)
            data, indices, indptr = _bench_csr(rs, n, _BENCH_PROB)
            if shared:
                data = np.array([0.5], np.float32)
            xshape = (n, _BENCH_COLS) if matrix else (n,)
            x = _bench_input(rs, xshape, _BENCH_RATE, binary)
            params = {"n": n, "p": _BENCH_PROB, "rate": _BENCH_RATE, "transpose": transpose,
                      "weight": "shared" if shared else "per-synapse"}
            if matrix:
                params["k"] = _BENCH_COLS
            out.append(BenchmarkConfig(
                args=(data, indices, indptr, x),
                kwargs={"shape": (n, n), "transpose": transpose},
                params=params,
            ))
        return out

    return configs


for (_binary, _matrix), _public_fn in {
    (False, False): csrmv,
    (True, False): binary_csrmv,
    (False, True): csrmm,
    (True, True): binary_csrmm,
}.items():
    KERNELS[(_binary, _matrix)].def_call(_public_fn)
    KERNELS[(_binary, _matrix)].def_benchmark_data(_benchmark_data(_binary, _matrix))
del _binary, _matrix, _public_fn
