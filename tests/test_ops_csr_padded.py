"""primforge.ops: padded CSR (``data``/``indices`` longer than ``indptr[-1]``), padding ignored.

The padding holds garbage (NaN weights, column indices out of range): it must change no
result, on any CPU backend, eagerly or under ``jit``, and its weight cotangent is zero.
"""

from __future__ import annotations

import itertools

import jax
import numpy as np
import pytest
import scipy.sparse as sp

from primforge import ops
from primforge.ops import CSC, CSR

BACKENDS = ["jax", "numba", "numba_parallel", "pallas", "cuda_raw"]
M, N, K, PAD = 7, 5, 3, 4
FUNCS = {(False, False): ops.csrmv, (True, False): ops.binary_csrmv,
         (False, True): ops.csrmm, (True, True): ops.binary_csrmm}


def padded_csr(seed, homo=False):
    """SciPy-built CSR arrays with ``PAD`` garbage entries appended, and the dense matrix."""
    rng = np.random.default_rng(seed)
    values = np.where(rng.random((M, N)) < 0.4, rng.normal(size=(M, N)), 0.0)
    values[2] = 0.0  # an empty row
    if homo:
        values = np.where(values != 0, 0.75, 0.0)
    values = values.astype(np.float32)
    s = sp.csr_matrix(values)
    data = np.array([0.75], np.float32) if homo else np.concatenate(
        [s.data.astype(np.float32), np.full(PAD, np.nan, np.float32)])
    indices = np.concatenate([s.indices, [N + 3, -1, N, 10**6][:PAD]]).astype(np.int32)
    return data, indices, s.indptr.astype(np.int32), values


def events(seed, rows, matrix, binary):
    rng = np.random.default_rng(seed)
    shape = (rows, K) if matrix else (rows,)
    active = rng.random(shape) < 0.5
    return active if binary else np.where(active, rng.normal(size=shape), 0.0).astype(np.float32)


@pytest.mark.parametrize("backend,binary,matrix,transpose", list(
    itertools.product(BACKENDS, [False, True], [False, True], [False, True])))
def test_padding_is_ignored_by_every_product(backend, binary, matrix, transpose):
    seed = 11 * binary + 3 * matrix + transpose
    for homo in (False, True):
        data, indices, indptr, dense = padded_csr(seed, homo)
        a = dense.T if transpose else dense
        x = events(seed, a.shape[1], matrix, binary)
        want = a @ x.astype(np.float32)
        f = FUNCS[(binary, matrix)]

        def call(d, x, f=f, indices=indices, indptr=indptr):
            return f(d, indices, indptr, x, shape=(M, N), transpose=transpose, backend=backend)

        np.testing.assert_allclose(np.asarray(call(data, x)), want, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(np.asarray(jax.jit(call)(data, x)), want, rtol=1e-5,
                                   atol=1e-5)


@pytest.mark.parametrize("backend,transpose", list(
    itertools.product(["jax", "numba", "numba_parallel"], [False, True])))
def test_weight_gradient_of_the_padding_is_zero(backend, transpose):
    data, indices, indptr, dense = padded_csr(5)
    a = dense.T if transpose else dense
    x = events(5, a.shape[1], False, False)
    ct = np.random.default_rng(6).normal(size=a.shape[0]).astype(np.float32)

    def loss(d):
        return ct @ ops.csrmv(d, indices, indptr, x, shape=(M, N), transpose=transpose,
                              backend=backend)

    nnz = int(indptr[-1])
    rows = np.repeat(np.arange(M), np.diff(indptr))
    cols = indices[:nnz]
    want = np.zeros(nnz + PAD, np.float32)
    want[:nnz] = x[rows] * ct[cols] if transpose else ct[rows] * x[cols]
    for g in (jax.grad(loss)(data), jax.jit(jax.grad(loss))(data)):
        np.testing.assert_allclose(np.asarray(g), want, rtol=1e-5, atol=1e-6)


def test_constructors_accept_padding():
    data, indices, indptr, dense = padded_csr(9)
    W = CSR(data, indices, indptr, shape=(M, N))
    np.testing.assert_allclose(np.asarray(W.todense()), dense)
    x = events(9, N, False, False)
    np.testing.assert_allclose(np.asarray(W @ x), dense @ x, rtol=1e-5, atol=1e-5)
    C = CSC(data, indices, indptr, shape=(N, M))
    np.testing.assert_allclose(np.asarray(C.todense()), dense.T)
    np.testing.assert_allclose(np.asarray(x @ C), x @ dense.T, rtol=1e-5, atol=1e-5)
    with pytest.raises(ops.CSRStructureError, match="indptr\\[-1\\]"):
        CSR(data[:3], indices[:3], indptr, shape=(M, N))  # fewer entries than indptr says


@pytest.mark.parametrize("backend,pre,indexed", [
    ("jax", True, False), ("jax", False, False), ("numba", True, False),
    ("numba", False, False), ("pallas", False, False), ("jax", False, True),
    ("numba", False, True)])
def test_plasticity_on_padded_csr(backend, pre, indexed):
    """The compressed updates (and the column index) leave the padding untouched."""
    data, indices, indptr, _ = padded_csr(13)
    rng = np.random.default_rng(14)
    spikes = rng.random(M if pre else N) < 0.5
    trace = rng.normal(size=N if pre else M).astype(np.float32) * 0.3
    W = CSR(data, indices, indptr, shape=(M, N))
    if indexed:
        W = ops.with_column_index(W)
    fn = ops.update_on_pre if pre else ops.update_on_post
    got = fn(W, spikes, trace, w_max=0.8, backend=backend)
    got = np.asarray((got.matrix if indexed else got).data)
    nnz = int(indptr[-1])
    rows = np.repeat(np.arange(M), np.diff(indptr))
    cols = indices[:nnz]
    fires = spikes[rows] if pre else spikes[cols]
    add = trace[cols] if pre else trace[rows]
    want = data.copy()
    want[:nnz] = np.where(fires, np.minimum(data[:nnz] + add, np.float32(0.8)), data[:nnz])
    np.testing.assert_array_equal(got, want)  # NaN padding stays NaN, in place


def test_diag_add_and_row_slices_leave_the_padding_out():
    data, indices, indptr, dense = padded_csr(17)
    d = np.arange(1, min(M, N) + 1, dtype=np.float32)
    new_data, new_indices, new_indptr = ops.diag_add(data, indices, indptr, d, shape=(M, N))
    want = dense.copy()
    want[np.arange(d.size), np.arange(d.size)] += d
    got = sp.csr_matrix((np.asarray(new_data), np.asarray(new_indices), np.asarray(new_indptr)),
                        shape=(M, N)).toarray()
    np.testing.assert_allclose(got, want, rtol=1e-6)
    rows = np.array([0, 2, 6])
    np.testing.assert_allclose(
        np.asarray(ops.csr_slice_rows(data, indices, indptr, rows, shape=(M, N))), dense[rows])
