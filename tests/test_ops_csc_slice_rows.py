"""CSC.slice_rows against SciPy's row indexing of the same matrix."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse as sp

from primforge import ops


def _dense(seed, m=6, n=5):
    rs = np.random.RandomState(seed)
    d = np.where(rs.random_sample((m, n)) < 0.4, rs.standard_normal((m, n)), 0)
    d[3] = 0  # an empty row
    return d.astype(np.float32)


@pytest.mark.parametrize("index", ([4, 0, 4, 3, 1], 2, [], [5, 5]))
def test_matches_scipy_with_repeats_single_and_empty(index):
    d = _dense(0)
    got = ops.CSC.from_dense(d).slice_rows(index)
    want = sp.csc_matrix(d)[np.atleast_1d(np.asarray(index, int)), :].toarray()
    assert isinstance(got, ops.CSC) and got.shape == want.shape
    np.testing.assert_array_equal(got.todense(), want)
    if np.ndim(index):  # the slice is a working matrix
        events = np.arange(want.shape[0]) % 2 == 0
        np.testing.assert_allclose(events @ got, events @ want, rtol=1e-6, atol=1e-6)
    ptr, ind = np.asarray(got.indptr), np.asarray(got.indices)
    assert all(np.all(np.diff(ind[a:b]) > 0) for a, b in itertools.pairwise(ptr))  # sorted


def test_an_empty_list_gives_no_rows_for_csr_too():
    d = _dense(4)
    for w in (ops.CSR.from_dense(d), ops.CSC.from_dense(d)):
        got = w.slice_rows([])
        assert got.shape == (0, d.shape[1]) and got.todense().shape == (0, d.shape[1])


def test_csr_transpose_shared_weight_and_grad():
    d = _dense(1)
    w = ops.CSR.from_dense(d.T).T  # a CSC seen from its CSR
    rows = [5, 1, 1]
    np.testing.assert_array_equal(w.slice_rows(rows).todense(), d[rows])
    shared = ops.CSC.from_dense(d).with_data(2.0)
    np.testing.assert_array_equal(shared.slice_rows(rows).todense(), 2.0 * (d[rows] != 0))
    r = np.random.RandomState(2).standard_normal((3, d.shape[1])).astype(np.float32)
    csc = ops.CSC.from_dense(d)
    f = lambda data: jnp.sum(csc.with_data(data).slice_rows(rows).todense() * r)
    grad = jax.grad(f)(csc.data)
    g_dense = np.zeros_like(d)
    np.add.at(g_dense, rows, r)  # d f / d W[i, j] = sum of r over the copies of row i
    want = sp.csc_matrix(np.where(d != 0, g_dense, 0))
    dense_grad = ops.CSC(grad, csc.indices, csc.indptr, shape=d.shape).todense()
    np.testing.assert_allclose(dense_grad, want.toarray() * (d != 0), rtol=1e-6)


def test_bad_index():
    w = ops.CSC.from_dense(_dense(3))
    with pytest.raises(IndexError, match=r"CSC.slice_rows: 'index' must lie in \[0, 6\)"):
        w.slice_rows([0, 6])
    with pytest.raises(TypeError, match="CSC.slice_rows: 'index' must be an int or a 1-D"):
        w.slice_rows([0.5])
    with pytest.raises(TypeError, match="'index' must be concrete"):
        jax.jit(lambda i: w.slice_rows(i))(np.int32([0]))
