"""Questions asked of a list of benchmark records: which records, which backend wins.

A record that failed or disagrees with its reference never wins; the winner has the lowest
geometric-mean time over the configs, among backends correct on all of them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from primforge.bench._record import BenchmarkRecord

__all__ = ["best_backends", "fastest_backend", "select", "unique"]


def unique(values: Iterable[Any]) -> list[Any]:
    """The distinct values, in order of first appearance.

    Example:
        >>> unique(['b', 'a', 'b', 'c', 'a'])
        ['b', 'a', 'c']
    """
    return list(dict.fromkeys(values))


def select(
    records: Iterable[BenchmarkRecord],
    *,
    kernel: str | None = None,
    backend: str | None = None,
    config: str | None = None,
    ok: bool | None = None,
) -> list[BenchmarkRecord]:
    """The records matching every criterion that is not None.

    Example:
        >>> recs = [BenchmarkRecord('k', 'c', 'jax', 'cpu'),
        ...         BenchmarkRecord('k', 'c', 'bad', 'cpu', success=False)]
        >>> [r.backend for r in select(recs, ok=False)]
        ['bad']
    """
    return [
        r
        for r in records
        if (kernel is None or r.kernel == kernel)
        and (backend is None or r.backend == backend)
        and (config is None or r.config == config)
        and (ok is None or r.ok == ok)
    ]


def best_backends(
    records: Iterable[BenchmarkRecord], stat: str = "median"
) -> dict[tuple[str, str], str]:
    """The fastest correct backend for each (kernel, config); ties keep the first.

    Example:
        >>> recs = [BenchmarkRecord('k', 'c', 'jax', 'cpu', times=(2e-6,)),
        ...         BenchmarkRecord('k', 'c', 'alt', 'cpu', times=(1e-6,))]
        >>> best_backends(recs)
        {('k', 'c'): 'alt'}
    """
    out: dict[tuple[str, str], str] = {}
    best_t: dict[tuple[str, str], float] = {}
    for r in records:
        t = r.stat(stat)
        if not r.ok or math.isnan(t):
            continue
        key = (r.kernel, r.config)
        if key not in best_t or t < best_t[key]:
            best_t[key], out[key] = t, r.backend
    return out


def fastest_backend(
    records: Sequence[BenchmarkRecord], kernel: str, stat: str = "median"
) -> str | None:
    """The backend of ``kernel`` with the lowest geometric-mean time over its configs.

    Only backends with a correct record on every config of the kernel compete; None when
    no backend qualifies.

    Example:
        >>> recs = [BenchmarkRecord('k', 'a', 'jax', 'cpu', times=(1e-6,)),
        ...         BenchmarkRecord('k', 'b', 'jax', 'cpu', times=(9e-6,)),
        ...         BenchmarkRecord('k', 'a', 'alt', 'cpu', times=(3e-6,)),
        ...         BenchmarkRecord('k', 'b', 'alt', 'cpu', times=(2e-6,))]
        >>> fastest_backend(recs, 'k')
        'alt'
    """
    recs = [r for r in records if r.kernel == kernel]
    configs = unique(r.config for r in recs)
    scores: dict[str, float] = {}
    for backend in unique(r.backend for r in recs):
        mine = {r.config: r for r in recs if r.backend == backend}
        if set(mine) != set(configs):
            continue
        times = [mine[c].stat(stat) for c in configs]
        if not all(mine[c].ok for c in configs) or any(math.isnan(t) or t <= 0 for t in times):
            continue
        scores[backend] = sum(math.log(t) for t in times) / len(times)
    return min(scores, key=scores.__getitem__) if scores else None
