"""primforge.ops dense event products: NumPy references, autodiff, vmap, bad input."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _jaxpr import eqn_names as _names
from jax.test_util import check_grads

from primforge import ops

BACKENDS = ["jax", "numba"]
M, N, C = 9, 13, 3

FUNCS = {
    (False, False): ops.densemv,
    (True, False): ops.binary_densemv,
    (False, True): ops.densemm,
    (True, True): ops.binary_densemm,
}
KERNELS = {
    (False, False): ops.densemv_p,
    (True, False): ops.binary_densemv_p,
    (False, True): ops.densemm_p,
    (True, True): ops.binary_densemm_p,
}


def make_input(rng, rows, matrix, binary, rate=0.4, dtype=np.float32, cols=C):
    shape = (rows, cols) if matrix else (rows,)
    active = rng.random(shape) < rate
    if matrix and rows > 2 and cols:
        active[1] = False  # a row with no event at all
    if binary:
        return active
    return np.where(active, rng.normal(size=shape), 0.0).astype(dtype)


def tol(dtype):
    return {"rtol": 1e-12, "atol": 1e-12} if dtype == np.float64 else {"rtol": 1e-5, "atol": 1e-5}




@pytest.mark.parametrize(
    "backend,binary,matrix,transpose,dtype,rate",
    list(itertools.product(BACKENDS, [False, True], [False, True], [False, True],
                           [np.float32, np.float64], [0.3, 1.0])),
)
def test_every_variant_matches_numpy(backend, binary, matrix, transpose, dtype, rate):
    rng = np.random.default_rng([binary, matrix, transpose, dtype == np.float64, rate == 1.0])
    with jax.enable_x64(dtype == np.float64):
        w = rng.normal(size=(M, N)).astype(dtype)
        a = w.T if transpose else w
        x = make_input(rng, a.shape[1], matrix, binary, rate=rate, dtype=dtype)
        want = a.astype(np.float64) @ x.astype(np.float64)
        f = lambda w, x: FUNCS[(binary, matrix)](w, x, transpose=transpose, backend=backend)
        got = f(w, x)
        assert got.shape == want.shape and got.dtype == dtype
        np.testing.assert_allclose(np.asarray(got), want, **tol(dtype))
        np.testing.assert_allclose(np.asarray(jax.jit(f)(w, x)), want, **tol(dtype))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int8, np.bool_])
def test_binary_events_of_any_dtype(backend, transpose, dtype):
    rng = np.random.default_rng(2)
    w = rng.normal(size=(M, N)).astype(np.float32)
    a = w.T if transpose else w
    x = ((rng.random(a.shape[1]) < 0.5) * rng.integers(-3, 5, size=a.shape[1])).astype(dtype)
    got = ops.binary_densemv(w, x, transpose=transpose, backend=backend)
    np.testing.assert_allclose(np.asarray(got), a @ (x != 0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "binary,matrix,transpose,m,n,cols",
    [(b, mat, t, *size) for b, mat, t in itertools.product([False, True], repeat=3)
     for size in [(0, 5, 2), (4, 0, 2), (0, 0, 2)] + [(4, 5, 0)] * mat],
)
def test_degenerate_sizes(backend, binary, matrix, transpose, m, n, cols):
    rng = np.random.default_rng(3)
    w = rng.normal(size=(m, n)).astype(np.float32)
    a = w.T if transpose else w
    x = make_input(rng, a.shape[1], matrix, binary, cols=cols)
    got = FUNCS[(binary, matrix)](w, x, transpose=transpose, backend=backend)
    want = a.astype(np.float64) @ x.astype(np.float64)
    assert got.shape == want.shape
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


def test_no_events_gives_zeros():
    w = np.ones((M, N), np.float32)
    for transpose in (False, True):
        rows = M if transpose else N
        assert not np.any(np.asarray(ops.binary_densemv(w, np.zeros(rows, bool),
                                                        transpose=transpose)))
        assert not np.any(np.asarray(ops.densemm(w, np.zeros((rows, 2), np.float32),
                                                 transpose=transpose)))


# ---------------------------------------------------------------------------- autodiff
@pytest.mark.parametrize("backend,matrix,transpose",
                         list(itertools.product(BACKENDS, [False, True], [False, True])))
def test_float_products_check_grads(backend, matrix, transpose):
    rng = np.random.default_rng([4, matrix, transpose])
    with jax.enable_x64(True):
        w = rng.normal(size=(M, N))
        x = make_input(rng, M if transpose else N, matrix, False, rate=1.0, dtype=np.float64)
        f = lambda w, x: FUNCS[(False, matrix)](w, x, transpose=transpose, backend=backend)
        check_grads(f, (w, x), order=2, modes=("fwd", "rev"), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("backend,matrix,transpose",
                         list(itertools.product(BACKENDS, [False, True], [False, True])))
def test_binary_products_check_grads_wrt_weights(backend, matrix, transpose):
    rng = np.random.default_rng([5, matrix, transpose])
    with jax.enable_x64(True):
        w = rng.normal(size=(M, N))
        ev = make_input(rng, M if transpose else N, matrix, True)
        f = lambda w: FUNCS[(True, matrix)](w, ev, transpose=transpose, backend=backend)
        check_grads(f, (w,), order=2, modes=("fwd", "rev"), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("backend,binary,matrix,transpose",
                         list(itertools.product(BACKENDS, [False, True], [False, True],
                                                [False, True])))
def test_gradients_equal_jnp_gradients(backend, binary, matrix, transpose):
    rng = np.random.default_rng([6, binary, matrix, transpose])
    w = rng.normal(size=(M, N)).astype(np.float32)
    x = make_input(rng, M if transpose else N, matrix, binary).astype(np.float32)
    ct = rng.normal(size=(N if transpose else M,) + ((C,) if matrix else ())).astype(np.float32)
    ref = lambda w, x: jnp.sum(ct * ((w.T if transpose else w) @ x))
    mine = lambda w, x: jnp.sum(ct * FUNCS[(binary, matrix)](w, x, transpose=transpose,
                                                             backend=backend))
    want = jax.grad(ref, argnums=(0, 1))(w, x)
    got = jax.grad(mine, argnums=(0, 1))(w, x)
    for g, r in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_jvp_and_bool_events_under_jit(backend):
    rng = np.random.default_rng(7)
    w, dw = rng.normal(size=(2, M, N)).astype(np.float32)
    x, dx = rng.normal(size=(2, N)).astype(np.float32)
    y, t = jax.jvp(lambda w, x: ops.densemv(w, x, backend=backend), (w, x), (dw, dx))
    np.testing.assert_allclose(np.asarray(y), w @ x, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(t), dw @ x + w @ dx, rtol=1e-5, atol=1e-5)
    ev = rng.random(M) < 0.5
    g = jax.jit(jax.grad(lambda w: ops.binary_densemv(w, ev, transpose=True,
                                                      backend=backend).sum()))(w)
    np.testing.assert_allclose(np.asarray(g), np.broadcast_to(ev[:, None], (M, N)) * 1.0)


# ---------------------------------------------------------------------------- vmap
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("binary,transpose", list(itertools.product([False, True], repeat=2)))
def test_vmap_over_input_is_one_matrix_call(backend, binary, transpose):
    rng = np.random.default_rng(8)
    w = rng.normal(size=(M, N)).astype(np.float32)
    a = w.T if transpose else w
    xs = np.stack([make_input(rng, a.shape[1], False, binary) for _ in range(5)])
    f = lambda x: FUNCS[(binary, False)](w, x, transpose=transpose, backend=backend)
    np.testing.assert_allclose(np.asarray(jax.vmap(f)(xs)), xs.astype(np.float64) @ a.T,
                               rtol=1e-5, atol=1e-5)
    names = _names(jax.make_jaxpr(jax.vmap(f))(xs).jaxpr)
    mm = KERNELS[(binary, True)].name
    assert names.count(mm) == 1 and KERNELS[(binary, False)].name not in names, names
    assert "while" not in jax.jit(jax.vmap(f)).lower(xs).as_text()
    # a matrix input batched on axis 1 is a wider matrix call
    xm = rng.random((a.shape[1], 4, 2)) < 0.4
    g = lambda x: FUNCS[(True, True)](w, x, transpose=transpose, backend=backend)
    np.testing.assert_allclose(np.asarray(jax.vmap(g, in_axes=1)(xm)),
                               np.stack([a @ xm[:, b] for b in range(4)]), rtol=1e-5, atol=1e-5)
    assert _names(jax.make_jaxpr(jax.vmap(g, in_axes=1))(xm).jaxpr).count(
        KERNELS[(True, True)].name) == 1
    empty = jax.vmap(f)(np.zeros((0, a.shape[1]), xs.dtype))
    assert empty.shape == (0, a.shape[0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_vmap_over_weights(backend):
    rng = np.random.default_rng(9)
    ws = rng.normal(size=(3, M, N)).astype(np.float32)
    xs = rng.random((3, M)) < 0.5
    f = lambda w, x: ops.binary_densemv(w, x, transpose=True, backend=backend)
    np.testing.assert_allclose(np.asarray(jax.vmap(f, in_axes=(0, None))(ws, xs[0])),
                               np.stack([xs[0] @ w for w in ws]), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(jax.vmap(f)(ws, xs)),
                               np.stack([x @ w for w, x in zip(ws, xs)]), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------- bad input
def test_trace_time_errors_name_the_argument():
    w = np.ones((M, N), np.float32)
    with pytest.raises(ValueError, match=r"input must have shape \(13,\)"):
        ops.densemv(w, np.ones(M, np.float32))
    with pytest.raises(ValueError, match=r"x @ W with W of shape \(9, 13\).*\(9, cols\)"):
        ops.binary_densemm(w, np.ones((N, 2), bool), transpose=True)
    with pytest.raises(ValueError, match="'weights' must be a 2-D"):
        ops.densemv(np.ones(N, np.float32), np.ones(N, np.float32))
    with pytest.raises(TypeError, match="the input must be floating point"):
        ops.densemv_p(w, np.ones(N, np.int32), transpose=False)
    with pytest.raises(ValueError, match=r"input must have shape"):
        jax.jit(lambda x: ops.densemv(w, x))(np.ones(N + 1, np.float32))


# ---------------------------------------------------------------------------- bench hooks
@pytest.mark.parametrize("binary,matrix", list(itertools.product([False, True], repeat=2)))
def test_benchmark_data_is_correct(binary, matrix):
    # every backend against jax on this data: tests/test_ops_bench.py's sweep
    kernel = KERNELS[(binary, matrix)]
    configs = kernel._benchmark_data_fn(platform="cpu")
    assert {c.params["transpose"] for c in configs} == {False, True}
    for cfg in configs:
        w, x = cfg.args
        a = w.T if cfg.kwargs["transpose"] else w
        got = kernel.call(*cfg.args, **cfg.kwargs, backend="numba")
        xf = (x != 0) if binary else x
        np.testing.assert_allclose(np.asarray(got), a.astype(np.float64) @ xf, rtol=1e-4,
                                   atol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("binary,matrix,transpose",
                         list(itertools.product([False, True], repeat=3)))
@pytest.mark.parametrize("active", [3, 20, 60, 400])
def test_sparse_and_dense_paths_of_the_kernels(backend, binary, matrix, transpose, active):
    """Few active inputs (the gather over active entries) and many (the full dot product)."""
    rng = np.random.default_rng([active, binary, matrix, transpose])
    m, n = 7, 400
    w = rng.normal(size=(m, n)).astype(np.float32)
    a = w.T if transpose else w
    rows = a.shape[1]
    shape = (rows, 2) if matrix else (rows,)
    x = np.zeros(shape, np.float32)
    pick = rng.choice(rows, size=min(active, rows), replace=False)
    x[pick] = rng.normal(size=(pick.size,) + shape[1:])
    x = (x != 0) if binary else x
    got = FUNCS[(binary, matrix)](w, x, transpose=transpose, backend=backend)
    np.testing.assert_allclose(np.asarray(got), a.astype(np.float64) @ x.astype(np.float64),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("binary,transpose", list(itertools.product([False, True], repeat=2)))
def test_matrix_columns_of_different_density(backend, binary, transpose):
    """One matrix input whose columns are empty, all active, sparse (gathered) and dense
    (full dot): each column of ``W @ X`` picks its own path, ``W.T @ X`` accumulates each
    column separately; every column must still equal its own matrix-vector product."""
    rng = np.random.default_rng([binary, transpose, 7])
    m, n = 9, 320
    w = rng.normal(size=(m, n)).astype(np.float32)
    a = w.T if transpose else w
    rows = a.shape[1]
    x = np.zeros((rows, 5), np.float32)
    x[:, 1] = rng.normal(size=rows)  # every entry active
    x[rng.choice(rows, 3, replace=False), 2] = 1.5  # sparse: gathered
    x[rng.choice(rows, rows // 3, replace=False), 3] = -0.5  # dense: unit-stride dot
    x[rows - 1, 4] = 2.0  # only the last entry (column 0 stays empty)
    x = (x != 0) if binary else x
    want = a.astype(np.float64) @ x.astype(np.float64)
    got = np.asarray(FUNCS[(binary, True)](w, x, transpose=transpose, backend=backend))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert not np.any(got[:, 0])
    batched = jax.vmap(lambda v: FUNCS[(binary, False)](w, v, transpose=transpose,
                                                         backend=backend), in_axes=1,
                       out_axes=1)(x)
    np.testing.assert_allclose(np.asarray(batched), want, rtol=1e-4, atol=1e-4)
