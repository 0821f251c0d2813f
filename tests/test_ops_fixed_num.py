"""primforge.ops fixed-number connectivity: dense NumPy references, autodiff, vmap, bad input."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _jaxpr import eqn_names as _names
from jax.test_util import check_grads

from primforge import ops
from primforge.ops import FixedNum, FixedNumStructureError, fixed_num

# "pallas" runs the GPU kernels interpreted on the CPU: the same kernel bodies as on a GPU.
# "numba_parallel": A @ x and the weight gradient of vector products on Numba's threads.
BACKENDS = ["jax", "numba", "numba_parallel", "pallas"]
M, N, K, C = 11, 7, 4, 3  # stored A is (M, N) with K entries per row; C input columns

FUNCS = {
    (False, False): ops.fixed_num_mv,
    (True, False): ops.binary_fixed_num_mv,
    (False, True): ops.fixed_num_mm,
    (True, True): ops.binary_fixed_num_mm,
}
PRIMS = {
    (False, False): "primforge.ops.fixed_num_mv",
    (True, False): "primforge.ops.binary_fixed_num_mv",
    (False, True): "primforge.ops.fixed_num_mm",
    (True, True): "primforge.ops.binary_fixed_num_mm",
}


def structure(rng, m=M, n=N, k=K, shared=False, dtype=np.float32):
    """Random indices (with repeats) and weights, and the dense (m, n) NumPy matrix."""
    ind = rng.integers(0, n, size=(m, k)).astype(np.int32) if n else np.zeros((m, k), np.int32)
    w = (np.array([0.75], dtype) if shared else rng.normal(size=(m, k)).astype(dtype))
    return w, ind, dense_of(w, ind, (m, n))


def dense_of(w, ind, shape, valid=None):
    """Dense matrix built with NumPy: A[i, ind[i, j]] += w[i, j] (optionally masked)."""
    a = np.zeros(shape, np.float64)
    vals = np.broadcast_to(np.asarray(w, np.float64).reshape(-1)[0] if w.ndim == 1 else w,
                           ind.shape)
    rows = np.broadcast_to(np.arange(ind.shape[0])[:, None], ind.shape)
    keep = np.ones(ind.shape, bool) if valid is None else valid
    np.add.at(a, (rows[keep], ind[keep]), vals[keep])
    return a


def make_input(rng, rows, matrix, binary, rate=0.4, dtype=np.float32):
    shape = (rows, C) if matrix else (rows,)
    active = rng.random(shape) < rate
    if binary:
        return active
    return np.where(active, rng.normal(size=shape), 0.0).astype(dtype)


def tol(dtype):
    return {"rtol": 1e-12, "atol": 1e-12} if dtype == np.float64 else {"rtol": 1e-5, "atol": 1e-5}




# ---------------------------------------------------------------------------- values
@pytest.mark.parametrize(
    "backend,binary,matrix,shared,transpose,dtype",
    list(itertools.product(BACKENDS, [False, True], [False, True], [False, True],
                           [False, True], [np.float32, np.float64])),
)
def test_every_variant_matches_dense_numpy(backend, binary, matrix, shared, transpose, dtype):
    rng = np.random.default_rng([binary, matrix, shared, transpose, dtype == np.float64])
    with jax.enable_x64(dtype == np.float64):
        w, ind, a = structure(rng, shared=shared, dtype=dtype)
        a = a.T if transpose else a
        x = make_input(rng, a.shape[1], matrix, binary, dtype=dtype)
        want = a @ x.astype(np.float64)
        f = lambda w, x: FUNCS[(binary, matrix)](w, ind, x, shape=(M, N), transpose=transpose,
                                                 backend=backend)
        got = f(w, x)
        assert got.shape == want.shape and got.dtype == dtype
        np.testing.assert_allclose(np.asarray(got), want, **tol(dtype))
        np.testing.assert_allclose(np.asarray(jax.jit(f)(w, x)), want, **tol(dtype))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int8, np.bool_])
def test_binary_events_of_any_dtype_count_when_non_zero(backend, transpose, dtype):
    rng = np.random.default_rng(3)
    w, ind, a = structure(rng)
    a = a.T if transpose else a
    x = ((rng.random(a.shape[1]) < 0.5) * rng.integers(-3, 5, size=a.shape[1])).astype(dtype)
    got = ops.binary_fixed_num_mv(w, ind, x, shape=(M, N), transpose=transpose, backend=backend)
    np.testing.assert_allclose(np.asarray(got), a @ (x != 0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "binary,matrix,transpose,m,n,k,cols",
    [(b, mat, t, *size) for b, mat, t in itertools.product([False, True], repeat=3)
     for size in [(0, 5, 3, 2), (6, 5, 0, 2), (6, 0, 0, 2), (0, 0, 0, 2)] + [(6, 5, 3, 0)] * mat],
)
def test_degenerate_sizes(backend, binary, matrix, transpose, m, n, k, cols):
    # (6, 5, 3, 0): an empty batch, i.e. a matrix input with no columns.
    rng = np.random.default_rng(5)
    w, ind, a = structure(rng, m=m, n=n, k=k)
    a = a.T if transpose else a
    shape = (a.shape[1], cols) if matrix else (a.shape[1],)
    x = rng.random(shape) < 0.5 if binary else rng.normal(size=shape).astype(np.float32)
    got = FUNCS[(binary, matrix)](w, ind, x, shape=(m, n), transpose=transpose, backend=backend)
    want = a @ x.astype(np.float64)
    assert got.shape == want.shape
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


def test_shared_weight_as_scalar_and_numba_is_cpu_default():
    rng = np.random.default_rng(6)
    _, ind, a = structure(rng, shared=True)
    x = rng.random(M) < 0.5
    got = ops.binary_fixed_num_mv(0.75, ind, x, shape=(M, N), transpose=True)
    np.testing.assert_allclose(np.asarray(got), a.T @ x, rtol=1e-6)
    assert ops.binary_fixed_num_mv_p.defaults["cpu"] == "numba"
    assert ops.densemv_p.defaults["cpu"] == "numba"


# ---------------------------------------------------------------------------- masking
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("binary,matrix,transpose,shared",
                         list(itertools.product([False, True], repeat=4)))
def test_out_of_range_indices_are_masked_under_jit(backend, binary, matrix, transpose, shared):
    rng = np.random.default_rng([7, binary, matrix, transpose, shared])
    w, ind, _ = structure(rng, shared=shared)
    bad = ind.copy()
    bad[0, 0], bad[3, 2], bad[5, 1] = 10_000_000, -1, N  # far out, negative, just past the end
    valid = (bad >= 0) & (bad < N)
    a = dense_of(w, np.where(valid, bad, 0), (M, N), valid)
    a = a.T if transpose else a
    x = make_input(rng, a.shape[1], matrix, binary, rate=1.0)
    f = jax.jit(lambda i: FUNCS[(binary, matrix)](w, i, x, shape=(M, N), transpose=transpose,
                                                  backend=backend))
    np.testing.assert_allclose(np.asarray(f(bad)), a @ x.astype(np.float64), rtol=1e-5,
                               atol=1e-5)
    if not binary and not shared:  # the masked entries get no gradient
        g = jax.grad(lambda w: FUNCS[(False, matrix)](w, bad, x, shape=(M, N),
                                                      transpose=transpose,
                                                      backend=backend).sum())(w)
        assert np.all(np.asarray(g)[~valid] == 0)


# ---------------------------------------------------------------------------- autodiff
@pytest.mark.parametrize("backend,matrix,shared,transpose",
                         list(itertools.product(BACKENDS, [False, True], [False, True],
                                                [False, True])))
def test_float_products_check_grads(backend, matrix, shared, transpose):
    rng = np.random.default_rng([8, matrix, shared, transpose])
    with jax.enable_x64(True):  # second order by finite differences needs float64
        w, ind, _ = structure(rng, shared=shared, dtype=np.float64)
        x = make_input(rng, M if transpose else N, matrix, False, rate=1.0, dtype=np.float64)
        f = lambda w, x: FUNCS[(False, matrix)](w, ind, x, shape=(M, N), transpose=transpose,
                                                backend=backend)
        check_grads(f, (w, x), order=2, modes=("fwd", "rev"), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("backend,matrix,shared,transpose",
                         list(itertools.product(BACKENDS, [False, True], [False, True],
                                                [False, True])))
def test_binary_products_check_grads_wrt_weights(backend, matrix, shared, transpose):
    rng = np.random.default_rng([9, matrix, shared, transpose])
    with jax.enable_x64(True):
        w, ind, _ = structure(rng, shared=shared, dtype=np.float64)
        ev = make_input(rng, M if transpose else N, matrix, True)
        f = lambda w: FUNCS[(True, matrix)](w, ind, ev, shape=(M, N), transpose=transpose,
                                            backend=backend)
        check_grads(f, (w,), order=2, modes=("fwd", "rev"), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("backend,binary,matrix,shared,transpose",
                         list(itertools.product(BACKENDS, [False, True], [False, True],
                                                [False, True], [False, True])))
def test_gradients_equal_dense_jnp_gradients(backend, binary, matrix, shared, transpose):
    """Weight and input gradients against jax.grad of the dense product in jax.numpy."""
    rng = np.random.default_rng([10, binary, matrix, shared, transpose])
    w, ind, _ = structure(rng, shared=shared)
    rows = np.broadcast_to(np.arange(M)[:, None], ind.shape)
    x = make_input(rng, M if transpose else N, matrix, binary)
    xf = x.astype(np.float32)
    ct = rng.normal(size=(N if transpose else M,) + ((C,) if matrix else ())).astype(np.float32)

    def dense_loss(a, x):
        a = a.T if transpose else a
        return jnp.sum(ct * (a @ x))

    def loss(w, x):
        return jnp.sum(ct * FUNCS[(binary, matrix)](w, ind, x, shape=(M, N),
                                                    transpose=transpose, backend=backend))

    a = jnp.asarray(dense_of(w, ind, (M, N)), jnp.float32)
    g_a, g_x = jax.grad(dense_loss, argnums=(0, 1))(a, jnp.asarray(xf))
    # dL/dw_ij = dL/dA[i, ind_ij]; a shared weight gets the sum over all entries.
    want_w = np.asarray(g_a)[rows, ind]
    want_w = want_w.sum().reshape(1) if shared else want_w
    x_in = xf if binary else x  # binary kernels: straight-through on float 0/1 events
    got_w, got_x = jax.grad(loss, argnums=(0, 1))(w, x_in)
    np.testing.assert_allclose(np.asarray(got_w), want_w, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(got_x), np.asarray(g_x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("transpose", [False, True])
def test_jvp_matches_dense(backend, transpose):
    rng = np.random.default_rng(11)
    w, ind, _ = structure(rng)
    dw = rng.normal(size=w.shape).astype(np.float32)
    x = make_input(rng, M if transpose else N, False, False, rate=1.0)
    dx = rng.normal(size=x.shape).astype(np.float32)
    f = lambda w, x: ops.fixed_num_mv(w, ind, x, shape=(M, N), transpose=transpose,
                                      backend=backend)
    y, t = jax.jvp(f, (w, x), (dw, dx))
    a, da = dense_of(w, ind, (M, N)), dense_of(dw, ind, (M, N))
    a, da = (a.T, da.T) if transpose else (a, da)
    np.testing.assert_allclose(np.asarray(y), a @ x, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(t), da @ x + a @ dx, rtol=1e-5, atol=1e-5)


def test_bool_events_have_no_tangent_and_grad_under_jit():
    rng = np.random.default_rng(12)
    w, ind, a = structure(rng)
    ev = rng.random(M) < 0.5
    g = jax.jit(jax.grad(lambda w: ops.binary_fixed_num_mv(w, ind, ev, shape=(M, N),
                                                           transpose=True).sum()))(w)
    np.testing.assert_allclose(np.asarray(g), np.broadcast_to(ev[:, None], w.shape) * 1.0)
    assert a.shape == (M, N)


# ---------------------------------------------------------------------------- vmap
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("binary,transpose,shared", [(True, True, True), (False, False, False),
                                                     (True, False, False), (False, True, True)])
def test_vmap_over_input_is_one_matrix_call(backend, binary, transpose, shared):
    rng = np.random.default_rng(13)
    w, ind, a = structure(rng, shared=shared)
    a = a.T if transpose else a
    xs = np.stack([make_input(rng, a.shape[1], False, binary) for _ in range(6)])
    f = lambda x: FUNCS[(binary, False)](w, ind, x, shape=(M, N), transpose=transpose,
                                         backend=backend)
    got = jax.vmap(f)(xs)
    np.testing.assert_allclose(np.asarray(got), xs.astype(np.float64) @ a.T, rtol=1e-5,
                               atol=1e-5)
    names = _names(jax.make_jaxpr(jax.vmap(f))(xs).jaxpr)
    assert names.count(PRIMS[(binary, True)]) == 1, names
    assert PRIMS[(binary, False)] not in names and "scan" not in names and "while" not in names
    if backend != "pallas":  # interpreted Pallas lowers its grid to a loop by design
        assert "while" not in jax.jit(jax.vmap(f)).lower(xs).as_text()


@pytest.mark.parametrize("backend", BACKENDS)
def test_vmap_of_matrix_input_on_axis_1_and_empty_batch(backend):
    rng = np.random.default_rng(14)
    w, ind, a = structure(rng)
    xs = rng.random((N, 4, C)) < 0.4
    f = lambda x: ops.binary_fixed_num_mm(w, ind, x, shape=(M, N), backend=backend)
    got = jax.vmap(f, in_axes=1)(xs)
    np.testing.assert_allclose(np.asarray(got), np.stack([a @ xs[:, b] for b in range(4)]),
                               rtol=1e-5, atol=1e-5)
    names = _names(jax.make_jaxpr(jax.vmap(f, in_axes=1))(xs).jaxpr)
    assert names.count(PRIMS[(True, True)]) == 1
    empty = jax.vmap(lambda x: ops.binary_fixed_num_mv(w, ind, x, shape=(M, N),
                                                       backend=backend))(np.zeros((0, N), bool))
    assert empty.shape == (0, M)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("transpose", [False, True])
def test_vmap_over_weights_and_both(backend, transpose):
    rng = np.random.default_rng(15)
    w, ind, _ = structure(rng)
    ws = np.stack([w * s for s in (1.0, -2.0, 0.5)])
    xs = np.stack([make_input(rng, M if transpose else N, False, False) for _ in range(3)])
    f = lambda w, x: ops.fixed_num_mv(w, ind, x, shape=(M, N), transpose=transpose,
                                      backend=backend)
    dense = [dense_of(wi, ind, (M, N)) for wi in ws]
    dense = [d.T if transpose else d for d in dense]
    np.testing.assert_allclose(np.asarray(jax.vmap(f, in_axes=(0, None))(ws, xs[0])),
                               np.stack([d @ xs[0] for d in dense]), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(jax.vmap(f)(ws, xs)),
                               np.stack([d @ x for d, x in zip(dense, xs)]), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------- FixedNum class
@pytest.mark.parametrize("per", ["pre", "post"])
@pytest.mark.parametrize("shared", [False, True])
def test_fixednum_class_products_on_both_sides(per, shared):
    rng = np.random.default_rng(16)
    n_pre, n_post = 9, 6
    rows, cols = (n_pre, n_post) if per == "pre" else (n_post, n_pre)
    w, ind, a = structure(rng, m=rows, n=cols, shared=shared)
    W = FixedNum.from_indices(ind, w, shape=(n_pre, n_post), per=per)
    dense = a if per == "pre" else a.T  # the (n_pre, n_post) matrix
    np.testing.assert_allclose(np.asarray(W.todense()), dense, rtol=1e-6)
    spikes = rng.random(n_pre) < 0.5
    v = rng.normal(size=n_post).astype(np.float32)
    np.testing.assert_allclose(np.asarray(spikes @ W), spikes @ dense, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(W @ v), dense @ v, rtol=1e-5, atol=1e-5)
    sm = rng.random((3, n_pre)) < 0.5
    np.testing.assert_allclose(np.asarray(sm @ W), sm @ dense, rtol=1e-5, atol=1e-5)
    vm = rng.normal(size=(n_post, 2)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(W @ vm), dense @ vm, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(W.T.todense()), dense.T, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(W.T @ spikes), dense.T @ spikes, rtol=1e-5, atol=1e-5)
    # A pytree under jit and vmap; grad w.r.t. the weights through with_data.
    np.testing.assert_allclose(np.asarray(jax.jit(lambda W, s: s @ W)(W, spikes)),
                               spikes @ dense, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(jax.vmap(lambda s: s @ W)(sm)), sm @ dense,
                               rtol=1e-5, atol=1e-5)
    g = jax.grad(lambda w: (spikes @ W.with_data(w)).sum())(W.weights)
    assert g.shape == W.weights.shape


def test_fixed_num_generator():
    W = fixed_num(300, 200, 10, seed=1)
    ind = np.asarray(W.indices)
    assert ind.shape == (300, 10) and W.homogeneous and W.per == "pre"
    assert all(len(set(r)) == 10 for r in ind.tolist())  # distinct partners by default
    assert ind.min() >= 0 and ind.max() < 200
    assert np.all((np.asarray(W.todense()) != 0).sum(axis=1) == 10)
    col_counts = np.bincount(ind.ravel(), minlength=200)
    assert abs(col_counts.mean() - 15) < 1e-9 and col_counts.std() < 8  # spread, not clumped
    P = fixed_num(50, 50, 49, per="post", allow_self_connections=False, seed=2,
                  weight=lambda rng, s: rng.uniform(1, 2, size=s))
    d = np.asarray(P.todense())
    assert np.all(np.diag(d) == 0) and np.all((d != 0).sum(axis=0) == 49)
    assert P.weights.shape == (50, 49)
    R = fixed_num(10, 3, 8, replace=True, seed=3)
    assert R.indices.shape == (10, 8)
    assert np.array_equal(np.asarray(fixed_num(20, 30, 4, seed=9).indices),
                          np.asarray(fixed_num(20, 30, 4, seed=9).indices))
    with pytest.raises(ValueError, match="k = 5 exceeds the 4 candidate"):
        fixed_num(10, 4, 5)
    with pytest.raises(ValueError, match="n_pre == n_post"):
        fixed_num(10, 4, 2, allow_self_connections=False)


# ---------------------------------------------------------------------------- bad input
def test_construction_validates_indices_once():
    with pytest.raises(FixedNumStructureError, match=r"indices\[1, 0\] = 3 \(2 entries"):
        FixedNum.from_indices([[0, 1], [3, 2], [-1, 0]], 1.0, shape=(3, 3))
    with pytest.raises(FixedNumStructureError, match=r"\[0, 2\)"):
        FixedNum.from_indices([[0, 2]], 1.0, shape=(1, 2), per="pre")
    FixedNum.from_indices([[0, 2]], 1.0, shape=(4, 1), per="post")  # sources in [0, 4)
    with pytest.raises(ValueError, match=r"'indices' must have 4 rows"):
        FixedNum.from_indices([[0, 2]], 1.0, shape=(4, 2), per="pre")
    with pytest.raises(TypeError, match="'indices' must be an integer array"):
        FixedNum.from_indices([[0.0, 1.0]], 1.0, shape=(1, 2))
    with pytest.raises(ValueError, match="'per' must be 'pre' or 'post'"):
        FixedNum.from_indices([[0]], 1.0, shape=(1, 2), per="both")


def test_trace_time_errors_name_the_argument():
    rng = np.random.default_rng(17)
    w, ind, _ = structure(rng)
    v = np.ones(N, np.float32)
    with pytest.raises(TypeError, match="'indices' must be an integer array"):
        ops.fixed_num_mv(w, ind.astype(np.float32), v, shape=(M, N))
    with pytest.raises(ValueError, match=r"'indices' must be 2-D"):
        ops.fixed_num_mv(w, ind.ravel(), v, shape=(M, N))
    with pytest.raises(ValueError, match=r"'indices' must have 12 rows"):
        ops.fixed_num_mv(w, ind, v, shape=(M + 1, N))
    with pytest.raises(ValueError, match=r"'weights' must have shape \(11, 4\).*same k"):
        ops.fixed_num_mv(w[:, :-1], ind, v, shape=(M, N))  # k mismatch
    with pytest.raises(ValueError, match=r"input must have shape \(7,\)"):
        ops.fixed_num_mv(w, ind, np.ones(M, np.float32), shape=(M, N))
    with pytest.raises(ValueError, match=r"input must have shape \(11, cols\)"):
        ops.binary_fixed_num_mm(w, ind, np.ones((N, 2), bool), shape=(M, N), transpose=True)
    with pytest.raises(TypeError, match="'shape' must be a pair"):
        ops.fixed_num_mv(w, ind, v, shape=N)
    with pytest.raises(ValueError, match="vector or a matrix"):
        FixedNum.from_indices(ind, w, shape=(M, N)) @ np.ones((2, 2, 2), np.float32)
    # Under jit the same checks fire at trace time.
    with pytest.raises(ValueError, match=r"'weights' must have shape"):
        jax.jit(lambda w: ops.fixed_num_mv(w, ind, v, shape=(M, N)))(w[:, :2])


# ---------------------------------------------------------------------------- bench hooks
@pytest.mark.parametrize("binary,matrix", list(itertools.product([False, True], repeat=2)))
def test_benchmark_data_is_correct(binary, matrix):
    # every backend against jax on this data: tests/test_ops_bench.py's sweep
    kernel = {(False, False): ops.fixed_num_mv_p, (True, False): ops.binary_fixed_num_mv_p,
              (False, True): ops.fixed_num_mm_p, (True, True): ops.binary_fixed_num_mm_p}[
                  (binary, matrix)]
    configs = kernel._benchmark_data_fn(platform="cpu")
    assert {c.params["transpose"] for c in configs} == {False, True}
    for cfg in configs:
        w, ind, x = cfg.args
        a = dense_of(w, ind, cfg.kwargs["shape"])
        a = a.T if cfg.kwargs["transpose"] else a
        got = kernel.call(*cfg.args, **cfg.kwargs, backend="numba")
        xf = (x != 0) if binary else x
        np.testing.assert_allclose(np.asarray(got), a @ xf.astype(np.float64), rtol=1e-4,
                                   atol=1e-4)


# ---------------------------------------------------------------------------- pallas (GPU)
def test_pallas_is_opt_in_and_the_defaults_stay():
    for kernel in (ops.fixed_num_mv_p, ops.binary_fixed_num_mv_p, ops.fixed_num_mm_p,
                   ops.binary_fixed_num_mm_p):
        assert kernel.defaults["cpu"] == "numba" and kernel.defaults["gpu"] == "jax"
        assert "pallas" in kernel.available_backends("gpu")
        assert "numba_parallel" in kernel.available_backends("cpu")


@pytest.mark.parametrize("k,cols", [(_k, _c) for _k in (1, 33, 70) for _c in (1, 5, 37)])
def test_pallas_chunks_and_column_blocks(k, cols):
    """Rows longer than one chunk of entries, more columns than one block (interpreted)."""
    from primforge.ops.fixed_num import pallas as _pallas_fixed_num

    assert max(k, cols) > _pallas_fixed_num.BLOCK_K or k == 1
    rng = np.random.default_rng([k, cols])
    m, n = 5, 40
    w, ind, a = structure(rng, m=m, n=n, k=k)
    ind[0, -1] = -3  # masked
    valid = ind >= 0
    a = dense_of(w, np.where(valid, ind, 0), (m, n), valid)
    for binary, transpose in itertools.product([False, True], repeat=2):
        at = a.T if transpose else a
        x = make_input(rng, at.shape[1], True, binary)[:, :1].repeat(cols, 1)
        x[:, ::2] = 0
        got = FUNCS[(binary, True)](w, ind, x, shape=(m, n), transpose=transpose,
                                    backend="pallas")
        np.testing.assert_allclose(np.asarray(got), at @ x.astype(np.float64), rtol=1e-5,
                                   atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_every_pallas_variant_lowers_to_a_triton_call_for_cuda(dtype):
    from gpu_utils import lower_for_cuda

    m, n, k = 6, 9, 4
    with jax.enable_x64(dtype == "float64"):
        idx = jnp.zeros((m, k), jnp.int64 if dtype == "float64" else jnp.int32)
        for binary, matrix, transpose, shared in itertools.product([False, True], repeat=4):
            rows_in = m if transpose else n
            x = jnp.zeros((rows_in, 3) if matrix else (rows_in,),
                          jnp.bool_ if binary else dtype)
            w = jnp.ones((1,) if shared else (m, k), dtype)
            f = lambda w, i, x, b=binary, mat=matrix, t=transpose: FUNCS[(b, mat)](
                w, i, x, shape=(m, n), transpose=t, backend="pallas")
            text = lower_for_cuda(f, w, idx, x)
            assert "__gpu$xla.gpu.triton" in text, (binary, matrix, transpose, shared)
            name = "pf_fixed_num_scatter" if transpose else "pf_fixed_num_gather"
            assert name in text


def test_every_pallas_variant_compiles_with_xla_gpu():
    """XLA:GPU's whole pipeline (Triton, ptxas) for every variant, on a machine without a GPU.

    Needs ``primforge.testing.compile_for_gpu`` and the ``gpu-compile`` extra; lowering alone
    (above) does not run Triton's verifier, which once rejected the scatter loop's mixed
    int32/int64 bounds.
    """
    testing = pytest.importorskip("primforge.testing", reason="primforge.testing not present")
    reason = testing.unavailable_reason()
    if reason is not None:
        pytest.skip(f"GPU compiler unavailable: {reason}")
    m, n, k = 100, 80, 40
    for binary, matrix, transpose, shared in itertools.product([False, True], repeat=4):
        rows_in = m if transpose else n
        x = jax.ShapeDtypeStruct((rows_in, 8) if matrix else (rows_in,),
                                 jnp.bool_ if binary else jnp.float32)
        w = jax.ShapeDtypeStruct((1,) if shared else (m, k), jnp.float32)
        idx = jax.ShapeDtypeStruct((m, k), jnp.int32)
        f = lambda w, i, x, b=binary, mat=matrix, t=transpose: FUNCS[(b, mat)](
            w, i, x, shape=(m, n), transpose=t, backend="pallas")
        result = testing.compile_for_gpu(f, w, idx, x, target="h100")
        assert result.ok, (binary, matrix, transpose, shared, result.error)
        name = "pf_fixed_num_scatter" if transpose else "pf_fixed_num_gather"
        assert any(name in kern.name for kern in result.kernels)


def _weight_grad_numpy(ind, x, c, n_out, *, binary, transpose):
    """d sum(c * (A @ x))/d w (A.T @ x when transposed) from its definition, in NumPy."""
    ev = (x != 0).astype(np.float64) if binary else x.astype(np.float64)
    c = c.astype(np.float64)
    by_row, by_col = (ev, c) if transpose else (c, ev)
    n = by_col.shape[0]
    inside = (ind >= 0) & (ind < n)
    gathered = by_col[np.where(inside, ind, 0)]  # (m, k) or (m, k, cols)
    g = (by_row[:, None] * gathered) if by_row.ndim == 1 else np.einsum(
        "ic,ijc->ij", by_row, gathered)
    return np.where(inside, g, 0.0)


@pytest.mark.parametrize("backend", ["jax", "numba", "numba_parallel"])
@pytest.mark.parametrize("binary,matrix,transpose", list(itertools.product([False, True],
                                                                           repeat=3)))
@pytest.mark.parametrize("events", ["none", "all", "some"])
def test_weight_gradient_kernel_matches_numpy(backend, binary, matrix, transpose, events):
    """The per-entry weight gradient (one kernel) against its NumPy definition: no events,
    every event, a row without any event, and masked slots (indices out of range)."""
    rng = np.random.default_rng([binary, matrix, transpose, len(events)])
    m, n, k, cols = 13, 9, 5, 3
    ind = rng.integers(0, n, size=(m, k)).astype(np.int32)
    ind[2, 1], ind[4, 0], ind[4, 4] = -1, n, n + 7  # masked slots
    w = rng.normal(size=(m, k)).astype(np.float32)
    rows_in = m if transpose else n
    shape = (rows_in, cols) if matrix else (rows_in,)
    active = {"none": np.zeros(shape, bool), "all": np.ones(shape, bool),
              "some": rng.random(shape) < 0.4}[events]
    if events == "some":
        active[3] = False  # an input row with no event at all
    x = active if binary else np.where(active, rng.normal(size=shape), 0.0).astype(np.float32)
    n_out = n if transpose else m
    c = rng.normal(size=(n_out, cols) if matrix else (n_out,)).astype(np.float32)
    f = FUNCS[(binary, matrix)]
    grad = jax.jit(jax.grad(lambda w_: jnp.sum(c * f(w_, ind, x, shape=(m, n),
                                                     transpose=transpose, backend=backend))))
    got = np.asarray(grad(w))
    want = _weight_grad_numpy(ind, x, c, n_out, binary=binary, transpose=transpose)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert not np.any(got[2, 1]) and not np.any(got[4, [0, 4]])


@pytest.mark.parametrize("transpose", [False, True])
def test_weight_gradient_has_second_derivatives(transpose):
    """grad w.r.t. weights, differentiated again w.r.t. a float input (numba default)."""
    rng = np.random.default_rng(5)
    w, ind, _ = structure(rng)
    x = rng.normal(size=M if transpose else N).astype(np.float32)
    f = lambda x_: jnp.sum(jax.grad(lambda w_: jnp.sum(jnp.sin(ops.fixed_num_mv(
        w_, ind, x_, shape=(M, N), transpose=transpose))))(w) ** 2)
    check_grads(f, (x,), order=1, modes=["rev", "fwd"], atol=2e-2, rtol=2e-2)
