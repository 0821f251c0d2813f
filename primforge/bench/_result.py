"""A collection of benchmark records: tables, best backends, JSON/CSV files and plots.

Queries live in ``_query``, files in ``_io`` and views in ``_report``; here they are
wrapped as methods of :class:`BenchmarkResult`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from typing import Any

from primforge.bench import _io, _query, _report
from primforge.bench._record import BenchmarkRecord

__all__ = ["BenchmarkResult"]


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
            platforms = _query.unique(r.platform for r in self.records)
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
        """Kernel names, in order of first appearance.

        Example:
            >>> from primforge.bench import BenchmarkRecord
            >>> res = BenchmarkResult([BenchmarkRecord('k', 'n=1', 'jax', 'cpu', times=(2.0,)),
            ...                        BenchmarkRecord('k', 'n=1', 'fast', 'cpu', times=(1.0,))])
            >>> res.kernels
            ['k']
        """
        return _query.unique(r.kernel for r in self.records)

    @property
    def backends(self) -> list[str]:
        """Backend names, in order of first appearance.

        Example:
            >>> from primforge.bench import BenchmarkRecord
            >>> res = BenchmarkResult([BenchmarkRecord('k', 'n=1', 'jax', 'cpu', times=(2.0,)),
            ...                        BenchmarkRecord('k', 'n=1', 'fast', 'cpu', times=(1.0,))])
            >>> res.backends
            ['jax', 'fast']
        """
        return _query.unique(r.backend for r in self.records)

    @property
    def configs(self) -> list[str]:
        """Config names, in order of first appearance.

        Example:
            >>> from primforge.bench import BenchmarkRecord
            >>> res = BenchmarkResult([BenchmarkRecord('k', 'n=1', 'jax', 'cpu', times=(2.0,)),
            ...                        BenchmarkRecord('k', 'n=1', 'fast', 'cpu', times=(1.0,))])
            >>> res.configs
            ['n=1']
        """
        return _query.unique(r.config for r in self.records)

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
            _query.select(self.records, kernel=kernel, backend=backend, config=config, ok=ok),
            platform=self.platform,
            meta=self.meta,
        )

    def failures(self) -> list[BenchmarkRecord]:
        """Records whose backend raised.

        Example:
            >>> from primforge.bench import BenchmarkRecord
            >>> res = BenchmarkResult([BenchmarkRecord('k', 'c', 'b', 'cpu', success=False,
            ...                                         error='ValueError: bad')])
            >>> [r.error for r in res.failures()]
            ['ValueError: bad']
        """
        return [r for r in self.records if not r.success]

    def mismatches(self) -> list[BenchmarkRecord]:
        """Records whose output disagreed with the reference backend.

        Example:
            >>> from primforge.bench import BenchmarkRecord
            >>> res = BenchmarkResult([BenchmarkRecord('k', 'c', 'b', 'cpu', reference='jax',
            ...                                         matches_reference=False)])
            >>> [r.backend for r in res.mismatches()]
            ['b']
        """
        return [r for r in self.records if r.matches_reference is False]

    # ------------------------------------------------------------------ analysis
    def best(self, stat: str = "median") -> dict[tuple[str, str], str]:
        """The fastest correct backend for each (kernel, config).

        Records that failed or disagree with the reference never win.

        Example:
            >>> from primforge.bench import BenchmarkRecord
            >>> res = BenchmarkResult([BenchmarkRecord('k', 'n=1', 'jax', 'cpu', times=(2.0,)),
            ...                        BenchmarkRecord('k', 'n=1', 'fast', 'cpu', times=(1.0,))])
            >>> res.best()
            {('k', 'n=1'): 'fast'}
        """
        return _query.best_backends(self.records, stat)

    def fastest_backend(self, kernel: str | None = None, stat: str = "median") -> str | None:
        """The backend with the lowest geometric-mean time over a kernel's configs.

        Only backends that ran correctly on every config of the kernel compete. With one
        kernel in the result ``kernel`` may be omitted. Returns None if no backend qualifies.

        Example:
            >>> from primforge.bench import BenchmarkRecord
            >>> res = BenchmarkResult([BenchmarkRecord('k', 'n=1', 'jax', 'cpu', times=(2.0,)),
            ...                        BenchmarkRecord('k', 'n=1', 'fast', 'cpu', times=(1.0,))])
            >>> res.fastest_backend('k')
            'fast'
        """
        if kernel is None:
            if len(self.kernels) != 1:
                raise ValueError(
                    f"fastest_backend: this result holds kernels {self.kernels}; pass kernel="
                )
            kernel = self.kernels[0]
        return _query.fastest_backend(self.records, kernel, stat)

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
            kernel  config  backend  mean    median  min     p90 ...  speedup  status
            k       n=10    jax      4 µs    2 µs    1 µs    7.6 µs ...  1.00x  ok
            k       n=10    alt      3 µs *  3 µs    3 µs    3 µs ...  1.33x  ok
        """
        return _report.render_table(self.records, stat, speedup_against, color=color)

    # ------------------------------------------------------------------ serialisation
    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the records, platform and meta.

        Example:
            >>> from primforge.bench import BenchmarkRecord
            >>> d = BenchmarkResult([BenchmarkRecord('k', 'c', 'jax', 'cpu')]).to_dict()
            >>> d['platform'], d['records'][0]['backend']
            ('cpu', 'jax')
        """
        return _io.document(self.records, self.platform, self.meta)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BenchmarkResult:
        """Rebuild a result from :meth:`to_dict` output.

        Example:
            >>> from primforge.bench import BenchmarkRecord
            >>> res = BenchmarkResult([BenchmarkRecord('k', 'c', 'jax', 'cpu')], meta={'a': 1})
            >>> again = BenchmarkResult.from_dict(res.to_dict())
            >>> again == res, again.meta
            (True, {'a': 1})
        """
        records, platform, meta = _io.parse_document(d)
        return cls(records, platform=platform, meta=meta)

    def to_json(self) -> str:
        """The result as a JSON document (see :meth:`save`).

        Example:
            >>> from primforge.bench import BenchmarkRecord
            >>> res = BenchmarkResult([BenchmarkRecord('k', 'n=1', 'jax', 'cpu', times=(2.0,)),
            ...                        BenchmarkRecord('k', 'n=1', 'fast', 'cpu', times=(1.0,))])
            >>> import json
            >>> len(json.loads(res.to_json())['records'])
            2
        """
        return json.dumps(self.to_dict(), indent=2, ensure_ascii=False)

    def to_csv(self) -> str:
        """The result as CSV, one row per record; ``params`` and ``times`` are JSON cells.

        Example:
            >>> from primforge.bench import BenchmarkRecord
            >>> text = BenchmarkResult([BenchmarkRecord('k', 'c', 'jax', 'cpu')]).to_csv()
            >>> text.splitlines()[0].split(',')[:4]
            ['kernel', 'config', 'backend', 'platform']
        """
        return _io.records_to_csv(self.records)

    @classmethod
    def from_csv(cls, text: str) -> BenchmarkResult:
        """Parse :meth:`to_csv` output.

        Example:
            >>> from primforge.bench import BenchmarkRecord
            >>> res = BenchmarkResult([BenchmarkRecord('k', 'n=1', 'jax', 'cpu', times=(2.0,)),
            ...                        BenchmarkRecord('k', 'n=1', 'fast', 'cpu', times=(1.0,))])
            >>> BenchmarkResult.from_csv(res.to_csv()) == res
            True
        """
        return cls(_io.records_from_csv(text))

    def save(self, path: str | os.PathLike) -> str:
        """Write the result to ``path``: ``.json`` or ``.csv`` by extension.

        Returns:
            the path written.

        Example:
            >>> from primforge.bench import BenchmarkRecord
            >>> res = BenchmarkResult([BenchmarkRecord('k', 'n=1', 'jax', 'cpu', times=(2.0,)),
            ...                        BenchmarkRecord('k', 'n=1', 'fast', 'cpu', times=(1.0,))])
            >>> import os, tempfile
            >>> with tempfile.TemporaryDirectory() as d:
            ...     os.path.basename(res.save(os.path.join(d, 'bench.json')))
            'bench.json'
        """
        path = os.fspath(path)
        kind = _io.file_kind(path)
        _io.write_text(path, self.to_json() if kind == "json" else self.to_csv())
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> BenchmarkResult:
        """Read a result written by :meth:`save` (``.json`` or ``.csv``).

        Example:
            >>> import os, tempfile
            >>> from primforge.bench import BenchmarkRecord
            >>> res = BenchmarkResult([BenchmarkRecord('k', 'c', 'jax', 'cpu', times=(0.1,))])
            >>> with tempfile.TemporaryDirectory() as d:
            ...     [BenchmarkResult.load(res.save(os.path.join(d, f'r.{ext}'))) == res
            ...      for ext in ('json', 'csv')]
            [True, True]
        """
        path = os.fspath(path)
        kind = _io.file_kind(path)
        text = _io.read_text(path)
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
        (``pip install -e ".[plot]"`` in the primforge checkout).

        Returns:
            the path written.

        Example:
            >>> from primforge.bench import BenchmarkRecord
            >>> res = BenchmarkResult([BenchmarkRecord('k', 'n=1', 'jax', 'cpu', times=(2.0,)),
            ...                        BenchmarkRecord('k', 'n=1', 'fast', 'cpu', times=(1.0,))])
            >>> import os, tempfile
            >>> with tempfile.TemporaryDirectory() as d:
            ...     os.path.basename(res.plot(os.path.join(d, 'bench.png')))
            'bench.png'
        """
        return _report.plot_records(self.records, path, stat=stat, kernels=kernels, dpi=dpi)
