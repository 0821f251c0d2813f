"""Small formatting helpers shared by tables, progress lines and the CLI."""

from __future__ import annotations

import math

__all__ = ["format_seconds"]


def format_seconds(t: float | None) -> str:
    """A duration in the unit that keeps three significant digits readable.

    Example:
        >>> format_seconds(1.234e-5), format_seconds(0.5), format_seconds(2.0)
        ('12.3 µs', '500 ms', '2.00 s')
        >>> format_seconds(None)
        '-'
    """
    if t is None or (isinstance(t, float) and math.isnan(t)):
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if abs(t) >= scale:
            return f"{t / scale:.3g} {unit}" if unit != "s" else f"{t:.2f} s"
    return f"{t / 1e-9:.3g} ns"
