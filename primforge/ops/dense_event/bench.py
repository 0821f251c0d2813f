"""Benchmark cases of the dense event kernels, imported only when benchmark data is asked for.

``CASES``, ``SEED`` and :func:`case` feed the four products (see
:meth:`primforge.ops._scaffold.Family.install`).
"""

from __future__ import annotations

import numpy as np

from primforge.ops import _scaffold

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
        lst = rs.randint(0, n, int(2 * _scaffold.BENCH_RATE * n)).astype(np.int32)
        lst[1] = lst[0]
        count = np.int32(lst.size // 2)
        out.append(BenchmarkConfig(args=(w, lst, count), kwargs={"transpose": transpose},
                                   params={"n": n, "spikes": int(count),
                                           "transpose": transpose}))
    return out


def spikes_mm(*, platform: str) -> list:
    """Several spike lists at once: :func:`spikes`' cases with lists of their own."""
    from primforge.bench import BenchmarkConfig

    out = []
    for i, cfg in enumerate(spikes(platform=platform)):
        rs = np.random.RandomState(SEED + 300 + i)
        w, lst, _ = cfg.args
        lists = rs.randint(0, w.shape[0], (_scaffold.BENCH_COLS, lst.size))
        counts = rs.randint(0, lst.size + 1, _scaffold.BENCH_COLS).astype(np.int32)
        out.append(BenchmarkConfig(args=(w, lists.astype(np.int32), counts),
                                   kwargs=cfg.kwargs,
                                   params=dict(cfg.params, lists=_scaffold.BENCH_COLS)))
    return out
