"""Just-in-time connectivity: every backend against the explicit matrix, transformations, GPU.

The explicit matrix comes from ``jitc_todense`` (a plain Python loop over the generator, no
kernel code); the generator itself is checked against its definition (thresholds from the
float64 formula, connection statistics). Backends: 'jax' (reference), 'numba' (CPU
default), 'pallas' (the GPU kernels, interpreted on the CPU).
"""

from __future__ import annotations

import fractions
import functools
import itertools
import math
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gpu_utils import compile_cases_for_targets, lower_for_cuda, requires_gpu_compiler
from jax.test_util import check_grads

from primforge import ops
from primforge.kernel.kernel import KernelError
from primforge.ops._operator import eqn_name
from primforge.ops.jitconn import api as jitconn

BACKENDS = ["jax", "numba", "pallas"]
KINDS = {"homo": 0.75, "uniform": (-0.5, 1.5), "normal": (0.25, 1.0)}
FUNCS = {
    (False, False): ops.jitc_matvec,
    (True, False): ops.binary_jitc_matvec,
    (False, True): ops.jitc_matmat,
    (True, True): ops.binary_jitc_matmat,
}
M, N, K, SEED = 37, 53, 5, 2024


def make_input(rng, shape, binary, rate=0.4):
    active = rng.random(shape) < rate
    if binary:
        return active
    return np.where(active, rng.normal(size=shape), 0.0).astype(np.float32)


# ----------------------------------------------------------------------------- the generator
@pytest.mark.parametrize("prob", [0.5, 0.75, 0.1, 0.003, 1.0])
def test_threshold_table_is_the_exact_formula(prob):
    """Entry k - 1 is floor((1 - prob)**k * 2**32) in exact rational arithmetic (``prob`` is
    a dyadic rational), including the powers of two where (1 - prob)**k * 2**32 is an
    integer and a rounded float64 power falls one below."""
    t = jitconn.threshold_table(prob)
    assert t.dtype == np.uint32 and t[-1] == 0 and np.all(np.diff(t.astype(np.int64)) <= 0)
    q = 1 - fractions.Fraction(prob)
    ks = np.unique(np.r_[1:min(t.size, 300), np.linspace(1, t.size, 50).astype(int)])
    want = [math.floor(q**int(k) * 2**32) for k in ks]
    np.testing.assert_array_equal(t[ks - 1], want)
    assert np.all(t[:-1] >= 1) and ks[-1] == t.size and want[-1] == 0  # every non-zero one
    if prob in (0.5, 0.75):
        np.testing.assert_array_equal(t[:-1], [2 ** (32 - k) for k in range(1, t.size)]
                                      if prob == 0.5 else
                                      [2 ** (32 - 2 * k) for k in range(1, t.size)])


def test_row_streams_are_their_definition():
    """Start and increment of each row (the 'jax' and 'pallas' code) against the definition
    in plain Python; the rows of the test matrix take both sides of the increment's fix."""
    def mix(v):
        v ^= v >> 16
        v = (v * jitconn.MIX_1) % 2**32
        v ^= v >> 15
        v = (v * jitconn.MIX_2) % 2**32
        return v ^ (v >> 16)

    rows = np.r_[0:M, 99_999, 2**31 - 1]
    for seed in (SEED, 0, 2**32 - 1):
        start, gamma = jitconn.row_streams(jnp.uint32(seed), jnp.asarray(rows, jnp.int32))
        flipped = []
        for i, a, g in zip(rows, np.asarray(start), np.asarray(gamma)):
            h = mix(int(i) ^ jitconn.ROW_SALT)
            want_g = mix(h ^ mix(seed ^ jitconn.GAMMA_SALT)) | 1
            flipped.append((want_g ^ (want_g >> 1)).bit_count() < jitconn.FEW_FLIPS)
            want_g ^= jitconn.FLIP if flipped[-1] else 0
            assert (int(a), int(g)) == (mix((h + mix(seed ^ jitconn.SEED_SALT)) % 2**32), want_g)
            assert g % 2 == 1 and (int(g) ^ (int(g) >> 1)).bit_count() >= jitconn.FEW_FLIPS
        if seed == SEED:
            assert 0 < sum(flipped[:M]) < M


@pytest.mark.parametrize("prob", [0.05, 0.3])
def test_connections_are_independent_bernoulli_with_prob(prob):
    m, n = 300, 400
    w = jitconn.jitc_todense(7, (m, n), prob) != 0
    # Overall density within 5 sigma of a binomial.
    sd = math.sqrt(prob * (1 - prob) / (m * n))
    assert abs(w.mean() - prob) < 5 * sd
    # Row lengths: variance of a Binomial(n, p), every column equally likely.
    counts = w.sum(1)
    assert abs(counts.var() / (n * prob * (1 - prob)) - 1) < 0.3
    col_density = w.mean(0)
    assert abs(col_density[: n // 2].mean() - col_density[n // 2 :].mean()) < 6 * sd * math.sqrt(2)
    # Neighbouring entries are uncorrelated (the gap is geometric, not shifted).
    both = (w[:, 1:] & w[:, :-1]).mean()
    assert abs(both - prob**2) < 5 * math.sqrt(prob**2 / (m * (n - 1)))
    # Different seeds give different matrices; the same seed the same one.
    assert not np.array_equal(w, jitconn.jitc_todense(8, (m, n), prob) != 0)
    np.testing.assert_array_equal(w, jitconn.jitc_todense(7, (m, n), prob) != 0)


def test_weights_follow_their_distribution():
    mask = jitconn.jitc_todense(3, (200, 300), 0.2) != 0
    u = jitconn.jitc_todense(3, (200, 300), 0.2, (2.0, 5.0), "uniform")[mask]
    assert u.min() > 2.0 and u.max() < 5.0 and abs(u.mean() - 3.5) < 0.05
    g = jitconn.jitc_todense(3, (200, 300), 0.2, (1.0, 2.0), "normal")[mask]
    assert abs(g.mean() - 1.0) < 0.05 and abs(g.std() - 2.0) < 0.05
    # The connectivity does not depend on the weight kind.
    assert np.array_equal((u != 0), np.ones_like(u, bool))
    assert np.count_nonzero(jitconn.jitc_todense(3, (200, 300), 0.2, (2.0, 5.0), "uniform")) == (
        mask.sum())


# ----------------------------------------------------------------------------- identity
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("prob", [0.2, 1.0, 0.01])
def test_connectivity_is_bitwise_the_seeds_matrix_in_both_directions(backend, prob):
    dense = jitconn.jitc_todense(SEED, (M, N), prob)
    # W @ I recovers W, W.T @ I recovers W.T: exact 0/1 entries with a unit weight.
    w = ops.jitc_matmat(1.0, SEED, np.eye(N, dtype=np.float32), shape=(M, N), prob=prob,
                        backend=backend)
    np.testing.assert_array_equal(np.asarray(w), dense)
    wt = ops.binary_jitc_matmat(1.0, SEED, np.eye(M, dtype=bool), shape=(M, N), prob=prob,
                                transpose=True, backend=backend)
    np.testing.assert_array_equal(np.asarray(wt), dense.T)


@pytest.mark.parametrize("backend", ["jax", "numba"])
@pytest.mark.parametrize("prob", [0.0004, 0.03, 0.6])
@pytest.mark.parametrize("kind", list(KINDS))
def test_matvec_kernels_draw_the_seeds_matrix(backend, prob, kind):
    """The vector kernels (not only the matrix ones) regenerate exactly the seed's matrix,
    on long rows: the skip search runs through every part of its guide (a tiny ``prob``
    has the longest gaps), and every synapse's weight comes from its own draws."""
    m, n = 12, 6000
    dense = jitconn.jitc_todense(SEED, (m, n), prob, KINDS[kind], kind)
    kw = {"shape": (m, n), "prob": prob, "weight_kind": kind, "backend": backend}
    # W @ ones (binary): the row sums; a shared weight must give count * weight exactly.
    got = np.asarray(ops.binary_jitc_matvec(KINDS[kind], SEED, np.ones(n, bool), **kw))
    if kind == "homo":
        counts = (dense != 0).sum(axis=1).astype(np.float64)
        np.testing.assert_array_equal(got, (counts * np.float32(KINDS[kind])).astype(np.float32))
    else:
        np.testing.assert_allclose(got, dense.sum(axis=1), rtol=1e-5, atol=1e-4)
    # One event at a time, e_i @ W: row i itself, entry by entry (connectivity exact).
    for i in (0, 5, m - 1):
        e = np.zeros(m, bool)
        e[i] = True
        row = np.asarray(ops.binary_jitc_matvec(KINDS[kind], SEED, e, transpose=True, **kw))
        np.testing.assert_array_equal(row != 0, dense[i] != 0)
        np.testing.assert_allclose(row, dense[i], rtol=2e-6, atol=2e-6)
    # Float input W @ x where only a few entries are non-zero: weights drawn on demand.
    x = np.zeros(n, np.float32)
    x[::7] = np.linspace(-1, 1, x[::7].size, dtype=np.float32)
    got = np.asarray(ops.jitc_matvec(KINDS[kind], SEED, x, **kw))
    np.testing.assert_allclose(got, dense.astype(np.float64) @ x, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["uniform", "normal"])
def test_weights_are_the_seeds_matrix(backend, kind):
    dense = jitconn.jitc_todense(SEED, (M, N), 0.3, KINDS[kind], kind)
    w = ops.jitc_matmat(KINDS[kind], SEED, np.eye(N, dtype=np.float32), shape=(M, N), prob=0.3,
                        weight_kind=kind, backend=backend)
    np.testing.assert_array_equal(np.asarray(w) != 0, dense != 0)
    np.testing.assert_allclose(np.asarray(w), dense, rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize(
    "backend,binary,matrix,transpose,kind",
    list(itertools.product(BACKENDS, [False, True], [False, True], [False, True], KINDS)),
)
def test_every_variant_matches_dense_numpy(backend, binary, matrix, transpose, kind):
    rng = np.random.default_rng(zlib.crc32(repr((binary, matrix, transpose, kind)).encode()))
    dense = jitconn.jitc_todense(SEED, (M, N), 0.2, KINDS[kind], kind)
    a = dense.T if transpose else dense
    x = make_input(rng, (a.shape[1], K) if matrix else (a.shape[1],), binary)
    want = a @ x.astype(np.float64)
    f = functools.partial(FUNCS[(binary, matrix)], shape=(M, N), prob=0.2, transpose=transpose,
                          weight_kind=kind, backend=backend)
    got = f(KINDS[kind], SEED, x)
    assert got.shape == want.shape and got.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(jax.jit(f)(jnp.asarray(KINDS[kind]), SEED, x)), want,
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int8, np.bool_])
def test_binary_events_count_when_non_zero(backend, dtype):
    rng = np.random.default_rng(5)
    x = ((rng.random(M) < 0.5) * rng.integers(1, 5, size=M)).astype(dtype)
    dense = jitconn.jitc_todense(SEED, (M, N), 0.2, 0.5)
    got = ops.binary_jitc_matvec(0.5, SEED, x, shape=(M, N), prob=0.2, transpose=True,
                                 backend=backend)
    np.testing.assert_allclose(np.asarray(got), (x != 0) @ dense, rtol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_degenerate_sizes(backend):
    for m, n in [(0, 5), (5, 0), (1, 1)]:
        x = np.ones(n, np.float32)
        got = ops.jitc_matvec(1.0, 1, x, shape=(m, n), prob=1.0, backend=backend)
        np.testing.assert_array_equal(np.asarray(got), np.ones((m, n)) @ x)
    got = ops.jitc_matmat(1.0, 1, np.ones((4, 0), np.float32), shape=(3, 4), prob=0.5,
                          backend=backend)
    assert got.shape == (3, 0)


def test_a_traced_seed_selects_the_matrix_without_recompiling():
    x = np.ones(N, np.float32)
    traces = []

    @jax.jit
    def f(seed):
        traces.append(1)
        return ops.jitc_matvec(1.0, seed, x, shape=(M, N), prob=0.2)

    for seed in (1, 2, -3, 2**32 - 3):
        want = jitconn.jitc_todense(seed, (M, N), 0.2) @ x
        np.testing.assert_array_equal(np.asarray(f(jnp.asarray(seed % 2**32, jnp.uint32))), want)
    assert len(traces) == 1
    # A signed traced seed wraps the same way.
    g = jax.jit(lambda seed: ops.jitc_matvec(1.0, seed, x, shape=(M, N), prob=0.2))
    np.testing.assert_array_equal(np.asarray(g(jnp.int32(-3))),
                                  jitconn.jitc_todense(2**32 - 3, (M, N), 0.2) @ x)
    # Python ints are taken modulo 2**32, like the traced uint32 seed.
    np.testing.assert_array_equal(ops.jitc_matvec(1.0, -3, x, shape=(M, N), prob=0.2),
                                  jitconn.jitc_todense(2**32 - 3, (M, N), 0.2) @ x)


# ----------------------------------------------------------------------------- autodiff
def _basis(kind, transpose):
    """Dense matrices of each weight parameter (the product is linear in them)."""
    size = jitconn.WEIGHT_KINDS[kind]
    out = []
    for k in range(size):
        e = np.zeros(size)
        e[k] = 1
        d = jitconn.jitc_todense(SEED, (M, N), 0.2, e if size > 1 else 1.0, kind)
        out.append(d.T if transpose else d)
    return out


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("matrix", [False, True])
@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("kind", list(KINDS))
def test_grad_wrt_input_and_weights_match_dense(backend, matrix, transpose, kind):
    rng = np.random.default_rng(11)
    rows_in, rows_out = (M, N) if transpose else (N, M)
    x = make_input(rng, (rows_in, K) if matrix else (rows_in,), False)
    ct = rng.normal(size=(rows_out, K) if matrix else (rows_out,)).astype(np.float32)
    theta = np.asarray(KINDS[kind], np.float32)
    f = functools.partial(FUNCS[(False, matrix)], shape=(M, N), prob=0.2, transpose=transpose,
                          weight_kind=kind, backend=backend)
    gw, gx = jax.grad(lambda w, x: jnp.sum(f(w, SEED, x) * ct), argnums=(0, 1))(
        jnp.asarray(theta), x)
    basis = _basis(kind, transpose)
    a = sum(float(t) * b for t, b in zip(np.ravel(theta), basis))
    np.testing.assert_allclose(np.asarray(gx), a.T @ ct, rtol=1e-4, atol=1e-4)
    want_w = [np.sum(ct * (b @ x)) for b in basis]
    np.testing.assert_allclose(np.ravel(gw), want_w, rtol=1e-4, atol=1e-4)
    # And finite differences, forward and reverse, through the primitive's own rules.
    check_grads(lambda w, x: f(w, SEED, x), (jnp.asarray(theta), jnp.asarray(x)), order=1,
                modes=("fwd", "rev"), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("backend", ["jax", "numba"])
@pytest.mark.parametrize("transpose", [False, True])
def test_jvp_of_binary_products(backend, transpose):
    rng = np.random.default_rng(2)
    rows_in = M if transpose else N
    e = (rng.random(rows_in) < 0.4).astype(np.float32)
    dense = jitconn.jitc_todense(SEED, (M, N), 0.2, (0.0, 1.0), "uniform")
    a = dense.T if transpose else dense
    f = functools.partial(ops.binary_jitc_matvec, shape=(M, N), prob=0.2, transpose=transpose,
                          weight_kind="uniform", backend=backend)
    theta, dtheta = jnp.array([0.0, 1.0]), jnp.array([0.3, -0.2])
    de = rng.normal(size=rows_in).astype(np.float32)
    y, t = jax.jvp(lambda w, x: f(w, SEED, x), (theta, e), (dtheta, de))
    np.testing.assert_allclose(np.asarray(y), a @ e, rtol=1e-5, atol=1e-5)
    d_a = jitconn.jitc_todense(SEED, (M, N), 0.2, (0.3, -0.2), "uniform")
    d_a = d_a.T if transpose else d_a
    # float events: the tangent of W @ x (straight through on 0/1 inputs)
    np.testing.assert_allclose(np.asarray(t), d_a @ e + a @ de, rtol=1e-4, atol=1e-4)
    # bool events have no tangent: only the weights' part remains
    _, tb = jax.jvp(lambda w: f(w, SEED, e.astype(bool)), (theta,), (dtheta,))
    np.testing.assert_allclose(np.asarray(tb), d_a @ e, rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------- vmap
def _primitives(jaxpr):
    return [eqn_name(eqn) for eqn in jaxpr.eqns]


@pytest.mark.parametrize("backend", ["jax", "numba"])
@pytest.mark.parametrize("binary,matrix,transpose",
                         list(itertools.product([False, True], repeat=3)))
def test_vmap_over_the_input_is_one_matmat_call(backend, binary, matrix, transpose):
    rng = np.random.default_rng(4)
    dense = jitconn.jitc_todense(SEED, (M, N), 0.2, KINDS["normal"], "normal")
    a = dense.T if transpose else dense
    xs = make_input(rng, (6, a.shape[1], K) if matrix else (6, a.shape[1]), binary)
    f = functools.partial(FUNCS[(binary, matrix)], KINDS["normal"], SEED, shape=(M, N), prob=0.2,
                          transpose=transpose, weight_kind="normal", backend=backend)
    got = jax.vmap(f)(xs)
    want = np.stack([a @ x.astype(np.float64) for x in xs])
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
    names = _primitives(jax.make_jaxpr(jax.vmap(f))(xs).jaxpr)
    kernel_names = [n for n in names if "jitc" in n]
    mm = "primforge.ops." + ("binary_" if binary else "") + "jitc_matmat"
    assert kernel_names == [mm], names


def test_vmap_over_seeds_and_weights_maps_the_kernel():
    x = np.linspace(-1, 1, N).astype(np.float32)
    seeds = jnp.arange(4, dtype=jnp.uint32)
    thetas = jnp.array([[0.0, 1.0], [1.0, 2.0], [-1.0, 0.5], [2.0, 2.0]], jnp.float32)
    got = jax.vmap(lambda s, w: ops.jitc_matvec(w, s, x, shape=(M, N), prob=0.2,
                                                 weight_kind="uniform"))(seeds, thetas)
    want = np.stack([jitconn.jitc_todense(int(s), (M, N), 0.2, np.asarray(w), "uniform") @ x
                     for s, w in zip(seeds, thetas)])
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


def test_grad_of_vmap_and_vmap_of_grad_agree_with_dense():
    rng = np.random.default_rng(8)
    xs = rng.normal(size=(3, M)).astype(np.float32)
    dense = jitconn.jitc_todense(SEED, (M, N), 0.2, 1.0)

    def loss(w, x):
        return jnp.sum(ops.jitc_matvec(w, SEED, x, shape=(M, N), prob=0.2, transpose=True) ** 2)

    g = jax.vmap(jax.grad(loss), in_axes=(None, 0))(jnp.float32(1.0), xs)
    want = [2 * np.sum((x @ dense) ** 2) for x in xs]  # d/dw sum((w x W)^2) at w = 1
    np.testing.assert_allclose(np.asarray(g), want, rtol=1e-4)
    gx = jax.grad(lambda x: jax.vmap(lambda r: loss(1.0, r))(x).sum())(xs)
    np.testing.assert_allclose(np.asarray(gx), 2 * (xs @ dense) @ dense.T, rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------- memory, scale
def test_a_large_matrix_is_never_stored_and_matches_sampled_rows():
    n, prob = 100_000, 0.001
    rng = np.random.default_rng(0)
    x = make_input(rng, (n,), False, rate=0.2)
    f = functools.partial(ops.jitc_matvec, 0.5, 77, shape=(n, n), prob=prob)
    # Everything the kernel gets: the input, the weight, the seed and the threshold table.
    jaxpr = jax.make_jaxpr(f)(x)
    (eqn,) = [e for e in jaxpr.eqns if "jitc" in e.primitive.name]
    stored = sum(v.aval.size * v.aval.dtype.itemsize for v in eqn.invars)
    assert stored < 4 * n + 100_000  # nothing of size nnz (~1e7 entries)
    y = np.asarray(f(x))
    rows = [0, 1, 4567, 99_999]
    w_rows = jitconn.jitc_todense(77, (n, n), prob, 0.5, rows=rows)
    np.testing.assert_allclose(y[rows], w_rows @ x, rtol=1e-5, atol=1e-5)
    assert abs(np.count_nonzero(w_rows) / (len(rows) * n) - prob) < 0.0006
    # x @ W, event-driven: three active rows give the sum of those rows.
    e = np.zeros(n, bool)
    e[rows[1:]] = True
    yt = np.asarray(ops.binary_jitc_matvec(0.5, 77, e, shape=(n, n), prob=prob, transpose=True))
    np.testing.assert_allclose(yt, w_rows[1:].sum(0), rtol=1e-6)


# ----------------------------------------------------------------------------- bad input
def test_bad_arguments_raise_clear_errors():
    x = np.ones(N, np.float32)
    kw = {"shape": (M, N), "prob": 0.2}
    with pytest.raises(ValueError, match="'prob' must be in"):
        ops.jitc_matvec(1.0, 0, x, shape=(M, N), prob=0.0)
    with pytest.raises(ValueError, match="'prob' must be in"):
        ops.jitc_matvec(1.0, 0, x, shape=(M, N), prob=1.5)
    with pytest.raises(ValueError, match="too small"):
        ops.jitc_matvec(1.0, 0, x, shape=(M, N), prob=1e-8)
    with pytest.raises(ValueError, match=r"'weight' must be a pair \(low, high\)"):
        ops.jitc_matvec(1.0, 0, x, weight_kind="uniform", **kw)
    with pytest.raises(ValueError, match="'weight' must be a scalar"):
        ops.jitc_matvec((1.0, 2.0), 0, x, **kw)
    with pytest.raises(ValueError, match="'weight_kind' must be one of"):
        ops.jitc_matvec(1.0, 0, x, weight_kind="lognormal", **kw)
    with pytest.raises(TypeError, match="'seed' must be one integer"):
        ops.jitc_matvec(1.0, 0.5, x, **kw)
    with pytest.raises(ValueError, match=r"the input must have shape \(53,\)"):
        ops.jitc_matvec(1.0, 0, np.ones(M, np.float32), **kw)
    with pytest.raises(ValueError, match=r"the input must have shape \(37, k\)"):
        ops.jitc_matmat(1.0, 0, np.ones((N, 2), np.float32), transpose=True, **kw)
    with pytest.raises(TypeError, match="'shape' must be a pair"):
        ops.jitc_matvec(1.0, 0, x, shape=N, prob=0.2)
    with pytest.raises(KernelError, match="backend 'pallas' supports float32 or float64"):
        ops.jitc_matvec(jnp.float16(1.0), 0, x.astype(np.float16), backend="pallas", **kw)
    # the primitive itself checks the table it is given
    with pytest.raises(ValueError, match="'table' must be threshold_table"):
        ops.jitc_matvec_p(jnp.ones(1), jnp.zeros(1, jnp.uint32), jnp.zeros(3, jnp.uint32),
                          jnp.ones(N), shape=(M, N), prob=0.2, transpose=False,
                          weight_kind="homo")


# ----------------------------------------------------------------------------- benchmark hooks
@pytest.mark.parametrize("binary,matrix", list(FUNCS))
def test_benchmark_data_runs_and_matches_sampled_rows(binary, matrix):
    kernel = jitconn.KERNELS[(binary, matrix)]
    configs = kernel._benchmark_data_fn(platform="cpu")
    assert {c.params["transpose"] for c in configs} == {False, True}
    assert {c.params["weight"] for c in configs} == {"homo", "uniform", "normal"}
    cfg = configs[0]  # n = 1000: small enough for the explicit matrix
    weight, seed, x = cfg.args
    dense = jitconn.jitc_todense(seed, cfg.kwargs["shape"], cfg.kwargs["prob"], weight,
                                 cfg.kwargs["weight_kind"])
    a = dense.T if cfg.kwargs["transpose"] else dense
    got = kernel.call(*cfg.args, **cfg.kwargs)
    np.testing.assert_allclose(np.asarray(got), a @ x.astype(np.float64), rtol=1e-4, atol=1e-4)
    # the 'jax' reference agrees on every config (what `primforge check` compares)
    for c in configs:
        np.testing.assert_allclose(np.asarray(kernel.call(*c.args, **c.kwargs, backend="jax")),
                                   np.asarray(kernel.call(*c.args, **c.kwargs)),
                                   rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------- GPU
@pytest.mark.parametrize("binary,matrix", list(FUNCS))
def test_every_pallas_variant_lowers_for_cuda(binary, matrix):
    for transpose, kind in itertools.product([False, True], KINDS):
        rows_in = M if transpose else N
        x = jnp.zeros((rows_in, K) if matrix else (rows_in,), jnp.bool_ if binary else jnp.float32)
        f = functools.partial(FUNCS[(binary, matrix)], shape=(M, N), prob=0.1,
                              transpose=transpose, weight_kind=kind, backend="pallas")
        text = lower_for_cuda(f, jnp.asarray(KINDS[kind], jnp.float32), jnp.int32(3), x)
        assert "__gpu$xla.gpu.triton" in text
        name = "pf_jitc_" + ("scatter_" if transpose else "gather_") + ("mm" if matrix else "mv")
        assert name in text


@requires_gpu_compiler
@pytest.mark.parametrize("binary,matrix", list(FUNCS))
@pytest.mark.parametrize("transpose", [False, True])
def test_every_pallas_variant_compiles_for_h100_and_a100(binary, matrix, transpose):
    sds = jax.ShapeDtypeStruct
    rows_in = M if transpose else N
    x = sds((rows_in, K) if matrix else (rows_in,), jnp.bool_ if binary else jnp.float32)
    name = "pf_jitc_" + ("scatter_" if transpose else "gather_") + ("mm" if matrix else "mv")
    cases = {}  # one XLA:GPU program per target, each weight distribution its own launch
    for kind, weight in KINDS.items():
        w = sds(np.shape(weight), jnp.float32)
        f = functools.partial(FUNCS[(binary, matrix)], shape=(M, N), prob=0.1,
                              transpose=transpose, weight_kind=kind, backend="pallas")
        cases[kind] = (f, (w, sds((), jnp.int32), x))
    expect = dict.fromkeys(cases, lambda n: n.startswith(name))
    # grad and vmap of the float products compile too
    if not binary:
        w = sds((2,), jnp.float32)
        g = jax.grad(lambda w, x: jnp.sum(FUNCS[(False, matrix)](
            w, 1, x, shape=(M, N), prob=0.1, transpose=transpose, weight_kind="normal",
            backend="pallas")), argnums=(0, 1))
        cases["grad"] = (g, (w, x))
        v = jax.vmap(functools.partial(FUNCS[(False, matrix)], 1.0, 1, shape=(M, N), prob=0.1,
                                       transpose=transpose, backend="pallas"))
        cases["vmap"] = (v, (sds((3,) + x.shape, x.dtype),))
    compile_cases_for_targets(cases, backend="pallas", expect=expect)
