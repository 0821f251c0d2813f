"""The Pallas (Triton) CSR kernels: chunked rows, column blocks, dtypes, and the GPU lowering.

The kernels run interpreted on the CPU here (same bodies as on a GPU) and are compared with
dense NumPy; the GPU path is lowered for CUDA on this machine (and compiled by XLA:GPU for
sm_90 and sm_80 in test_ops_gpu_compile.py) and, on a GPU, compared with the pure-JAX
backend. The variant sweep through the public API lives in test_ops_csr.py (the
"pallas" entry of BACKENDS).
"""

from __future__ import annotations

import contextlib
import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gpu_utils import lower_for_cuda, requires_gpu

from primforge import ops
from primforge.ops.csr import pallas as _pallas_csr

FUNCS = {
    (False, False): ops.csrmv,
    (True, False): ops.binary_csrmv,
    (False, True): ops.csrmm,
    (True, True): ops.binary_csrmm,
}


@contextlib.contextmanager
def enable_x64(on: bool = True):
    old = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", on)
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", old)


def structure(rng, m, n, long_row=None, dup_row=None, dtype=np.int32):
    """Random CSR arrays (unsorted columns allowed) and the dense matrix, built with NumPy."""
    mask = rng.random((m, n)) < 0.3
    if long_row is not None:  # a full row: longer than several chunks
        mask[long_row] = True
    rows, cols = np.nonzero(mask)
    if dup_row is not None:  # the same column three times in one row
        rows = np.concatenate([rows, np.full(3, dup_row)])
        cols = np.concatenate([cols, np.full(3, 1)])
    order = np.argsort(rows, kind="stable")
    rows, cols = rows[order], cols[order]
    data = rng.normal(size=rows.size)
    dense = np.zeros((m, n))
    np.add.at(dense, (rows, cols), data)
    indptr = np.zeros(m + 1, np.int64)
    np.cumsum(np.bincount(rows, minlength=m), out=indptr[1:])
    return data, cols.astype(dtype), indptr.astype(dtype), dense


def run(binary, matrix, transpose, data, indices, indptr, x, shape):
    return FUNCS[(binary, matrix)](data, indices, indptr, x, shape=shape, transpose=transpose,
                                   backend="pallas")


@pytest.mark.parametrize("binary,transpose", list(itertools.product([False, True], repeat=2)))
def test_rows_longer_than_a_chunk_and_duplicate_columns(binary, transpose):
    m, n = 6, 2 * _pallas_csr.BLOCK_NNZ + 37  # row 2 spans three chunks
    rng = np.random.default_rng(1)
    data, indices, indptr, dense = structure(rng, m, n, long_row=2, dup_row=4)
    assert np.diff(indptr).max() > 2 * _pallas_csr.BLOCK_NNZ
    rows_in = m if transpose else n
    x = rng.random(rows_in) < 0.5 if binary else rng.normal(size=rows_in)
    got = run(binary, False, transpose, data.astype(np.float32), indices, indptr,
              x if binary else x.astype(np.float32), (m, n))
    a = dense.T if transpose else dense
    np.testing.assert_allclose(np.asarray(got), a @ x.astype(float), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("k", [1, 5, _pallas_csr.BLOCK_COLS + 3])
@pytest.mark.parametrize("binary,transpose", list(itertools.product([False, True], repeat=2)))
def test_matmat_column_blocks(k, binary, transpose):
    m, n = 5, 2 * _pallas_csr.BLOCK_NNZ_MM + 3
    rng = np.random.default_rng(2)
    data, indices, indptr, dense = structure(rng, m, n, long_row=1, dup_row=3)
    rows_in = m if transpose else n
    x = rng.random((rows_in, k)) < 0.4
    if not binary:
        x = np.where(x, rng.normal(size=x.shape), 0.0).astype(np.float32)
    got = run(binary, True, transpose, data.astype(np.float32), indices, indptr, x, (m, n))
    a = dense.T if transpose else dense
    assert got.shape == (a.shape[0], k)
    np.testing.assert_allclose(np.asarray(got), a @ x.astype(float), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("matrix,transpose", list(itertools.product([False, True], repeat=2)))
def test_float64_weights_and_int64_indices(matrix, transpose):
    m, n = 7, 40
    rng = np.random.default_rng(3)
    data, indices, indptr, dense = structure(rng, m, n, dtype=np.int64)
    rows_in = m if transpose else n
    x = rng.normal(size=(rows_in, 3) if matrix else rows_in)
    with enable_x64():
        got = FUNCS[(False, matrix)](jnp.asarray(data), jnp.asarray(indices), jnp.asarray(indptr),
                                     jnp.asarray(x), shape=(m, n), transpose=transpose,
                                     backend="pallas")
        assert got.dtype == jnp.float64
        a = dense.T if transpose else dense
        np.testing.assert_allclose(np.asarray(got), a @ x, rtol=1e-12, atol=1e-12)


def test_degenerate_sizes_use_the_reference_kernel():
    empty = np.zeros(0, np.int32)
    got = ops.csrmv(np.zeros(0, np.float32), empty, np.zeros(4, np.int32),
                    np.ones(5, np.float32), shape=(3, 5), backend="pallas")
    np.testing.assert_array_equal(np.asarray(got), np.zeros(3))
    got = ops.csrmm(np.ones(2, np.float32), np.array([0, 1], np.int32),
                    np.array([0, 1, 2], np.int32), np.ones((2, 0), np.float32), shape=(2, 2),
                    backend="pallas")
    assert got.shape == (2, 0)


def test_half_precision_weights_are_refused_with_a_clear_error():
    with pytest.raises(Exception, match=r"float32 or float64 weights.*backend='jax'"):
        ops.csrmv(np.ones(2, np.float16), np.array([0, 1], np.int32),
                  np.array([0, 1, 2], np.int32), np.ones(2, np.float16), shape=(2, 2),
                  backend="pallas")


def test_pallas_is_opt_in_and_the_defaults_stay():
    for kernel in ops.csr.api.KERNELS.values():
        assert "pallas" in kernel.available_backends("gpu")
        assert "pallas" in kernel.available_backends("cpu")
        assert kernel.defaults["gpu"] == "jax" and kernel.defaults["cpu"] == "numba"


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_every_variant_lowers_to_a_triton_call_for_cuda(dtype):
    m, n, k, nnz = 6, 9, 4, 12
    idx_dtype = jnp.int64 if dtype == "float64" else jnp.int32
    with enable_x64(dtype == "float64"):
        for binary, matrix, transpose, homo in itertools.product([False, True], repeat=4):
            rows_in = m if transpose else n
            xshape = (rows_in, k) if matrix else (rows_in,)
            x = jnp.zeros(xshape, jnp.bool_ if binary else dtype)
            data = jnp.ones((1,) if homo else (nnz,), dtype)
            f = functools.partial(FUNCS[(binary, matrix)], shape=(m, n), transpose=transpose,
                                  backend="pallas")
            text = lower_for_cuda(f, data, jnp.zeros(nnz, idx_dtype),
                                  jnp.zeros(m + 1, idx_dtype), x)
            assert "__gpu$xla.gpu.triton" in text, (binary, matrix, transpose, homo)
            name = ("pf_csr_scatter_" if transpose else "pf_csr_gather_") + (
                "mm" if matrix else "mv")
            assert name in text


@requires_gpu
@pytest.mark.parametrize("binary,matrix,transpose,homo",
                         list(itertools.product([False, True], repeat=4)))
def test_on_the_gpu_matches_the_jax_backend(binary, matrix, transpose, homo):
    m, n, k = 3000, 2000, 8
    rng = np.random.default_rng(4)
    data, indices, indptr, _ = structure(rng, m, n)
    data = np.array([0.5]) if homo else data
    rows_in = m if transpose else n
    xshape = (rows_in, k) if matrix else (rows_in,)
    x = rng.random(xshape) < 0.05
    if not binary:
        x = np.where(x, rng.normal(size=xshape), 0.0).astype(np.float32)
    args = (data.astype(np.float32), indices, indptr, x)
    f = FUNCS[(binary, matrix)]
    got = f(*args, shape=(m, n), transpose=transpose, backend="pallas")
    want = f(*args, shape=(m, n), transpose=transpose, backend="jax")
    assert jax.devices()[0].platform == "gpu"
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-4)
