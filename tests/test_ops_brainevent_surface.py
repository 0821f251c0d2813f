"""Index conversions, row slices, diagonal updates and SDDMM against NumPy and SciPy."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse as sp
from jax.test_util import check_grads

from primforge import ops
from primforge.ops import CSRStructureError


def random_csr(m, n, density, seed, dtype=np.int32, empty_rows=True):
    rng = np.random.default_rng(seed)
    dense = (rng.random((m, n)) < density) * rng.uniform(0.5, 1.5, (m, n))
    if empty_rows and m > 2:
        dense[1] = 0.0
    mat = sp.csr_matrix(dense.astype(np.float32))
    return (mat.data, mat.indices.astype(dtype), mat.indptr.astype(dtype), dense)


def random_coo(m, n, nnz, seed, dtype):
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, m, nnz).astype(dtype)
    cols = rng.integers(0, n, nnz).astype(dtype)  # duplicates kept (and likely)
    return rows, cols, rng.standard_normal(nnz)


# ----------------------------------------------------------------------------- conversions
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("lib", ["numpy", "jax"])
@pytest.mark.parametrize("m,n,nnz", [(7, 5, 30), (4, 9, 0), (1, 3, 4)])
def test_coo_conversions_match_scipy(m, n, nnz, lib, dtype):
    rows, cols, vals = random_coo(m, n, nnz, seed=m * n + nnz, dtype=dtype)
    conv = (lambda a: jnp.asarray(a)) if lib == "jax" else (lambda a: a)
    expected = sp.coo_matrix((vals, (rows, cols)), shape=(m, n)).toarray()

    indptr, indices, order = ops.coo2csr(conv(rows), conv(cols), shape=(m, n))
    assert isinstance(indptr, np.ndarray) == (lib == "numpy")
    indptr, indices, order = map(np.asarray, (indptr, indices, order))
    assert indices.dtype == np.int32
    np.testing.assert_array_equal(indptr, np.r_[0, np.cumsum(np.bincount(rows, minlength=m))])
    np.testing.assert_array_equal(order, np.argsort(rows, kind="stable"))
    got = sp.csr_matrix((vals[order], indices, indptr), shape=(m, n)).toarray()
    np.testing.assert_allclose(got, expected)

    ptr, row_ind, perm = map(np.asarray, ops.coo_to_csc_index(conv(rows), conv(cols),
                                                              shape=(m, n)))
    got = sp.csc_matrix((vals[perm], row_ind, ptr), shape=(m, n)).toarray()
    np.testing.assert_allclose(got, expected)
    np.testing.assert_array_equal(perm, np.argsort(cols, kind="stable"))


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("lib", ["numpy", "jax", "jit"])
def test_csr_csc_round_trip_matches_scipy(lib, dtype):
    data, indices, indptr, dense = random_csr(9, 6, 0.3, seed=1, dtype=dtype)
    shape = dense.shape
    conv = (lambda a: jnp.asarray(a)) if lib != "numpy" else (lambda a: a)

    def run(f, *args, **kw):
        if lib == "jit":
            return jax.jit(lambda *a: f(*a, **kw))(*map(conv, args))
        return f(*map(conv, args), **kw)

    rows, cols = map(np.asarray, run(ops.csr_to_coo_index, indptr, indices))
    ref = sp.csr_matrix((data, indices, indptr), shape=shape).tocoo()
    np.testing.assert_array_equal(rows, ref.row)
    np.testing.assert_array_equal(cols, ref.col)

    ptr, rind, perm = map(np.asarray, run(ops.csr_to_csc_index, indptr, indices, shape=shape))
    csc = sp.csr_matrix((data, indices, indptr), shape=shape).tocsc()
    np.testing.assert_array_equal(ptr, csc.indptr)
    np.testing.assert_array_equal(rind, csc.indices)  # scipy's rows are sorted within a column
    np.testing.assert_allclose(data[perm], csc.data)

    back_ptr, back_ind, back_perm = map(np.asarray,
                                        run(ops.csc_to_csr_index, ptr, rind, shape=shape))
    np.testing.assert_array_equal(back_ptr, indptr)
    np.testing.assert_array_equal(back_ind, indices)
    np.testing.assert_array_equal(perm[back_perm], np.arange(len(data)))


def test_include_perm_false_returns_none():
    _, indices, indptr, dense = random_csr(4, 4, 0.5, seed=2)
    assert ops.csr_to_csc_index(indptr, indices, shape=dense.shape, include_perm=False)[2] is None
    assert ops.csc_to_csr_index(indptr, indices, shape=dense.shape, include_perm=False)[2] is None


@pytest.mark.parametrize("call,match", [
    (lambda: ops.coo2csr(np.array([0, 3]), np.array([0, 1]), shape=(3, 2)),
     r"coo2csr: row_ids must lie in \[0, 3\).*row_ids\[1\] = 3"),
    (lambda: ops.coo2csr(np.array([0, -1]), np.array([0, 1]), shape=(3, 2)),
     r"row_ids\[1\] = -1"),
    (lambda: ops.coo_to_csc_index(np.array([0, 1]), np.array([0, 2]), shape=(3, 2)),
     r"coo_to_csc_index: indices must lie in \[0, 2\)"),
    (lambda: ops.csr_to_coo_index(np.array([0, 2, 1, 3]), np.array([0, 1, 2])),
     r"csr_to_coo_index: indptr must be non-decreasing"),
    (lambda: ops.csr_to_csc_index(np.array([0, 1, 2]), np.array([0, 5]), shape=(2, 3)),
     r"csr_indices must lie in \[0, 3\)"),
    (lambda: ops.csc_to_csr_index(np.array([0, 1, 3]), np.array([0, 1]), shape=(2, 2)),
     r"csc_indptr\[-1\] must equal the number of entries 2"),
])
def test_bad_structure_raises_naming_the_argument(call, match):
    with pytest.raises(CSRStructureError, match=match):
        call()


def test_float_and_misshapen_indices_raise():
    with pytest.raises(TypeError, match="'col_ids' must be an integer array"):
        ops.coo2csr(np.array([0, 1]), np.array([0.0, 1.0]), shape=(2, 2))
    with pytest.raises(ValueError, match="'csr_indptr' must have shape"):
        ops.csr_to_csc_index(np.array([0, 1]), np.array([0]), shape=(2, 2))
    with pytest.raises(ValueError, match="same length"):
        ops.coo2csr(np.array([0, 1]), np.array([0]), shape=(2, 2))


def test_bad_index_under_jit_raises_at_run_time():
    f = jax.jit(lambda r, c: ops.coo2csr(r, c, shape=(3, 3)))
    with pytest.raises(Exception, match="row_ids must lie in"):
        jax.block_until_ready(f(jnp.array([0, 7]), jnp.array([0, 1])))


# ----------------------------------------------------------------------------- row slices
@pytest.mark.parametrize("path", ["gather", "product", "traced"])
def test_slice_rows_matches_dense_and_grads(path):
    """Concrete structure (gather), an explicit product backend, a structure traced by jit."""
    data, indices, indptr, dense = random_csr(6, 5, 0.5, seed=3)
    rows = np.array([4, 1, 0, 4])

    def slice_rows(d, r, indices=indices, indptr=indptr, shape=dense.shape):
        if path == "traced":
            return jax.jit(lambda d, i, p, r: ops.csr_slice_rows(d, i, p, r, shape=shape))(
                d, jnp.asarray(indices), jnp.asarray(indptr), r)
        backend = "numba" if path == "product" else None
        return ops.csr_slice_rows(d, indices, indptr, r, shape=shape, backend=backend)

    got = slice_rows(data, rows)
    np.testing.assert_allclose(got, dense[rows], rtol=1e-6)
    np.testing.assert_allclose(slice_rows(data, np.int32(2)), dense[2], rtol=1e-6)
    # homogeneous weights
    np.testing.assert_allclose(slice_rows(jnp.array([0.5]), rows), 0.5 * (dense[rows] != 0))
    f = lambda d: slice_rows(d, rows)
    check_grads(f, (jnp.asarray(data, jnp.float32),), order=1, modes=("fwd", "rev"),
                atol=1e-2, rtol=1e-2)
    batch = np.array([[0, 2], [5, 5], [3, 1]])
    vm = jax.vmap(lambda r: slice_rows(data, r))
    np.testing.assert_allclose(vm(jnp.asarray(batch)), dense[batch], rtol=1e-6)
    # an empty matrix
    empty = slice_rows(jnp.zeros(0), rows, np.zeros(0, np.int32), np.zeros(7, np.int32))
    np.testing.assert_array_equal(empty, np.zeros((4, 5)))


def test_slice_rows_sums_duplicate_entries():
    # row 0 stores column 1 twice: the dense row holds their sum, as scipy's does
    data, indices, indptr = np.array([1.0, 2.0, 4.0], np.float32), np.array([1, 1, 0]), \
        np.array([0, 2, 3])
    ref = sp.csr_matrix((data, indices, indptr), shape=(2, 2)).toarray()
    for backend in (None, "jax"):
        got = ops.csr_slice_rows(data, indices, indptr, np.array([0, 1]), shape=(2, 2),
                                 backend=backend)
        np.testing.assert_allclose(got, ref)


def test_slice_rows_out_of_range():
    data, indices, indptr, dense = random_csr(4, 3, 0.5, seed=4)
    with pytest.raises(ValueError, match="'data' must have shape"):
        ops.csr_slice_rows(np.ones(len(data) + 1), indices, indptr, 0, shape=dense.shape)
    with pytest.raises(CSRStructureError, match="indices must lie in"):
        ops.csr_slice_rows(data, indices + 3, indptr, 0, shape=dense.shape)
    with pytest.raises(IndexError, match=r"'row_indices' must lie in \[0, 4\)"):
        ops.csr_slice_rows(data, indices, indptr, np.array([0, 4]), shape=dense.shape)
    with pytest.raises(IndexError, match="row_indices"):
        ops.csr_slice_rows(data, indices, indptr, -1, shape=dense.shape)
    got = jax.jit(lambda r: ops.csr_slice_rows(data, indices, indptr, r, shape=dense.shape))(
        jnp.array([1, 4, -1]))
    np.testing.assert_allclose(got[0], dense[1], rtol=1e-6)
    assert np.isnan(got[1:]).all()


def test_csr_slice_rows_method():
    data, indices, indptr, dense = random_csr(5, 4, 0.5, seed=5)
    W = ops.CSR(data, indices, indptr, shape=dense.shape)
    sub = W.slice_rows(np.array([3, 1, 3]))
    assert sub.shape == (3, 4)
    np.testing.assert_allclose(sub.todense(), dense[[3, 1, 3]], rtol=1e-6)
    g = jax.grad(lambda d: W.with_data(d).slice_rows([0]).todense().sum())(W.data)
    np.testing.assert_array_equal(g, np.asarray(indptr[1] > np.arange(len(data)), np.float32))
    with pytest.raises(IndexError, match="'index' must lie in"):
        W.slice_rows(5)


# ----------------------------------------------------------------------------- diag_add
@pytest.mark.parametrize("m,n", [(6, 6), (4, 7), (7, 3)])
def test_diag_add_matches_dense(m, n):
    data, indices, indptr, dense = random_csr(m, n, 0.4, seed=m + n)
    k = min(m, n)
    diag = np.arange(1, k + 1, dtype=np.float32)
    new_data, new_indices, new_indptr = ops.diag_add(data, indices, indptr, diag, shape=(m, n))
    got = sp.csr_matrix((np.asarray(new_data), new_indices, new_indptr), shape=(m, n))
    expected = dense.copy()
    expected[np.arange(k), np.arange(k)] += diag
    np.testing.assert_allclose(got.toarray(), expected, rtol=1e-6)
    assert got.has_sorted_indices  # inserted entries land in their sorted place
    # every diagonal entry is stored exactly once
    assert got.nnz == len(data) + int(np.sum(dense[np.arange(k), np.arange(k)] == 0))
    plan = ops.csr_diag_position(indptr, indices, shape=(m, n))
    f = jax.jit(lambda d, g: ops.csr_diag_add(d, plan, g))
    check_grads(f, (jnp.asarray(data), jnp.asarray(diag)), order=1, modes=("fwd", "rev"))


def test_diag_add_method_and_errors():
    W = ops.CSR.from_dense([[0.0, 2.0, 0.0], [3.0, 4.0, 0.0]])
    np.testing.assert_allclose(W.diag_add(jnp.array([1.0, 1.0])).todense(),
                               [[1.0, 2.0, 0.0], [3.0, 5.0, 0.0]])
    with pytest.raises(ValueError, match=r"'diag_value' must have shape \(min\(rows, cols\),\)"):
        W.diag_add(jnp.ones(3))
    with pytest.raises(TypeError, match="'indptr' must be concrete"):
        jax.jit(lambda p: ops.csr_diag_position(p, W.indices, shape=W.shape))(W.indptr)


# ----------------------------------------------------------------------------- SDDMM
def test_sddmm_matches_dense_product_and_grads():
    _, indices, indptr, dense = random_csr(6, 5, 0.4, seed=7)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((6, 3)).astype(np.float32)
    b = rng.standard_normal((3, 5)).astype(np.float32)
    got = ops.csr_sddmm(a, b, indices, indptr, shape=(6, 5))
    ref = sp.csr_matrix(((a @ b)[dense != 0], indices, indptr), shape=(6, 5))
    np.testing.assert_allclose(got, ref.data, rtol=1e-5)
    np.testing.assert_allclose(
        ops.csr_sddmm(a, b, indices, indptr, shape=(6, 5), backend="jax"), ref.data, rtol=1e-5)
    vm = jax.vmap(lambda x: ops.csr_sddmm(x, b, indices, indptr, shape=(6, 5)))(
        jnp.stack([a, 2 * a]))
    np.testing.assert_allclose(vm, np.stack([ref.data, 2 * ref.data]), rtol=1e-5)
    f = jax.jit(lambda x, y: ops.csr_sddmm(x, y, indices, indptr, shape=(6, 5)))
    check_grads(f, (jnp.asarray(a), jnp.asarray(b)), order=1, modes=("fwd", "rev"),
                atol=1e-2, rtol=1e-2)
    # the weight gradient of y = W @ x, summed against a cotangent, is an SDDMM
    x, ct = rng.standard_normal((5, 2)).astype(np.float32), np.ones((6, 2), np.float32)
    w_grad = jax.grad(lambda d: jnp.sum(ct * ops.csrmm(d, indices, indptr, x, shape=(6, 5))))(
        jnp.ones(len(indices)))
    np.testing.assert_allclose(ops.csr_sddmm(ct, x.T, indices, indptr, shape=(6, 5)), w_grad,
                               rtol=1e-5)


def test_sddmm_bad_structure():
    a, b = np.ones((2, 1), np.float32), np.ones((1, 3), np.float32)
    with pytest.raises(CSRStructureError, match="indices must lie in"):
        ops.csr_sddmm(a, b, np.array([0, 3]), np.array([0, 1, 2]), shape=(2, 3))
    got = jax.jit(lambda i: ops.csr_sddmm(a, b, i, np.array([0, 1, 2]), shape=(2, 3)))(
        jnp.array([0, 3]))
    assert np.isnan(got).all()
    with pytest.raises(ValueError, match="'a' must be"):
        ops.csr_sddmm(np.ones((2, 2)), b, np.array([0, 1]), np.array([0, 1, 2]), shape=(2, 3))
