"""ops.jitc_numba_columns: the just-in-time generator as a Numba function for fused kernels.

The reference is :func:`primforge.ops.jitc_todense`, a plain Python loop over the generator's
definition, and the jitc product itself.
"""

import numpy as np
import pytest

numba = pytest.importorskip("numba")

from primforge.ops import binary_jitc_matvec, jitc_numba_columns, jitc_todense


@pytest.mark.parametrize("prob", [1.0, 0.5, 0.2, 0.03, 0.0007])
def test_rows_are_those_of_the_dense_matrix(prob):
    n = 700
    columns = jitc_numba_columns(prob)
    rows = np.random.default_rng(0).choice(5000, 6, replace=False)
    for seed in (0, 7, 2**32 - 1, 2**40 + 3):  # seeds are taken modulo 2**32
        dense = jitc_todense(seed, (5000, n), prob, rows=rows)
        for want, row in zip(dense, rows):
            out = np.full(n, -1, np.int64)
            count = columns(seed, int(row), n, out)
            np.testing.assert_array_equal(out[:count], np.flatnonzero(want))
            assert (out[count:] == -1).all()  # nothing written past the row


def test_a_fused_numba_kernel_reproduces_the_event_driven_product():
    """The use it is for: scatter the rows of active sources inside one's own kernel."""
    prob, shape, seed = 0.05, (300, 400), 12345
    columns = jitc_numba_columns(prob)

    @numba.njit
    def spikes_times_w(spikes, weight, out):
        buf = np.empty(out.shape[0], np.int64)
        for i in range(spikes.shape[0]):
            if spikes[i]:
                for k in range(columns(seed, i, out.shape[0], buf)):
                    out[buf[k]] += weight

    spikes = np.random.default_rng(1).random(shape[0]) < 0.2
    got = np.zeros(shape[1], np.float32)
    spikes_times_w(spikes, np.float32(0.25), got)
    want = binary_jitc_matvec(0.25, seed, spikes, shape=shape, prob=prob, transpose=True)
    np.testing.assert_array_equal(got, np.asarray(want))  # the same sums, bit for bit


def test_empty_and_one_column_matrices():
    columns = jitc_numba_columns(0.5)
    out = np.zeros(4, np.int64)
    assert columns(3, 0, 0, out) == 0
    got = [columns(3, r, 1, out) for r in range(200)]
    dense = jitc_todense(3, (200, 1), 0.5)[:, 0]
    np.testing.assert_array_equal(got, dense != 0)


@pytest.mark.parametrize("prob", [0.0, -0.1, 1.5, "x", 1e-9])
def test_bad_probabilities_are_refused(prob):
    with pytest.raises((ValueError, TypeError), match="prob"):
        jitc_numba_columns(prob)


def test_one_compiled_function_per_probability():
    assert jitc_numba_columns(0.3) is jitc_numba_columns(0.3)
    assert jitc_numba_columns(0.3) is not jitc_numba_columns(0.31)
