"""The binary CSR vector product reads bit-packed events in its kernel, bit for bit equal
to the product on the unpacked events."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _jaxpr import eqn_names

from primforge import ops
from primforge.ops.csr.packed import binary_csrmv_packed


def _csr(rs, m, n, homo):
    d = np.where(rs.random_sample((m, n)) < 0.2, rs.standard_normal((m, n)), 0)
    d[2] = 0  # an empty row
    w = ops.CSR.from_dense(d.astype(np.float32))
    return w.with_data(jnp.float32(0.7)) if homo else w


_EXH = pytest.mark.exhaustive


@pytest.mark.parametrize(("backend", "homo", "transpose"), [
    ("numba", False, True), ("numba", True, False),
    pytest.param("numba", True, True, marks=_EXH), pytest.param("numba", False, False, marks=_EXH),
    *(pytest.param("jax", h, t, marks=_EXH) for h in (False, True) for t in (True, False))])
def test_bitwise_equal_to_the_unpacked_product(backend, homo, transpose):
    rs = np.random.RandomState(0)
    m, n = 70, 45  # neither a multiple of 32
    w = _csr(rs, m, n, homo)
    size = m if transpose else n
    e = rs.random_sample(size) < 0.3
    p = ops.pack_events(e)
    # bits past the last event are ignored, as unpacking ignores them
    p = ops.PackedEvents(p.words.at[-1].set(p.words[-1] | jnp.uint32(1 << 31)), size)
    call = lambda x, t=transpose: ops.binary_csrmv(w.data, w.indices, w.indptr, x,
                                                   shape=w.shape, transpose=t,
                                                   backend=backend)
    want = call(e)
    np.testing.assert_array_equal(call(p), want)
    direct = binary_csrmv_packed(w.data, w.indices, w.indptr, p, shape=w.shape,
                                 transpose=transpose, backend=backend)  # the kernel itself
    np.testing.assert_array_equal(direct, want)
    dense = np.asarray(w.todense(), np.float64)
    np.testing.assert_allclose(want, (dense.T if transpose else dense) @ e, rtol=1e-5,
                               atol=1e-5)


def test_the_kernel_reads_the_words():
    w = _csr(np.random.RandomState(1), 40, 40, False)
    p = ops.pack_events(jnp.arange(40) % 3 == 0)
    for f in (lambda p: p @ w, lambda p: w @ p, lambda p: w.T @ p, lambda p: p @ w.T):
        names = eqn_names(jax.make_jaxpr(f)(p).jaxpr)
        assert "primforge.ops.binary_csrmv_packed" in names, names
        assert "shift_right_logical" not in names, names
        np.testing.assert_array_equal(f(p), f(p.unpack()))


def test_grad_vmap_and_malformed_structure_as_unpacked():
    rs = np.random.RandomState(2)
    w = _csr(rs, 50, 30, False)
    e = rs.random_sample((3, 50)) < 0.3
    p = ops.pack_events(e.T)  # (words, 3): one packed vector per column
    loss = lambda d, x: jnp.sum((x @ w.with_data(d)) ** 2)
    p0 = ops.PackedEvents(p.words[:, 0], 50)
    np.testing.assert_array_equal(jax.grad(loss)(w.data, p0), jax.grad(loss)(w.data, e[0]))
    got = jax.vmap(lambda words: ops.PackedEvents(words, 50) @ w, in_axes=1)(p.words)
    np.testing.assert_allclose(got, np.stack([x @ w for x in e]), rtol=1e-6)
    bad = np.asarray(w.indices).copy()
    row = int(np.flatnonzero(e[0])[0])
    bad[int(np.asarray(w.indptr)[row])] = 99  # a column outside, in a firing row: NaN
    for t, x in ((True, e[0]), (False, e[0][:30])):
        call = lambda x, t=t: ops.binary_csrmv(w.data, bad, w.indptr, x, shape=(50, 30),
                                               transpose=t)
        out = call(ops.pack_events(x))
        assert np.isnan(out).any()
        np.testing.assert_array_equal(out, call(x))  # NaN where the unpacked one is
    with pytest.raises(ValueError, match="must be 50 events in 2 uint32 words"):
        ops.binary_csrmv(w.data, w.indices, w.indptr, ops.pack_events(e[0][:40]),
                         shape=(50, 30), transpose=True)


def test_on_gpu_the_words_are_unpacked_for_the_csr_product():
    w = _csr(np.random.RandomState(3), 40, 40, False)
    p = ops.pack_events(jnp.arange(40) % 3 == 0)
    lowered = jax.jit(lambda p: p @ w).trace(p).lower(lowering_platforms=("cuda",))
    text = lowered.as_text()
    assert "shift_right_logical" in text  # unpacked by XLA, then binary_csrmv's own choice
    cpu = jax.jit(lambda p: p @ w).trace(p).lower().as_text()
    assert "shift_right_logical" not in cpu  # the numba kernel reads the words
