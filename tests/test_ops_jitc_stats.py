"""Statistics of the just-in-time connectivity generator: its rows are independent Bernoulli rows.

The rows come from :func:`primforge.ops.jitc_numba_columns` (bitwise the rows of every jitc
product and of ``jitc_todense``, checked in ``test_ops_jitconn.py`` and
``test_ops_jitc_numba.py``), the weights from ``jitc_todense``. Every check uses fixed seeds
and fails only far in the tail of its null distribution (a p-value below 1e-6, or an event
of probability below 1e-6), so they do not flake; SciPy gives the reference distributions.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import scipy.stats as st

numba = pytest.importorskip("numba")

from primforge.ops import jitc_numba_columns, jitc_todense

TAIL = 1e-6  # every check fails with probability below this for independent rows
SEED = 2  # the rows of the checks on 2000 x 2000 matrices


@functools.cache
def _rows_runner(prob: float):
    columns = jitc_numba_columns(prob)

    @numba.njit
    def run(seed, m, n, gaps, counts, col_counts):
        buf = np.empty(n, np.int64)
        pos = 0
        for i in range(m):
            c = columns(seed, i, n, buf)
            prev = -1
            for t in range(c):
                gaps[pos + t] = buf[t] - prev - 1
                col_counts[buf[t]] += 1
                prev = buf[t]
            counts[i] = c
            pos += c
        return pos

    return run


@functools.cache
def gaps_of_rows(seed: int, shape: tuple[int, int], prob: float):
    """The gaps (columns skipped before each connection) of every row, concatenated, the
    number of connections of each row and the column counts (read-only)."""
    m, n = shape
    gaps = np.empty(m * n, np.int64)
    counts = np.empty(m, np.int64)
    col_counts = np.zeros(n, np.int64)
    total = _rows_runner(prob)(seed, m, n, gaps, counts, col_counts)
    out = gaps[:total].copy(), counts, col_counts
    for a in out:
        a.setflags(write=False)
    return out


def repeated_windows(gaps: np.ndarray, counts: np.ndarray, w: int) -> list[tuple[int, int]]:
    """Row pairs (possibly a row with itself) sharing a run of ``w`` consecutive gaps.

    Every window of ``w`` gaps inside a row is hashed (a sum of the gaps times random odd
    64-bit constants, wrapping), the hashes sorted and equal neighbours reported."""
    c = np.random.default_rng(0).integers(0, 2**63, size=w, dtype=np.uint64) | np.uint64(1)
    size = gaps.size - w + 1
    h = np.zeros(size, np.uint64)
    g = gaps.astype(np.uint64) + np.uint64(1)
    for k in range(w):
        h += g[k:k + size] * c[k]
    ends = np.cumsum(counts)
    row = np.repeat(np.arange(counts.size), counts)[:size]
    inside = np.flatnonzero(np.arange(size) + w <= ends[row])
    order = inside[np.argsort(h[inside], kind="stable")]
    same = np.flatnonzero(h[order[1:]] == h[order[:-1]])
    return [(int(row[order[i]]), int(row[order[i + 1]])) for i in same]


def window_for(prob: float, windows: int) -> int:
    """Gaps per window such that two independent windows among ``windows`` coincide with
    probability below TAIL: the chance that two geometric gaps are equal is
    ``sum_g (p q^g)^2 = p / (2 - p)``."""
    pairs = windows**2 / 2
    return math.ceil(math.log(TAIL / pairs) / math.log(prob / (2 - prob)))


def chi2_pvalue(observed: np.ndarray, pmf: np.ndarray) -> float:
    """Chi-square goodness of fit of counts to a distribution, neighbouring cells merged
    until each expects at least 5."""
    obs, exp, o, e = [], [], 0.0, 0.0
    for a, b in zip(observed, pmf * observed.sum()):
        o, e = o + a, e + b
        if e >= 5:
            obs.append(o)
            exp.append(e)
            o, e = 0.0, 0.0
    obs[-1] += o
    exp[-1] += e
    obs, exp = np.asarray(obs), np.asarray(exp)
    return float(st.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue)


# ----------------------------------------------------------------------------- shifted copies
@pytest.mark.parametrize("prob", [0.5, 0.1])
def test_no_row_is_a_shifted_copy_of_another(prob):
    """Rows as windows of one shared stream would repeat each other's gaps at an offset;
    independent rows share no long run of gaps anywhere (in another row or their own)."""
    m = n = 2000
    gaps, counts, _ = gaps_of_rows(SEED, (m, n), prob)
    w = window_for(prob, gaps.size)
    assert repeated_windows(gaps, counts, w) == []
    # The search itself finds a run copied from one row into another at another offset.
    ends = np.cumsum(counts)
    planted = gaps.copy()
    planted[ends[8] + 40:ends[8] + 40 + w] = gaps[ends[2] + 3:ends[2] + 3 + w]
    assert (3, 9) in repeated_windows(planted, counts, w)


def test_rows_of_a_pair_once_shifted_copies_share_no_run_of_gaps():
    """Rows 3241 and 3901 of this seed's 4000 x 4000 matrix would be shifted copies (1895 of
    one's 2026 gaps the other's, offset by 136) if every row read a window of one shared
    stream; they share no run of gaps."""
    prob = 0.5
    a, b = jitc_todense(20261123, (4000, 4000), prob, rows=[3241, 3901])
    gaps = np.concatenate([np.diff(np.r_[-1, np.flatnonzero(r)]) - 1 for r in (a, b)])
    counts = np.array([np.count_nonzero(a), np.count_nonzero(b)])
    assert repeated_windows(gaps, counts, window_for(prob, gaps.size)) == []


# ----------------------------------------------------------------------------- connections
@pytest.mark.parametrize("prob", [0.5, 0.1, 0.01])
def test_row_and_column_counts_are_binomial(prob):
    m = n = 2000
    _, counts, col_counts = gaps_of_rows(SEED, (m, n), prob)
    for observed, trials in ((counts, n), (col_counts, m)):
        hist = np.bincount(observed, minlength=trials + 1)
        assert chi2_pvalue(hist, st.binom.pmf(np.arange(trials + 1), trials, prob)) > TAIL


@pytest.mark.parametrize("prob", [0.5, 0.1, 0.01])
def test_gaps_are_geometric(prob):
    """The first ``k`` gaps of each row (every row has more than ``k`` connections, so the
    end of the row does not censor them) against the geometric distribution."""
    m = n = 2000
    gaps, counts, _ = gaps_of_rows(SEED, (m, n), prob)
    k = int(n * prob - 7 * math.sqrt(n * prob * (1 - prob)))
    assert counts.min() > k
    first = np.concatenate([gaps[e - c:e - c + k] for e, c in zip(np.cumsum(counts), counts)])
    hist = np.bincount(first)
    pmf = st.geom.pmf(np.arange(1, hist.size + 1), prob)
    pmf[-1] += st.geom.sf(hist.size, prob)
    assert chi2_pvalue(hist, pmf) > TAIL
    # Neighbouring gaps are uncorrelated.
    r = np.corrcoef(gaps[:-1], gaps[1:])[0, 1]
    assert abs(r) * math.sqrt(gaps.size) < 5


def test_rows_share_the_columns_of_independent_rows():
    """No two of 1000 rows overlap more than Binomial(n, p**2) allows (a near-copy would)."""
    m, n, prob = 1000, 2000, 0.5
    columns = jitc_numba_columns(prob)
    w = np.zeros((m, n), np.float32)
    out = np.empty(n, np.int64)
    for i in range(m):
        w[i, out[:columns(5, i, n, out)]] = 1
    overlap = (w @ w.T)[np.triu_indices(m, 1)]
    limit = st.binom.isf(TAIL / overlap.size, n, prob**2)
    assert overlap.max() <= limit and overlap.min() >= n * prob**2 - (limit - n * prob**2)


# ----------------------------------------------------------------------------- weights
@pytest.mark.parametrize("kind,theta,dist", [
    ("uniform", (-1.0, 3.0), st.uniform(-1.0, 4.0)),
    ("normal", (0.5, 2.0), st.norm(0.5, 2.0)),
])
def test_weights_follow_their_distribution(kind, theta, dist):
    shape, prob = (150, 400), 0.2
    mask = jitc_todense(21, shape, prob) != 0
    w = jitc_todense(21, shape, prob, theta, kind)
    np.testing.assert_array_equal(w != 0, mask)  # the connectivity is the weight kind's
    values = w[mask]
    assert st.kstest(values, dist.cdf).pvalue > TAIL
    # Successive weights of a row are uncorrelated.
    r = np.corrcoef(values[:-1], values[1:])[0, 1]
    assert abs(r) * math.sqrt(values.size) < 5
