"""The matrices' array helpers compile one XLA program for a new shape, not one per step.

Building a column index, densifying a matrix, packing or unpacking events, slicing rows,
adding a diagonal and converting CSR to CSC indices are several jax.numpy steps each;
called outside ``jit`` every step would compile a program of its own for every new shape.
Each helper is one jitted function instead. The XLA compiles are counted with
``jax.monitoring`` (JAX's backend-compile event), and every result is checked against
NumPy, so the helpers stay right while they compile less.
"""

from __future__ import annotations

import contextlib

import jax.monitoring
import numpy as np
import pytest

from primforge import ops

_COMPILE_EVENT = "backend_compile_duration"  # JAX's event for one XLA compile
_EVENTS: list[str] = []
jax.monitoring.register_event_duration_secs_listener(
    lambda name, _secs, **_kw: _EVENTS.append(name))


@contextlib.contextmanager
def xla_compiles():
    """Yields a list that holds, on exit, one entry per XLA compile inside the block."""
    start = len(_EVENTS)
    seen: list[str] = []
    yield seen
    seen.extend(e for e in _EVENTS[start:] if e.endswith(_COMPILE_EVENT))


def _dense(rng, m, n):
    """A random ``(m, n)`` float32 matrix, about a third of it non-zero."""
    return np.where(rng.random((m, n)) < 0.35, rng.standard_normal((m, n)), 0).astype(np.float32)


# Shapes no other test uses, so that no program of theirs is already compiled.
SHAPES = [(13, 17), (29, 11)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("fmt", ["CSR", "CSC"])
def test_todense_compiles_once_and_matches_numpy(fmt, shape):
    d = _dense(np.random.default_rng(shape[0]), *shape)
    W = getattr(ops, fmt).from_dense(d)
    with xla_compiles() as seen:
        out = np.asarray(W.todense())
    np.testing.assert_array_equal(out, d)
    assert len(seen) <= 1, seen  # none where this process compiled the shape already


@pytest.mark.parametrize("per", ["pre", "post"])
def test_fixed_num_todense_compiles_once_and_matches_numpy(per):
    rng = np.random.default_rng(3)
    rows, k, other = 11, 3, 19
    idx = np.stack([rng.choice(other, k, replace=False) for _ in range(rows)]).astype(np.int32)
    w = rng.standard_normal((rows, k)).astype(np.float32)
    shape = (rows, other) if per == "pre" else (other, rows)
    W = ops.FixedNum.from_indices(idx, w, shape=shape, per=per)
    want = np.zeros((rows, other), np.float32)
    for i in range(rows):
        want[i, idx[i]] = w[i]
    with xla_compiles() as seen:
        out = np.asarray(W.todense())
    np.testing.assert_allclose(out, want if per == "pre" else want.T)
    assert len(seen) <= 1, seen  # none where this process compiled the shape already


@pytest.mark.parametrize("fmt", ["CSR", "FixedNum"])
def test_column_index_compiles_once_and_lists_each_column_s_entries(fmt):
    rng = np.random.default_rng(5)
    if fmt == "CSR":
        d = _dense(rng, 23, 31)
        W = ops.CSR.from_dense(d)
        rows_of, cols = np.nonzero(d)  # row-major: the stored order
    else:
        idx = np.stack([rng.choice(31, 4, replace=False) for _ in range(23)]).astype(np.int32)
        W = ops.FixedNum.from_indices(idx, np.ones((23, 4), np.float32), shape=(23, 31),
                                      per="pre")
        rows_of, cols = np.repeat(np.arange(23), 4), idx.reshape(-1)
    with xla_compiles() as seen:
        C = ops.with_column_index(W)
        colptr, perm, rows = (np.asarray(a) for a in (C.colptr, C.perm, C.rows))
    assert len(seen) <= 1, seen  # none where this process compiled the shape already
    want_perm = np.argsort(cols, kind="stable")
    np.testing.assert_array_equal(perm, want_perm)
    np.testing.assert_array_equal(rows, rows_of[want_perm])
    np.testing.assert_array_equal(colptr, np.concatenate([[0], np.cumsum(
        np.bincount(cols, minlength=31))]))


@pytest.mark.parametrize("shape", [(45,), (70, 3)], ids=str)
def test_packing_and_unpacking_compile_once_each_and_round_trip(shape):
    x = np.random.default_rng(7).random(shape) < 0.3
    with xla_compiles() as packing:
        P = ops.pack_events(x)
        words = np.asarray(P.words)
    with xla_compiles() as unpacking:
        back = np.asarray(P.unpack())
    assert len(packing) <= 1 and len(unpacking) <= 1, (packing, unpacking)
    np.testing.assert_array_equal(back, x)
    bits = np.zeros((words.shape[0] * 32,) + shape[1:], bool)
    bits[: shape[0]] = x
    want = np.sum(bits.reshape((-1, 32) + shape[1:]).astype(np.uint64)
                  << np.arange(32, dtype=np.uint64).reshape((1, 32) + (1,) * (len(shape) - 1)),
                  axis=1).astype(np.uint32)
    np.testing.assert_array_equal(words, want)


def test_slice_rows_compiles_once_and_gives_the_rows_of_the_dense_matrix():
    d = _dense(np.random.default_rng(9), 27, 33)
    W = ops.CSR.from_dense(d)
    rows = np.array([4, 0, 26, 4])
    with xla_compiles() as seen:
        out = np.asarray(ops.csr_slice_rows(W.data, W.indices, W.indptr, rows, shape=W.shape))
    assert len(seen) <= 1, seen  # none where this process compiled the shape already
    np.testing.assert_array_equal(out, d[rows])
    one = ops.csr_slice_rows(W.data, W.indices, W.indptr, 7, shape=W.shape)
    np.testing.assert_array_equal(np.asarray(one), d[7])


def test_diag_add_compiles_once_and_equals_numpy():
    rng = np.random.default_rng(11)
    d = _dense(rng, 21, 21)
    W = ops.CSR.from_dense(d)
    diag = rng.standard_normal(21).astype(np.float32)
    with xla_compiles() as seen:
        data, indices, indptr = ops.diag_add(W.data, W.indices, W.indptr, diag, shape=W.shape)
        data = np.asarray(data)
    assert len(seen) <= 1, seen  # none where this process compiled the shape already
    got = ops.CSR(data, indices, indptr, shape=W.shape).todense()
    np.testing.assert_allclose(np.asarray(got), d + np.diag(diag), rtol=1e-6)


def test_csr_to_csc_index_of_jax_arrays_compiles_little_and_equals_numpy():
    d = _dense(np.random.default_rng(13), 19, 23)
    W = ops.CSR.from_dense(d)
    with xla_compiles() as seen:  # the row ids and the sort
        ptr, rows, perm = (np.asarray(a) for a in ops.csr_to_csc_index(
            W.indptr, W.indices, shape=W.shape))
    assert len(seen) <= 2, seen
    want = ops.csr_to_csc_index(np.asarray(W.indptr), np.asarray(W.indices), shape=W.shape)
    for got, ref in zip((ptr, rows, perm), want, strict=True):
        np.testing.assert_array_equal(got, ref)
    np.testing.assert_array_equal(np.asarray(W.data)[perm], d.T[d.T != 0])


def test_fixed_num_from_numpy_compiles_nothing_and_keeps_jax_dtypes():
    rng = np.random.default_rng(17)
    idx = rng.integers(0, 41, (37, 3))  # int64 and float64 in: int32 and float32 out
    w = rng.standard_normal((37, 3))
    with xla_compiles() as seen:
        F = ops.FixedNum.from_indices(idx, w, shape=(37, 41))
    assert seen == []
    assert (F.indices.dtype, F.weights.dtype) == (np.int32, np.float32)
    np.testing.assert_array_equal(np.asarray(F.indices), idx)
    np.testing.assert_array_equal(np.asarray(F.weights), w.astype(np.float32))
