"""A collection of benchmark records: tables, best backends, JSON/CSV files and plots.

Design: :class:`BenchmarkResult` is a thin, ordered list of
:class:`~primforge.bench.BenchmarkRecord` that may span several kernels (the CLI merges the
results of every kernel it benchmarks). Everything else is a view of those records: the
aligned table marks the fastest backend of each config with ``*`` and shows the speedup
against a chosen backend; ``save``/``load`` pick JSON or CSV from the file's extension and
round-trip exactly; ``plot`` needs matplotlib (the ``plot`` extra) and draws time against
config, one line per backend.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from collections.abc import Iterable, Iterator
from typing import Any

from primforge.bench._format import format_seconds
from primforge.bench._record import STATS, BenchmarkRecord

__all__ = ["BenchmarkResult"]

_FORMAT = "primforge-benchmark"
_VERSION = 1

_CSV_FIELDS = (
    "kernel", "config", "backend", "platform", "success", "error", "n_runs", *STATS,
    "compile_time", "n_warmup", "n_batch_per_run", "reference", "matches_reference",
    "max_abs_diff", "mismatch", "params", "times",
)

_PLOT_MISSING = (
    "BenchmarkResult.plot needs matplotlib, which is not installed. Install it with "
    "`pip install primforge[plot]` (or `pip install matplotlib`)."
)


def _unique(values: Iterable[Any]) -> list[Any]:
    return list(dict.fromkeys(values))


def _parse_bool(s: str) -> bool | None:
    if s == "":
        return None
    if s in ("True", "true", "1"):
        return True
    if s in ("False", "false", "0"):
        return False
    raise ValueError(f"expected a boolean, got {s!r}")


def _parse_float(s: str) -> float | None:
    return None if s == "" else float(s)


def _parse_str(s: str) -> str | None:
    return None if s == "" else s


class BenchmarkResult:
    """Benchmark records of one or more kernels, with views for people and files.

    Args:
        records: the :class:`BenchmarkRecord` s, in the order they were measured.
        platform: the platform they ran on (informational).
        meta: free-form information saved with the records (versions, host, ...).

    Example:
        >>> from primforge.bench import BenchmarkRecord, BenchmarkResult
        >>> res = BenchmarkResult([
        ...     BenchmarkRecord('k', 'n=10', 'jax', 'cpu', times=(4e-6, 4e-6)),
        ...     BenchmarkRecord('k', 'n=10', 'fast', 'cpu', times=(2e-6, 2e-6)),
        ... ])
        >>> res.best()
        {('k', 'n=10'): 'fast'}
        >>> res.fastest_backend('k')
        'fast'
        >>> print(res.table(speedup_against='jax'))
        kernel  config  backend  median   min      p90      std     compile  speedup  status
        k       n=10    jax      4 µs     4 µs     4 µs     0 ns    -          1.00x  ok
        k       n=10    fast     2 µs *   2 µs     2 µs     0 ns    -          2.00x  ok
    """

    def __init__(
        self,
        records: Iterable[BenchmarkRecord] = (),
        *,
        platform: str | None = None,
        meta: dict[str, Any] | None = None,
    ):
        self.records: list[BenchmarkRecord] = list(records)
        for r in self.records:
            if not isinstance(r, BenchmarkRecord):
                raise TypeError(
                    f"BenchmarkResult: records must be BenchmarkRecord, got {type(r).__name__}"
                )
        if platform is None:
            platforms = _unique(r.platform for r in self.records)
            platform = platforms[0] if len(platforms) == 1 else None
        self.platform = platform
        self.meta = dict(meta or {})

    # ------------------------------------------------------------------ container
    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self) -> Iterator[BenchmarkRecord]:
        return iter(self.records)

    def __getitem__(self, i: int) -> BenchmarkRecord:
        return self.records[i]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BenchmarkResult):
            return NotImplemented
        return self.records == other.records and self.platform == other.platform

    def __add__(self, other: BenchmarkResult) -> BenchmarkResult:
        if not isinstance(other, BenchmarkResult):
            return NotImplemented
        return BenchmarkResult.merge([self, other])

    def __repr__(self) -> str:
        return (
            f"BenchmarkResult({len(self.records)} records, kernels={self.kernels}, "
            f"backends={self.backends}, platform={self.platform!r})"
        )

    def __str__(self) -> str:
        return self.table()

    @classmethod
    def merge(cls, results: Iterable[BenchmarkResult]) -> BenchmarkResult:
        """Concatenate several results (e.g. one per kernel) into one.

        Example:
            >>> from primforge.bench import BenchmarkRecord
            >>> a = BenchmarkResult([BenchmarkRecord('a', 'c', 'jax', 'cpu')])
            >>> b = BenchmarkResult([BenchmarkRecord('b', 'c', 'jax', 'cpu')])
            >>> BenchmarkResult.merge([a, b]).kernels
            ['a', 'b']
        """
        results = list(results)
        meta: dict[str, Any] = {}
        for r in results:
            meta.update(r.meta)
        return cls([rec for r in results for rec in r.records], meta=meta)

    @property
    def kernels(self) -> list[str]:
        """Kernel names, in order of first appearance."""
        return _unique(r.kernel for r in self.records)

    @property
    def backends(self) -> list[str]:
        """Backend names, in order of first appearance."""
        return _unique(r.backend for r in self.records)

    @property
    def configs(self) -> list[str]:
        """Config names, in order of first appearance."""
        return _unique(r.config for r in self.records)

    def filter(
        self,
        *,
        kernel: str | None = None,
        backend: str | None = None,
        config: str | None = None,
        ok: bool | None = None,
    ) -> BenchmarkResult:
        """The records matching every given criterion.

        Example:
            >>> from primforge.bench import BenchmarkRecord
            >>> res = BenchmarkResult([BenchmarkRecord('k', 'c', 'jax', 'cpu'),
            ...                        BenchmarkRecord('k', 'c', 'bad', 'cpu', success=False)])
            >>> [r.backend for r in res.filter(ok=True)]
            ['jax']
        """
        return BenchmarkResult(
            [
                r
                for r in self.records
                if (kernel is None or r.kernel == kernel)
                and (backend is None or r.backend == backend)
                and (config is None or r.config == config)
                and (ok is None or r.ok == ok)
            ],
            platform=self.platform,
            meta=self.meta,
        )

    def failures(self) -> list[BenchmarkRecord]:
        """Records whose backend raised."""
        return [r for r in self.records if not r.success]

    def mismatches(self) -> list[BenchmarkRecord]:
        """Records whose output disagreed with the reference backend."""
        return [r for r in self.records if r.matches_reference is False]

    # ------------------------------------------------------------------ analysis
    def best(self, stat: str = "median") -> dict[tuple[str, str], str]:
        """The fastest correct backend for each (kernel, config).

        Records that failed or disagree with the reference never win.
        """
        out: dict[tuple[str, str], str] = {}
        best_t: dict[tuple[str, str], float] = {}
        for r in self.records:
            t = r.stat(stat)
            if not r.ok or math.isnan(t):
                continue
            key = (r.kernel, r.config)
            if key not in best_t or t < best_t[key]:
                best_t[key], out[key] = t, r.backend
        return out

    def fastest_backend(self, kernel: str | None = None, stat: str = "median") -> str | None:
        """The backend with the lowest geometric-mean time over a kernel's configs.

        Only backends that ran correctly on every config of the kernel compete. With one
        kernel in the result ``kernel`` may be omitted. Returns None if no backend qualifies.
        """
        if kernel is None:
            if len(self.kernels) != 1:
                raise ValueError(
                    f"fastest_backend: this result holds kernels {self.kernels}; pass kernel="
                )
            kernel = self.kernels[0]
        recs = [r for r in self.records if r.kernel == kernel]
        configs = _unique(r.config for r in recs)
        scores: dict[str, float] = {}
        for backend in _unique(r.backend for r in recs):
            mine = {r.config: r for r in recs if r.backend == backend}
            if set(mine) != set(configs):
                continue
            times = [mine[c].stat(stat) for c in configs]
            if not all(mine[c].ok for c in configs) or any(
                math.isnan(t) or t <= 0 for t in times
            ):
                continue
            scores[backend] = sum(math.log(t) for t in times) / len(times)
        return min(scores, key=scores.__getitem__) if scores else None

    # ------------------------------------------------------------------ table
    def table(
        self,
        stat: str = "median",
        speedup_against: str | None = None,
        *,
        color: bool = False,
    ) -> str:
        """An aligned text table, one row per record.

        Args:
            stat: the statistic used to pick the best backend (marked ``*``) and speedups.
            speedup_against: backend whose time is the 1.00x baseline of a ``speedup``
                column, per (kernel, config); defaults to the records' reference backend
                when they have one. Pass ``''`` for no speedup column.
            color: highlight the best row in bold (ANSI escapes; for terminals).

        Returns:
            The table; the column of ``stat`` comes first among the times.

        Example:
            >>> from primforge.bench import BenchmarkRecord, BenchmarkResult
            >>> res = BenchmarkResult([
            ...     BenchmarkRecord('k', 'n=10', 'jax', 'cpu', times=(1e-6, 9e-6, 2e-6)),
            ...     BenchmarkRecord('k', 'n=10', 'alt', 'cpu', times=(3e-6, 3e-6, 3e-6)),
            ... ])
            >>> print(res.table(stat='mean', speedup_against='jax'))
            kernel  config  backend  mean    median  min     p90       std       compile  speedup  status
            k       n=10    jax      4 µs    2 µs    1 µs    7.6 µs    3.56 µs   -          1.00x  ok
            k       n=10    alt      3 µs *  3 µs    3 µs    3 µs      0 ns      -          1.33x  ok
        """
        if stat not in STATS:
            raise ValueError(f"table: stat must be one of {STATS}, got {stat!r}")
        if not self.records:
            return "(no benchmark records)"
        if speedup_against is None:
            refs = _unique(r.reference for r in self.records if r.reference)
            speedup_against = refs[0] if len(refs) == 1 else ""
        elif speedup_against and speedup_against not in self.backends:
            raise ValueError(
                f"table: speedup_against={speedup_against!r} is not a backend of this result; "
                f"backends: {self.backends}"
            )
        best = self.best(stat)
        base: dict[tuple[str, str], float] = {}
        if speedup_against:
            for r in self.records:
                if r.backend == speedup_against and r.success:
                    base[(r.kernel, r.config)] = r.stat(stat)
        # The chosen statistic is the first time column (the one the best marker and the
        # speedups follow), then the usual others.
        shown = [stat, *(s for s in ("median", "min", "p90", "std") if s != stat)]
        header = ["kernel", "config", "backend", *shown]
        header += ["compile"] + (["speedup"] if speedup_against else []) + ["status"]
        rows, is_best = [], []
        for r in self.records:
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
            cells.append(_status(r))
            rows.append(cells)
            is_best.append(win)
        right = {"speedup"}
        widths = [max(len(h), *(len(c[i]) for c in rows)) for i, h in enumerate(header)]

        def line(cells):
            parts = [
                c.rjust(w) if h in right else c.ljust(w)
                for c, w, h in zip(cells, widths, header)
            ]
            return "  ".join(parts).rstrip()

        out = [line(header)]
        for cells, win in zip(rows, is_best):
            text = line(cells)
            out.append(f"\033[1m{text}\033[0m" if color and win else text)
        return "\n".join(out)

    # ------------------------------------------------------------------ serialisation
    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the records, platform and meta.

        Example:
            >>> from primforge.bench import BenchmarkRecord
            >>> d = BenchmarkResult([BenchmarkRecord('k', 'c', 'jax', 'cpu')]).to_dict()
            >>> d['platform'], d['records'][0]['backend']
            ('cpu', 'jax')
        """
        return {
            "format": _FORMAT,
            "version": _VERSION,
            "platform": self.platform,
            "meta": self.meta,
            "records": [r.to_dict() for r in self.records],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BenchmarkResult:
        """Rebuild a result from :meth:`to_dict` output."""
        if not isinstance(d, dict) or "records" not in d:
            raise ValueError("BenchmarkResult.from_dict: expected a dict with a 'records' list")
        if d.get("format", _FORMAT) != _FORMAT:
            raise ValueError(f"not a primforge benchmark file (format {d.get('format')!r})")
        return cls(
            [BenchmarkRecord.from_dict(r) for r in d["records"]],
            platform=d.get("platform"),
            meta=d.get("meta"),
        )

    def to_json(self) -> str:
        """The result as a JSON document (see :meth:`save`)."""
        return json.dumps(self.to_dict(), indent=2, ensure_ascii=False)

    def to_csv(self) -> str:
        """The result as CSV, one row per record; ``params`` and ``times`` are JSON cells.

        Example:
            >>> from primforge.bench import BenchmarkRecord
            >>> text = BenchmarkResult([BenchmarkRecord('k', 'c', 'jax', 'cpu')]).to_csv()
            >>> text.splitlines()[0].split(',')[:4]
            ['kernel', 'config', 'backend', 'platform']
        """
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=_CSV_FIELDS, lineterminator="\n")
        writer.writeheader()
        for r in self.records:
            d = r.to_dict()
            row = {k: ("" if d[k] is None else d[k]) for k in _CSV_FIELDS}
            row["params"] = json.dumps(r.params)
            row["times"] = json.dumps(list(r.times))
            for k in (*STATS, "compile_time", "max_abs_diff"):
                if d[k] is not None:
                    row[k] = repr(float(d[k]))
            writer.writerow(row)
        return buf.getvalue()

    @classmethod
    def from_csv(cls, text: str) -> BenchmarkResult:
        """Parse :meth:`to_csv` output."""
        records = []
        for i, row in enumerate(csv.DictReader(io.StringIO(text))):
            try:
                records.append(
                    BenchmarkRecord(
                        kernel=row["kernel"],
                        config=row["config"],
                        backend=row["backend"],
                        platform=row["platform"],
                        params=json.loads(row["params"] or "{}"),
                        success=bool(_parse_bool(row["success"])),
                        error=_parse_str(row["error"]),
                        times=tuple(json.loads(row["times"] or "[]")),
                        compile_time=_parse_float(row["compile_time"]),
                        n_warmup=int(row["n_warmup"] or 0),
                        n_batch_per_run=int(row["n_batch_per_run"] or 1),
                        reference=_parse_str(row["reference"]),
                        matches_reference=_parse_bool(row["matches_reference"]),
                        max_abs_diff=_parse_float(row["max_abs_diff"]),
                        mismatch=_parse_str(row["mismatch"]),
                    )
                )
            except (KeyError, ValueError) as e:
                raise ValueError(f"benchmark CSV row {i + 1} is malformed: {e}") from None
        return cls(records)

    def save(self, path: str | os.PathLike) -> str:
        """Write the result to ``path``: ``.json`` or ``.csv`` by extension.

        Returns:
            the path written.
        """
        path = os.fspath(path)
        kind = _kind(path)
        text = self.to_json() if kind == "json" else self.to_csv()
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        with open(path, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> BenchmarkResult:
        """Read a result written by :meth:`save` (``.json`` or ``.csv``)."""
        path = os.fspath(path)
        kind = _kind(path)
        with open(path, encoding="utf-8", newline="") as f:
            text = f.read()
        if kind == "json":
            return cls.from_dict(json.loads(text))
        return cls.from_csv(text)

    # ------------------------------------------------------------------ plot
    def plot(
        self,
        path: str | os.PathLike,
        *,
        stat: str = "median",
        kernels: Iterable[str] | None = None,
        dpi: int = 100,
    ) -> str:
        """Write a PNG of time per config, one line per backend, one panel per kernel.

        The shaded band spans the fastest run to the 90th percentile. Needs matplotlib
        (``pip install primforge[plot]``).

        Returns:
            the path written.
        """
        try:
            from matplotlib.backends.backend_agg import FigureCanvasAgg
            from matplotlib.figure import Figure
        except ImportError as e:
            raise ImportError(_PLOT_MISSING) from e
        if stat not in STATS:
            raise ValueError(f"plot: stat must be one of {STATS}, got {stat!r}")
        names = list(kernels) if kernels is not None else self.kernels
        unknown = [k for k in names if k not in self.kernels]
        if unknown:
            raise ValueError(f"plot: kernels {unknown} are not in this result ({self.kernels})")
        if not names:
            raise ValueError("plot: the result holds no records to plot")
        fig = Figure(figsize=(7, 3.5 * len(names)), dpi=dpi)
        FigureCanvasAgg(fig)
        axes = fig.subplots(len(names), 1, squeeze=False)[:, 0]
        for ax, kernel in zip(axes, names):
            recs = [r for r in self.records if r.kernel == kernel]
            configs = _unique(r.config for r in recs)
            drew = False
            for backend in _unique(r.backend for r in recs):
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
                ax.plot(xs, [y * 1e6 for y in ys], marker="o", label=label,
                        linestyle="--" if bad else "-")
                ax.fill_between(xs, [v * 1e6 for v in lo], [v * 1e6 for v in hi], alpha=0.2)
                drew = True
            ax.set_xticks(range(len(configs)))
            ax.set_xticklabels(configs, rotation=30, ha="right", fontsize=8)
            ax.set_ylabel(f"{stat} time per call (µs)")
            ax.set_title(kernel)
            if drew:
                ax.set_yscale("log")
                ax.legend(fontsize=8)
            ax.grid(True, alpha=0.3)
        fig.tight_layout()
        path = os.fspath(path)
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        fig.savefig(path, format="png")
        return path


def _status(r: BenchmarkRecord) -> str:
    if not r.success:
        # One line in a table; the full message stays in the record.
        text = " ".join(str(r.error).split())
        return "FAILED: " + (text if len(text) <= 100 else text[:99] + "…")
    if r.matches_reference is False:
        return f"MISMATCH vs {r.reference}" + (
            f" (max |diff| {r.max_abs_diff:.3g})" if r.max_abs_diff is not None else ""
        )
    return "ok"


def _kind(path: str) -> str:
    ext = os.path.splitext(path)[1].lower()
    if ext == ".json":
        return "json"
    if ext == ".csv":
        return "csv"
    raise ValueError(f"benchmark file {path!r}: expected a .json or .csv extension")
