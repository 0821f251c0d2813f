"""One measurement: a kernel's backend on one benchmark config.

Raw per-call times are kept and every statistic derived from them, so a saved record
loads back exactly; the comparison with the reference is stored in the record.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

__all__ = ["STATS", "BenchmarkRecord"]

#: Statistics a record derives from its times, by name.
STATS = ("mean", "median", "min", "max", "p90", "std")


@dataclasses.dataclass(frozen=True)
class BenchmarkRecord:
    """The outcome of timing one backend of one kernel on one config.

    Attributes:
        kernel: kernel name.
        config: config name.
        backend: backend name.
        platform: 'cpu', 'gpu' or 'tpu'.
        params: the config's descriptive params.
        success: False when the backend raised; ``error`` then holds the message.
        error: ``'ExceptionType: message'`` of a failed run, else None.
        times: per-call run times in seconds, one per timed run (each the mean of the
            run's ``n_batch_per_run`` back-to-back calls).
        compile_time: seconds spent tracing, lowering and compiling (None when unknown).
        n_warmup: untimed calls made before timing.
        n_batch_per_run: calls issued per timed interval.
        reference: the backend this one was compared against (None: no comparison).
        matches_reference: True/False after a comparison, None when none was made.
        max_abs_diff: largest absolute difference from the reference output.
        mismatch: a description of how the output differs from the reference, else None.

    Example:
        >>> r = BenchmarkRecord('k', 'n=10', 'jax', 'cpu', times=(3e-6, 1e-6, 2e-6))
        >>> r.median, r.min, r.n_runs
        (2e-06, 1e-06, 3)
        >>> BenchmarkRecord.from_dict(r.to_dict()) == r
        True
    """

    kernel: str
    config: str
    backend: str
    platform: str
    params: dict[str, Any] = dataclasses.field(default_factory=dict)
    success: bool = True
    error: str | None = None
    times: tuple[float, ...] = ()
    compile_time: float | None = None
    n_warmup: int = 0
    n_batch_per_run: int = 1
    reference: str | None = None
    matches_reference: bool | None = None
    max_abs_diff: float | None = None
    mismatch: str | None = None

    def __post_init__(self):
        object.__setattr__(self, "times", tuple(float(t) for t in self.times))
        object.__setattr__(self, "params", dict(self.params))

    # -- statistics (seconds per call; NaN when there are no times)
    @property
    def n_runs(self) -> int:
        """Number of timed runs.

        Example:
            >>> r = BenchmarkRecord('k', 'c', 'jax', 'cpu', times=(1e-6, 2e-6, 3e-6, 4e-6))
            >>> r.n_runs
            4
        """
        return len(self.times)

    def _stat(self, fn) -> float:
        return float(fn(np.asarray(self.times))) if self.times else math.nan

    @property
    def mean(self) -> float:
        """Mean seconds per call.

        Example:
            >>> r = BenchmarkRecord('k', 'c', 'jax', 'cpu', times=(1e-6, 2e-6, 3e-6, 4e-6))
            >>> r.mean
            2.5e-06
        """
        return self._stat(np.mean)

    @property
    def median(self) -> float:
        """Median seconds per call.

        Example:
            >>> r = BenchmarkRecord('k', 'c', 'jax', 'cpu', times=(1e-6, 2e-6, 3e-6, 4e-6))
            >>> r.median
            2.5e-06
        """
        return self._stat(np.median)

    @property
    def min(self) -> float:
        """Fastest run, seconds per call.

        Example:
            >>> r = BenchmarkRecord('k', 'c', 'jax', 'cpu', times=(1e-6, 2e-6, 3e-6, 4e-6))
            >>> r.min
            1e-06
        """
        return self._stat(np.min)

    @property
    def max(self) -> float:
        """Slowest run, seconds per call.

        Example:
            >>> r = BenchmarkRecord('k', 'c', 'jax', 'cpu', times=(1e-6, 2e-6, 3e-6, 4e-6))
            >>> r.max
            4e-06
        """
        return self._stat(np.max)

    @property
    def p90(self) -> float:
        """90th percentile, seconds per call.

        Example:
            >>> r = BenchmarkRecord('k', 'c', 'jax', 'cpu', times=(1e-6, 2e-6, 3e-6, 4e-6))
            >>> round(r.p90 * 1e6, 2)
            3.7
        """
        return self._stat(lambda a: np.percentile(a, 90))

    @property
    def std(self) -> float:
        """Standard deviation over runs, seconds per call.

        Example:
            >>> r = BenchmarkRecord('k', 'c', 'jax', 'cpu', times=(1e-6, 2e-6, 3e-6, 4e-6))
            >>> round(r.std * 1e6, 3)
            1.118
        """
        return self._stat(np.std)

    @property
    def ok(self) -> bool:
        """Ran and did not disagree with the reference.

        Example:
            >>> BenchmarkRecord('k', 'c', 'b', 'cpu', matches_reference=False).ok
            False
        """
        return self.success and self.matches_reference is not False

    def stat(self, name: str) -> float:
        """A statistic by name (one of ``STATS``).

        Example:
            >>> BenchmarkRecord('k', 'c', 'b', 'cpu', times=(1.0, 3.0)).stat('mean')
            2.0
        """
        if name not in STATS:
            raise ValueError(f"stat must be one of {STATS}, got {name!r}")
        return getattr(self, name)

    # -- serialisation
    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: the stored fields plus the derived statistics.

        Example:
            >>> d = BenchmarkRecord('k', 'c', 'jax', 'cpu', times=(1e-3,)).to_dict()
            >>> d['backend'], d['median'], d['n_runs']
            ('jax', 0.001, 1)
        """
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["times"] = list(self.times)
        d["n_runs"] = self.n_runs
        for s in STATS:
            v = self.stat(s)
            d[s] = None if math.isnan(v) else v
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BenchmarkRecord:
        """Rebuild a record from :meth:`to_dict` output (derived entries are ignored).

        Example:
            >>> BenchmarkRecord.from_dict({'kernel': 'k', 'config': 'c', 'backend': 'b',
            ...                            'platform': 'cpu', 'median': 1.0}).times
            ()
        """
        names = {f.name for f in dataclasses.fields(cls)}
        missing = {"kernel", "config", "backend", "platform"} - set(d)
        if missing:
            raise ValueError(f"BenchmarkRecord.from_dict: missing fields {sorted(missing)}")
        return cls(**{k: v for k, v in d.items() if k in names})
