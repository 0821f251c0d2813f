"""Delayed event products through a just-in-time matrix (``binary_delayed_jitc_matvec``).

References: the dense weights of ``jitc_todense`` and the dense delays of
``jitc_delays_todense`` driven through a NumPy ring buffer.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from primforge import ops

SEED, SHAPE, PROB, RANGE = 5, (24, 32), 0.2, (1, 4)
DEPTH = RANGE[1] + 1
WEIGHTS = {"homo": 0.5, "uniform": (0.25, 1.5), "normal": (0.5, 1.0)}


def _np_deliver(buf, w, d, ev, t, transpose):
    """Add the active synapses' weights into ``buf`` (float64, in place)."""
    for i, j in zip(*np.nonzero(d >= 0), strict=True):
        if ev[i] if transpose else ev[j]:
            buf[(t + d[i, j]) % buf.shape[0], j if transpose else i] += w[i, j]


def _call(ev, buf, t, *, transpose, kind, backend, weight=None):
    return ops.binary_delayed_jitc_matvec(
        WEIGHTS[kind] if weight is None else weight, SEED, ev, buf, t, shape=SHAPE, prob=PROB,
        delay_range=RANGE, transpose=transpose, weight_kind=kind, backend=backend)


@pytest.mark.parametrize("backend,transpose,kind", [
    ("numba", True, "uniform"), ("jax", True, "normal"),
    ("numba", False, "homo"), ("jax", False, "normal")])
def test_simulation_matches_a_numpy_ring_buffer(backend, transpose, kind):
    w = ops.jitc_todense(SEED, SHAPE, PROB, WEIGHTS[kind], kind)
    d = ops.jitc_delays_todense(SEED, SHAPE, PROB, RANGE)
    n_src, n_dst = SHAPE if transpose else SHAPE[::-1]
    spikes = np.random.default_rng(1).random((20, n_src)) < 0.3

    @jax.jit
    def step(buf, t, ev):
        buf = _call(ev, buf, t, transpose=transpose, kind=kind, backend=backend)
        return ops.delay_read(buf, t)

    buf, ref = ops.delay_buffer(RANGE[1], n_dst), np.zeros((DEPTH, n_dst))
    for t in range(20):
        now, buf = step(buf, jnp.int32(t), spikes[t])
        _np_deliver(ref, w, d, spikes[t], t, transpose)
        want = ref[t % DEPTH].copy()
        ref[t % DEPTH] = 0
        np.testing.assert_allclose(np.asarray(now), want, rtol=1e-5, atol=1e-5,
                                   err_msg=f"step {t}")
    assert np.abs(ref).sum() > 0  # input still in flight: the delays reach past the end


@pytest.mark.parametrize("transpose,kind", [(True, "uniform"), (False, "homo")])
def test_numba_and_jax_agree(transpose, kind):
    n_src, n_dst = SHAPE if transpose else SHAPE[::-1]
    ev = np.random.default_rng(2).random(n_src) < 0.4
    buf = np.zeros((DEPTH, n_dst), np.float32)
    got = {b: np.asarray(_call(ev, buf, 3, transpose=transpose, kind=kind, backend=b))
           for b in ("numba", "jax")}
    if kind == "homo":  # sums of 0.5: exact on both
        np.testing.assert_array_equal(got["numba"], got["jax"])
    else:
        np.testing.assert_allclose(got["numba"], got["jax"], rtol=1e-6, atol=1e-6)
    assert np.count_nonzero(got["jax"]) > 10


def test_same_synapses_and_weights_as_the_undelayed_product():
    # Summed over the buffer's rows, the delayed product is binary_jitc_matvec.
    ev = np.random.default_rng(3).random(SHAPE[0]) < 0.5
    buf = np.zeros((DEPTH, SHAPE[1]), np.float32)
    got = _call(ev, buf, 2, transpose=True, kind="uniform", backend="numba").sum(0)
    want = ops.binary_jitc_matvec(WEIGHTS["uniform"], SEED, ev, shape=SHAPE, prob=PROB,
                                  transpose=True, weight_kind="uniform")
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    d = ops.jitc_delays_todense(SEED, SHAPE, PROB, RANGE)
    np.testing.assert_array_equal(d >= 0, ops.jitc_todense(SEED, SHAPE, PROB) != 0)


def test_delays_cover_the_range_uniformly():
    lo, hi = 2, 9
    d = ops.jitc_delays_todense(11, (300, 300), 0.1, (lo, hi))
    d = d[d >= 0]
    counts = np.bincount(d - lo, minlength=hi - lo + 1)
    assert d.min() == lo and d.max() == hi and counts.size == hi - lo + 1
    expected = d.size / counts.size
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < 40, (chi2, counts)  # 7 degrees of freedom: P(chi2 > 40) ~ 1e-6
    # Other seeds give other delays of the same synapses' range.
    other = ops.jitc_delays_todense(12, (300, 300), 0.1, (lo, hi))
    assert not np.array_equal(other[:20], ops.jitc_delays_todense(11, (300, 300), 0.1,
                                                                   (lo, hi))[:20])


@pytest.mark.parametrize("backend", ["numba", "jax"])
def test_vmap_over_events_and_buffers(backend):
    rs = np.random.default_rng(4)
    evs = rs.random((3, SHAPE[0])) < 0.3
    bufs = rs.standard_normal((3, DEPTH, SHAPE[1])).astype(np.float32)
    f = jax.jit(jax.vmap(lambda e, b: _call(e, b, 7, transpose=True, kind="uniform",
                                            backend=backend)))
    got = f(evs, bufs)
    for k in range(3):
        want = _call(evs[k], bufs[k], 7, transpose=True, kind="uniform", backend=backend)
        np.testing.assert_allclose(got[k], want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("backend", ["numba", "jax"])
def test_grad_wrt_the_weights_and_buffer(backend):
    ev = np.random.default_rng(5).random(SHAPE[0]) < 0.5
    c = np.random.default_rng(6).standard_normal((DEPTH, SHAPE[1])).astype(np.float32)
    buf = jnp.zeros((DEPTH, SHAPE[1]))

    def loss(theta, b):
        return jnp.sum(c * _call(ev, b, 4, transpose=True, kind="uniform", backend=backend,
                                 weight=theta))

    g_theta, g_buf = jax.grad(loss, argnums=(0, 1))(jnp.array([0.25, 1.5]), buf)
    # W = low * (1 - U) + high * U: each parameter's coefficient matrix, as a dense weight.
    d = ops.jitc_delays_todense(SEED, SHAPE, PROB, RANGE)
    want = []
    for unit in ((1.0, 0.0), (0.0, 1.0)):
        coef = ops.jitc_todense(SEED, SHAPE, PROB, unit, "uniform")
        acc = np.zeros((DEPTH, SHAPE[1]))
        _np_deliver(acc, coef, d, ev, 4, True)
        want.append((c * acc).sum())
    np.testing.assert_allclose(g_theta, want, rtol=1e-4)
    np.testing.assert_array_equal(g_buf, c)


@pytest.mark.parametrize("delay_range,match", [
    ((-1, 3), "0 <= dmin <= dmax"), ((3, 2), "0 <= dmin <= dmax"),
    ((1, DEPTH), "below the buffer's depth"), ((1.0, 3), "pair of ints"),
    (3, "pair of ints")])
def test_bad_delay_range_is_named(delay_range, match):
    ev = np.ones(SHAPE[0], bool)
    err = TypeError if "pair" in match else ValueError
    with pytest.raises(err, match=f"binary_delayed_jitc_matvec: 'delay_range'.*{match}"):
        ops.binary_delayed_jitc_matvec(0.5, SEED, ev, ops.delay_buffer(RANGE[1], SHAPE[1]), 0,
                                       shape=SHAPE, prob=PROB, delay_range=delay_range)
    if err is ValueError and delay_range[1] < DEPTH:
        with pytest.raises(ValueError, match="jitc_delays_todense: 'delay_range'"):
            ops.jitc_delays_todense(SEED, SHAPE, PROB, delay_range)


def test_traced_seed_step_and_numeric_events():
    ev = (np.random.default_rng(7).random(SHAPE[0]) < 0.5).astype(np.int8)
    buf = np.zeros((DEPTH, SHAPE[1]), np.float32)

    @jax.jit
    def f(seed, t):
        return ops.binary_delayed_jitc_matvec(
            WEIGHTS["uniform"], seed, ev, buf, t, shape=SHAPE, prob=PROB, delay_range=RANGE,
            weight_kind="uniform")

    got = f(jnp.uint32(SEED), jnp.int32(DEPTH + 2))  # step D + 2: row 2 of the buffer
    want = _call(ev != 0, buf, 2, transpose=True, kind="uniform", backend="numba")
    np.testing.assert_array_equal(got, want)
    assert not np.array_equal(f(jnp.uint32(SEED + 1), jnp.int32(2)), want)


def test_the_gpu_default_lowers_for_cuda():
    """On a GPU the jax reference runs (no custom call); it lowers for CUDA here."""
    def f(e, b, t):
        return ops.binary_delayed_jitc_matvec(WEIGHTS["uniform"], SEED, e, b, t, shape=SHAPE,
                                              prob=PROB, delay_range=RANGE,
                                              weight_kind="uniform")

    args = (jnp.zeros(SHAPE[0], bool), jnp.zeros((DEPTH, SHAPE[1])), jnp.int32(0))
    text = jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    assert "while" in text and "custom_call" not in text
