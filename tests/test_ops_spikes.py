"""Fixed-number and dense products taking a spike list, against NumPy and the bool products."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from primforge import ops

BACKENDS = ("numba", "jax")
# The numba kernels in the default run; the jax reference (the same checks) in the full one.
TIERED = ("numba", pytest.param("jax", marks=pytest.mark.exhaustive))
M, N, K = 7, 5, 3


def _fixed(rs, homo):
    """A fixed-number ``(M, N)`` matrix with a repeated and a masked slot, and its dense form."""
    ind = rs.randint(0, N, (M, K)).astype(np.int32)
    ind[0, 1] = ind[0, 0]  # a repeated column adds up
    ind[2, 2] = -1  # a masked slot
    ind[4, 0] = N  # another
    w = np.float32([0.75]) if homo else rs.standard_normal((M, K)).astype(np.float32)
    dense = np.zeros((M, N), np.float64)
    for i in range(M):
        for j in range(K):
            if 0 <= ind[i, j] < N:
                dense[i, ind[i, j]] += w[0] if homo else w[i, j]
    return w, ind, dense


def _family(name, rs, homo=False):
    """``(weights, mv(w, s, c, transpose, backend), mm(...), dense)`` for one family."""
    if name == "fixed_num":
        w, ind, dense = _fixed(rs, homo)
        mv = lambda w, s, c, t, b: ops.binary_fixed_num_mv_spikes(
            w, ind, s, c, shape=(M, N), transpose=t, backend=b)
        mm = lambda w, s, c, t, b: ops.binary_fixed_num_mm_spikes(
            w, ind, s, c, shape=(M, N), transpose=t, backend=b)
        return w, mv, mm, dense
    w = rs.standard_normal((M, N)).astype(np.float32)
    mv = lambda w, s, c, t, b: ops.binary_densemv_spikes(w, s, c, transpose=t, backend=b)
    mm = lambda w, s, c, t, b: ops.binary_densemm_spikes(w, s, c, transpose=t, backend=b)
    return w, mv, mm, w.astype(np.float64)


def _numpy(dense, spikes, count, transpose):
    e = np.bincount(np.asarray(spikes)[:count], minlength=dense.shape[0 if transpose else 1])
    return (dense.T if transpose else dense) @ e


@pytest.mark.parametrize("family", ("fixed_num", "dense"))
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("transpose", (True, False))
def test_matches_numpy_with_duplicates_and_ignored_tail(family, backend, transpose):
    rs = np.random.RandomState(0)
    w, mv, _, dense = _family(family, rs)
    src = M if transpose else N
    spikes = np.array([1, 3, 3, 0, src - 1, 99], np.int32)  # duplicate 3, tail past count
    got = mv(w, spikes, 5, transpose, backend)
    np.testing.assert_allclose(got, _numpy(dense, spikes, 5, transpose), rtol=1e-5, atol=1e-5)
    jitted = jax.jit(lambda s, c: mv(w, s, c, transpose, backend))
    np.testing.assert_allclose(jitted(spikes, 5), got, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("backend", TIERED)
def test_fixed_num_shared_weight(backend):
    w, mv, _, dense = _family("fixed_num", np.random.RandomState(1), homo=True)
    spikes = np.array([0, 2, 4, 4], np.int32)
    for transpose in (True, False):
        np.testing.assert_allclose(mv(w, spikes, 4, transpose, backend),
                                   _numpy(dense, spikes, 4, transpose), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("family", ("fixed_num", "dense"))
def test_equals_the_bool_product_on_a_built_list(family):
    rs = np.random.RandomState(2)
    w, mv, _, _ = _family(family, rs)
    events = rs.random_sample(M) < 0.5
    idx, count = jax.jit(ops.spike_list, static_argnums=1)(events, M)
    got = jax.jit(lambda s, c: mv(w, s, c, True, None))(idx, count)
    if family == "fixed_num":
        ind = _fixed(np.random.RandomState(2), False)[1]
        want = ops.binary_fixed_num_mv(w, ind, events, shape=(M, N), transpose=True)
        # the FixedNum matrix with per='post' is the same computation seen transposed
        fnt = ops.FixedNum(jnp.asarray(w), jnp.asarray(ind), shape=(M, N)).T
        np.testing.assert_allclose(fnt @ events, want, rtol=1e-6)
    else:
        want = ops.binary_densemv(w, events, transpose=True)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("family", ("fixed_num", "dense"))
@pytest.mark.parametrize("backend", TIERED)
def test_vmap_over_lists_counts_and_weights(family, backend):
    rs = np.random.RandomState(3)
    w, mv, _, dense = _family(family, rs)
    spikes = rs.randint(0, M, (3, 5)).astype(np.int32)
    counts = np.array([0, 2, 5], np.int32)
    got = jax.vmap(lambda s, c: mv(w, s, c, True, backend))(spikes, counts)
    want = np.stack([_numpy(dense, s, c, True) for s, c in zip(spikes, counts)])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    got = jax.vmap(lambda c: mv(w, spikes[2], c, True, backend))(counts)
    want = np.stack([_numpy(dense, spikes[2], c, True) for c in counts])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    scales = np.float32([1.0, -2.0])
    got = jax.vmap(lambda a: mv(w * a, spikes[1], 3, True, backend))(scales)
    np.testing.assert_allclose(got, [a * _numpy(dense, spikes[1], 3, True) for a in scales],
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", ("fixed_num", "dense"))
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("transpose", (True, False))
def test_grad_wrt_weights(family, backend, transpose):
    rs = np.random.RandomState(4)
    w, mv, _, _ = _family(family, rs)
    spikes = np.array([0, 2, 2, 4] if transpose else [0, 3, 3], np.int32)
    f = lambda w: mv(w, spikes, 3, transpose, backend)
    check_grads(f, (jnp.asarray(w),), order=1, modes=("fwd", "rev"), atol=1e-2, rtol=1e-2)
    if family == "fixed_num" and transpose:  # a shared weight
        check_grads(lambda a: f(a.reshape(1)), (jnp.float32(0.7),), order=1,
                    modes=("fwd", "rev"), atol=1e-2, rtol=1e-2)
    # the gradient of a sum is the summed listed rows (columns) of ones: against NumPy
    ind = _fixed(np.random.RandomState(4), False)[1] if family == "fixed_num" else None
    grad = np.asarray(jax.grad(lambda w: f(w).sum())(jnp.asarray(w)))
    want = np.zeros(w.shape)
    for s in spikes[:3]:
        if family == "dense":
            want[(s, slice(None)) if transpose else (slice(None), s)] += 1
        elif transpose:
            want[s] += (ind[s] >= 0) & (ind[s] < N)
        else:
            want += ind == s
    np.testing.assert_allclose(grad, want, atol=1e-6)


@pytest.mark.parametrize("family", ("fixed_num", "dense"))
@pytest.mark.parametrize("backend", TIERED)
def test_bad_spike_lists(family, backend):
    w, mv, mm, _ = _family(family, np.random.RandomState(5))
    call = lambda s, c=None: mv(w, s, c, True, backend)
    with pytest.raises(IndexError, match="'spike_indices' holds -1"):
        call(np.int32([0, -1]))
    with pytest.raises(IndexError, match=f"'spike_indices' holds {M}"):
        call(np.int32([M]))
    with pytest.raises(ValueError, match="'spike_count' must be in"):
        call(np.int32([0]), 2)
    with pytest.raises(TypeError, match="'spike_indices' must be a 1-D integer"):
        call(np.float32([0.5]))
    assert not np.isnan(call(np.int32([0, 77]), 1)).any()  # the tail is ignored
    for s, c in ((np.int32([0, -1]), 2), (np.int32([M]), 1), (np.int32([0]), 2),
                 (np.int32([0]), -1)):
        out = jax.jit(call)(s, c)
        assert np.isnan(out).all(), (s, c)
    lists = np.int32([[0, 1], [M, 0]])
    out = jax.jit(lambda s: mm(w, s, np.int32([2, 1]), True, backend))(lists)
    assert not np.isnan(out[0]).any() and np.isnan(out[1]).all()  # a bad list: its own row


@pytest.mark.parametrize("family", ("fixed_num", "dense"))
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("transpose", (True, False))
def test_matrix_form_matches_numpy_per_list(family, backend, transpose):
    rs = np.random.RandomState(6)
    w, _, mm, dense = _family(family, rs)
    spikes = rs.randint(0, M if transpose else N, (4, 5)).astype(np.int32)
    counts = np.array([0, 5, 2, 3], np.int32)
    want = np.stack([_numpy(dense, s, c, transpose) for s, c in zip(spikes, counts)])
    np.testing.assert_allclose(mm(w, spikes, counts, transpose, backend), want, rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_allclose(mm(w, spikes, 2, transpose, backend),
                               [_numpy(dense, s, 2, transpose) for s in spikes], rtol=1e-5,
                               atol=1e-5)
    if backend != "jax":  # the weight gradient is the reference's either way
        return
    # the gradient of the lists' products adds the gradients of each list's product
    ct = rs.standard_normal(want.shape).astype(np.float32)
    got = jax.grad(lambda w: jnp.vdot(ct, mm(w, spikes, counts, transpose, backend)))(w)
    one = lambda w, s, c, r: jnp.vdot(r, mm(w, s[None], c[None], transpose, "jax")[0])
    each = jax.vmap(jax.grad(one), in_axes=(None, 0, 0, 0))(w, spikes, counts, ct)
    np.testing.assert_allclose(got, np.sum(each, axis=0), rtol=1e-5, atol=1e-5)


def test_a_non_finite_weight_of_a_silent_source_never_enters():
    w, mv, _, _ = _family("fixed_num", np.random.RandomState(7))
    w = w.copy()
    w[3] = np.nan  # row 3 never fires
    for backend in BACKENDS:
        assert not np.isnan(mv(w, np.int32([0, 1]), 2, True, backend)).any()
    d = np.ones((M, N), np.float32)
    d[:, 2] = np.inf  # column 2 never listed
    for backend in BACKENDS:
        np.testing.assert_array_equal(
            ops.binary_densemv_spikes(d, np.int32([0, 1]), backend=backend), np.full(M, 2.0))


@pytest.mark.parametrize("backend", TIERED)
def test_csc_and_csr_transpose_take_a_spike_list_through_the_csr_product(backend):
    rs = np.random.RandomState(8)
    dense = np.where(rs.random_sample((M, N)) < 0.4, rs.standard_normal((M, N)), 0)
    csc = ops.CSC.from_dense(dense.astype(np.float32))
    assert isinstance(ops.CSR.from_dense(dense.T.astype(np.float32)).T, ops.CSC)
    events = np.zeros(M, bool)
    events[[1, 4]] = True
    # events @ W for a CSC W: its stored CSR is W.T, so the list holds its columns
    got = ops.binary_csrmv_spikes(csc.data, csc.indices, csc.indptr, np.int32([1, 4]),
                                   shape=(N, M), backend=backend)
    np.testing.assert_allclose(got, events @ csc, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got, events @ dense, rtol=1e-5, atol=1e-6)
