"""Bit-packed events: the layout against NumPy's packbits, and every binary product fed packed
events giving exactly what it gives for the same events as bool (under jit and vmap too)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from primforge import ops


def numpy_words(events: np.ndarray) -> np.ndarray:
    """Independent packing: NumPy's little-endian packbits, four bytes to a uint32 word."""
    bits = np.packbits(np.asarray(events) != 0, axis=0, bitorder="little")
    pad = (-bits.shape[0]) % 4
    bits = np.concatenate([bits, np.zeros((pad,) + bits.shape[1:], np.uint8)], axis=0)
    by = bits.reshape((bits.shape[0] // 4, 4) + bits.shape[1:]).astype(np.uint32)
    shifts = np.array([0, 8, 16, 24], np.uint32).reshape((1, 4) + (1,) * (bits.ndim - 1))
    return np.sum(by << shifts, axis=1, dtype=np.uint32)


@pytest.mark.parametrize("shape", [(1,), (31,), (32,), (33,), (100,), (65, 3), (0,), (7, 0)])
def test_layout_matches_numpy_and_round_trips(shape):
    rs = np.random.RandomState(sum(shape) + len(shape))
    ev = rs.random_sample(shape) < 0.3
    packed = ops.pack_events(ev)
    assert packed.words.dtype == jnp.uint32 and packed.shape == shape
    np.testing.assert_array_equal(np.asarray(packed.words), numpy_words(ev))
    np.testing.assert_array_equal(np.asarray(packed.unpack()), ev)
    # numbers: non-zero is active
    nums = np.where(ev, rs.standard_normal(shape), 0)
    np.testing.assert_array_equal(np.asarray(ops.pack_events(nums).words), numpy_words(ev))


def test_pack_under_jit_and_bad_input():
    ev = jnp.arange(40) % 3 == 0
    packed = jax.jit(ops.pack_events)(ev)
    np.testing.assert_array_equal(np.asarray(packed.words), numpy_words(np.asarray(ev)))
    with pytest.raises(ValueError, match="'events' must be a vector or a matrix"):
        ops.pack_events(jnp.ones((2, 2, 2), bool))


def _cases():
    rs = np.random.RandomState(0)
    m, n, k = 37, 45, 3
    dense = np.where(rs.random_sample((m, n)) < 0.2, rs.standard_normal((m, n)), 0)
    dense = dense.astype(np.float32)
    W = ops.CSR.from_dense(dense)
    ind = np.stack([rs.choice(n, 4, replace=False) for _ in range(m)]).astype(np.int32)
    fw = rs.standard_normal((m, 4)).astype(np.float32)
    d, i, p = W.data, W.indices, W.indptr

    def ev(rows, cols=None):
        return rs.random_sample((rows,) if cols is None else (rows, cols)) < 0.3

    # (name, function of the events, events)
    return [
        ("binary_csrmv", lambda e: ops.binary_csrmv(d, i, p, e, shape=(m, n)), ev(n)),
        ("binary_csrmv_T", lambda e: ops.binary_csrmv(d, i, p, e, shape=(m, n), transpose=True),
         ev(m)),
        ("binary_csrmm", lambda e: ops.binary_csrmm(d, i, p, e, shape=(m, n)), ev(n, k)),
        ("binary_csrmm_T", lambda e: ops.binary_csrmm(d, i, p, e, shape=(m, n), transpose=True),
         ev(m, k)),
        ("csr_matmul", lambda e: W @ e, ev(n)),
        ("csr_rmatmul", lambda e: e @ W, ev(m)),
        ("csc_matmul", lambda e: W.T @ e, ev(m)),
        ("binary_fixed_num_mv", lambda e: ops.binary_fixed_num_mv(fw, ind, e, shape=(m, n),
                                                                   transpose=True), ev(m)),
        ("binary_fixed_num_mm", lambda e: ops.binary_fixed_num_mm(fw, ind, e, shape=(m, n)),
         ev(n, k)),
        ("binary_jitc_matvec", lambda e: ops.binary_jitc_matvec(0.5, 7, e, shape=(m, n),
                                                                 prob=0.2, transpose=True), ev(m)),
        ("binary_jitc_matmat", lambda e: ops.binary_jitc_matmat(0.5, 7, e, shape=(m, n),
                                                                 prob=0.2), ev(n, k)),
        ("binary_densemv", lambda e: ops.binary_densemv(dense, e), ev(n)),
        ("binary_densemm", lambda e: ops.binary_densemm(dense, e, transpose=True), ev(m, k)),
        ("update_on_pre", lambda e: ops.update_on_pre(W, e, jnp.ones(n)).data, ev(m)),
        ("update_on_post", lambda e: ops.update_on_post(dense, e, jnp.ones(m)), ev(n)),
    ]


CASES = _cases()


@pytest.mark.parametrize("name,fn,events", CASES, ids=[c[0] for c in CASES])
def test_every_binary_product_accepts_packed_events(name, fn, events):
    want = np.asarray(fn(jnp.asarray(events)))
    packed = ops.pack_events(events)
    np.testing.assert_array_equal(np.asarray(fn(packed)), want)
    np.testing.assert_array_equal(np.asarray(jax.jit(fn)(packed)), want)


@pytest.mark.parametrize("name,fn,events", CASES[:2] + CASES[9:10],
                         ids=[c[0] for c in CASES[:2] + CASES[9:10]])
def test_vmap_over_packed_events(name, fn, events):
    rs = np.random.RandomState(3)
    batch = rs.random_sample((4,) + events.shape) < 0.3
    words = jnp.stack([ops.pack_events(b).words for b in batch])
    got = jax.vmap(lambda w: fn(ops.PackedEvents(w, events.shape[0])))(words)
    # exactly what vmap gives for the bool events (a batched product may sum in another
    # order than one product per element, so compare like with like)...
    np.testing.assert_array_equal(np.asarray(got), np.asarray(jax.vmap(fn)(jnp.asarray(batch))))
    # ...and, to rounding, one product per element
    want = np.stack([np.asarray(fn(jnp.asarray(b))) for b in batch])
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
