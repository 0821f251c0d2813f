"""Integer edges of the operators: spike lists and counts of every integer dtype, shapes
and counts at and past the int32 range, jitc blocks that start before or past ``W``, and
a CSR with no rows split into blocks.

Every expected value comes from NumPy (a dense matrix times the spike counts that
``np.bincount`` gives, or a padded NumPy slice of :func:`~primforge.ops.jitc_todense`).
The default tier checks each edge once; ``-m exhaustive`` runs the whole sweep.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from primforge import ops

BACKENDS = ("numba", "jax")
INT_DTYPES = (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64)

# ----------------------------------------------------------------------------- matrices
M, N = 3, 4  # sources (rows) and targets (columns) of every spike-list product here
_RNG = np.random.default_rng(0)
_DENSE = np.where(_RNG.random((M, N)) < 0.6, _RNG.integers(1, 5, (M, N)), 0).astype(np.float32)
_DENSE[:, 0] = 1.0  # every row has an entry: each source contributes
_CSR = ops.CSR.from_dense(_DENSE)
_K = 2
_FN_IDX = np.array([[0, 2], [1, 3], [3, 0]], np.int32)
_FN_W = np.array([[1., 2.], [3., 4.], [5., 6.]], np.float32)
_FN_DENSE = np.zeros((M, N), np.float32)
for _r in range(M):
    for _c in range(_K):
        _FN_DENSE[_r, _FN_IDX[_r, _c]] += _FN_W[_r, _c]
_JITC = {"shape": (M, N), "prob": 0.5}
_JITC_DENSE = ops.jitc_todense(5, (M, N), 0.5, 0.25).astype(np.float32)


def _product(family: str, matrix: bool, spikes, count, backend):
    """``e @ W`` (``W.T @ e``) of the family's ``(3, 4)`` matrix for a spike list."""
    if family == "csr":
        f = ops.binary_csrmm_spikes if matrix else ops.binary_csrmv_spikes
        return f(_CSR.data, _CSR.indices, _CSR.indptr, spikes, count, shape=(M, N),
                 transpose=True, backend=backend)
    if family == "fixed_num":
        f = ops.binary_fixed_num_mm_spikes if matrix else ops.binary_fixed_num_mv_spikes
        return f(_FN_W, _FN_IDX, spikes, count, shape=(M, N), transpose=True, backend=backend)
    if family == "dense":
        f = ops.binary_densemm_spikes if matrix else ops.binary_densemv_spikes
        return f(_DENSE, spikes, count, transpose=True, backend=backend)
    f = ops.binary_jitc_mm_spikes if matrix else ops.binary_jitc_mv_spikes
    return f(0.25, 5, spikes, count, backend=backend, **_JITC)


_DENSE_OF = {"csr": _DENSE, "fixed_num": _FN_DENSE, "dense": _DENSE, "jitc": _JITC_DENSE}
FAMILIES = tuple(_DENSE_OF)


def _expected(family, lists, counts):
    """NumPy: the counts of each source among the valid entries, times the dense matrix."""
    lists, counts = np.atleast_2d(lists), np.atleast_1d(counts)
    hist = np.stack([np.bincount(np.asarray(s[:int(c)], np.int64), minlength=M)
                     for s, c in zip(lists, counts)])
    return hist.astype(np.float64) @ _DENSE_OF[family].astype(np.float64)


def _list(dtype, length):
    """A list of ``length`` sources (cycling 0, 1, 2) in ``dtype``."""
    return (np.arange(length) % M).astype(dtype)


def _edges(dtype):
    """List lengths at and just past the dtype's range (the count a narrow dtype cannot
    hold); a wide dtype's range is out of reach, so a small length stands in."""
    info = np.iinfo(dtype)
    if info.max < 2**16:
        return (int(info.max), int(info.max) + 1)
    return (5,)


def _check_list_product(family, matrix, dtype, length, backend, jit, count_kind="default"):
    spikes = _list(dtype, length)
    if count_kind == "default":
        count = None
        want_count = length
    else:  # one less than the length, in the list's own dtype when it holds it
        want_count = length - 1
        count = np.asarray(want_count, dtype) if want_count <= np.iinfo(dtype).max else want_count
    if matrix:
        spikes = np.stack([spikes, spikes[::-1].copy()])
    call = (lambda s: _product(family, matrix, s, count, backend))
    got = jax.jit(call)(spikes) if jit else call(spikes)
    want = _expected(family, spikes, [want_count] * (2 if matrix else 1))
    np.testing.assert_allclose(np.asarray(got, np.float64).reshape(want.shape), want,
                               rtol=1e-5)


# ----------------------------------------------------------------------------- spike counts
def test_uint8_list_of_256_counts_every_spike():
    """A count past the list dtype's range: 256 spikes of a uint8 list all count."""
    W3 = ops.CSR.from_dense(np.array([[1., 0., 2.], [0., 3., 0.]], np.float32))
    for backend in BACKENDS:
        y = ops.binary_csrmv_spikes(W3.data, W3.indices, W3.indptr, np.zeros(256, np.uint8),
                                    shape=(2, 3), transpose=True, backend=backend)
        np.testing.assert_allclose(y, [256., 0., 512.])


def test_int16_list_of_32768_entries_is_valid():
    """Its count, 32768, is the list's length (not -32768 after a cast to int16)."""
    for backend in BACKENDS:
        y = ops.binary_densemv_spikes(_DENSE, np.zeros(2**15, np.int16), transpose=True,
                                      backend=backend)
        np.testing.assert_allclose(y, 2**15 * _DENSE[0].astype(np.float64), rtol=1e-6)


def test_uint8_count_of_255_in_a_list_of_256_is_not_nan():
    """The jax reference compared the count with the list length in the count's dtype."""
    for backend in BACKENDS:
        y = jax.jit(lambda s, c, b=backend: _product("csr", False, s, c, b))(
            _list(np.uint8, 256), np.uint8(255))
        np.testing.assert_allclose(y, _expected("csr", _list(np.uint8, 256), 255)[0],
                                   rtol=1e-6)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_counts_past_a_uint8_list_range(family):
    for backend, jit, matrix in [("numba", False, False), ("jax", True, True)]:
        _check_list_product(family, matrix, np.uint8, 256, backend, jit)


@pytest.mark.exhaustive
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dtype", INT_DTYPES, ids=lambda d: np.dtype(d).name)
def test_spike_lists_of_every_integer_dtype_at_and_past_its_range(family, dtype):
    for length, backend, jit, matrix, kind in itertools.product(
            _edges(dtype), BACKENDS, (False, True), (False, True), ("default", "explicit")):
        _check_list_product(family, matrix, dtype, length, backend, jit, kind)


def test_a_count_past_int32_is_named_not_wrapped():
    for count in (2**32 + 1, np.int64(2**32 + 1), np.uint64(2**32 + 1), np.int64(-2**32)):
        for family in FAMILIES:
            with pytest.raises(ValueError, match=r"'spike_count' must be in \[0, 2\].*got "
                                                 + str(int(count))):
                _product(family, False, np.array([0, 1]), count, "numba")


@pytest.mark.parametrize("family", FAMILIES)
def test_both_backends_agree_on_padded_and_malformed_lists(family):
    """Entries past the count are ignored whatever they hold; a bad index inside the count
    or a count outside [0, len] makes the result NaN under jit, on both backends alike."""
    cases = [
        (np.array([2, 0, 99, -7], np.int8), 2, False),        # junk past the count
        (np.array([2, 0, 255, 0], np.uint8), 2, False),       # junk at the dtype's edge
        (np.array([2, 300, 1], np.int16), 3, True),           # outside the sources
        (np.array([2, -1, 1], np.int32), 2, True),            # negative index
        (np.array([2, 0, 1], np.int32), 4, True),             # count past the length
        (np.array([2, 0, 1], np.int32), -1, True),            # negative count
    ]
    for spikes, count, bad in cases:
        outs = [np.asarray(jax.jit(lambda s, c, b=b: _product(family, False, s, c, b))(
            spikes, jnp.int32(count))) for b in BACKENDS]
        np.testing.assert_array_equal(outs[0], outs[1])
        if bad:
            assert np.isnan(outs[0]).all()
        else:
            np.testing.assert_allclose(outs[0], _expected(family, spikes, count)[0], rtol=1e-6)


# ----------------------------------------------------------------------------- shapes
_BIG = 2**32 + 1


def _shape_takers():
    """``(name, call(shape))`` of the public functions that take a shape; each call keeps
    its allocations small whatever the large side of the shape."""
    ones, zero = np.ones(1, np.float32), np.array([0])
    return [
        ("coo2csr", lambda s: ops.coo2csr(zero, zero, shape=(1, s))),
        ("coo_to_csc_index", lambda s: ops.coo_to_csc_index(zero, zero, shape=(s, 1))),
        ("csr_to_csc_index", lambda s: ops.csr_to_csc_index(np.array([0, 1]), zero,
                                                            shape=(1, s))),
        ("csc_to_csr_index", lambda s: ops.csc_to_csr_index(np.array([0, 1]), zero,
                                                            shape=(s, 1))),
        ("CSR", lambda s: ops.CSR(ones, zero, np.array([0, 1]), shape=(1, s))),
        ("CSC", lambda s: ops.CSC(ones, zero, np.array([0, 1]), shape=(s, 1))),
        ("FixedNum", lambda s: ops.FixedNum(np.ones((1, 1), np.float32), np.array([[0]]),
                                            shape=(1, s))),
        ("fixed_prob", lambda s: ops.fixed_prob(1, s, 0.0)),
        ("fixed_num", lambda s: ops.fixed_num(1, s, 0)),
        ("csrmv", lambda s: ops.csrmv(ones, zero, np.array([0, 1]), np.ones(1, np.float32),
                                      shape=(1, s), transpose=True)),
        ("binary_csrmv_spikes", lambda s: ops.binary_csrmv_spikes(
            ones, zero, np.array([0, 1]), zero, shape=(1, s))),
        ("binary_fixed_num_mv_spikes", lambda s: ops.binary_fixed_num_mv_spikes(
            np.ones((1, 1), np.float32), np.array([[0]]), zero, shape=(1, s))),
        ("jitc_matvec", lambda s: ops.jitc_matvec(1.0, 1, np.ones(1, np.float32),
                                                  shape=(1, s), prob=0.5, transpose=True)),
    ]


SHAPE_TAKERS = _shape_takers()


def test_coo2csr_refuses_a_shape_past_int32():
    with pytest.raises(ValueError, match="coo2csr: 'shape'"):
        ops.coo2csr(np.array([0]), np.array([_BIG]), shape=(1, 2**33))
    with pytest.raises(ValueError, match="coo_to_csc_index: 'shape'"):
        ops.coo_to_csc_index(np.array([_BIG]), np.array([0]), shape=(2**33, 1))


def test_conversions_at_the_int32_edge_keep_the_coordinates():
    edge = 2**31 - 2  # the largest extent whose coordinates fit int32 below its end
    ptr, idx, order = ops.coo2csr(np.array([0]), np.array([edge - 1]), shape=(1, edge))
    assert ptr.tolist() == [0, 1] and idx.tolist() == [edge - 1] and order.tolist() == [0]
    ptr, rows, _ = ops.coo_to_csc_index(np.array([edge - 1]), np.array([0]),
                                           shape=(edge, 1))
    assert ptr.tolist() == [0, 1] and rows.tolist() == [edge - 1]


_DEFAULT_TIER = ("coo2csr", "coo_to_csc_index", "csr_to_csc_index", "csc_to_csr_index",
                 "CSR", "FixedNum", "fixed_prob")


@pytest.mark.parametrize("name, call", [t for t in SHAPE_TAKERS if t[0] in _DEFAULT_TIER],
                         ids=[t[0] for t in SHAPE_TAKERS if t[0] in _DEFAULT_TIER])
def test_a_shape_past_int32_is_refused(name, call):
    for extent in (2**31 - 1, np.int64(2**31), np.uint64(_BIG)):
        with pytest.raises(ValueError, match="'shape' must be non-negative and below"):
            call(extent)


@pytest.mark.exhaustive
@pytest.mark.parametrize("name, call", SHAPE_TAKERS, ids=[t[0] for t in SHAPE_TAKERS])
def test_every_shape_taker_over_int_kinds_at_and_past_int32(name, call):
    for kind in (int, np.int64, np.uint64):
        for extent in (2**31 - 1, 2**31, 2**32, _BIG, 2**63 - 1):
            with pytest.raises(ValueError, match="'shape' must be non-negative and below"):
                call(kind(extent))
        call(kind(7))  # a small extent of each kind is accepted


def test_sizes_and_counts_past_int32_are_refused():
    with pytest.raises(ValueError, match="fixed_num: 'k'"):
        ops.fixed_num(3, 3, np.uint64(_BIG), replace=True)
    with pytest.raises(ValueError, match="'num_blocks' must be a positive integer below"):
        ops.csr_row_blocks(_CSR, np.int64(_BIG))


# ----------------------------------------------------------------------------- int64 rule
def test_matrices_refuse_int64_indices_past_int32():
    ones, ptr = np.ones(1, np.float32), np.array([0, 1])
    for cls in (ops.CSR, ops.CSC):
        with pytest.raises(ValueError, match=rf"{cls.__name__}: 'indices' holds {_BIG}"):
            cls(ones, np.array([_BIG]), ptr, shape=(1, 4) if cls is ops.CSR else (4, 1))
        with pytest.raises(ValueError, match=rf"{cls.__name__}: 'indptr' holds {_BIG}"):
            cls(ones, np.array([0]), np.array([0, _BIG]),
                shape=(1, 4) if cls is ops.CSR else (4, 1))
    with pytest.raises(ValueError, match=rf"FixedNum: 'indices' holds {_BIG}"):
        ops.FixedNum(np.ones((1, 1), np.float32), np.array([[_BIG]]), shape=(1, 4))


def test_a_held_int64_matrix_flattened_into_jit_keeps_its_values():
    """int64 arrays in range: the pytree's leaves cast by jit keep their values."""
    W = ops.CSR(_CSR.data, np.asarray(_CSR.indices, np.int64),
                np.asarray(_CSR.indptr, np.int64), shape=(M, N))
    x = np.arange(M, dtype=np.float32)
    np.testing.assert_allclose(jax.jit(lambda W: x @ W)(W), x @ _DENSE, rtol=1e-6)


# ----------------------------------------------------------------------------- jitc blocks
_JM, _JN, _JP, _JSEED = 8, 6, 0.5, 1
_JD = ops.jitc_todense(_JSEED, (_JM, _JN), _JP, 1.0).astype(np.float64)


def _block_of(r0, h, c0, w):
    """``W[r0:r0+h, c0:c0+w]`` with the part outside ``W`` zero (NumPy)."""
    out = np.zeros((h, w))
    for i in range(h):
        for j in range(w):
            r, c = r0 + i, c0 + j
            if 0 <= r < _JM and 0 <= c < _JN:
                out[i, j] = _JD[r, c]
    return out


def test_negative_traced_row_start_keeps_the_rows_inside_W():
    y = jax.jit(lambda s: ops.jitc_matvec(1.0, 1, np.ones(4, np.float32), shape=(8, 4),
                                          prob=0.5, rows=(s, 4)))(jnp.int32(-2))
    dense = ops.jitc_todense(1, (8, 4), 0.5, 1.0)
    np.testing.assert_allclose(y, np.r_[0.0, 0.0, dense[:2].sum(axis=1)], rtol=1e-6)


def _check_block(backend, binary, matrix, transpose, r0, c0, h=4, w=3):
    f = {(False, False): ops.jitc_matvec, (True, False): ops.binary_jitc_matvec,
         (False, True): ops.jitc_matmat, (True, True): ops.binary_jitc_matmat}[binary, matrix]
    k = h if transpose else w
    x = np.random.default_rng(abs(r0) + 7 * abs(c0)).standard_normal(
        (k, 2) if matrix else k).astype(np.float32)
    if binary:
        x = x > 0
    B = _block_of(r0, h, c0, w)
    y = jax.jit(lambda r, c: f(1.0, _JSEED, x, shape=(_JM, _JN), prob=_JP, rows=(r, h),
                               cols=(c, w), transpose=transpose, backend=backend))(
        jnp.int32(r0), jnp.int32(c0))
    want = (B.T if transpose else B) @ x.astype(np.float64)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_blocks_starting_before_W_are_the_padded_slice(backend):
    for r0, c0, transpose in [(-2, 0, False), (0, -2, True), (-3, -1, True)]:
        _check_block(backend, False, False, transpose, r0, c0)


@pytest.mark.exhaustive
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("binary, matrix, transpose",
                         list(itertools.product((False, True), repeat=3)))
def test_every_block_start_traced_against_the_padded_slice(backend, binary, matrix,
                                                           transpose):
    starts = [(-2, 0), (0, -2), (-3, -2), (-4, 0), (0, -3), (-40, 1), (1, -40), (5, 4),
              (7, 5), (8, 0), (0, 6), (2**31 - 1, 0), (0, 2**31 - 1), (-2**31, -2**31)]
    for r0, c0 in starts:
        _check_block(backend, binary, matrix, transpose, r0, c0)


def test_a_concrete_start_outside_W_is_refused():
    with pytest.raises(ValueError, match=r"'rows' = \(-2, 4\) must lie in \[0, 8\]"):
        ops.jitc_matvec(1.0, 1, np.ones(4, np.float32), shape=(8, 4), prob=0.5, rows=(-2, 4))


# ----------------------------------------------------------------------------- 0-row blocks
def test_row_blocks_of_a_csr_without_rows_give_zero_products():
    blocks = ops.csr_row_blocks(ops.CSR.from_dense(np.zeros((0, 3), np.float32)), 2)
    assert blocks.block_shape == (0, 3)
    for backend in BACKENDS:
        for d, i, p in zip(blocks.data, blocks.indices, blocks.indptr):
            y = ops.csrmv(d, i, p, np.ones(3, np.float32), shape=(0, 3), backend=backend)
            assert y.shape == (0,)
            for f, x in ((ops.csrmv, np.ones(0, np.float32)),
                         (ops.binary_csrmv, np.ones(0, bool)),
                         (ops.csrmm, np.ones((0, 2), np.float32))):
                y = f(d, i, p, x, shape=(0, 3), transpose=True, backend=backend)
                np.testing.assert_array_equal(y, np.zeros((3,) + x.shape[1:]))
            y = ops.binary_csrmv_spikes(d, i, p, np.zeros(0, np.int32), shape=(0, 3),
                                        transpose=True, backend=backend)
            np.testing.assert_array_equal(y, np.zeros(3))
            def total(d, i=i, p=p, b=backend):
                return ops.csrmv(d, i, p, np.ones(0, np.float32), shape=(0, 3),
                                 transpose=True, backend=b).sum()

            g = jax.grad(total)(d)
            np.testing.assert_array_equal(g, np.zeros_like(d))
