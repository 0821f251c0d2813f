"""The CSR product taking a spike list, against NumPy and against binary_csrmv."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from primforge import ops

BACKENDS = ("numba", "jax")


def _random_csr(rs, m, n, p=0.3):
    dense = np.where(rs.random_sample((m, n)) < p, rs.standard_normal((m, n)), 0.0)
    dense[1] = 0.0  # an empty row
    rows, cols = np.nonzero(dense)
    indptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=m))]).astype(np.int32)
    return (dense[rows, cols].astype(np.float32), cols.astype(np.int32), indptr,
            dense.astype(np.float32))


def _numpy(dense, spikes, count, transpose):
    e = np.bincount(np.asarray(spikes)[:count], minlength=dense.shape[0 if transpose else 1])
    return (dense.T if transpose else dense) @ e.astype(np.float32)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("transpose", (True, False))
@pytest.mark.parametrize("homo", (False, True))
def test_matches_numpy_with_duplicates_and_ignored_tail(backend, transpose, homo):
    rs = np.random.RandomState(0)
    data, indices, indptr, dense = _random_csr(rs, 7, 5)
    if homo:
        data, dense = np.float32([1.5]), np.where(dense != 0, 1.5, 0).astype(np.float32)
    src = 7 if transpose else 5
    spikes = np.array([1, 3, 3, 0, src - 1, 99], np.int32)  # duplicate 3, tail past count
    got = ops.binary_csrmv_spikes(data, indices, indptr, spikes, 5, shape=(7, 5),
                                   transpose=transpose, backend=backend)
    np.testing.assert_allclose(got, _numpy(dense, spikes, 5, transpose), rtol=1e-5, atol=1e-6)
    jitted = jax.jit(lambda s, c: ops.binary_csrmv_spikes(
        data, indices, indptr, s, c, shape=(7, 5), transpose=transpose, backend=backend))
    np.testing.assert_allclose(jitted(spikes, 5), got, rtol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_equals_binary_csrmv_on_the_bool_vector(backend):
    rs = np.random.RandomState(1)
    data, indices, indptr, _ = _random_csr(rs, 40, 30, p=0.1)
    events = rs.random_sample(40) < 0.2
    idx, count = jax.jit(ops.spike_list, static_argnums=1)(events, 16)
    assert int(count) == events.sum() <= 16
    got = ops.binary_csrmv_spikes(data, indices, indptr, idx, count, shape=(40, 30),
                                   transpose=True, backend=backend)
    want = ops.binary_csrmv(data, indices, indptr, events, shape=(40, 30), transpose=True)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_vmap_over_spike_lists(backend):
    rs = np.random.RandomState(2)
    data, indices, indptr, dense = _random_csr(rs, 6, 4)
    spikes = rs.randint(0, 6, size=(3, 5)).astype(np.int32)
    counts = np.array([0, 2, 5], np.int32)
    got = jax.vmap(lambda s, c: ops.binary_csrmv_spikes(
        data, indices, indptr, s, c, shape=(6, 4), transpose=True, backend=backend))(
        spikes, counts)
    want = np.stack([_numpy(dense, s, c, True) for s, c in zip(spikes, counts)])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("transpose", (True, False))
def test_grad_wrt_data(backend, transpose):
    rs = np.random.RandomState(3)
    data, indices, indptr, _ = _random_csr(rs, 5, 4)
    spikes = np.array([0, 2, 2, 4] if transpose else [0, 3, 3], np.int32)
    f = lambda w: ops.binary_csrmv_spikes(w, indices, indptr, spikes, 3, shape=(5, 4),
                                           transpose=transpose, backend=backend)
    check_grads(f, (jnp.asarray(data),), order=1, modes=("fwd", "rev"), atol=1e-2, rtol=1e-2)
    check_grads(lambda w: f(w.reshape(1)), (jnp.float32(0.7),), order=1,
                modes=("fwd", "rev"), atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_spike_lists(backend):
    data, indices, indptr = np.float32([1, 2, 3]), np.int32([0, 2, 1]), np.int32([0, 2, 3])
    call = lambda s, c=None: ops.binary_csrmv_spikes(
        data, indices, indptr, s, c, shape=(2, 3), transpose=True, backend=backend)
    with pytest.raises(IndexError, match="'spike_indices' holds -1"):
        call(np.int32([0, -1]))
    with pytest.raises(IndexError, match="'spike_indices' holds 2"):
        call(np.int32([2]))
    with pytest.raises(ValueError, match="'spike_count' must be in"):
        call(np.int32([0]), 2)
    np.testing.assert_array_equal(call(np.int32([0, 7]), 1), [1.0, 0.0, 2.0])  # tail ignored
    for s, c in ((np.int32([0, -1]), 2), (np.int32([2]), 1), (np.int32([0]), 2),
                 (np.int32([0]), -1)):
        out = jax.jit(call)(s, c)
        assert np.isnan(out).all(), (s, c)


def test_spike_list_overflow_is_not_silent():
    events = jnp.array([True, True, True, False])
    idx, count = ops.spike_list(events, 2)
    assert idx.tolist() == [0, 1] and int(count) == 3
    out = jax.jit(lambda s, c: ops.binary_csrmv_spikes(
        jnp.ones(1), jnp.array([0, 1]), jnp.array([0, 1, 2, 2, 2]), s, c, shape=(4, 2),
        transpose=True))(idx, count)
    assert np.isnan(out).all()
    with pytest.raises(TypeError, match="'spike_indices' must be a 1-D integer"):
        ops.binary_csrmv_spikes(jnp.ones(1), jnp.array([0]), jnp.array([0, 1]),
                                 jnp.array([0.5]), shape=(1, 1))


@pytest.mark.parametrize("cap", (0, 3, 12))
def test_spike_list_against_numpy_eager_jit_vmap(cap):
    rs = np.random.RandomState(4)
    events = rs.random_sample((3, 10)) < 0.4
    events[2] = False  # no events at all
    want = [np.flatnonzero(e) for e in events]
    pad = lambda w: np.concatenate([w[:cap], np.zeros(max(0, cap - len(w)), int)])
    for e, w in zip(events, want):
        for f in (ops.spike_list, jax.jit(ops.spike_list, static_argnums=1)):
            idx, count = f(e.astype(np.float32), cap)  # non-zero floats are events too
            np.testing.assert_array_equal(idx, pad(w))
            assert int(count) == len(w)
    idx, count = jax.vmap(lambda e: ops.spike_list(e, cap))(events)
    np.testing.assert_array_equal(idx, np.stack([pad(w) for w in want]).reshape(3, cap))
    np.testing.assert_array_equal(count, [len(w) for w in want])


@pytest.mark.parametrize("backend", BACKENDS)
def test_spike_list_backends_agree_with_numpy(backend):
    from primforge.ops.csr.indexed import _spike_list_p

    events = np.random.RandomState(5).random_sample(50) < 0.2
    idx, count = _spike_list_p(events, max_spikes=8, backend=backend)
    want = np.flatnonzero(events)
    np.testing.assert_array_equal(idx[: min(8, len(want))], want[:8])
    assert int(count[0]) == len(want)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("transpose", (True, False))
def test_matrix_form_matches_numpy_per_list_and_its_grad(backend, transpose):
    rs = np.random.RandomState(6)
    data, indices, indptr, dense = _random_csr(rs, 6, 5)
    spikes = rs.randint(0, 6 if transpose else 5, (4, 5)).astype(np.int32)
    counts = np.array([0, 5, 2, 3], np.int32)
    f = lambda w, s, c: ops.binary_csrmm_spikes(w, indices, indptr, s, c, shape=(6, 5),
                                                 transpose=transpose, backend=backend)
    want = np.stack([_numpy(dense, s, c, transpose) for s, c in zip(spikes, counts)])
    for g in (f, jax.jit(f)):
        np.testing.assert_allclose(g(data, spikes, counts), want, rtol=1e-5, atol=1e-6)
    check_grads(lambda w: f(w, spikes, counts), (jnp.asarray(data),), order=1,
                modes=("fwd", "rev"), atol=1e-2, rtol=1e-2)
    bad = jax.jit(f)(data, np.where(np.arange(5) == 0, -1, spikes), counts)
    assert np.isnan(bad[1:]).all() and not np.isnan(bad[0]).any()  # list 0 is empty
    with pytest.raises(IndexError, match="'spike_indices' holds -1"):
        f(data, np.where(np.arange(5) == 0, -1, spikes), counts)


@pytest.mark.parametrize("backend", BACKENDS)
def test_vmap_over_counts_alone_and_over_weights(backend):
    rs = np.random.RandomState(7)
    data, indices, indptr, dense = _random_csr(rs, 6, 4)
    spikes = np.array([5, 0, 2, 2], np.int32)
    call = lambda w, c: ops.binary_csrmv_spikes(w, indices, indptr, spikes, c, shape=(6, 4),
                                                 transpose=True, backend=backend)
    got = jax.vmap(lambda c: call(data, c))(np.arange(5, dtype=np.int32))
    np.testing.assert_allclose(got, [_numpy(dense, spikes, c, True) for c in range(5)],
                               rtol=1e-5, atol=1e-6)
    scales = np.float32([1.0, -2.0, 0.5])
    got = jax.vmap(lambda s: call(data * s, 3))(scales)
    np.testing.assert_allclose(got, [s * _numpy(dense, spikes, 3, True) for s in scales],
                               rtol=1e-5, atol=1e-6)
