"""Close-match suggestions for error messages about unknown names."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["close_matches", "did_you_mean"]


def close_matches(name: object, candidates: Iterable[str], n: int = 3) -> list[str]:
    """The candidates closest to ``name`` (at most ``n``, best first; empty if none is close).

    A dotted candidate also matches by its last part, so ``'csrmv'`` finds
    ``'primforge.ops.csrmv'``.

    Example:
        >>> close_matches('nmuba', ['jax', 'numba', 'pallas'])
        ['numba']
        >>> close_matches('csrmc', ['primforge.ops.csrmv', 'primforge.ops.densemv'])
        ['primforge.ops.csrmv']
    """
    if not isinstance(name, str):
        return []
    full = sorted(set(candidates))
    short: dict[str, list[str]] = {}
    for c in full:
        short.setdefault(c.rsplit(".", 1)[-1], []).append(c)
    found = difflib.get_close_matches(name, full, n=n, cutoff=0.6)
    for s in difflib.get_close_matches(name.rsplit(".", 1)[-1], list(short), n=n, cutoff=0.6):
        found.extend(c for c in short[s] if c not in found)
    return found[:n]


def did_you_mean(name: object, candidates: Iterable[str]) -> str:
    """``" (did you mean 'x'?)"`` for the closest candidates, else ``''``.

    Example:
        >>> 'unknown backend' + did_you_mean('nmuba', ['jax', 'numba'])
        "unknown backend (did you mean 'numba'?)"
        >>> did_you_mean('zzz', ['jax', 'numba'])
        ''
    """
    found = close_matches(name, candidates)
    if not found:
        return ""
    return " (did you mean " + " or ".join(repr(f) for f in found) + "?)"
