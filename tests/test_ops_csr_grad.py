"""primforge.ops: gradients (check_grads, transpose rules), JVP and batched gradients."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _jaxpr import eqn_names as _names
from jax.test_util import check_grads
from test_ops_csr import BACKENDS, FUNCS, K, M, N, make_input, random_csr

from primforge import ops
from primforge.ops import CSR


@pytest.mark.parametrize(
    "backend,matrix,homo,transpose",
    list(itertools.product(BACKENDS, [False, True], [False, True], [False, True])),
)
def test_float_products_check_grads(backend, matrix, homo, transpose):
    rng = np.random.default_rng(hash((matrix, homo, transpose)) % 2**32)
    data, indices, indptr, _ = random_csr(rng, homo=homo)
    x = make_input(rng, M if transpose else N, matrix, False, rate=1.0)
    fn = FUNCS[(False, matrix)]
    f = lambda d, x: fn(d, indices, indptr, x, shape=(M, N), transpose=transpose,
                        backend=backend)
    # Second order (transpose of the JVP) on the CPU default; first order on the reference.
    check_grads(f, (data, x), order=2 if backend == "numba" else 1, modes=("fwd", "rev"),
                atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize(
    "backend,matrix,homo,transpose",
    list(itertools.product(BACKENDS, [False, True], [False, True], [False, True])),
)
def test_binary_products_check_grads_wrt_weights(backend, matrix, homo, transpose):
    rng = np.random.default_rng(hash((matrix, homo, transpose, 1)) % 2**32)
    data, indices, indptr, _ = random_csr(rng, homo=homo)
    ev = make_input(rng, M if transpose else N, matrix, True)
    fn = FUNCS[(True, matrix)]
    f = lambda d: fn(d, indices, indptr, ev, shape=(M, N), transpose=transpose,
                     backend=backend)
    check_grads(f, (data,), order=1, modes=("fwd", "rev"), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("homo", [False, True])
def test_weight_gradient_equals_dense_formula(backend, homo):
    # d/dW <c, s @ W> = outer(s, c) restricted to the stored entries.
    rng = np.random.default_rng(21)
    data, indices, indptr, dense = random_csr(rng, homo=homo)
    s = rng.random(M) < 0.4
    c = rng.normal(size=N).astype(np.float32)
    g = jax.grad(lambda d: jnp.dot(c, ops.binary_csrmv(d, indices, indptr, s, shape=(M, N),
                                                       transpose=True, backend=backend)))(data)
    full = np.outer(s, c)
    rows, cols = np.nonzero(dense)
    want = full[rows, cols].sum(keepdims=True) if homo else full[rows, cols]
    np.testing.assert_allclose(np.asarray(g), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_input_gradient_is_transposed_product(backend):
    rng = np.random.default_rng(22)
    data, indices, indptr, dense = random_csr(rng)
    v = rng.normal(size=N).astype(np.float32)
    c = rng.normal(size=M).astype(np.float32)
    g = jax.grad(lambda v: jnp.dot(c, ops.csrmv(data, indices, indptr, v, shape=(M, N),
                                                backend=backend)))(v)
    np.testing.assert_allclose(np.asarray(g), dense.T @ c, rtol=1e-4, atol=1e-5)
    # Reverse mode goes through the transpose rule: the flipped kernel, no dense matrix.
    jaxpr = jax.make_jaxpr(jax.grad(lambda v: ops.csrmv(data, indices, indptr, v,
                                                        shape=(M, N)).sum()))(v).jaxpr
    names = _names(jaxpr)
    assert names.count("primforge.ops.csrmv") >= 1
    assert "scan" not in names and "while" not in names


@pytest.mark.parametrize("backend", BACKENDS)
def test_binary_float_events_get_straight_through_gradient(backend):
    rng = np.random.default_rng(23)
    data, indices, indptr, dense = random_csr(rng)
    s = (rng.random(M) < 0.5).astype(np.float32)
    c = rng.normal(size=N).astype(np.float32)
    g = jax.grad(lambda s: jnp.dot(c, ops.binary_csrmv(data, indices, indptr, s, shape=(M, N),
                                                       transpose=True, backend=backend)))(s)
    np.testing.assert_allclose(np.asarray(g), dense @ c, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_jvp_matches_dense(backend):
    rng = np.random.default_rng(24)
    data, indices, indptr, dense = random_csr(rng)
    B = rng.normal(size=(N, K)).astype(np.float32)
    dd = rng.normal(size=data.shape).astype(np.float32)
    dB = rng.normal(size=(N, K)).astype(np.float32)
    f = lambda d, B: ops.csrmm(d, indices, indptr, B, shape=(M, N), backend=backend)
    y, t = jax.jvp(f, (data, B), (dd, dB))
    rows, cols = np.nonzero(dense)
    ddense = np.zeros_like(dense)
    ddense[rows, cols] = dd
    np.testing.assert_allclose(np.asarray(y), dense @ B, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(t), ddense @ B + dense @ dB, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
def test_per_example_gradients_under_vmap(backend):
    rng = np.random.default_rng(25)
    data, indices, indptr, dense = random_csr(rng)
    spikes = rng.random((4, M)) < 0.4
    c = rng.normal(size=(4, N)).astype(np.float32)

    def loss(d, s, c):
        return jnp.dot(c, ops.binary_csrmv(d, indices, indptr, s, shape=(M, N), transpose=True,
                                           backend=backend))

    got = jax.vmap(jax.grad(loss), in_axes=(None, 0, 0))(data, spikes, c)
    rows, cols = np.nonzero(dense)
    want = np.stack([np.outer(s, cc)[rows, cols] for s, cc in zip(spikes, c)])
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-5)


def test_grad_through_csr_class_and_jit():
    rng = np.random.default_rng(26)
    *_, dense = random_csr(rng)
    W = CSR.from_dense(dense)
    v = rng.normal(size=N).astype(np.float32)

    @jax.jit
    def loss(w, v):
        return jnp.sum(jnp.tanh(W.with_data(w) @ v))

    gw, gv = jax.grad(loss, argnums=(0, 1))(W.data, v)
    y = dense @ v
    dy = 1 - np.tanh(y) ** 2
    rows, cols = np.nonzero(dense)
    np.testing.assert_allclose(np.asarray(gw), dy[rows] * v[cols], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(gv), dense.T @ dy, rtol=1e-4, atol=1e-5)
