"""CSR products under vmap with zero-size dimensions (rows, columns, batch), every CPU backend.

Each case is compared with the dense ``jax.numpy`` product of the same matrix.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from primforge.ops import CSR, fixed_prob
from primforge.ops.csr.api import csrmv_p

BACKENDS = csrmv_p.available_backends("cpu")
SHAPES = [(0, 5), (5, 0), (0, 0), (4, 5)]


def _weights(rng, nnz):
    return rng.uniform(0.5, 1.5, size=nnz)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", SHAPES)
def test_vmapped_csr_products_with_zero_size_dims(shape, backend):
    W = fixed_prob(*shape, 0.5, weight=_weights, seed=0)
    dense = W.todense()
    n_rows, n_cols = shape
    cases = [
        (lambda v: W.matmul(v, backend=backend), jnp.ones((3, n_cols)), lambda v: dense @ v),
        (lambda v: W.rmatmul(v, backend=backend), jnp.ones((3, n_rows)), lambda v: v @ dense),
        (lambda m: W.matmul(m, backend=backend), jnp.ones((3, n_cols, 2)), lambda m: dense @ m),
        (lambda v: W.matmul(v, backend=backend), jnp.ones((0, n_cols)), lambda v: dense @ v),
    ]
    for f, xs, ref in cases:
        np.testing.assert_allclose(jax.vmap(f)(xs), jax.vmap(ref)(xs), rtol=1e-6)
    # Batched weights (one product per batch element), zero-size matrix included.
    ds = jnp.stack([W.data, 2 * W.data])
    got = jax.vmap(lambda d: W.with_data(d).matmul(jnp.ones(n_cols), backend=backend))(ds)
    np.testing.assert_allclose(got, jnp.stack([dense.sum(1), 2 * dense.sum(1)]), rtol=1e-6)


def test_grad_through_a_zero_row_csr_product():
    W = fixed_prob(0, 5, 0.5, weight=_weights, seed=0)
    g = jax.grad(lambda v: (W @ v).sum())(jnp.ones(5))
    np.testing.assert_allclose(g, np.zeros(5))
    assert isinstance(W, CSR)


def test_a_captured_matrix_keeps_its_index_arrays_out_of_constant_folding():
    # Captured from the enclosing scope, W's arrays are compile-time constants: the index
    # arrays must reach the kernels through an optimization barrier, or XLA evaluates the
    # gradient's index computations while compiling (benchmarks/captured_matrix.py).
    W = fixed_prob(50, 40, 0.2, weight=_weights, seed=0)
    s = jnp.ones(50)
    f = jax.jit(jax.grad(lambda w: (s @ W.with_data(w)).sum()))
    assert "optimization_barrier" in f.lower(W.data).as_text()
    dense_grad = jax.grad(lambda w: (s @ CSR(w, W.indices, W.indptr, shape=W.shape).todense()
                                     ).sum())(W.data)
    np.testing.assert_allclose(f(W.data), dense_grad, rtol=1e-6)
