"""Benchmark cases of the dense event kernels, imported only when benchmark data is asked for.

``CASES``, ``SEED`` and :func:`case` feed the four products (see
:meth:`primforge.ops._scaffold.Family.install`).
"""

from __future__ import annotations

import numpy as np

from primforge.ops import _scaffold, _spikes

__all__ = ["CASES", "SEED", "case", "spikes", "spikes_mm"]

SEED = 777
CASES = ((500, True), (500, False), (2000, True), (2000, False))  # (n, transpose)


def case(rs, case, binary: bool, matrix: bool):
    """One product's ``(args, kwargs, params)`` for the entry ``case`` of ``CASES``."""
    n, transpose = case
    w = rs.standard_normal((n, n)).astype(np.float32)
    x = _scaffold.bench_input(rs, n, binary, matrix)
    params = {"n": n, "rate": _scaffold.BENCH_RATE, "transpose": transpose}
    return (w, x), {"transpose": transpose}, params


def spikes(*, platform: str) -> list:
    """The spike-list product: both directions, a repeated index and entries past the
    count."""
    from primforge.bench import BenchmarkConfig

    del platform
    out = []
    for i, (n, transpose) in enumerate(CASES):
        rs = np.random.RandomState(SEED + 100 + i)
        w = rs.standard_normal((n, n)).astype(np.float32)
        lst, count = _spikes.bench_list(rs, n)
        out.append(BenchmarkConfig(args=(w, lst, count), kwargs={"transpose": transpose},
                                   params={"n": n, "spikes": int(count),
                                           "transpose": transpose}))
    return out


def spikes_mm(*, platform: str) -> list:
    """Several spike lists at once: :func:`spikes`' cases with lists of their own."""
    return _spikes.bench_lists(spikes(platform=platform), SEED)
