"""Benchmark records for people: an aligned text table and a PNG plot.

The plot imports matplotlib (the ``plot`` extra) only when called.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence

from primforge.backends._common import install_hint
from primforge.bench._format import format_seconds
from primforge.bench._io import make_parent
from primforge.bench._query import best_backends, unique
from primforge.bench._record import STATS, BenchmarkRecord

__all__ = ["plot_records", "render_table", "status"]

PLOT_MISSING = (
    "BenchmarkResult.plot needs matplotlib, which is not installed. Install it with "
    f"`{install_hint('plot')}` (or `pip install matplotlib`)."
)

#: Time columns that follow the chosen statistic's, in order.
_TIME_COLUMNS = ("median", "min", "p90", "std")


def status(r: BenchmarkRecord) -> str:
    """The one-line status cell of a record: ``ok``, ``FAILED: ...`` or ``MISMATCH ...``.

    Example:
        >>> status(BenchmarkRecord('k', 'c', 'alt', 'cpu', reference='jax',
        ...                        matches_reference=False, max_abs_diff=0.5))
        'MISMATCH vs jax (max |diff| 0.5)'
        >>> status(BenchmarkRecord('k', 'c', 'alt', 'cpu', success=False, error='E: a\\nb'))
        'FAILED: E: a b'
    """
    if not r.success:
        # One line in a table; the full message stays in the record.
        text = " ".join(str(r.error).split())
        return "FAILED: " + (text if len(text) <= 100 else text[:99] + "…")
    if r.matches_reference is False:
        return f"MISMATCH vs {r.reference}" + (
            f" (max |diff| {r.max_abs_diff:.3g})" if r.max_abs_diff is not None else ""
        )
    return "ok"


def render_table(
    records: Sequence[BenchmarkRecord],
    stat: str = "median",
    speedup_against: str | None = None,
    *,
    color: bool = False,
) -> str:
    """The text of :meth:`BenchmarkResult.table <primforge.bench.BenchmarkResult.table>`.

    Example:
        >>> print(render_table([BenchmarkRecord('k', 'c', 'jax', 'cpu', times=(1e-3,))]))
        kernel  config  backend  median  min   p90   std   compile  status
        k       c       jax      1 ms *  1 ms  1 ms  0 ns  -        ok
    """
    if stat not in STATS:
        raise ValueError(f"table: stat must be one of {STATS}, got {stat!r}")
    if not records:
        return "(no benchmark records)"
    backends = unique(r.backend for r in records)
    if speedup_against is None:
        refs = unique(r.reference for r in records if r.reference)
        speedup_against = refs[0] if len(refs) == 1 else ""
    elif speedup_against and speedup_against not in backends:
        raise ValueError(
            f"table: speedup_against={speedup_against!r} is not a backend of this result; "
            f"backends: {backends}"
        )
    shown = [stat, *(s for s in _TIME_COLUMNS if s != stat)]
    header = ["kernel", "config", "backend", *shown]
    header += ["compile"] + (["speedup"] if speedup_against else []) + ["status"]
    rows, is_best = _rows(records, stat, shown, speedup_against)
    return _align(header, rows, is_best, color=color)


def _rows(
    records: Sequence[BenchmarkRecord], stat: str, shown: list[str], speedup_against: str
) -> tuple[list[list[str]], list[bool]]:
    """The cells of every record's row, and whether the row is its config's fastest."""
    best = best_backends(records, stat)
    base: dict[tuple[str, str], float] = {}
    if speedup_against:
        for r in records:
            if r.backend == speedup_against and r.success:
                base[(r.kernel, r.config)] = r.stat(stat)
    rows, is_best = [], []
    for r in records:
        key = (r.kernel, r.config)
        win = best.get(key) == r.backend
        cells = [r.kernel, r.config, r.backend]
        for s in shown:
            text = format_seconds(r.stat(s)) if r.success else "-"
            cells.append(text + (" *" if win and s == stat else ""))
        cells.append(format_seconds(r.compile_time))
        if speedup_against:
            b, t = base.get(key), r.stat(stat)
            ok = r.success and b is not None and t > 0 and not math.isnan(b)
            cells.append(f"{b / t:.2f}x" if ok else "-")
        cells.append(status(r))
        rows.append(cells)
        is_best.append(win)
    return rows, is_best


def _align(header: list[str], rows: list[list[str]], is_best: list[bool], *, color: bool) -> str:
    """Columns padded to their widest cell; ``speedup`` right-aligned; best rows bold."""
    right = {"speedup"}
    widths = [max(len(h), *(len(c[i]) for c in rows)) for i, h in enumerate(header)]

    def line(cells):
        parts = [c.rjust(w) if h in right else c.ljust(w) for c, w, h in zip(cells, widths, header)]
        return "  ".join(parts).rstrip()

    out = [line(header)]
    for cells, win in zip(rows, is_best):
        text = line(cells)
        out.append(f"\033[1m{text}\033[0m" if color and win else text)
    return "\n".join(out)


def plot_records(
    records: Sequence[BenchmarkRecord],
    path: str | os.PathLike,
    *,
    stat: str = "median",
    kernels: Iterable[str] | None = None,
    dpi: int = 100,
) -> str:
    """Draw :meth:`BenchmarkResult.plot <primforge.bench.BenchmarkResult.plot>`'s PNG.

    Returns:
        the path written.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        raise ImportError(PLOT_MISSING) from e
    present = unique(r.kernel for r in records)
    if stat not in STATS:
        raise ValueError(f"plot: stat must be one of {STATS}, got {stat!r}")
    names = list(kernels) if kernels is not None else present
    unknown = [k for k in names if k not in present]
    if unknown:
        raise ValueError(f"plot: kernels {unknown} are not in this result ({present})")
    if not names:
        raise ValueError("plot: the result holds no records to plot")
    fig = Figure(figsize=(7, 3.5 * len(names)), dpi=dpi)
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(names), 1, squeeze=False)[:, 0]
    for ax, kernel in zip(axes, names):
        _draw_kernel(ax, [r for r in records if r.kernel == kernel], stat)
        ax.set_title(kernel)
    fig.tight_layout()
    path = os.fspath(path)
    make_parent(path)
    fig.savefig(path, format="png")
    return path


def _draw_kernel(ax, recs: list[BenchmarkRecord], stat: str) -> None:
    """One kernel's panel: a line per backend with a min..p90 band, log time axis."""
    configs = unique(r.config for r in recs)
    drew = False
    for backend in unique(r.backend for r in recs):
        pts = [
            (configs.index(r.config), r.stat(stat), r.min, r.p90)
            for r in recs
            if r.backend == backend and r.success and r.stat(stat) > 0
        ]
        if not pts:
            continue
        xs, ys, lo, hi = zip(*pts)
        bad = any(not r.ok for r in recs if r.backend == backend)
        label = backend + (" (mismatch/failed)" if bad else "")
        ax.plot(xs, [y * 1e6 for y in ys], marker="o", label=label, linestyle="--" if bad else "-")
        ax.fill_between(xs, [v * 1e6 for v in lo], [v * 1e6 for v in hi], alpha=0.2)
        drew = True
    ax.set_xticks(range(len(configs)))
    ax.set_xticklabels(configs, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(f"{stat} time per call (µs)")
    if drew:
        ax.set_yscale("log")
        ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
