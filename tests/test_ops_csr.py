"""primforge.ops: CSR products against dense NumPy, the CSR/CSC classes, vmap, bad input."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse as sp
from _jaxpr import eqn_names as _eqn_names

from primforge import ops
from primforge.ops import CSC, CSR, CSRStructureError, fixed_prob

# "pallas" runs the GPU kernels interpreted on the CPU: the same kernel bodies as on a GPU.
BACKENDS = ["jax", "numba", "pallas"]
M, N, K = 13, 9, 3


def random_csr(rng, m=M, n=N, density=0.35, homo=False, empty_row=True):
    """CSR arrays built by SciPy (independent of primforge) and the dense NumPy matrix.

    The positions of the entries are random, their number is not (``density * m * n``,
    rounded): every matrix of a given size then has the same array shapes, so a product
    compiled for one test's matrix is reused by every other test that runs the same
    product (same backend, input kind, weights, transpose), instead of being compiled anew
    for each test's number of entries.
    """
    allowed = np.ones((m, n), bool)
    if empty_row:
        allowed[2] = False  # an empty row exercises indptr runs
    mask = np.zeros(m * n, bool)
    mask[rng.choice(np.flatnonzero(allowed), size=round(density * m * n), replace=False)] = True
    mask = mask.reshape(m, n)
    values = np.where(mask, rng.normal(size=(m, n)), 0.0).astype(np.float32)
    if homo:
        values = np.where(mask, np.float32(0.75), np.float32(0.0))
    s = sp.csr_matrix(values)
    s.sort_indices()
    data = np.array([0.75], np.float32) if homo else s.data.astype(np.float32)
    return data, s.indices.astype(np.int32), s.indptr.astype(np.int32), values


FUNCS = {
    (False, False): ops.csrmv,
    (True, False): ops.binary_csrmv,
    (False, True): ops.csrmm,
    (True, True): ops.binary_csrmm,
}


def make_input(rng, rows, matrix, binary, rate=0.4):
    shape = (rows, K) if matrix else (rows,)
    active = rng.random(shape) < rate
    if binary:
        return active
    return np.where(active, rng.normal(size=shape), 0.0).astype(np.float32)


@pytest.mark.parametrize(
    "backend,binary,matrix,homo,transpose",
    list(itertools.product(BACKENDS, [False, True], [False, True], [False, True], [False, True])),
)
def test_every_variant_matches_dense_numpy(backend, binary, matrix, homo, transpose):
    rng = np.random.default_rng(hash((binary, matrix, homo, transpose)) % 2**32)
    data, indices, indptr, dense = random_csr(rng, homo=homo)
    a = dense.T if transpose else dense
    x = make_input(rng, a.shape[1], matrix, binary)
    want = a @ x.astype(np.float32)
    got = FUNCS[(binary, matrix)](
        data, indices, indptr, x, shape=(M, N), transpose=transpose, backend=backend
    )
    assert got.shape == want.shape and got.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
    jitted = jax.jit(
        lambda d, x: FUNCS[(binary, matrix)](
            d, indices, indptr, x, shape=(M, N), transpose=transpose, backend=backend
        )
    )
    np.testing.assert_allclose(np.asarray(jitted(data, x)), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int8])
def test_binary_events_of_any_dtype_count_when_non_zero(backend, dtype):
    rng = np.random.default_rng(3)
    data, indices, indptr, dense = random_csr(rng)
    x = (rng.random(M) < 0.5) * rng.integers(1, 5, size=M)
    got = ops.binary_csrmv(
        data, indices, indptr, x.astype(dtype), shape=(M, N), transpose=True, backend=backend
    )
    np.testing.assert_allclose(np.asarray(got), dense.T @ (x != 0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_matrix_and_no_events(backend):
    indptr = np.zeros(M + 1, np.int32)
    empty_idx = np.zeros(0, np.int32)
    got = ops.csrmv(np.zeros(0, np.float32), empty_idx, indptr, np.ones(N, np.float32),
                    shape=(M, N), backend=backend)
    np.testing.assert_array_equal(np.asarray(got), np.zeros(M))
    data, indices, indptr, _ = random_csr(np.random.default_rng(4))
    got = ops.binary_csrmv(data, indices, indptr, np.zeros(M, bool), shape=(M, N),
                           transpose=True, backend=backend)
    np.testing.assert_array_equal(np.asarray(got), np.zeros(N))


def test_numba_is_the_cpu_default():
    for kernel in (ops.csrmv_p, ops.binary_csrmv_p, ops.csrmm_p, ops.binary_csrmm_p):
        assert kernel.defaults["cpu"] == "numba"
        # jax and numba (serial; parallel opt-in), plus the CPU twins of the opt-in GPU kernels
        assert set(kernel.available_backends("cpu")) == {"jax", "numba", "numba_parallel", "pallas",
                                                         "cuda_raw"}
        assert kernel.defaults["gpu"] == "jax"


# ---------------------------------------------------------------------------- CSR class
def test_csr_roundtrip_and_products():
    rng = np.random.default_rng(5)
    *_, dense = random_csr(rng)
    W = CSR.from_dense(dense)
    assert W.shape == (M, N) and W.nnz == np.count_nonzero(dense)
    np.testing.assert_array_equal(np.asarray(W.todense()), dense)
    v, u = rng.normal(size=N).astype(np.float32), rng.normal(size=M).astype(np.float32)
    B, C = rng.normal(size=(N, 4)).astype(np.float32), rng.normal(size=(2, M)).astype(np.float32)
    np.testing.assert_allclose(W @ v, dense @ v, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(u @ W, u @ dense, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(W @ B, dense @ B, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(C @ W, C @ dense, rtol=1e-5, atol=1e-5)
    s = u > 0
    np.testing.assert_allclose(s @ W, s @ dense, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(W.T @ s, dense.T @ s, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(W.matmul(v, backend="jax"), dense @ v, rtol=1e-5, atol=1e-5)


def test_transpose_is_csc_view_and_back():
    rng = np.random.default_rng(6)
    *_, dense = random_csr(rng)
    W = CSR.from_dense(dense)
    Wt = W.T
    assert isinstance(Wt, CSC) and Wt.shape == (N, M) and Wt.indices is W.indices
    np.testing.assert_array_equal(np.asarray(Wt.todense()), dense.T)
    assert isinstance(Wt.T, CSR)
    np.testing.assert_array_equal(np.asarray(Wt.T.todense()), dense)
    Wc = CSC.from_dense(dense)
    np.testing.assert_array_equal(np.asarray(Wc.todense()), dense)
    v = rng.normal(size=N).astype(np.float32)
    np.testing.assert_allclose(Wc @ v, dense @ v, rtol=1e-5, atol=1e-5)
    s = rng.random(M) < 0.5
    np.testing.assert_allclose(Wt @ s, dense.T @ s, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(s @ Wt.T, s @ dense, rtol=1e-5, atol=1e-5)


def test_homogeneous_from_dense_and_with_data():
    dense = np.array([[0, 2, 0], [2, 0, 2]], np.float32)
    W = CSR.from_dense(dense, homogeneous=True)
    assert W.homogeneous and W.data.shape == (1,)
    np.testing.assert_array_equal(np.asarray(W.todense()), dense)
    with pytest.raises(ValueError, match="one shared weight"):
        CSR.from_dense(np.array([[1.0, 2.0]]), homogeneous=True)
    W2 = W.with_data(np.array([1.0, 2.0, 3.0], np.float32))
    np.testing.assert_array_equal(np.asarray(W2.todense()), [[0, 1, 0], [2, 0, 3]])


def test_csr_is_a_pytree_under_jit():
    *_, dense = random_csr(np.random.default_rng(7))
    W = CSR.from_dense(dense)
    leaves, _treedef = jax.tree_util.tree_flatten(W)
    assert len(leaves) == 3
    v = np.ones(N, np.float32)
    np.testing.assert_allclose(jax.jit(lambda W, v: W @ v)(W, v), dense @ v, rtol=1e-5, atol=1e-5)


def test_fixed_prob_statistics_and_structure():
    W = fixed_prob(400, 300, 0.05, weight=0.3, seed=0)
    assert W.shape == (400, 300) and W.homogeneous
    assert abs(W.nnz / (400 * 300) - 0.05) < 0.006
    ind, ptr = np.asarray(W.indices), np.asarray(W.indptr)
    assert ptr[0] == 0 and ptr[-1] == W.nnz and np.all(np.diff(ptr) >= 0)
    for i in range(0, 400, 37):  # sorted, unique columns in every row
        row = ind[ptr[i] : ptr[i + 1]]
        assert np.all(np.diff(row) > 0)
    # Every column is reached about equally often (independent pairs).
    per_col = np.bincount(ind, minlength=300)
    assert per_col.mean() == pytest.approx(20, rel=0.15)
    D = fixed_prob(200, 200, 0.5, seed=1, allow_self_connections=False).todense()
    assert np.all(np.diag(np.asarray(D)) == 0)
    full = fixed_prob(5, 4, 1.0, seed=2)
    assert full.nnz == 20
    assert fixed_prob(5, 4, 0.0, seed=2).nnz == 0
    hetero = fixed_prob(30, 30, 0.3, weight=lambda rng, k: rng.uniform(1, 2, size=k), seed=3)
    assert hetero.data.shape == (hetero.nnz,) and float(hetero.data.min()) >= 1.0
    # Same seed, same matrix.
    a, b = fixed_prob(50, 60, 0.1, seed=9), fixed_prob(50, 60, 0.1, seed=9)
    np.testing.assert_array_equal(np.asarray(a.indices), np.asarray(b.indices))


# ---------------------------------------------------------------------------- vmap


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("binary,transpose,homo", [(True, True, True), (False, False, False),
                                                   (True, False, False), (False, True, True)])
def test_vmap_over_events_is_one_matmat_call(backend, binary, transpose, homo):
    rng = np.random.default_rng(11)
    data, indices, indptr, dense = random_csr(rng, homo=homo)
    rows_in = M if transpose else N
    xs = make_input(rng, 6 * rows_in, False, binary).reshape(6, rows_in)
    f = lambda x: FUNCS[(binary, False)](data, indices, indptr, x, shape=(M, N),
                                         transpose=transpose, backend=backend)
    got = jax.vmap(f)(xs)
    loop = np.stack([np.asarray(f(x)) for x in xs])
    a = dense.T if transpose else dense
    np.testing.assert_allclose(np.asarray(got), loop, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(got), xs.astype(np.float32) @ a.T, rtol=1e-5, atol=1e-5)
    jaxpr = jax.make_jaxpr(jax.vmap(f))(xs).jaxpr
    names = _eqn_names(jaxpr)
    mm = ("primforge.ops.binary_csrmm" if binary else "primforge.ops.csrmm")
    assert names.count(mm) == 1, names
    assert not any(n in ("scan", "while") for n in names), names
    assert not any(n.endswith("csrmv") for n in names), names
    if backend != "pallas":  # interpreted Pallas lowers its grid to a loop by design
        hlo = jax.jit(jax.vmap(f)).lower(xs).as_text()
        assert "while" not in hlo and "stablehlo.while" not in hlo


@pytest.mark.parametrize("backend", BACKENDS)
def test_vmap_of_matmat_and_in_axes_1(backend):
    rng = np.random.default_rng(12)
    data, indices, indptr, dense = random_csr(rng)
    xs = make_input(rng, N * 4 * K, False, True).reshape(N, 4, K)  # batch on axis 1
    f = lambda x: ops.binary_csrmm(data, indices, indptr, x, shape=(M, N), backend=backend)
    got = jax.vmap(f, in_axes=1)(xs)
    want = np.stack([dense @ xs[:, b, :] for b in range(4)])
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
    names = _eqn_names(jax.make_jaxpr(jax.vmap(f, in_axes=1))(xs).jaxpr)
    assert names.count("primforge.ops.binary_csrmm") == 1 and "scan" not in names


@pytest.mark.parametrize("backend", BACKENDS)
def test_vmap_over_weights_matches_loop(backend):
    rng = np.random.default_rng(13)
    data, indices, indptr, dense = random_csr(rng)
    ws = np.stack([data * s for s in (1.0, -2.0, 0.5)])
    v = rng.normal(size=N).astype(np.float32)
    f = lambda w, v: ops.csrmv(w, indices, indptr, v, shape=(M, N), backend=backend)
    got = jax.vmap(f, in_axes=(0, None))(ws, v)
    want = np.stack([dense * s @ v for s in (1.0, -2.0, 0.5)])
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


def test_vmap_through_the_csr_class():
    rng = np.random.default_rng(14)
    *_, dense = random_csr(rng)
    W = CSR.from_dense(dense)
    spikes = rng.random((5, M)) < 0.3
    got = jax.vmap(lambda s: s @ W)(spikes)
    np.testing.assert_allclose(np.asarray(got), spikes @ dense, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------- bad input
def test_concrete_out_of_range_index_raises():
    data, indices, indptr, _ = random_csr(np.random.default_rng(15))
    bad = indices.copy()
    bad[4] = N + 3
    with pytest.raises(CSRStructureError, match=r"indices must lie in \[0, 9\).*indices\[4\] = 12"):
        CSR(data, bad, indptr, shape=(M, N))
    bad[4] = -1
    with pytest.raises(CSRStructureError, match="indices"):
        CSR(data, bad, indptr, shape=(M, N))


def test_concrete_inconsistent_indptr_raises():
    data, indices, indptr, _ = random_csr(np.random.default_rng(16))
    p = indptr.copy()
    p[5], p[6] = p[6] + 1, p[5]
    with pytest.raises(CSRStructureError, match="non-decreasing"):
        CSR(data, indices, p, shape=(M, N))
    p = indptr.copy()
    p[-1] += 1
    with pytest.raises(CSRStructureError, match=r"indptr\[-1\] must be at most len\(indices\)"):
        CSR(data, indices, p, shape=(M, N))
    p = indptr.copy()
    p[0] = 1
    with pytest.raises(CSRStructureError, match=r"indptr\[0\] must be 0"):
        CSR(data, indices, p, shape=(M, N))


def test_shape_errors_are_clear_at_trace_time():
    data, indices, indptr, _ = random_csr(np.random.default_rng(17))
    with pytest.raises(ValueError, match=r"input must have shape \(9,\)"):
        ops.csrmv(data, indices, indptr, np.ones(M, np.float32), shape=(M, N))
    with pytest.raises(ValueError, match="'indptr' must have shape"):
        CSR(data, indices, indptr[:-1], shape=(M, N))
    with pytest.raises(ValueError, match="'data' must have shape"):
        ops.csrmv(data[:-1], indices, indptr, np.ones(N, np.float32), shape=(M, N))
    with pytest.raises(TypeError, match="'indices' must be an integer array"):
        ops.csrmv(data, indices.astype(np.float32), indptr, np.ones(N, np.float32), shape=(M, N))
    with pytest.raises(ValueError, match="vector or a matrix"):
        CSR(data, indices, indptr, shape=(M, N)) @ np.ones((2, 2, 2), np.float32)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("matrix", [False, True])
@pytest.mark.parametrize("transpose", [False, True])
def test_bad_structure_under_jit_gives_nan_not_garbage(backend, matrix, transpose):
    data, indices, indptr, _ = random_csr(np.random.default_rng(18))
    bad_idx = indices.copy()
    bad_idx[3] = 10_000_000  # would be far out of bounds
    bad_ptr = indptr.copy()
    bad_ptr[4] = 10_000_000
    rows_in = M if transpose else N
    x = np.ones((rows_in, K) if matrix else (rows_in,), bool)
    f = jax.jit(lambda i, p: FUNCS[(True, matrix)](data, i, p, x, shape=(M, N),
                                                   transpose=transpose, backend=backend))
    assert np.all(np.isnan(np.asarray(f(bad_idx, indptr))))
    assert np.all(np.isnan(np.asarray(f(indices, bad_ptr))))
    assert not np.any(np.isnan(np.asarray(f(indices, indptr))))


def test_opt_in_check_under_jit_raises_with_the_problem():
    data, indices, indptr, _ = random_csr(np.random.default_rng(19))
    bad = indices.copy()
    bad[0] = 99

    @jax.jit
    def f(ind):
        W = CSR(data, ind, indptr, shape=(M, N)).check()
        return W @ np.ones(N, np.float32)

    assert f(indices).shape == (M,)
    with pytest.raises(Exception, match=r"indices\[0\] = 99"):
        jax.block_until_ready(f(bad))


@pytest.mark.parametrize("dtype", ["bool", "int8", "int16", "float32", "float64"])
def test_events_at_word_boundaries_are_each_found(dtype):
    # The numba kernel of `events @ W` skips 8 bytes of zero events at a time: events on
    # both sides of every word boundary, past the last whole word, -0.0 (not all bits zero)
    # and NaN (no zero bits) each count as they do one by one (dense NumPy reference).
    rs = np.random.RandomState(11)
    for m in (1, 3, 8, 9, 15, 17, 33):
        dense = np.where(rs.random_sample((m, 6)) < 0.6, rs.uniform(0.5, 1.5, (m, 6)),
                         0).astype(np.float32)
        W = CSR.from_dense(dense)
        for active in ([0], [m - 1], list(range(0, m, 7)), list(range(m))):
            x = np.zeros(m, dtype)
            x[active] = 2 if dtype.startswith("int") else 1
            if dtype.startswith("float") and m > 2:
                x[1] = -0.0
                if m // 2 not in active:
                    x[m // 2] = np.nan
            binary = dtype in ("bool", "int8", "int16")
            got = np.asarray(ops.binary_csrmv(W.data, W.indices, W.indptr, jnp.asarray(x),
                                              shape=W.shape, transpose=True)
                             if binary else
                             ops.csrmv(W.data, W.indices, W.indptr, jnp.asarray(x),
                                       shape=W.shape, transpose=True))
            xs = (x != 0).astype(np.float64) if binary else x.astype(np.float64)
            want = np.nansum(xs[:, None] * dense, axis=0) if not np.isnan(xs).any() else None
            if want is None:  # a NaN event reaches exactly its row's targets
                hit = dense[m // 2] != 0
                assert np.isnan(got[hit]).all() and not np.isnan(got[~hit]).any()
                continue
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6,
                                       err_msg=f"m={m}, active {active}")
