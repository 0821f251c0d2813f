"""Benchmark cases of the plasticity kernels, imported only when benchmark data is asked for.

:func:`compressed` feeds ``compressed_update_p``, :func:`dense` feeds ``dense_update_p``.
"""

from __future__ import annotations

import numpy as np

from primforge.bench import BenchmarkConfig
from primforge.ops.column_index import with_column_index
from primforge.ops.connectivity import fixed_prob

__all__ = ["CASES", "RATE", "compressed", "dense"]

CASES = ((2_000, 0.02), (10_000, 0.01))  # (n, p) of the compressed cases
RATE = 0.02  # fraction of neurons that spike


def compressed(*, platform: str) -> list:
    """Row-side and column-side updates of a random CSR matrix, with and without an index."""
    del platform
    out = []
    for i, (n, p) in enumerate(CASES):
        W = fixed_prob(n, n, p, weight=0.5, seed=11 + i)
        rs = np.random.RandomState(5 + i)
        data = rs.random_sample(W.nnz).astype(np.float32)
        index = tuple(np.asarray(a) for a in with_column_index(W).index)
        for on_rows, indexed in ((True, False), (False, False), (False, True)):
            spikes = rs.random_sample(n) < RATE
            trace = rs.standard_normal(n).astype(np.float32) * 0.01
            out.append(BenchmarkConfig(
                args=(data, np.asarray(W.indices), np.asarray(W.indptr), spikes, trace,
                      *(index if indexed else ())),
                kwargs={"shape": (n, n), "on_rows": on_rows, "w_min": 0.0, "w_max": 1.0},
                params={"n": n, "p": p, "rate": RATE, "on_rows": on_rows,
                        "column_index": indexed}))
    return out


def dense(*, platform: str) -> list:
    """Row-side and column-side updates of a dense matrix."""
    del platform
    out = []
    for i, n in enumerate((500, 2_000)):
        rs = np.random.RandomState(23 + i)
        weights = rs.random_sample((n, n)).astype(np.float32)
        for on_rows in (True, False):
            spikes = rs.random_sample(n) < RATE
            trace = rs.standard_normal(n).astype(np.float32) * 0.01
            out.append(BenchmarkConfig(
                args=(weights, spikes, trace),
                kwargs={"on_rows": on_rows, "w_min": 0.0, "w_max": 1.0},
                params={"n": n, "rate": RATE, "on_rows": on_rows}))
    return out
