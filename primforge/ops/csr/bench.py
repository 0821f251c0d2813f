"""Benchmark cases of the CSR kernels, imported only when benchmark data is asked for.

``CASES``, ``SEED`` and :func:`case` feed the four products (see
:meth:`primforge.ops._scaffold.Family.install`); :func:`weight_grad` the weight gradient,
:func:`indexed` and :func:`spike_lists` the spike-list product and its builder,
:func:`packed` the product on bit-packed events.
"""

from __future__ import annotations

import numpy as np

from primforge.bench import BenchmarkConfig
from primforge.ops import _scaffold, _spikes

__all__ = ["CASES", "PROB", "SEED", "case", "indexed", "indexed_mm", "packed", "random_csr",
           "spike_lists", "weight_grad"]

SEED = 1234
PROB = 0.05  # connection probability
# (n, transpose, shared weight): both sizes and directions, and one shared-weight case.
CASES = ((200, False, False), (200, True, True), (1000, False, False), (1000, True, False))


def random_csr(rs, n: int, prob: float):
    """A random ``n x n`` CSR structure (sorted columns) with per-synapse float32 weights."""
    mask = rs.random_sample((n, n)) < prob
    rows, cols = np.nonzero(mask)
    indptr = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(np.bincount(rows, minlength=n), out=indptr[1:])
    data = rs.standard_normal(cols.size).astype(np.float32)
    return data, cols.astype(np.int32), indptr


def case(rs, case, binary: bool, matrix: bool):
    """One product's ``(args, kwargs, params)`` for the entry ``case`` of ``CASES``."""
    n, transpose, shared = case
    data, indices, indptr = random_csr(rs, n, PROB)
    if shared:
        data = np.array([0.5], np.float32)
    x = _scaffold.bench_input(rs, n, binary, matrix)
    params = {"n": n, "p": PROB, "rate": _scaffold.BENCH_RATE, "transpose": transpose,
              "weight": "shared" if shared else "per-synapse"}
    if matrix:
        params["k"] = _scaffold.BENCH_COLS
    return (data, indices, indptr, x), {"shape": (n, n), "transpose": transpose}, params


def weight_grad(*, platform: str) -> list:
    """Both directions, binary and float events, vector and matrix inputs, with empty rows
    and a zero input row (square matrices, so the cotangent and input have one length)."""
    del platform
    out = []
    for i, (n, p) in enumerate(((1_000, 0.02), (4_000, 0.01))):
        rs = np.random.RandomState(7 + i)
        counts = rs.binomial(n, p, n)
        counts[::13] = 0  # empty rows
        indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
        indices = np.concatenate([np.sort(rs.choice(n, c, replace=False)) for c in counts])
        out += [BenchmarkConfig(args=(indices.astype(np.int32), indptr, ct, x), kwargs=flags,
                                params={"n": n, "p": p, **flags})
                for x, ct, flags in _scaffold.bench_grad_inputs(rs, n)]
    return out


def indexed(*, platform: str) -> list:
    """The spike-list product: both directions, a shared weight, a repeated index and
    entries past the count."""
    del platform
    out = []
    for i, (n, transpose, shared) in enumerate(CASES):
        rs = np.random.RandomState(SEED + 100 + i)
        data, indices, indptr = random_csr(rs, n, PROB)
        if shared:
            data = np.array([0.5], np.float32)
        spikes, count = _spikes.bench_list(rs, n)
        out.append(BenchmarkConfig(
            args=(data, indices, indptr, spikes, count),
            kwargs={"shape": (n, n), "transpose": transpose},
            params={"n": n, "p": PROB, "spikes": int(count), "transpose": transpose,
                    "weight": "shared" if shared else "per-synapse"}))
    return out


def spike_lists(*, platform: str) -> list:
    """Bool vectors compacted into spike lists (one list overflowing its capacity)."""
    del platform
    out = []
    for i, (n, cap) in enumerate(((1_000, 100), (10_000, 200), (10_000, 20))):
        events = np.random.RandomState(SEED + 200 + i).random_sample(n) < _scaffold.BENCH_RATE
        out.append(BenchmarkConfig(args=(events, cap), kwargs={},
                                   params={"n": n, "max_spikes": cap}))
    return out


def indexed_mm(*, platform: str) -> list:
    """Several spike lists at once: :func:`indexed`'s cases with lists of their own."""
    return _spikes.bench_lists(indexed(platform=platform), SEED)


def packed(*, platform: str) -> list:
    """The binary vector product on bit-packed events: :data:`CASES` with bool events
    (packed by the call), including a length that is not a multiple of 32."""
    del platform
    out = []
    for i, (n, transpose, shared) in enumerate(CASES):
        rs = np.random.RandomState(SEED + 400 + i)
        n = n + 7  # a partly filled last word
        data, indices, indptr = random_csr(rs, n, PROB)
        if shared:
            data = np.array([0.5], np.float32)
        events = rs.random_sample(n) < _scaffold.BENCH_RATE
        out.append(BenchmarkConfig(
            args=(data, indices, indptr, events),
            kwargs={"shape": (n, n), "transpose": transpose},
            params={"n": n, "p": PROB, "rate": _scaffold.BENCH_RATE, "transpose": transpose,
                    "weight": "shared" if shared else "per-synapse"}))
    return out
