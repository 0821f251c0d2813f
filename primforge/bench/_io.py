"""Benchmark records to and from files: a JSON document or a CSV table.

Both formats round-trip exactly; the file's extension picks the format.
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Iterable
from typing import Any

from primforge.bench._record import STATS, BenchmarkRecord

__all__ = [
    "CSV_FIELDS",
    "document",
    "file_kind",
    "make_parent",
    "parse_document",
    "read_text",
    "records_from_csv",
    "records_to_csv",
    "write_text",
]

FORMAT = "primforge-benchmark"
VERSION = 1

#: The CSV columns, in order.
CSV_FIELDS = (
    "kernel",
    "config",
    "backend",
    "platform",
    "success",
    "error",
    "n_runs",
    *STATS,
    "compile_time",
    "n_warmup",
    "n_batch_per_run",
    "reference",
    "matches_reference",
    "max_abs_diff",
    "mismatch",
    "params",
    "times",
)


def document(
    records: Iterable[BenchmarkRecord], platform: str | None, meta: dict[str, Any]
) -> dict[str, Any]:
    """The JSON-ready dict of a result.

    Example:
        >>> d = document([BenchmarkRecord('k', 'c', 'jax', 'cpu')], 'cpu', {})
        >>> d['format'], d['version'], d['records'][0]['kernel']
        ('primforge-benchmark', 1, 'k')
    """
    return {
        "format": FORMAT,
        "version": VERSION,
        "platform": platform,
        "meta": meta,
        "records": [r.to_dict() for r in records],
    }


def parse_document(
    d: Any,
) -> tuple[list[BenchmarkRecord], str | None, dict[str, Any] | None]:
    """``(records, platform, meta)`` of a :func:`document` dict.

    Example:
        >>> recs, platform, meta = parse_document(
        ...     document([BenchmarkRecord('k', 'c', 'jax', 'cpu')], 'cpu', {'a': 1}))
        >>> [r.backend for r in recs], platform, meta
        (['jax'], 'cpu', {'a': 1})
        >>> parse_document({'format': 'other', 'records': []})
        Traceback (most recent call last):
        ValueError: not a primforge benchmark file (format 'other')
    """
    if not isinstance(d, dict) or "records" not in d:
        raise ValueError("BenchmarkResult.from_dict: expected a dict with a 'records' list")
    if d.get("format", FORMAT) != FORMAT:
        raise ValueError(f"not a primforge benchmark file (format {d.get('format')!r})")
    records = [BenchmarkRecord.from_dict(r) for r in d["records"]]
    return records, d.get("platform"), d.get("meta")


def records_to_csv(records: Iterable[BenchmarkRecord]) -> str:
    """CSV text, a header and one row per record.

    Example:
        >>> text = records_to_csv([BenchmarkRecord('k', 'c', 'jax', 'cpu', times=(0.1,))])
        >>> row = text.splitlines()[1]
        >>> row.startswith('k,c,jax,cpu,True,,1,0.1,'), row.endswith(',{},[0.1]')
        (True, True)
    """
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    for r in records:
        d = r.to_dict()
        row = {k: ("" if d[k] is None else d[k]) for k in CSV_FIELDS}
        row["params"] = json.dumps(r.params)
        row["times"] = json.dumps(list(r.times))
        for k in (*STATS, "compile_time", "max_abs_diff"):
            if d[k] is not None:
                row[k] = repr(float(d[k]))
        writer.writerow(row)
    return buf.getvalue()


def records_from_csv(text: str) -> list[BenchmarkRecord]:
    """Parse :func:`records_to_csv` output; a bad row raises ValueError naming it.

    Example:
        >>> r = BenchmarkRecord('k', 'c', 'jax', 'cpu', times=(0.1, 0.3), compile_time=2.0)
        >>> records_from_csv(records_to_csv([r])) == [r]
        True
    """
    records = []
    for i, row in enumerate(csv.DictReader(io.StringIO(text))):
        try:
            records.append(_record_from_row(row))
        except (KeyError, ValueError) as e:
            raise ValueError(f"benchmark CSV row {i + 1} is malformed: {e}") from None
    return records


def _record_from_row(row: dict[str, str]) -> BenchmarkRecord:
    return BenchmarkRecord(
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


def file_kind(path: str) -> str:
    """``'json'`` or ``'csv'`` from a path's extension (any case); else ValueError.

    Example:
        >>> file_kind('out/run.JSON'), file_kind('run.csv')
        ('json', 'csv')
        >>> file_kind('run.txt')
        Traceback (most recent call last):
        ValueError: benchmark file 'run.txt': expected a .json or .csv extension
    """
    ext = os.path.splitext(path)[1].lower()
    if ext == ".json":
        return "json"
    if ext == ".csv":
        return "csv"
    raise ValueError(f"benchmark file {path!r}: expected a .json or .csv extension")


def make_parent(path: str) -> None:
    """Create the folder that will hold ``path``, if it has one and it is missing."""
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)


def write_text(path: str, text: str) -> None:
    """Write ``text`` to ``path`` as UTF-8 (no newline translation), creating its folder.

    Example:
        >>> import os, tempfile
        >>> with tempfile.TemporaryDirectory() as d:
        ...     p = os.path.join(d, 'sub', 'r.csv')
        ...     write_text(p, 'a\\r\\nb')
        ...     read_text(p)
        'a\\r\\nb'
    """
    make_parent(path)
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(text)


def read_text(path: str) -> str:
    """The UTF-8 text of ``path``, newlines as written."""
    with open(path, encoding="utf-8", newline="") as f:
        return f.read()
