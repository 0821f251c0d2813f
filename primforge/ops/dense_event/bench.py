"""Benchmark cases of the dense event kernels, imported only when benchmark data is asked for.

``CASES``, ``SEED`` and :func:`case` feed the four products (see
:meth:`primforge.ops._scaffold.Family.install`).
"""

from __future__ import annotations

import numpy as np

from primforge.ops import _scaffold

__all__ = ["CASES", "SEED", "case"]

SEED = 777
CASES = ((500, True), (500, False), (2000, True), (2000, False))  # (n, transpose)


def case(rs, case, binary: bool, matrix: bool):
    """One product's ``(args, kwargs, params)`` for the entry ``case`` of ``CASES``."""
    n, transpose = case
    w = rs.standard_normal((n, n)).astype(np.float32)
    x = _scaffold.bench_input(rs, n, binary, matrix)
    params = {"n": n, "rate": _scaffold.BENCH_RATE, "transpose": transpose}
    return (w, x), {"transpose": transpose}, params
