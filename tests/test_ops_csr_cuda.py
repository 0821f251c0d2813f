"""cuda_raw CSR kernels: the C++ twin of the CUDA bodies on the CPU against dense NumPy,
nvcc builds for sm_90/sm_80 and GPU lowering on any machine (XLA:GPU compiles of every
variant: test_ops_gpu_compile.py), real GPU runs against the jax backend."""

from __future__ import annotations

import contextlib
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gpu_utils import lower_for_cuda, requires_gpu
from jax.test_util import check_grads

import primforge
from primforge import ops
from primforge.backends import cuda as pcuda
from primforge.ops.csr import cuda as _cuda_csr

FUNCS = {
    (False, False): ops.csrmv,
    (True, False): ops.binary_csrmv,
    (False, True): ops.csrmm,
    (True, True): ops.binary_csrmm,
}
KINDS = list(FUNCS)  # (binary, matrix)
M, N = 37, 45
KS = (1, 3, 40)  # columns of a matrix input: one, fewer than a warp, more than a warp

needs_nvcc = pytest.mark.skipif(pcuda.find_nvcc() is None,
                                reason="nvcc not found (CUDA toolkit or primforge[cuda])")


def kind_id(kind):
    binary, matrix = kind
    return ("binary_" if binary else "") + ("csrmm" if matrix else "csrmv")


def x64_if(flag: bool):
    return jax.enable_x64(True) if flag else contextlib.nullcontext()


@pytest.fixture(scope="module", autouse=True)
def cpu_module():
    """Compile (or fetch from the disk cache) the C++ twin once for the module."""
    return _cuda_csr._module("cpu")


# ----------------------------------------------------------------------------- references
def structure(rng, m=M, n=N, index_dtype=np.int32):
    """indices/indptr with a row longer than a warp, duplicate columns and empty rows."""
    rows = []
    for i in range(m):
        if i == 0:
            cols = rng.integers(0, n, size=41)  # > 32 entries, unsorted, repeats likely
        elif i == 1:
            cols = [3, n // 2, 3, 3, n - 1]  # duplicate column indices
        elif i in (2, 5, m - 1):
            cols = []  # empty rows, including the last
        else:
            cols = rng.choice(n, size=rng.integers(0, 8), replace=False)
        rows.append(np.asarray(cols, np.int64))
    indptr = np.zeros(m + 1, np.int64)
    indptr[1:] = np.cumsum([len(c) for c in rows])
    return np.concatenate(rows).astype(index_dtype), indptr.astype(index_dtype)


def dense(data, indices, indptr, m, n, homo):
    """W as a float64 NumPy array (duplicates add up)."""
    w = np.zeros((m, n))
    rows = np.repeat(np.arange(m), np.diff(indptr.astype(np.int64)))
    vals = np.full(indices.shape[0], float(data[0])) if homo else data.astype(np.float64)
    np.add.at(w, (rows, indices.astype(np.int64)), vals)
    return w


def events(rng, shape, binary, dtype, style="bool"):
    active = rng.random(shape) < 0.4
    if shape and shape[0] > 3:
        active[3] = False  # an input row with no event at all
    if not binary:
        return np.where(active, rng.normal(size=shape), 0.0).astype(dtype)
    return active if style == "bool" else active.astype(dtype)


def tolerance(dtype):
    return {"rtol": 1e-12, "atol": 1e-12} if dtype == np.float64 else {"rtol": 1e-5,
                                                                          "atol": 1e-4}


def weights(rng, nnz, homo, dtype):
    return np.array([0.75], dtype) if homo else rng.normal(size=nnz).astype(dtype)


# ----------------------------------------------------------------------------- C++ twin
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64], ids=["i32", "i64"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("homo", [False, True], ids=["hetero", "homo"])
@pytest.mark.parametrize("transpose", [False, True], ids=["W", "WT"])
@pytest.mark.parametrize("kind", KINDS, ids=kind_id)
def test_every_variant_matches_dense_numpy(kind, transpose, homo, dtype, index_dtype):
    binary, matrix = kind
    rng = np.random.default_rng([binary, matrix, transpose, homo, dtype == np.float64,
                                 index_dtype == np.int64])
    indices, indptr = structure(rng, index_dtype=index_dtype)
    data = weights(rng, indices.shape[0], homo, dtype)
    a = dense(data, indices, indptr, M, N, homo)
    a = a.T if transpose else a
    styles = ("bool", "float") if binary else ("float",)
    with x64_if(dtype == np.float64 or index_dtype == np.int64):
        for k, style in itertools.product(KS if matrix else (None,), styles):
            shape = (a.shape[1], k) if matrix else (a.shape[1],)
            x = events(rng, shape, binary, dtype, style)
            got = FUNCS[kind](data, indices, indptr, x, shape=(M, N), transpose=transpose,
                              backend="cuda_raw")
            assert got.dtype == dtype and got.shape == (a.shape[0],) + shape[1:]
            np.testing.assert_allclose(np.asarray(got), a @ x.astype(np.float64),
                                       **tolerance(dtype), err_msg=f"k={k} events={style}")


@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.float32])
def test_binary_events_count_when_non_zero(transpose, dtype):
    rng = np.random.default_rng(7)
    indices, indptr = structure(rng)
    data = weights(rng, indices.shape[0], False, np.float32)
    a = dense(data, indices, indptr, M, N, False)
    a = a.T if transpose else a
    x = ((rng.random(a.shape[1]) < 0.5) * rng.integers(-3, 4, size=a.shape[1])).astype(dtype)
    got = ops.binary_csrmv(data, indices, indptr, x, shape=(M, N), transpose=transpose,
                           backend="cuda_raw")
    np.testing.assert_allclose(np.asarray(got), a @ (x != 0), rtol=1e-5, atol=1e-4)
    xm = np.stack([x, np.roll(x, 1)], axis=1)
    got = ops.binary_csrmm(data, indices, indptr, xm, shape=(M, N), transpose=transpose,
                           backend="cuda_raw")
    np.testing.assert_allclose(np.asarray(got), a @ (xm != 0), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("kind", KINDS, ids=kind_id)
def test_empty_structures(kind):
    binary, matrix = kind
    for m, n, homo in [(M, N, False), (M, N, True), (0, 6, False), (6, 0, True)]:
        indices = np.zeros(0, np.int32)
        indptr = np.zeros(m + 1, np.int32)
        data = np.array([2.0], np.float32) if homo else np.zeros(0, np.float32)
        for transpose in (False, True):
            rows_in, rows_out = (m, n) if transpose else (n, m)
            shape = (rows_in, 4) if matrix else (rows_in,)
            x = np.ones(shape, bool if binary else np.float32)
            got = FUNCS[kind](data, indices, indptr, x, shape=(m, n), transpose=transpose,
                              backend="cuda_raw")
            assert got.shape == (rows_out,) + shape[1:]
            np.testing.assert_array_equal(np.asarray(got), 0.0)


def test_mixed_index_dtypes():
    rng = np.random.default_rng(11)
    indices, indptr = structure(rng)
    data = weights(rng, indices.shape[0], False, np.float32)
    x = events(rng, (N,), False, np.float32)
    want = dense(data, indices, indptr, M, N, False) @ x
    with jax.enable_x64(True):
        for ind, ptr in [(indices, indptr.astype(np.int64)), (indices.astype(np.int64), indptr),
                         (indices.astype(np.uint16), indptr)]:
            got = ops.csrmv(data, ind, ptr, x, shape=(M, N), backend="cuda_raw")
            np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_indices_and_inputs_pass_through_without_a_copy(index_dtype):
    rng = np.random.default_rng(12)
    indices, indptr = structure(rng, index_dtype=index_dtype)
    data = weights(rng, indices.shape[0], False, np.float32)
    x = events(rng, (M,), True, np.float32)
    with jax.enable_x64(True):
        text = jax.jit(lambda d, i, p, x: ops.binary_csrmv(
            d, i, p, x, shape=(M, N), transpose=True, backend="cuda_raw")).lower(
                data, indices, indptr, x.astype(bool)).as_text()
    assert _cuda_csr._module("cpu").target("PfCsrCpu") in text
    assert "convert" not in text and "compare" not in text


@pytest.mark.parametrize("matrix", [False, True])
@pytest.mark.parametrize("transpose", [False, True])
def test_malformed_structure_gives_all_nan(matrix, transpose):
    rng = np.random.default_rng(13)
    indices, indptr = structure(rng)
    data = weights(rng, indices.shape[0], False, np.float32)
    cases = {}
    for name, where, value in [("index too large", 4, 10_000_000), ("negative index", 0, -1),
                               ("index == n", 2, N)]:
        bad = indices.copy()
        bad[where] = value
        cases[name] = (bad, indptr)
    p = indptr.copy()
    p[4] = 10_000_000
    cases["huge indptr entry"] = (indices, p)
    p = indptr.copy()
    p[7], p[8] = p[8], p[7] - 1  # a decreasing step, ends still right
    cases["decreasing indptr"] = (indices, p)
    p = indptr.copy()
    p[-1] += 1
    cases["indptr[-1] > len(indices)"] = (indices, p)
    p = indptr.copy()
    p[0] = 1
    cases["indptr[0] != 0"] = (indices, p)
    rows_in = M if transpose else N
    shape = (rows_in, 5) if matrix else (rows_in,)
    for binary in (False, True):
        x = np.ones(shape, bool) if binary else np.ones(shape, np.float32)
        f = jax.jit(lambda i, p, x, binary=binary: FUNCS[(binary, matrix)](
            data, i, p, x, shape=(M, N), transpose=transpose, backend="cuda_raw"))
        for name, (ind, ptr) in cases.items():
            got = np.asarray(f(ind, ptr, x))
            assert np.all(np.isnan(got)), f"{name} (binary={binary})"
        assert not np.any(np.isnan(np.asarray(f(indices, indptr, x))))


def test_unsupported_weight_dtype_is_a_clear_trace_time_error():
    rng = np.random.default_rng(14)
    indices, indptr = structure(rng)
    data = weights(rng, indices.shape[0], False, np.float16)
    with pytest.raises(primforge.KernelError, match=r"float32 or float64.*backend='jax'"):
        ops.csrmv(data, indices, indptr, np.ones(N, np.float16), shape=(M, N),
                  backend="cuda_raw")


# ----------------------------------------------------------------------------- transformations
@pytest.mark.parametrize("homo", [False, True], ids=["hetero", "homo"])
@pytest.mark.parametrize("transpose", [False, True], ids=["W", "WT"])
@pytest.mark.parametrize("matrix", [False, True], ids=["mv", "mm"])
def test_float_grads(matrix, transpose, homo):
    rng = np.random.default_rng([matrix, transpose, homo])
    with jax.enable_x64(True):
        indices, indptr = structure(rng, m=9, n=7)
        data = weights(rng, indices.shape[0], homo, np.float64)
        rows_in = 9 if transpose else 7
        x = rng.normal(size=(rows_in, 3) if matrix else (rows_in,))
        f = lambda d, x: FUNCS[(False, matrix)](d, indices, indptr, x, shape=(9, 7),
                                                transpose=transpose, backend="cuda_raw")
        check_grads(f, (data, x), order=2, modes=("fwd", "rev"))
        # and against jax.grad of the same loss written with a dense jax.numpy matrix
        rows = np.repeat(np.arange(9), np.diff(indptr))
        nnz = indices.shape[0]

        def dense_w(d):
            vals = jnp.broadcast_to(d[0], (nnz,)) if homo else d
            w = jnp.zeros((9, 7), d.dtype).at[rows, indices].add(vals)
            return w.T if transpose else w

        loss = lambda d, x: jnp.sum(jnp.sin(f(d, x)))
        loss_ref = lambda d, x: jnp.sum(jnp.sin(dense_w(d) @ x))
        got = jax.grad(loss, argnums=(0, 1))(data, x)
        want = jax.grad(loss_ref, argnums=(0, 1))(data, x)
        for g, w in zip(got, want):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("transpose", [False, True], ids=["W", "WT"])
@pytest.mark.parametrize("matrix", [False, True], ids=["mv", "mm"])
def test_binary_grad_wrt_weights(matrix, transpose):
    rng = np.random.default_rng([matrix, transpose, 5])
    with jax.enable_x64(True):
        indices, indptr = structure(rng, m=9, n=7)
        data = weights(rng, indices.shape[0], False, np.float64)
        rows_in = 9 if transpose else 7
        ev = events(rng, (rows_in, 3) if matrix else (rows_in,), True, np.float64)
        f = lambda d: FUNCS[(True, matrix)](d, indices, indptr, ev, shape=(9, 7),
                                            transpose=transpose, backend="cuda_raw")
        check_grads(f, (data,), order=1, modes=("fwd", "rev"))


@pytest.mark.parametrize("kind", KINDS, ids=kind_id)
def test_vmap_over_events_and_over_weights(kind):
    binary, matrix = kind
    rng = np.random.default_rng([binary, matrix, 9])
    indices, indptr = structure(rng)
    data = weights(rng, indices.shape[0], False, np.float32)
    for transpose in (False, True):
        rows_in = M if transpose else N
        xshape = (rows_in, 3) if matrix else (rows_in,)
        xs = np.stack([events(rng, xshape, binary, np.float32) for _ in range(4)])
        ds = np.stack([data * s for s in (1.0, -0.5, 2.0, 0.0)]).astype(np.float32)
        f = lambda d, x, t=transpose: FUNCS[kind](d, indices, indptr, x, shape=(M, N),
                                                  transpose=t, backend="cuda_raw")
        got_x = jax.vmap(f, in_axes=(None, 0))(data, xs)
        got_d = jax.vmap(f, in_axes=(0, None))(ds, xs[0])
        for b in range(4):
            a = dense(data, indices, indptr, M, N, False)
            a = a.T if transpose else a
            np.testing.assert_allclose(np.asarray(got_x[b]), a @ xs[b].astype(np.float64),
                                       rtol=1e-5, atol=1e-4)
            ad = dense(ds[b], indices, indptr, M, N, False)
            ad = ad.T if transpose else ad
            np.testing.assert_allclose(np.asarray(got_d[b]), ad @ xs[0].astype(np.float64),
                                       rtol=1e-5, atol=1e-4)


def test_defaults_are_unchanged_and_cuda_raw_is_registered():
    for kernel in (ops.csrmv_p, ops.binary_csrmv_p, ops.csrmm_p, ops.binary_csrmm_p):
        assert kernel.get_default("cpu") == "numba"
        assert kernel.get_default("gpu") == "jax"
        assert "cuda_raw" in kernel.available_backends("cpu")
        assert "cuda_raw" in kernel.available_backends("gpu")


# ----------------------------------------------------------------------------- nvcc, lowering
@needs_nvcc
@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
def test_nvcc_compiles_the_cuda_source(arch):
    """The CUDA bodies build for H100 and A100 (XLA:GPU's compile of the calls is in
    test_ops_gpu_compile.py)."""
    module = _cuda_csr.load_module("gpu", register=False, arch=arch)
    assert module.platform == "CUDA" and "PfCsrGpu" in module.targets


@needs_nvcc
@pytest.mark.parametrize("kind", KINDS, ids=kind_id)
def test_gpu_lowering_calls_the_cuda_handler(kind):
    binary, matrix = kind
    rng = np.random.default_rng(15)
    indices, indptr = structure(rng)
    data = weights(rng, indices.shape[0], True, np.float32)
    target = _cuda_csr._module("gpu").target("PfCsrGpu")
    for transpose in (False, True):
        rows_in = M if transpose else N
        x = events(rng, (rows_in, 4) if matrix else (rows_in,), binary, np.float32)
        for backend in ("cuda_raw", None):
            text = lower_for_cuda(lambda d, x, b=backend, t=transpose: FUNCS[kind](
                d, indices, indptr, x, shape=(M, N), transpose=t, backend=b),
                data, x)
            assert (target in text) == (backend == "cuda_raw"), backend
            if backend:
                assert f"transpose = {str(transpose).lower()}" in text
                assert f"binary = {str(binary).lower()}" in text
                assert "homo = true" in text


# ----------------------------------------------------------------------------- real GPU
def _on_gpu(a):
    return jax.device_put(a, jax.devices("gpu")[0])


def _gpu_compare(kind, transpose, data, indices, indptr, x, shape, tol):
    f = lambda backend: np.asarray(FUNCS[kind](
        _on_gpu(data), _on_gpu(indices), _on_gpu(indptr), _on_gpu(x), shape=shape,
        transpose=transpose, backend=backend))
    np.testing.assert_allclose(f("cuda_raw"), f("jax"), **tol)


@requires_gpu
@needs_nvcc
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64], ids=["i32", "i64"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("homo", [False, True], ids=["hetero", "homo"])
@pytest.mark.parametrize("transpose", [False, True], ids=["W", "WT"])
@pytest.mark.parametrize("kind", KINDS, ids=kind_id)
def test_gpu_matches_jax_backend(kind, transpose, homo, dtype, index_dtype):
    binary, matrix = kind
    rng = np.random.default_rng([binary, matrix, transpose, homo, dtype == np.float64])
    with x64_if(dtype == np.float64 or index_dtype == np.int64):
        indices, indptr = structure(rng, index_dtype=index_dtype)
        data = weights(rng, indices.shape[0], homo, dtype)
        rows_in = M if transpose else N
        for k in KS if matrix else (None,):
            x = events(rng, (rows_in, k) if matrix else (rows_in,), binary, dtype)
            _gpu_compare(kind, transpose, data, indices, indptr, x, (M, N), tolerance(dtype))
        if (dtype == np.float64) != (index_dtype == np.int64):
            return  # the large cases below only for f32/i32 and f64/i64, to save GPU time
        # a larger random matrix with a very long row, and more rows than one grid covers
        # (65535 blocks x 8 warps), so the grid-stride loop wraps
        for m, n, density in [(3000, 2000, 0.01), (600_000, 64, 0.03)]:
            mask_rows = rng.binomial(n, density, size=m)
            mask_rows[1] = n  # a full row
            indptr_l = np.zeros(m + 1, np.int64)
            indptr_l[1:] = np.cumsum(mask_rows)
            indices_l = rng.integers(0, n, size=indptr_l[-1]).astype(index_dtype)
            data_l = weights(rng, indices_l.shape[0], homo, dtype)
            rows_in = m if transpose else n
            for k in (5, 128) if matrix else (None,):
                x = events(rng, (rows_in, k) if matrix else (rows_in,), binary, dtype)
                _gpu_compare(kind, transpose, data_l, indices_l, indptr_l.astype(index_dtype),
                             x, (m, n), {"rtol": 1e-4, "atol": 1e-3})


@requires_gpu
@needs_nvcc
@pytest.mark.parametrize("matrix", [False, True])
@pytest.mark.parametrize("transpose", [False, True])
def test_gpu_malformed_structure_gives_all_nan(matrix, transpose):
    rng = np.random.default_rng(16)
    indices, indptr = structure(rng)
    data = weights(rng, indices.shape[0], False, np.float32)
    bad = indices.copy()
    bad[4] = 10_000_000
    ptr = indptr.copy()
    ptr[4] = 10_000_000
    rows_in = M if transpose else N
    x = np.ones((rows_in, 5) if matrix else (rows_in,), bool)
    for ind, p in [(bad, indptr), (indices, ptr)]:
        got = FUNCS[(True, matrix)](_on_gpu(data), _on_gpu(ind), _on_gpu(p), _on_gpu(x),
                                    shape=(M, N), transpose=transpose, backend="cuda_raw")
        assert np.all(np.isnan(np.asarray(got)))


@requires_gpu
@needs_nvcc
@pytest.mark.parametrize("kind", KINDS, ids=kind_id)
def test_gpu_grad_and_vmap(kind):
    binary, matrix = kind
    rng = np.random.default_rng(17)
    indices, indptr = structure(rng)
    data = weights(rng, indices.shape[0], False, np.float32)
    xs = np.stack([events(rng, (N, 3) if matrix else (N,), binary, np.float32)
                   for _ in range(3)])

    def loss(backend):
        f = lambda d, x: jnp.sum(FUNCS[kind](d, indices, indptr, x, shape=(M, N),
                                             backend=backend) ** 2)
        return jax.jit(jax.vmap(jax.grad(f), in_axes=(None, 0)))(_on_gpu(data), _on_gpu(xs))

    np.testing.assert_allclose(np.asarray(loss("cuda_raw")), np.asarray(loss("jax")),
                               rtol=1e-4, atol=1e-4)

