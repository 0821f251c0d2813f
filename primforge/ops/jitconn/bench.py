"""Benchmark cases of the jitc kernels, imported only when benchmark data is asked for.

``CASES``, ``SEED`` and :func:`case` feed the four products (see
:meth:`primforge.ops._scaffold.Family.install`).
"""

from __future__ import annotations

import numpy as np

from primforge.ops import _scaffold

__all__ = ["CASES", "SEED", "case"]

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
