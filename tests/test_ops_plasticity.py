"""Plasticity updates against a NumPy loop over the dense matrix, for every storage format.

Covered: CSR, CSC, FixedNum (per='pre' and 'post', with masked slots) and dense weights x
pre/post updates x bool/float events x no/one/both bounds x float32/float64 x the jax and
numba backends; jit, vmap (one batched call), grad/jvp (finite differences), malformed
structure (NaN, never out of bounds), bad arguments; a pair-based STDP run under lax.scan.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _jaxpr import eqn_names
from jax.test_util import check_grads

from primforge import ops

BACKENDS = ["jax", "numba"]
BOUNDS = [(None, None), (None, 0.6), (0.05, 0.55)]  # lower-only: the dtype and grad tests


def numpy_update(dense, mask, spikes, trace, *, pre, lo, hi):
    """The independent reference: a loop over the stored synapses of the dense matrix."""
    out = dense.copy()
    m, n = dense.shape
    for i, j in itertools.product(range(m), range(n)):
        if not mask[i, j]:
            continue
        fires = spikes[i] if pre else spikes[j]
        if fires:
            w = out[i, j] + (trace[j] if pre else trace[i])
            if lo is not None and w < lo:
                w = lo
            if hi is not None and w > hi:
                w = hi
            out[i, j] = w
    return out


def random_case(seed, m=13, n=11, dtype=np.float32, p=0.35, float_events=False):
    rs = np.random.RandomState(seed)
    mask = rs.random_sample((m, n)) < p
    dense = np.where(mask, rs.random_sample((m, n)) * 0.6, 0).astype(dtype)
    pre = rs.random_sample(m) < 0.4
    post = rs.random_sample(n) < 0.4
    if float_events:
        pre = np.where(pre, rs.random_sample(m) + 0.5, 0).astype(dtype)
        post = np.where(post, rs.random_sample(n) + 0.5, 0).astype(dtype)
    pre_trace = (rs.standard_normal(m) * 0.2).astype(dtype)
    post_trace = (rs.standard_normal(n) * 0.2).astype(dtype)
    return mask, dense, pre, post, pre_trace, post_trace


def as_format(fmt, dense, mask):
    if fmt == "csr":
        return ops.CSR.from_dense(dense)
    if fmt == "csc":
        return ops.CSC.from_dense(dense)
    return jnp.asarray(dense)


def to_dense(W):
    return np.asarray(W if isinstance(W, jax.Array) else W.todense())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt", ["csr", "csc", "dense"])
@pytest.mark.parametrize("pre", [True, False], ids=["on_pre", "on_post"])
@pytest.mark.parametrize("bounds", BOUNDS, ids=lambda b: f"{b[0]}-{b[1]}")
def test_matches_numpy(backend, fmt, pre, bounds):
    mask, dense, pre_s, post_s, pre_t, post_t = random_case(1)
    # from_dense stores the non-zeros; a dense matrix has every synapse
    mask = np.ones(dense.shape, bool) if fmt == "dense" else dense != 0
    W = as_format(fmt, dense, mask)
    lo, hi = bounds
    spikes, trace = (pre_s, post_t) if pre else (post_s, pre_t)
    fn = ops.update_on_pre if pre else ops.update_on_post
    got = fn(W, spikes, trace, w_min=lo, w_max=hi, backend=backend)
    assert type(got) is type(W)
    want = numpy_update(dense, mask, spikes, trace, pre=pre, lo=lo, hi=hi)
    np.testing.assert_array_equal(to_dense(got), want)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("float_events", [False, True])
def test_dtypes_events_and_shapes(backend, dtype, float_events):
    seed = 2 + float_events + 2 * (dtype == np.float64)  # a random shape per case
    rs = np.random.RandomState(seed)
    m, n = rs.randint(1, 30, size=2)
    with jax.enable_x64(dtype == np.float64):
        mask, dense, pre_s, post_s, pre_t, post_t = random_case(
            seed, m, n, dtype=dtype, float_events=float_events)
        mask = dense != 0
        for fmt, pre in itertools.product(("csr", "csc", "dense"), (True, False)):
            mask = np.ones(dense.shape, bool) if fmt == "dense" else dense != 0
            W = as_format(fmt, dense, mask)
            spikes, trace = (pre_s, post_t) if pre else (post_s, pre_t)
            fn = ops.update_on_pre if pre else ops.update_on_post
            got = fn(W, spikes, trace, w_min=0.0, w_max=0.5, backend=backend)
            assert to_dense(got).dtype == dtype
            want = numpy_update(dense, mask, spikes != 0, trace, pre=pre, lo=0.0, hi=0.5)
            np.testing.assert_array_equal(to_dense(got), want, err_msg=f"{fmt} pre={pre}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("per", ["pre", "post"])
@pytest.mark.parametrize("pre", [True, False], ids=["on_pre", "on_post"])
def test_fixed_num_with_masked_slots(backend, per, pre):
    rs = np.random.RandomState(4)
    n_pre, n_post, k = 9, 7, 3
    rows, cols = (n_pre, n_post) if per == "pre" else (n_post, n_pre)
    # distinct partners per row, some slots masked with an out-of-range index
    ind = np.stack([rs.choice(cols, k, replace=False) for _ in range(rows)]).astype(np.int32)
    ind[rs.random_sample(ind.shape) < 0.2] = cols + 3
    weights = rs.random_sample((rows, k)).astype(np.float32)
    W = ops.FixedNum(jnp.asarray(weights), jnp.asarray(ind), shape=(n_pre, n_post), per=per)
    pre_s, post_s = rs.random_sample(n_pre) < 0.5, rs.random_sample(n_post) < 0.5
    pre_t = rs.standard_normal(n_pre).astype(np.float32)
    post_t = rs.standard_normal(n_post).astype(np.float32)
    spikes, trace = (pre_s, post_t) if pre else (post_s, pre_t)
    fn = ops.update_on_pre if pre else ops.update_on_post
    got = fn(W, spikes, trace, w_max=0.9, backend=backend)
    assert isinstance(got, ops.FixedNum) and got.per == per
    want = weights.copy()  # the update slot by slot, in storage order
    for r, s in itertools.product(range(rows), range(k)):
        c = ind[r, s]
        if c >= cols:
            continue
        i, j = (r, c) if per == "pre" else (c, r)
        if (pre_s[i] if pre else post_s[j]):
            want[r, s] = min(want[r, s] + (post_t[j] if pre else pre_t[i]), np.float32(0.9))
    np.testing.assert_array_equal(np.asarray(got.weights), want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_jit_and_vmap_one_batched_call(backend):
    dense = random_case(5)[1]
    mask = dense != 0
    W = ops.CSR.from_dense(dense)
    rs = np.random.RandomState(6)
    spikes = rs.random_sample((4, dense.shape[0])) < 0.5
    traces = rs.standard_normal((4, dense.shape[1])).astype(np.float32)

    def step(data, s, t):
        return ops.update_on_pre(W.with_data(data), s, t, w_min=0.0, backend=backend).data

    batched = jax.jit(jax.vmap(step, in_axes=(None, 0, 0)))
    got = batched(W.data, spikes, traces)
    for b in range(4):
        want = numpy_update(dense, mask, spikes[b], traces[b], pre=True, lo=0.0, hi=None)
        np.testing.assert_array_equal(np.asarray(ops.CSR(got[b], W.indices, W.indptr,
                                                         shape=W.shape).todense()), want)
    jaxpr = jax.make_jaxpr(jax.vmap(step, in_axes=(None, 0, 0)))(W.data, spikes, traces)
    names = eqn_names(jaxpr.jaxpr)
    assert names.count("primforge.ops.compressed_update") == 1
    assert "scan" not in names and "while" not in names


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt", ["csr", "dense"])
@pytest.mark.parametrize("pre", [True, False], ids=["on_pre", "on_post"])
def test_grad_and_jvp_by_finite_differences(backend, fmt, pre):
    rs = np.random.RandomState(7)
    m, n = 6, 5
    mask = rs.random_sample((m, n)) < 0.6
    dense = np.where(mask, 0.3 + 0.2 * rs.random_sample((m, n)), 0).astype(np.float64)
    spikes = (rs.random_sample(m if pre else n) < 0.6)
    trace = (0.05 * rs.standard_normal(n if pre else m)).astype(np.float64)
    fn = ops.update_on_pre if pre else ops.update_on_post
    with jax.enable_x64():
        if fmt == "csr":
            W = ops.CSR.from_dense(dense)

            def f(w, t):
                return fn(W.with_data(w), spikes, t, w_min=0.0, w_max=1.0, backend=backend).data

            w0 = W.data
        else:
            def f(w, t):
                return fn(w, spikes, t, w_min=0.0, w_max=1.0, backend=backend)

            w0 = jnp.asarray(dense)
        check_grads(f, (w0, jnp.asarray(trace)), order=1, modes=("fwd", "rev"), eps=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
def test_clipped_synapses_have_zero_derivative(backend):
    W = ops.CSR.from_dense(np.array([[0.9, 0.2]], np.float32))
    spikes = jnp.array([True])
    g_trace = jax.grad(lambda t: ops.update_on_pre(W, spikes, t, w_max=1.0,
                                                   backend=backend).data.sum())
    # 0.9 + 0.5 is clipped to 1.0 (no derivative), 0.2 + 0.5 is not
    np.testing.assert_array_equal(np.asarray(g_trace(jnp.array([0.5, 0.5]))), [0.0, 1.0])
    g_w = jax.grad(lambda w: ops.update_on_pre(W.with_data(w), spikes, jnp.array([0.5, 0.5]),
                                               w_max=1.0, backend=backend).data.sum())
    np.testing.assert_array_equal(np.asarray(g_w(W.data)), [0.0, 1.0])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("pre", [True, False], ids=["on_pre", "on_post"])
def test_malformed_structure_gives_nan(backend, pre):
    data = jnp.array([0.1, 0.2, 0.3], jnp.float32)
    good_idx, good_ptr = jnp.array([0, 1, 1]), jnp.array([0, 2, 3])
    bad_cases = {
        "index_out_of_range": (jnp.array([0, 9, 1]), good_ptr),
        "negative_index": (jnp.array([0, -1, 1]), good_ptr),
        "indptr_past_nnz": (good_idx, jnp.array([0, 2, 7])),
        "indptr_decreasing": (good_idx, jnp.array([0, 3, 2])),
    }
    spikes = jnp.array([True, True])
    trace = jnp.array([1.0, 1.0])
    for name, (idx, ptr) in bad_cases.items():
        W = ops.CSR._unchecked(data, idx, ptr, (2, 2))
        fn = ops.update_on_pre if pre else ops.update_on_post
        got = jax.jit(lambda W, fn=fn: fn(W, spikes, trace, backend=backend).data)(W)
        assert np.isnan(np.asarray(got)).all(), name


def test_bad_arguments_are_named():
    W = ops.CSR.from_dense(np.eye(3, dtype=np.float32))
    with pytest.raises(ValueError, match="'pre_spikes' must be a vector"):
        ops.update_on_pre(W, jnp.ones((3, 1), bool), jnp.zeros(3))
    with pytest.raises(ValueError, match=r"'spikes' must have shape \(3,\)"):
        ops.update_on_pre(W, jnp.ones(4, bool), jnp.zeros(3))
    with pytest.raises(ValueError, match=r"'trace' must have shape \(3,\)"):
        ops.update_on_post(W, jnp.ones(3, bool), jnp.zeros(2))
    with pytest.raises(ValueError, match="one weight per synapse"):
        ops.update_on_pre(W.with_data(1.0), jnp.ones(3, bool), jnp.zeros(3))
    with pytest.raises(ValueError, match="w_min .* must not exceed w_max"):
        ops.update_on_pre(W, jnp.ones(3, bool), jnp.zeros(3), w_min=1.0, w_max=0.0)
    with pytest.raises(TypeError, match="'w_max' must be a Python number"):
        ops.update_on_pre(W, jnp.ones(3, bool), jnp.zeros(3), w_max="high")
    with pytest.raises(TypeError, match="W must be a CSR, CSC, FixedNum or a float dense"):
        ops.update_on_pre(jnp.ones((3, 3), jnp.int32), jnp.ones(3, bool), jnp.zeros(3))


@pytest.mark.parametrize("backend", BACKENDS)
def test_pair_stdp_under_scan_matches_numpy(backend):
    """Pair-based STDP with exponential traces, 40 steps, against a NumPy simulation."""
    rs = np.random.RandomState(8)
    n_pre, n_post, steps = 20, 15, 40
    mask = rs.random_sample((n_pre, n_post)) < 0.3
    dense = np.where(mask, 0.5, 0).astype(np.float32)
    pre_spk = rs.random_sample((steps, n_pre)) < 0.1
    post_spk = rs.random_sample((steps, n_post)) < 0.1
    decay, a_plus, a_minus = np.float32(0.9), np.float32(0.01), np.float32(-0.012)
    W0 = ops.CSR.from_dense(dense)

    def body(carry, spk):
        data, x_pre, x_post = carry
        s_pre, s_post = spk
        x_pre = x_pre * decay + s_pre
        x_post = x_post * decay + s_post
        W = W0.with_data(data)
        W = ops.update_on_pre(W, s_pre, a_plus * x_post, w_min=0.0, w_max=1.0, backend=backend)
        W = ops.update_on_post(W, s_post, a_minus * x_pre, w_min=0.0, w_max=1.0,
                               backend=backend)
        return (W.data, x_pre, x_post), None

    init = (W0.data, jnp.zeros(n_pre), jnp.zeros(n_post))
    (data, _, _), _ = jax.lax.scan(body, init, (pre_spk, post_spk))
    got = np.asarray(W0.with_data(data).todense())

    w, x_pre, x_post = dense.copy(), np.zeros(n_pre, np.float32), np.zeros(n_post, np.float32)
    for t in range(steps):
        x_pre = x_pre * decay + pre_spk[t]
        x_post = x_post * decay + post_spk[t]
        w = numpy_update(w, mask, pre_spk[t], a_plus * x_post, pre=True, lo=0.0, hi=1.0)
        w = numpy_update(w, mask, post_spk[t], a_minus * x_pre, pre=False, lo=0.0, hi=1.0)
    np.testing.assert_allclose(got, w, rtol=0, atol=1e-6)
    assert not np.array_equal(got, dense)  # the run did change weights


@pytest.mark.parametrize("fmt", ["csr", "csc"])
@pytest.mark.parametrize("pre", [True, False], ids=["on_pre", "on_post"])
def test_pallas_interpreted_matches_numpy(fmt, pre):
    """The Pallas kernel body (interpreted on the CPU) for compressed storage."""
    mask, dense, pre_s, post_s, pre_t, post_t = random_case(9, m=21, n=17, p=0.5)
    mask = dense != 0
    W = as_format(fmt, dense, mask)
    spikes, trace = (pre_s, post_t) if pre else (post_s, pre_t)
    fn = ops.update_on_pre if pre else ops.update_on_post
    for lo, hi in [(None, None), (0.05, 0.55)]:
        got = fn(W, spikes, trace, w_min=lo, w_max=hi, backend="pallas")
        want = numpy_update(dense, mask, spikes, trace, pre=pre, lo=lo, hi=hi)
        np.testing.assert_array_equal(to_dense(got), want)


def test_pallas_interpreted_masked_slots_and_bad_structure():
    ind = jnp.array([[0, 9], [1, 0]], jnp.int32)  # slot (0, 1) is masked
    W = ops.FixedNum(jnp.array([[0.1, 0.2], [0.3, 0.4]]), ind, shape=(2, 2))
    got = ops.update_on_pre(W, jnp.array([True, True]), jnp.array([1.0, 2.0]),
                            backend="pallas")
    np.testing.assert_allclose(np.asarray(got.weights), [[1.1, 0.2], [2.3, 1.4]], rtol=1e-6)
    bad = ops.CSR._unchecked(jnp.array([0.1, 0.2]), jnp.array([0, 5]), jnp.array([0, 1, 2]),
                             (2, 2))
    for fn in (ops.update_on_pre, ops.update_on_post):
        out = fn(bad, jnp.array([True, True]), jnp.array([1.0, 1.0]), backend="pallas")
        assert np.isnan(np.asarray(out.data)).all()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n_spikes", [0, 1, 2, 30, 70])
def test_column_updates_at_every_spike_count(backend, n_spikes):
    """The column-side updates (CSR on_post, CSC on_pre, FixedNum on its partners' side)
    with few spiking columns (copy, then a scan) and many (one fused pass), against NumPy;
    masked FixedNum slots stay unchanged and a bad column index poisons both paths."""
    rs = np.random.RandomState(11 + n_spikes)
    m, n = 23, 70
    mask = rs.random_sample((m, n)) < 0.3
    mask[5] = False  # an empty row
    dense = np.where(mask, rs.random_sample((m, n)) * 0.6, 0).astype(np.float32)
    spikes = np.zeros(n, bool)
    spikes[rs.choice(n, n_spikes, replace=False)] = True
    trace = (rs.standard_normal(m) * 0.2).astype(np.float32)
    want = numpy_update(dense, mask, spikes, trace, pre=False, lo=0.05, hi=0.55)
    got = ops.update_on_post(ops.CSR.from_dense(dense), spikes, trace, w_min=0.05,
                             w_max=0.55, backend=backend)
    np.testing.assert_array_equal(to_dense(got), want)
    got = ops.update_on_pre(ops.CSC.from_dense(dense.T), spikes, trace, w_min=0.05,
                            w_max=0.55, backend=backend)
    np.testing.assert_array_equal(to_dense(got), want.T)
    # FixedNum, rows presynaptic: on_post updates its partners' side; masked slots.
    k = 6
    ind = np.stack([rs.choice(n, k, replace=False) for _ in range(m)]).astype(np.int32)
    ind[rs.random_sample(ind.shape) < 0.2] = n + 4
    ind[3, 0] = -2
    w = rs.random_sample((m, k)).astype(np.float32)
    F = ops.FixedNum(jnp.asarray(w), jnp.asarray(ind), shape=(m, n), per="pre")
    got = np.asarray(ops.update_on_post(F, spikes, trace, w_max=0.9, backend=backend).weights)
    want_f = w.copy()
    for r, s in itertools.product(range(m), range(k)):
        c = ind[r, s]
        if 0 <= c < n and spikes[c]:
            want_f[r, s] = min(want_f[r, s] + trace[r], np.float32(0.9))
    np.testing.assert_array_equal(got, want_f)
    # A bad column index in a CSR (not masked): all NaN once any column spikes.
    C = ops.CSR.from_dense(dense)
    bad = ops.CSR._unchecked(C.data, C.indices.at[-1].set(n + 1), C.indptr, C.shape)
    got = np.asarray(ops.update_on_post(bad, spikes, trace, backend=backend).data)
    assert np.isnan(got).all() if n_spikes else not np.isnan(got).any()


@pytest.mark.parametrize("fmt", ["csr", "csc", "fixed", "dense"])
def test_the_callers_weights_are_never_modified(fmt):
    """The numba kernels write into the weights' buffer: XLA must copy whenever the caller
    still holds that buffer (eager calls, jit without donation, an unmapped vmap input)."""
    dense = random_case(12, m=9, n=8, p=0.6)[1]
    if fmt == "fixed":
        W = ops.FixedNum(jnp.asarray(dense[:, :3] + 0.1), jnp.tile(jnp.arange(3), (9, 1)),
                         shape=(9, 8))
    else:
        W = as_format(fmt, dense, dense != 0)
    before = [np.array(x) for x in jax.tree_util.tree_leaves(W)]
    for pre in (True, False):
        fn = ops.update_on_pre if pre else ops.update_on_post
        spikes = np.ones(9 if pre else 8, bool)
        trace = np.ones(8 if pre else 9, np.float32)
        outs = [fn(W, spikes, trace, backend="numba"),
                jax.jit(lambda W, s, t, fn=fn: fn(W, s, t, backend="numba"))(W, spikes, trace),
                jax.vmap(lambda s, fn=fn, t=trace: fn(W, s, t, backend="numba"))(
                    np.stack([spikes] * 2))]
        for out in outs:
            assert not np.array_equal(np.asarray(jax.tree_util.tree_leaves(out)[0]),
                                      before[0])  # the update did change weights
    for got, want in zip(jax.tree_util.tree_leaves(W), before):
        np.testing.assert_array_equal(np.asarray(got), want)


def test_inside_a_scan_the_weights_are_updated_in_place():
    """No copy of the weights per step: the compiled scan body holds no copy of them."""
    W = ops.fixed_prob(400, 300, 0.1, weight=0.5, seed=3)
    W = W.with_data(jnp.full(W.nnz, 0.5, jnp.float32))
    spikes = np.random.RandomState(0).random_sample((5, 300)) < 0.1

    def run(data):
        def body(data, s):
            new = ops.update_on_post(W.with_data(data), s, jnp.full(400, 0.01),
                                     backend="numba")
            return new.data, None
        return jax.lax.scan(body, data, spikes)[0]

    hlo = jax.jit(run, donate_argnums=0).lower(W.data).compile().as_text()
    shape = f"f32[{W.nnz}]"
    copies = [line for line in hlo.splitlines() if " copy(" in line and shape in line]
    assert not copies, copies
    calls = [line for line in hlo.splitlines() if "custom-call(" in line and shape in line]
    assert calls and all("output_to_operand_aliasing" in line for line in calls), calls
    dense = np.asarray(W.todense())
    want = dense.copy()
    for s in spikes:
        want = numpy_update(want, dense != 0, s, np.full(400, 0.01, np.float32), pre=False,
                            lo=None, hi=None)
    got = W.with_data(jax.jit(run, donate_argnums=0)(jnp.array(W.data))).todense()
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)
