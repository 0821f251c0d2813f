"""Benchmark cases of the fixed-number kernels, imported only when benchmark data is asked for.

``CASES``, ``SEED`` and :func:`case` feed the four products (see
:meth:`primforge.ops._scaffold.Family.install`); :func:`weight_grad` the weight gradient,
:func:`packed` the product on bit-packed events.
"""

from __future__ import annotations

import numpy as np

from primforge.bench import BenchmarkConfig
from primforge.ops import _scaffold, _spikes

__all__ = ["CASES", "SEED", "case", "packed", "spikes", "spikes_mm", "weight_grad"]

SEED = 4321
CASES = ((1000, 20, False, True), (1000, 20, True, False), (5000, 50, True, True),
         (5000, 50, False, False))  # (n, k, transpose, shared weight)


def case(rs, case, binary: bool, matrix: bool):
    """One product's ``(args, kwargs, params)`` for the entry ``case`` of ``CASES``."""
    n, k, transpose, shared = case
    ind = rs.randint(0, n, size=(n, k)).astype(np.int32)
    w = np.array([0.5], np.float32) if shared else rs.standard_normal((n, k)).astype(np.float32)
    x = _scaffold.bench_input(rs, n, binary, matrix)
    params = {"n": n, "k": k, "rate": _scaffold.BENCH_RATE, "transpose": transpose,
              "weight": "shared" if shared else "per-synapse"}
    return (w, ind, x), {"shape": (n, n), "transpose": transpose}, params


def weight_grad(*, platform: str) -> list:
    """Both directions, binary and float events, vector and matrix inputs, with masked
    slots (-1 and n) and silent sources (square, so the cotangent and input have one length)."""
    del platform
    out = []
    for i, (n, k) in enumerate(((1_000, 20), (4_000, 40))):
        rs = np.random.RandomState(17 + i)
        indices = rs.randint(0, n, (n, k)).astype(np.int32)
        indices[::7, -1] = -1
        indices[::11, 0] = n
        out += [BenchmarkConfig(args=(indices, ct, x), kwargs=flags,
                                params={"n": n, "k": k, **flags})
                for x, ct, flags in _scaffold.bench_grad_inputs(rs, n)]
    return out


def spikes(*, platform: str) -> list:
    """The spike-list product: both directions, a shared weight, masked slots, a repeated
    index and entries past the count."""
    del platform
    out = []
    for i, (n, k, transpose, shared) in enumerate(CASES):
        rs = np.random.RandomState(SEED + 100 + i)
        ind = rs.randint(0, n, size=(n, k)).astype(np.int32)
        ind[::7, -1] = -1
        w = np.array([0.5], np.float32) if shared else rs.standard_normal((n, k)).astype(
            np.float32)
        lst, count = _spikes.bench_list(rs, n)
        out.append(BenchmarkConfig(
            args=(w, ind, lst, count), kwargs={"shape": (n, n), "transpose": transpose},
            params={"n": n, "k": k, "spikes": int(count), "transpose": transpose,
                    "weight": "shared" if shared else "per-synapse"}))
    return out


def spikes_mm(*, platform: str) -> list:
    """Several spike lists at once: :func:`spikes`' cases with lists of their own."""
    return _spikes.bench_lists(spikes(platform=platform), SEED)


def packed(*, platform: str) -> list:
    """The binary vector product on bit-packed events: :data:`CASES` with bool events
    (packed by the call), a length that is not a multiple of 32 and masked slots."""
    del platform
    out = []
    for i, (n, k, transpose, shared) in enumerate(CASES):
        rs = np.random.RandomState(SEED + 400 + i)
        n = n + 7  # a partly filled last word
        ind = rs.randint(0, n, size=(n, k)).astype(np.int32)
        ind[::7, -1] = -1
        w = np.array([0.5], np.float32) if shared else rs.standard_normal((n, k)).astype(
            np.float32)
        events = rs.random_sample(n) < _scaffold.BENCH_RATE
        out.append(BenchmarkConfig(
            args=(w, ind, events), kwargs={"shape": (n, n), "transpose": transpose},
            params={"n": n, "k": k, "rate": _scaffold.BENCH_RATE, "transpose": transpose,
                    "weight": "shared" if shared else "per-synapse"}))
    return out
