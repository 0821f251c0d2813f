"""Delayed event products (primforge.ops.delay) against a NumPy simulation of arrivals.

The reference keeps an array of arrivals by absolute step (no ring buffer, no modulo): a
spike of ``i`` at step ``t`` adds ``w_ij`` to ``arrivals[t + d_ij, j]``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from primforge.ops import (
    CSC,
    CSR,
    FixedNum,
    binary_delayed_csrmv,
    delay_buffer,
    delay_read,
    delayed_csrmv,
    delayed_matvec,
    pack_events,
)

N_PRE, N_POST, MAX_DELAY, STEPS = 13, 9, 5, 24


def _network(kind: str, seed: int = 0):
    """``(W, delays, pre, post, w, d)``: the matrix, its delays argument and, per synapse,
    source, target, weight and delay in NumPy (read from the stored arrays)."""
    rs = np.random.RandomState(seed)
    if kind.startswith("fixed"):
        per = kind.split("_")[1]
        rows, cols = (N_PRE, N_POST) if per == "pre" else (N_POST, N_PRE)
        k = 4
        idx = np.stack([rs.choice(cols, k, replace=False) for _ in range(rows)])
        weights = rs.standard_normal((rows, k)).astype(np.float32)
        W = FixedNum.from_indices(idx, weights, shape=(N_PRE, N_POST), per=per)
        delays = rs.randint(0, MAX_DELAY + 1, (rows, k)).astype(np.int32)
        r = np.repeat(np.arange(rows), k)
        c = idx.reshape(-1)
        pre, post = (r, c) if per == "pre" else (c, r)
        return W, delays, pre, post, weights.reshape(-1), delays.reshape(-1)
    dense = np.where(rs.random_sample((N_PRE, N_POST)) < 0.4,
                     rs.standard_normal((N_PRE, N_POST)), 0).astype(np.float32)
    W = (CSC if kind == "csc" else CSR).from_dense(dense)
    indptr, indices = np.asarray(W.indptr), np.asarray(W.indices)
    r = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))
    pre, post = (r, indices) if kind != "csc" else (indices, r)
    w = np.asarray(W.data)
    if kind == "csr_shared":
        W = W.with_data(jnp.float32(0.75))
        w = np.full(len(pre), 0.75, np.float32)
    if kind == "csr_one_delay":
        return W, 3, pre, post, w, np.full(len(pre), 3)
    d = rs.randint(0, MAX_DELAY + 1, len(pre)).astype(np.int32)
    return W, d, pre, post, w, d


def _reference(pre, post, w, d, inputs):
    """Input arriving at each step: ``inputs`` is ``(steps, n_pre)``."""
    arrivals = np.zeros((len(inputs) + MAX_DELAY + 1, N_POST))
    for t, x in enumerate(inputs):
        vals = (x != 0).astype(float) if x.dtype == bool else x.astype(float)
        for i, j, wk, dk in zip(pre, post, w, d):
            if vals[i] != 0:
                arrivals[t + dk, j] += wk * vals[i]
    return arrivals[:len(inputs)]


def _simulate(W, delays, inputs, backend, buffer=None):
    """Each step: add the step's input with its delays, then read the step's arrivals."""
    def step(buf, tx):
        t, x = tx
        buf = delayed_matvec(W, x, delays, buf, t, backend=backend)
        now, buf = delay_read(buf, t, backend=backend)
        return buf, now

    buf = delay_buffer(MAX_DELAY, N_POST) if buffer is None else buffer
    return jax.lax.scan(step, buf, (jnp.arange(len(inputs)), inputs))[1]


def _inputs(binary, seed=1):
    rs = np.random.RandomState(seed)
    active = rs.random_sample((STEPS, N_PRE)) < 0.3
    if binary:
        return active
    return np.where(active, rs.standard_normal((STEPS, N_PRE)), 0).astype(np.float32)


@pytest.mark.parametrize("backend", ["numba", "jax"])
@pytest.mark.parametrize("binary", [True, False], ids=["events", "floats"])
@pytest.mark.parametrize("kind", ["csr", "csc", "fixed_pre", "fixed_post", "csr_shared",
                                  "csr_one_delay"])
def test_simulation_matches_numpy_arrivals(kind, binary, backend):
    W, delays, pre, post, w, d = _network(kind)
    inputs = _inputs(binary)
    got = jax.jit(_simulate, static_argnums=3)(W, delays, jnp.asarray(inputs), backend)
    want = _reference(pre, post, w, d, inputs)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
    assert np.abs(want).sum() > 0  # the drive produced arrivals


def test_delay_zero_arrives_in_the_same_step_and_d_steps_later_otherwise():
    W = CSR.from_dense([[1.0, 2.0]])
    buf = delayed_matvec(W, jnp.array([True]), jnp.array([0, 2]), delay_buffer(2, 2), 7)
    reads = []
    for t in (7, 8, 9):
        now, buf = delay_read(buf, t)
        reads.append(now.tolist())
    assert reads == [[1.0, 0.0], [0.0, 0.0], [0.0, 2.0]]


def test_low_level_products_match_dense_reference_for_both_directions():
    W, d, pre, post, w, dd = _network("csr", seed=3)
    rs = np.random.RandomState(4)
    buf = rs.standard_normal((MAX_DELAY + 1, N_POST)).astype(np.float32)
    x = rs.standard_normal(N_PRE).astype(np.float32) * (rs.random_sample(N_PRE) < 0.5)
    want = buf.astype(float).copy()
    for i, j, wk, dk in zip(pre, post, w, dd):
        want[(5 + dk) % (MAX_DELAY + 1), j] += wk * x[i]
    args = (W.data, W.indices, W.indptr, d)
    got = delayed_csrmv(*args, x, buf, 5, shape=W.shape)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # The same synapses stored by target rows (transpose=False).
    Wt = CSR.from_dense(np.asarray(W.todense()).T)
    order = np.lexsort((pre, post))  # stored order of the transposed CSR: by target, source
    got_t = binary_delayed_csrmv(Wt.data, Wt.indices, Wt.indptr, dd[order], x != 0, buf, 5,
                                 shape=Wt.shape, transpose=False)
    want_b = buf.astype(float).copy()
    for i, j, wk, dk in zip(pre, post, w, dd):
        if x[i] != 0:
            want_b[(5 + dk) % (MAX_DELAY + 1), j] += wk
    np.testing.assert_allclose(got_t, want_b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["csr", pytest.param("csr_shared", marks=pytest.mark.exhaustive),
                                  pytest.param("fixed_post", marks=pytest.mark.exhaustive)])
def test_gradients_through_a_scan_match_finite_differences(kind):
    W, delays, *_ = _network(kind, seed=5)
    inputs = jnp.asarray(_inputs(False, seed=6)[:MAX_DELAY + 2])
    coef = jnp.asarray(np.random.RandomState(7).standard_normal((len(inputs), N_POST)),
                       jnp.float32)
    is_fixed = isinstance(W, FixedNum)
    weights = W.weights if is_fixed else W.data

    def loss(weights, inputs, buf0):
        return jnp.sum(coef * _simulate(W.with_data(weights), delays, inputs, "numba", buf0))

    buf0 = jnp.asarray(np.random.RandomState(8).standard_normal((MAX_DELAY + 1, N_POST)),
                       jnp.float32)
    check_grads(jax.jit(loss), (weights, inputs, buf0), order=1, modes=["fwd", "rev"], atol=2e-2,
                rtol=2e-2)


def test_binary_weight_gradient_is_the_sum_of_cotangents_at_arrival():
    W, delays, pre, post, _w, d = _network("csr", seed=9)
    spikes = _inputs(True, seed=10)[:6]
    ct = np.random.RandomState(11).standard_normal((6, N_POST)).astype(np.float32)

    def loss(data):
        return jnp.sum(ct * _simulate(W.with_data(data), delays, jnp.asarray(spikes), "numba"))

    want = np.zeros(len(pre))
    for t, x in enumerate(spikes):
        for k in range(len(pre)):
            if x[pre[k]] and t + d[k] < 6:
                want[k] += ct[t + d[k], post[k]]
    np.testing.assert_allclose(jax.grad(loss)(W.data), want, rtol=1e-5, atol=1e-5)


def test_vmap_over_events_and_over_weights():
    W, delays, pre, post, w, d = _network("csr", seed=12)
    batch = np.stack([_inputs(True, seed=s)[:8] for s in (13, 14, 15)])
    got = jax.vmap(lambda x: _simulate(W, delays, x, "numba"))(jnp.asarray(batch))
    for b in range(3):
        np.testing.assert_allclose(got[b], _reference(pre, post, w, d, batch[b]), atol=1e-5)
    scales = jnp.array([0.5, 2.0])
    got_w = jax.vmap(lambda s: _simulate(W.with_data(W.data * s), delays,
                                         jnp.asarray(batch[0]), "numba"))(scales)
    for b, s in enumerate((0.5, 2.0)):
        np.testing.assert_allclose(got_w[b], _reference(pre, post, w * s, d, batch[0]),
                                   rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- bad input
def test_bad_delays_are_refused_naming_the_argument():
    W = CSR.from_dense([[1.0, 2.0], [0.0, 3.0]])
    x, buf = jnp.array([True, True]), delay_buffer(2, 2)
    with pytest.raises(ValueError, match="'delays' holds -1, outside"):
        delayed_matvec(W, x, np.array([0, -1, 1]), buf, 0)
    with pytest.raises(ValueError, match=r"'delays' holds 3, outside \[0, D\) = \[0, 3\)"):
        delayed_matvec(W, x, np.array([0, 3, 1]), buf, 0)
    with pytest.raises(ValueError, match="'delays' holds 3"):
        delayed_matvec(W, x, 3, buf, 0)
    with pytest.raises(ValueError, match=r"'delays' must be one integer or hold one delay per "
                                         r"synapse, shape \(3,\), got \(2,\)"):
        delayed_matvec(W, x, np.array([0, 1]), buf, 0)
    with pytest.raises(TypeError, match="'delays' must be integers"):
        delayed_matvec(W, x, np.array([0.0, 1.0, 1.0]), buf, 0)
    with pytest.raises(TypeError, match="'delays' must be integers"):
        delayed_matvec(W, x, 1.5, buf, 0)
    with pytest.raises(TypeError, match="'t' must be an integer scalar"):
        delayed_matvec(W, x, np.array([0, 1, 1]), buf, 0.5)
    with pytest.raises(ValueError, match=r"'buffer' must have shape \(D, 2\)"):
        delayed_matvec(W, x, np.array([0, 1, 1]), delay_buffer(2, 3), 0)
    with pytest.raises(ValueError, match=r"'x' must have shape \(2,\)"):
        delayed_matvec(W, jnp.ones(3, bool), np.array([0, 1, 1]), buf, 0)
    with pytest.raises(TypeError, match="'W' must be a CSR, CSC or FixedNum"):
        delayed_matvec(np.eye(2), x, 0, buf, 0)
    with pytest.raises(ValueError, match="'buffer' must be a \\(D, n_post\\) array"):
        delay_read(jnp.zeros(3), 0)
    with pytest.raises(ValueError, match="'max_delay' and 'n_post' must be non-negative"):
        delay_buffer(-1, 3)


def test_delays_captured_by_a_jitted_function_are_checked_on_the_host():
    W = CSR.from_dense([[1.0, 2.0], [0.0, 3.0]])
    good, bad = jnp.array([0, 2, 1]), jnp.array([0, 3, 1])
    f = jax.jit(lambda x: delayed_matvec(W, x, good, delay_buffer(2, 2), 1))
    np.testing.assert_allclose(f(jnp.array([True, False])), [[0, 2], [1, 0], [0, 0]])
    with pytest.raises(ValueError, match="'delays' holds 3"):
        jax.jit(lambda x: delayed_matvec(W, x, bad, delay_buffer(2, 2), 1))(jnp.ones(2, bool))


@pytest.mark.parametrize("backend", ["numba", "jax"])
def test_traced_delays_outside_the_buffer_fill_it_with_nan(backend):
    W = CSR.from_dense([[1.0, 2.0], [0.0, 3.0]])
    buf = delay_buffer(2, 2)

    @jax.jit
    def f(delays, x):
        return delayed_matvec(W, x, delays, buf, 0, backend=backend)

    assert np.isnan(f(jnp.array([0, 5, 1]), jnp.array([True, False]))).all()
    assert np.isnan(f(jnp.array([0, 1, -1]), jnp.array([False, True]))).all()
    # A bad delay of a synapse no event visits is never read.
    np.testing.assert_allclose(f(jnp.array([0, 1, -1]), jnp.array([True, False])),
                               [[1.0, 0.0], [0.0, 2.0], [0.0, 0.0]])


@pytest.mark.exhaustive
def test_cli_check_passes_for_the_delay_kernels(capsys, monkeypatch):
    """``primforge check`` end to end on one operator family: the benchmark cases agree
    between the numba and jax backends (tests/test_ops_bench.py runs the same comparison
    for the other families)."""
    from primforge.cli import main

    monkeypatch.delenv("PRIMFORGE_AUTOTUNE", raising=False)
    code = main(["check", "--tags", "delay", "--platform", "cpu"])
    out = capsys.readouterr().out
    assert code == 0, out
    # Two kernels: the delayed products (every form of the operator) and the read.
    assert "PASS  primforge.ops.delayed:" in out and "PASS  primforge.ops.delay_read:" in out, out
    assert "2 of 2 kernel(s) passed on cpu" in out, out


def test_a_simulation_step_updates_the_buffer_in_place():
    """No copy of the ring buffer in the compiled loop: the product and the read each write
    into it (a slice-and-update read after the product's call made XLA copy it per step)."""
    W, delays, *_ = _network("csr", seed=16)
    inputs = jnp.asarray(_inputs(True, seed=17))
    hlo = jax.jit(_simulate, static_argnums=3).lower(W, delays, inputs, "numba").compile()
    shape = f"f32[{MAX_DELAY + 1},{N_POST}]"
    copies = [line for line in hlo.as_text().splitlines()
              if f"= {shape}" in line and " copy(" in line]
    assert len(copies) <= 1, copies  # at most the initial buffer's, outside the loop


@pytest.mark.parametrize("backend", ["numba", "jax"])
def test_degenerate_sizes_and_event_types(backend):
    W = CSR.from_dense(np.array([[1.0, 2.0], [0.0, 3.0]], np.float32))
    empty = CSR.from_dense(np.zeros((3, 4), np.float32))
    got = delayed_matvec(empty, jnp.ones(3, bool), np.zeros(0, np.int32), delay_buffer(2, 4), 1,
                         backend=backend)
    np.testing.assert_array_equal(got, np.zeros((3, 4)))
    # One row (every delay 0), int8 events: the step's row gets everything.
    got = delayed_matvec(W, jnp.array([1, 1], jnp.int8), np.zeros(3, np.int32),
                         delay_buffer(0, 2), 5, backend=backend)
    np.testing.assert_array_equal(got, [[1.0, 5.0]])
    packed = pack_events(jnp.array([True, True]))
    got = delayed_matvec(W, packed, np.array([0, 1, 1], np.int32), delay_buffer(1, 2), 0,
                         backend=backend)
    np.testing.assert_array_equal(got, [[1.0, 0.0], [0.0, 5.0]])


@pytest.mark.parametrize("dtype", ["bool", "int8", "int16", "float32", "float64"])
def test_every_event_is_found_whatever_its_dtype_and_place(dtype):
    # The kernel finds the sources that fired a word (8 bytes) at a time: events on both
    # sides of every word boundary, in the tail past the last whole word, -0.0 (zero bits
    # set) and NaN (no zero bits) must each count exactly as one by one.
    rs = np.random.RandomState(7)
    for n_pre in (1, 3, 8, 9, 15, 17, 33):
        dense = np.where(rs.random_sample((n_pre, 5)) < 0.6,
                         rs.uniform(0.5, 1.5, (n_pre, 5)), 0).astype(np.float32)
        W = CSR.from_dense(dense)
        d = rs.randint(0, 3, int(W.nnz)).astype(np.int32)
        indptr, indices = np.asarray(W.indptr), np.asarray(W.indices)
        pre = np.repeat(np.arange(n_pre), np.diff(indptr))
        for active in ([0], [n_pre - 1], list(range(0, n_pre, 7)), list(range(n_pre))):
            x = np.zeros(n_pre, dtype)
            x[active] = 1
            if dtype.startswith("float") and n_pre > 2:
                x[1] = -0.0  # zero, though not all bits are
                x[n_pre // 2] = np.nan if n_pre // 2 not in active else x[n_pre // 2]
            got = np.asarray(delayed_matvec(W, jnp.asarray(x), d, delay_buffer(2, 5), 1))
            want = np.zeros((3, 5))
            vals = x.astype(float)
            for i, j, wk, dk in zip(pre, indices, np.asarray(W.data), d, strict=True):
                if vals[i] != 0:
                    want[(1 + dk) % 3, j] += wk * (1.0 if dtype in ("bool", "int8", "int16")
                                                   else vals[i])
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6,
                                       err_msg=f"{n_pre} sources, active {active}")
