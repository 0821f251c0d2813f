"""Blocks of just-in-time matrices: ``rows=`` and ``cols=`` of the jitc products.

The reference is a slice ``jitc_todense(...)[r0:r0 + h, c0:c0 + w]`` of the whole matrix
(a plain Python loop over the generator) multiplied in NumPy: a block is the same global
matrix whatever the split.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from primforge import ops

M, N, P, SEED = 37, 53, 0.2, 2024
KINDS = {"homo": 0.75, "normal": (0.25, 1.0)}
DENSE = {kind: ops.jitc_todense(SEED, (M, N), P, w, kind) for kind, w in KINDS.items()}
FUNCS = {(False, False): ops.jitc_matvec, (True, False): ops.binary_jitc_matvec,
         (False, True): ops.jitc_matmat, (True, True): ops.binary_jitc_matmat}
H, W = 20, 25  # blocks of one size (one compilation each), starts traced
STARTS = [(0, 0), (17, N - W), (5, 13)]  # the first, the last and an inner block
CASES = [("homo", 0.75, p) for p in FUNCS] + [("normal", KINDS["normal"], (False, False)),
                                             ("normal", KINDS["normal"], (True, True))]


def _input(rng, rows, binary, matrix):
    x = rng.standard_normal((rows, 3) if matrix else rows).astype(np.float32)
    return x > 0.3 if binary else x


@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("backend", ["numba", "jax"])
def test_block_products_are_slices_of_the_whole_matrix(backend, transpose):
    rng = np.random.default_rng(1)
    for kind, weight, (binary, matrix) in CASES:
        f = FUNCS[(binary, matrix)]

        @jax.jit
        def product(x, r0, c0, f=f, kind=kind, weight=weight):
            return f(weight, SEED, x, shape=(M, N), prob=P, transpose=transpose,
                     weight_kind=kind, backend=backend, rows=(r0, H), cols=(c0, W))

        for r0, c0 in STARTS:
            block = DENSE[kind][r0:r0 + H, c0:c0 + W]
            x = _input(rng, H if transpose else W, binary, matrix)
            want = (block.T if transpose else block) @ x.astype(np.float64)
            np.testing.assert_allclose(product(x, r0, c0), want, rtol=1e-5, atol=1e-5,
                                       err_msg=f"{kind} {(r0, c0)} {f.__name__}")
    # concrete starts, a band of rows and a window of columns
    for rows, cols in (((3, 20), None), (None, (N - 1, 1))):
        r0, h = rows or (0, M)
        c0, w = cols or (0, N)
        x = _input(rng, h if transpose else w, False, False)
        y = ops.jitc_matvec(0.75, SEED, x, shape=(M, N), prob=P, transpose=transpose,
                            backend=backend, rows=rows, cols=cols)
        block = DENSE["homo"][r0:r0 + h, c0:c0 + w]
        np.testing.assert_allclose(y, (block.T if transpose else block) @ x, rtol=1e-5,
                                   atol=1e-5)


@pytest.mark.parametrize("backend", ["numba", "jax"])
def test_traced_starts_one_column_window_per_device_index(backend):
    """The use it is for: ``c0 = axis_index * width`` inside a map over devices; here the
    starts are a vmapped (traced) argument and each block is checked against its slice,
    including a start whose window runs past the matrix (those columns are zero)."""
    spikes = np.random.default_rng(2).random(M) < 0.4
    width = 14
    starts = jnp.arange(4, dtype=jnp.int32) * width  # 0, 14, 28, 42: the last runs past N

    def part(c0):
        return ops.binary_jitc_matvec(0.5, SEED, spikes, shape=(M, N), prob=P, transpose=True,
                                      backend=backend, cols=(c0, width))

    y = jax.jit(jax.vmap(part))(starts)
    padded = np.zeros((M, 4 * width))
    padded[:, :N] = DENSE["homo"] / 0.75 * 0.5
    np.testing.assert_allclose(np.asarray(y).ravel(), spikes @ padded, rtol=1e-6)
    # a negative start: the window's first 3 columns lie before W (zeros), the rest are W's
    before = np.zeros((M, width))
    before[:, 3:] = padded[:, :width - 3]
    np.testing.assert_allclose(jax.jit(part)(jnp.int32(-3)), spikes @ before, rtol=1e-6)
    # a start a whole window before W or far past it: zeros
    far = jax.jit(part)(jnp.int32(-width)), jax.jit(part)(jnp.int32(10 * N))
    np.testing.assert_array_equal(np.stack(far), 0)


@pytest.mark.parametrize("backend", ["numba", "jax"])
def test_gradients_of_a_block_are_those_of_the_slice(backend):
    """The transpose of a block product is the same block's product the other way."""
    (r0, h), (c0, w) = (5, 20), (11, 30)
    kind, theta = "normal", jnp.asarray(KINDS["normal"], jnp.float32)
    block = DENSE[kind][r0:r0 + h, c0:c0 + w]
    rng = np.random.default_rng(3)
    for transpose in (False, True):
        x = rng.standard_normal(h if transpose else w).astype(np.float32)
        ct = rng.standard_normal(w if transpose else h).astype(np.float32)
        mat = block.T if transpose else block

        def loss(theta, x, r0=r0, transpose=transpose, ct=ct):
            y = ops.jitc_matvec(theta, SEED, x, shape=(M, N), prob=P, transpose=transpose,
                                weight_kind=kind, backend=backend, rows=(r0, h), cols=(c0, w))
            return jnp.vdot(y, ct)

        g_theta, g_x = jax.jit(jax.grad(loss, argnums=(0, 1)))(theta, x, jnp.int32(r0))
        np.testing.assert_allclose(g_x, mat.T @ ct, rtol=1e-4, atol=1e-4)
        # d/d(mean) counts the synapses (weight = mean + std z), d/d(std) is exact too
        z = (mat - theta[0] * (mat != 0)) / theta[1]
        want = [ct @ ((mat != 0) @ x), ct @ (z @ x)]
        np.testing.assert_allclose(g_theta, want, rtol=1e-4, atol=1e-4)
        t = jax.jvp(lambda x: loss(theta, x), (x,), (x,))[1]
        np.testing.assert_allclose(t, ct @ (mat @ x), rtol=1e-4, atol=1e-4)


def test_a_batch_of_inputs_on_one_block_is_one_matrix_call():
    (r0, h), (c0, w) = (2, 30), (10, 40)
    xs = np.random.default_rng(4).standard_normal((6, h)).astype(np.float32)
    y = jax.vmap(lambda x: ops.jitc_matvec(0.75, SEED, x, shape=(M, N), prob=P,
                                           transpose=True, rows=(r0, h), cols=(c0, w)))(xs)
    np.testing.assert_allclose(y, xs @ DENSE["homo"][r0:r0 + h, c0:c0 + w], rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize("bad, error, match", [
    ({"cols": 5}, TypeError, "'cols' must be a pair"),
    ({"cols": (0, 2.0)}, TypeError, "size in 'cols' must be an int"),
    ({"rows": (0, M + 1)}, ValueError, r"size in 'rows' must be in \[0, 37\]"),
    ({"cols": (50, 10)}, ValueError, r"start must be in \[0, 43\]"),
    ({"rows": (-1, 3)}, ValueError, r"start must be in \[0, 34\]"),
    ({"cols": (jnp.zeros(2, jnp.int32), 3)}, TypeError, "start in 'cols' must be an integer"),
    ({"cols": (0, 3), "backend": "pallas"}, ValueError, "'pallas' does not take 'rows'"),
])
def test_bad_blocks_are_named(bad, error, match):
    kw = {"rows": None, "cols": None, "backend": None, **bad}
    rows = M if kw["rows"] is None else 3

    def call(x):
        return ops.jitc_matvec(0.5, SEED, x, shape=(M, N), prob=P, transpose=True, **kw)

    x = jnp.ones(rows, jnp.float32)
    with pytest.raises(error, match=match):
        jax.eval_shape(call, x) if kw["backend"] is None else call(x)
