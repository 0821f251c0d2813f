"""Benchmark cases of the jitc kernels, imported only when benchmark data is asked for.

``CASES``, ``SEED`` and :func:`case` feed the four products (see
:meth:`primforge.ops._scaffold.Family.install`); :func:`spikes` and :func:`spikes_mm` the
products taking spike lists.
"""

from __future__ import annotations

import numpy as np

from primforge.bench import BenchmarkConfig
from primforge.ops import _scaffold, _spikes

__all__ = ["CASES", "SEED", "case", "spikes", "spikes_mm"]

SEED = 4321
# (n, prob, transpose, weight_kind, seed)
CASES = ((1000, 0.05, False, "homo", 1234), (1000, 0.05, True, "homo", 1235),
         (2000, 0.02, True, "uniform", 1236), (2000, 0.02, False, "normal", 1237))


def case(rs, case, binary: bool, matrix: bool):
    """One product's ``(args, kwargs, params)`` for the entry ``case`` of ``CASES``."""
    n, prob, transpose, kind, seed = case
    x = _scaffold.bench_input(rs, n, binary, matrix)
    weight = np.float32(0.5) if kind == "homo" else np.array([0.1, 0.5], np.float32)
    params = {"n": n, "p": prob, "rate": _scaffold.BENCH_RATE, "transpose": transpose,
              "weight": kind}
    if matrix:
        params["k"] = _scaffold.BENCH_COLS
    kwargs = {"shape": (n, n), "prob": prob, "transpose": transpose, "weight_kind": kind}
    return (weight, seed, x), kwargs, params


def spikes(*, platform: str) -> list:
    """The spike-list product on :data:`CASES`' matrices: every weight kind, a repeated row
    and entries past the count."""
    del platform
    out = []
    for i, (n, prob, _, kind, seed) in enumerate(CASES):
        rs = np.random.RandomState(SEED + 100 + i)
        weight = np.float32(0.5) if kind == "homo" else np.array([0.1, 0.5], np.float32)
        lst, count = _spikes.bench_list(rs, n)
        out.append(BenchmarkConfig(
            args=(weight, seed, lst, count),
            kwargs={"shape": (n, n), "prob": prob, "weight_kind": kind},
            params={"n": n, "p": prob, "seed": seed, "spikes": int(count), "weight": kind}))
    return out


def spikes_mm(*, platform: str) -> list:
    """Several spike lists at once: :func:`spikes`' cases with lists of their own."""
    return _spikes.bench_lists(spikes(platform=platform), SEED)
