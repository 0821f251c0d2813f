"""The binary fixed-number vector product reads bit-packed events in its kernel, bit for bit
equal to the product on the unpacked events."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _jaxpr import eqn_names
from jax.test_util import check_grads

from primforge import ops
from primforge.ops.fixed_num.packed import binary_fixed_num_mv_packed

M, N, K = 90, 70, 6  # neither a multiple of 32; both over two words


def _structure(rs, homo, m=M, n=N):
    ind = rs.randint(0, n, (m, K)).astype(np.int32)
    ind[::5, 0] = -1  # masked slots, in firing rows too
    ind[::7, -1] = n
    ind[3, 1] = np.iinfo(np.int32).min  # wraps to a huge unsigned index: masked as well
    w = np.array([0.7], np.float32) if homo else rs.standard_normal((m, K)).astype(np.float32)
    return jnp.asarray(w), jnp.asarray(ind)


def _events(rs, size):
    e = rs.random_sample(size) < 0.3
    e[:32] = False  # a zero word
    e[32:64] = True  # a full word
    return e


def _dense(w, ind, m=M, n=N):
    return np.asarray(ops.FixedNum(w, ind, shape=(m, n)).todense(), np.float64)


_EXH = pytest.mark.exhaustive


@pytest.mark.parametrize(("backend", "homo", "transpose"), [
    ("numba", False, True), ("numba", True, False),
    pytest.param("numba", True, True, marks=_EXH), pytest.param("numba", False, False, marks=_EXH),
    *(pytest.param("jax", h, t, marks=_EXH) for h in (False, True) for t in (True, False))])
def test_bitwise_equal_to_the_unpacked_product(backend, homo, transpose):
    rs = np.random.RandomState(0)
    w, ind = _structure(rs, homo)
    size = M if transpose else N
    e = _events(rs, size)
    p = ops.pack_events(e)
    # bits past the last event are ignored, as unpacking ignores them
    p = ops.PackedEvents(p.words.at[-1].set(p.words[-1] | jnp.uint32(1 << 31)), size)
    call = lambda x: ops.binary_fixed_num_mv(w, ind, x, shape=(M, N), transpose=transpose,
                                             backend=backend)
    want = call(e)
    np.testing.assert_array_equal(call(p), want)
    np.testing.assert_array_equal(jax.jit(call)(p), want)
    direct = binary_fixed_num_mv_packed(w, ind, p, shape=(M, N), transpose=transpose,
                                        backend=backend)  # the kernel itself
    np.testing.assert_array_equal(direct, want)
    dense = _dense(w, ind)
    np.testing.assert_allclose(want, (dense.T if transpose else dense) @ e, rtol=1e-5,
                               atol=1e-5)


def test_the_kernel_reads_the_words_and_skips_silent_words():
    rs = np.random.RandomState(1)
    w, ind = _structure(rs, False, 40, 40)
    p = ops.pack_events(jnp.arange(40) % 3 == 0)
    pre, post = ops.FixedNum(w, ind, shape=(40, 40)), ops.FixedNum(w, ind, shape=(40, 40),
                                                                    per="post")
    for f in (lambda p: p @ pre, lambda p: pre @ p, lambda p: p @ post, lambda p: post @ p):
        names = eqn_names(jax.make_jaxpr(f)(p).jaxpr)
        assert "primforge.ops.binary_fixed_num_mv_packed" in names, names
        assert "shift_right_logical" not in names, names
        np.testing.assert_array_equal(f(p), f(p.unpack()))
    # no event at all: every word is skipped, the output is zero
    silent = ops.pack_events(jnp.zeros(40, bool))
    np.testing.assert_array_equal(silent @ pre, np.zeros(40, np.float32))


@pytest.mark.parametrize(("homo", "transpose"), [
    (False, True), pytest.param(True, True, marks=_EXH), pytest.param(False, False, marks=_EXH),
    pytest.param(True, False, marks=_EXH)])
def test_grad_jit_and_vmap_as_unpacked(homo, transpose):
    rs = np.random.RandomState(2)
    w, ind = _structure(rs, homo)
    size = M if transpose else N
    e = rs.random_sample((3, size)) < 0.3
    words = ops.pack_events(e.T).words  # (words, 3): one packed vector per column
    call = lambda wt, x: ops.binary_fixed_num_mv(wt, ind, x, shape=(M, N), transpose=transpose)
    loss = lambda wt, x: jnp.sum(call(wt, x) ** 2)

    p0 = ops.PackedEvents(words[:, 0], size)
    g = jax.jit(jax.grad(loss))(w, p0)
    np.testing.assert_array_equal(g, jax.grad(loss)(w, e[0]))
    check_grads(lambda wt: loss(wt, p0), (w,), order=1, modes=("rev",), atol=1e-2, rtol=1e-2)
    # against the dense matrix in jax.numpy
    dense = lambda wt: jnp.asarray(ops.FixedNum(wt, ind, shape=(M, N)).todense())
    apply = lambda d, x: x @ d if transpose else d @ x
    np.testing.assert_allclose(
        g, jax.grad(lambda wt: jnp.sum(apply(dense(wt), e[0]) ** 2))(w), rtol=1e-5, atol=1e-4)
    # vmap over the packed vectors, and over the weights with the words fixed
    got = jax.vmap(lambda wd: call(w, ops.PackedEvents(wd, size)), in_axes=1)(words)
    d = _dense(w, ind)
    np.testing.assert_allclose(got, np.stack([apply(d, x) for x in e]), rtol=1e-5, atol=1e-5)
    scales = jnp.array([1.0, -2.0], w.dtype)
    got = jax.vmap(lambda s: call(w * s, p0))(scales)
    np.testing.assert_allclose(got, np.stack([apply(d * float(s), e[0]) for s in scales]),
                               rtol=1e-5, atol=1e-5)


def test_malformed_structure_and_events_as_unpacked():
    rs = np.random.RandomState(3)
    w, ind = _structure(rs, False)
    e = _events(rs, M)
    p = ops.pack_events(e)
    call = lambda wt, i, x: ops.binary_fixed_num_mv(wt, i, x, shape=(M, N), transpose=True)
    # indices far outside [0, n), in firing rows: masked, never wrapped onto a column
    bad = np.asarray(ind).copy()
    bad[40:50, :] = np.array([-5, N, N + 1, 2**31 - 1, -(2**31), -1])
    out = call(w, bad, p)
    np.testing.assert_array_equal(out, call(w, bad, e))
    np.testing.assert_allclose(out, e @ _dense(w, jnp.asarray(bad)), rtol=1e-5, atol=1e-5)
    # a NaN weight of a silent row never enters, as with the unpacked events
    nan_w = w.at[0].set(jnp.nan)  # row 0 is in the zero word
    out = call(nan_w, ind, p)
    assert not np.isnan(out).any()
    np.testing.assert_array_equal(out, call(nan_w, ind, e))
    # a structure of the wrong shape: the unpacked product's error
    for wt, i, match in ((w, ind[:, :3], "'weights' must have shape"),
                         (w, ind[:50], "'indices' must have 90 rows")):
        for x in (e, p):
            with pytest.raises(ValueError, match=match):
                call(wt, i, x)
    with pytest.raises(ValueError, match="must be 90 events in 3 uint32 words"):
        call(w, ind, ops.pack_events(e[:60]))


def test_on_gpu_the_words_are_unpacked_for_the_fixed_num_product():
    w, ind = _structure(np.random.RandomState(4), True, 40, 40)
    f = ops.FixedNum(w, ind, shape=(40, 40))
    p = ops.pack_events(jnp.arange(40) % 3 == 0)
    lowered = jax.jit(lambda p: p @ f).trace(p).lower(lowering_platforms=("cuda",))
    assert "shift_right_logical" in lowered.as_text()  # unpacked by XLA on the GPU
    cpu = jax.jit(lambda p: p @ f).trace(p).lower().as_text()
    assert "shift_right_logical" not in cpu  # the numba kernel reads the words
