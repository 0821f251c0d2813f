"""Just-in-time products taking a spike list, against NumPy on the explicit matrix
(``jitc_todense``, a plain Python loop over the generator) and the bool product."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from primforge import ops
from primforge.ops.jitconn import threshold_table

BACKENDS = ("numba", "jax")
# The numba kernels in the default run; the jax reference (the same checks) in the full one.
TIERED = ("numba", pytest.param("jax", marks=pytest.mark.exhaustive))
KINDS = {"homo": 0.75, "uniform": (-0.5, 1.5), "normal": (0.25, 0.5)}
# (rows, cols, prob): a few shapes, so that few Numba variants compile
SHAPES = ((9, 13, 0.3), (20, 7, 0.5))


def _dense(seed, shape, prob, kind, weight=None):
    weight = KINDS[kind] if weight is None else weight
    return ops.jitc_todense(seed, shape, prob, weight, kind)


def _numpy(dense, spikes, count):
    return np.bincount(np.asarray(spikes)[:count], minlength=dense.shape[0]) @ dense


def _mv(kind, shape, prob, seed, backend, weight=None):
    weight = KINDS[kind] if weight is None else weight
    return lambda s, c, w=weight: ops.binary_jitc_mv_spikes(
        w, seed, s, c, shape=shape, prob=prob, weight_kind=kind, backend=backend)


def _mm(kind, shape, prob, seed, backend):
    return lambda s, c: ops.binary_jitc_mm_spikes(KINDS[kind], seed, s, c, shape=shape,
                                                  prob=prob, weight_kind=kind, backend=backend)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("backend", TIERED)
def test_random_lists_match_numpy(kind, backend):
    rs = np.random.RandomState(list(KINDS).index(kind))
    for m, n, prob in SHAPES:
        # the seed traced too: one compilation per shape
        jitted = jax.jit(lambda seed, s, c, m=m, n=n, p=prob: ops.binary_jitc_mv_spikes(
            KINDS[kind], seed, s, c, shape=(m, n), prob=p, weight_kind=kind, backend=backend))
        length = m + 3  # room for repeats, which count once each
        for seed in rs.randint(0, 2**32, 2, dtype=np.uint64).astype(np.uint32):
            dense = _dense(int(seed), (m, n), prob, kind)
            spikes = rs.randint(0, m, length).astype(np.int32)
            for count in (0, rs.randint(1, length), length):
                np.testing.assert_allclose(jitted(seed, spikes, np.int32(count)),
                                           _numpy(dense, spikes, count), rtol=1e-5, atol=1e-5)
        mv = _mv(kind, (m, n), prob, int(seed), backend)  # eagerly; no count: the whole list
        np.testing.assert_allclose(mv(spikes, None), _numpy(dense, spikes, length), rtol=1e-5,
                                   atol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
def test_equals_the_bool_product_on_a_built_list(kind):
    rs = np.random.RandomState(10)
    m, n, prob = SHAPES[1]
    for backend in BACKENDS:
        listed = jax.jit(lambda seed, e, b=backend: ops.binary_jitc_mv_spikes(
            KINDS[kind], seed, *ops.spike_list(e, m), shape=(m, n), prob=prob,
            weight_kind=kind, backend=b))
        dense = jax.jit(lambda seed, e, b=backend: ops.binary_jitc_matvec(
            KINDS[kind], seed, e, shape=(m, n), prob=prob, transpose=True, weight_kind=kind,
            backend=b))
        for seed in np.uint32([3, 2**32 - 1]):
            for rate in (0.0, 0.4, 1.0):
                events = rs.random_sample(m) < rate
                got, want = listed(seed, events), dense(seed, events)
                if backend == "numba":  # the same synapses, weights and order of sums
                    np.testing.assert_array_equal(got, want)
                else:
                    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", TIERED)
def test_vmap_over_lists_counts_and_weights(backend):
    rs = np.random.RandomState(3)
    (m, n, prob), seed, kind = SHAPES[0], 5, "uniform"
    dense, mv = _dense(seed, (m, n), prob, kind), _mv(kind, (m, n), prob, seed, backend)
    spikes = rs.randint(0, m, (3, 6)).astype(np.int32)
    counts = np.array([0, 2, 6], np.int32)
    want = np.stack([_numpy(dense, s, c) for s, c in zip(spikes, counts)])
    np.testing.assert_allclose(jax.vmap(mv)(spikes, counts), want, rtol=1e-5, atol=1e-5)
    got = jax.vmap(lambda c: mv(spikes[2], c))(counts)
    np.testing.assert_allclose(got, np.stack([_numpy(dense, spikes[2], c) for c in counts]),
                               rtol=1e-5, atol=1e-5)
    lows = np.float32([-0.5, 0.25])
    got = jax.vmap(lambda lo: mv(spikes[1], 4, jnp.stack([lo, jnp.float32(1.5)])))(lows)
    np.testing.assert_allclose(
        got, [_numpy(_dense(seed, (m, n), prob, kind, (lo, 1.5)), spikes[1], 4) for lo in lows],
        rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("backend", TIERED)  # the reverse mode is the reference's either way
def test_grad_wrt_the_weight(kind, backend):
    (m, n, prob), seed = SHAPES[0], 8
    spikes = np.int32([1, 4, 4, 8, 0])
    mv = _mv(kind, (m, n), prob, seed, backend)
    theta = jnp.asarray(KINDS[kind], jnp.float32)
    check_grads(lambda w: mv(spikes, 4, w), (theta,), order=1, modes=("fwd", "rev"),
                atol=1e-2, rtol=1e-2)
    # the product is linear in the parameters: d<ct, y>/d theta_k is <ct, y(e_k)>
    ct = np.random.RandomState(9).standard_normal(n)
    units = np.eye(theta.size)
    want = [ct @ _numpy(_dense(seed, (m, n), prob, kind, e), spikes, 4) for e in units]
    grad = jax.grad(lambda w: jnp.vdot(jnp.asarray(ct, jnp.float32), mv(spikes, 4, w)))(theta)
    np.testing.assert_allclose(np.ravel(grad), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_matrix_form_matches_numpy_per_list(backend):
    rs = np.random.RandomState(6)
    for (m, n, prob), kind in zip(SHAPES, ("normal", "homo")):
        seed = int(rs.randint(1000))
        dense = _dense(seed, (m, n), prob, kind)
        mm = _mm(kind, (m, n), prob, seed, backend)
        spikes = rs.randint(0, m, (4, 5)).astype(np.int32)
        counts = np.array([0, 5, 2, 3], np.int32)
        want = np.stack([_numpy(dense, s, c) for s, c in zip(spikes, counts)])
        np.testing.assert_allclose(mm(spikes, counts), want, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(jax.jit(mm)(spikes, counts), want, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(mm(spikes, 2), [_numpy(dense, s, 2) for s in spikes],
                                   rtol=1e-5, atol=1e-5)
    # the gradient of the lists' products adds the gradients of each list's product
    ct = rs.standard_normal(want.shape).astype(np.float32)
    f = lambda w: jnp.vdot(ct, ops.binary_jitc_mm_spikes(w, seed, spikes, counts, shape=(m, n),
                                                         prob=prob, backend=backend))
    want = sum(ct[b] @ _numpy(_dense(seed, (m, n), prob, "homo", 1.0), spikes[b], counts[b])
               for b in range(4))
    np.testing.assert_allclose(jax.grad(f)(jnp.float32(0.3)), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", TIERED)
def test_bad_spike_lists(backend):
    (m, n, prob), kind = SHAPES[0], "homo"
    mv = _mv(kind, (m, n), prob, 1, backend)
    with pytest.raises(IndexError, match="'spike_indices' holds -1"):
        mv(np.int32([0, -1]), None)
    with pytest.raises(IndexError, match=f"'spike_indices' holds {m}"):
        mv(np.int32([m]), None)
    with pytest.raises(ValueError, match="'spike_count' must be in"):
        mv(np.int32([0]), 2)
    assert not np.isnan(mv(np.int32([0, 77]), 1)).any()  # the tail is ignored
    for s, c in ((np.int32([0, -1]), 2), (np.int32([m]), 1), (np.int32([0]), 2),
                 (np.int32([0]), -1)):
        assert np.isnan(jax.jit(mv)(s, np.int32(c))).all(), (s, c)
    mm = jax.jit(lambda s: ops.binary_jitc_mm_spikes(0.5, 1, s, np.int32([2, 1]), shape=(m, n),
                                                     prob=prob, backend=backend))
    out = mm(np.int32([[0, 1], [m, 0]]))
    assert not np.isnan(out[0]).any() and np.isnan(out[1]).all()  # a bad list: its own row


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_non_finite_weight_reaches_only_the_listed_synapses(backend):
    (m, n, prob), seed = SHAPES[0], 4
    mv = _mv("uniform", (m, n), prob, seed, backend, weight=(0.0, np.inf))
    np.testing.assert_array_equal(mv(np.int32([1]), 0), np.zeros(n))  # nothing listed
    reached = _dense(seed, (m, n), prob, "homo")[2] != 0
    got = np.asarray(mv(np.int32([2]), 1))
    assert np.isinf(got[reached]).all() and (got[~reached] == 0).all()


def test_bad_arguments_raise_at_trace_time_naming_them():
    kw = {"shape": (5, 4), "prob": 0.5}
    f = ops.binary_jitc_mv_spikes
    lst = np.int32([0, 1])
    with pytest.raises(TypeError, match="'spike_indices' must be a 1-D integer"):
        f(1.0, 0, np.float32([0.5]), **kw)
    with pytest.raises(TypeError, match="'spike_indices' must be a 2-D"):
        ops.binary_jitc_mm_spikes(1.0, 0, lst, **kw)
    with pytest.raises(TypeError, match="'spike_count' must be an integer scalar"):
        jax.jit(lambda c: f(1.0, 0, lst, c, **kw))(jnp.zeros(2, jnp.int32))
    with pytest.raises(ValueError, match="'weight' must be a pair"):
        f(1.0, 0, lst, weight_kind="uniform", **kw)
    with pytest.raises(ValueError, match="'weight_kind' must be one of"):
        f(1.0, 0, lst, weight_kind="lognormal", **kw)
    with pytest.raises(TypeError, match="'seed' must be one integer"):
        f(1.0, 0.5, lst, **kw)
    with pytest.raises(ValueError, match="'prob' must be in"):
        f(1.0, 0, lst, shape=(5, 4), prob=1.5)
    with pytest.raises(ValueError, match="'shape' must be non-negative"):
        f(1.0, 0, lst, shape=(5, -4), prob=0.5)
    with pytest.raises(ValueError, match="binary_jitc_mm_spikes: 'seed' must be a"):
        ops.binary_jitc_mm_spikes_p(jnp.ones(1), jnp.zeros(1, jnp.int32),
                                    jnp.asarray(threshold_table(0.5)),
                                    jnp.zeros((1, 1), jnp.int32), jnp.zeros(1, jnp.int32),
                                    shape=(5, 4), prob=0.5, weight_kind="homo")


def test_benchmark_data_matches_numpy_on_the_listed_rows():
    for kernel, matrix in ((ops.binary_jitc_mv_spikes_p, False),
                           (ops.binary_jitc_mm_spikes_p, True)):
        cfg = kernel._benchmark_data_fn(platform="cpu")[1]  # n = 1000, a shared weight
        weight, seed, lists, counts = cfg.args
        got = np.asarray(kernel.call(*cfg.args, **cfg.kwargs))
        lists, counts = (lists, counts) if matrix else (lists[None], np.reshape(counts, 1))
        for b, (lst, c) in enumerate(zip(lists[:2], counts)):
            rows = lst[:c]
            part = ops.jitc_todense(seed, cfg.kwargs["shape"], cfg.kwargs["prob"], weight,
                                    cfg.kwargs["weight_kind"], rows=rows)
            np.testing.assert_allclose(got.reshape(len(lists), -1)[b], part.sum(axis=0),
                                       rtol=1e-5, atol=1e-5)
