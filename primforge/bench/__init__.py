"""Benchmarking kernels: configs in, timed and cross-checked records out.

Example:
    >>> from primforge.bench import BenchmarkRecord, BenchmarkResult
    >>> res = BenchmarkResult([BenchmarkRecord('k', 'n=1', 'jax', 'cpu', times=(1e-6,))])
    >>> res.records[0].median
    1e-06
"""

from primforge.bench._config import (
    BenchmarkConfig,
    BenchmarkDataFnNotProvidedError,
    BenchmarkMismatchWarning,
)
from primforge.bench._format import format_seconds
from primforge.bench._record import STATS, BenchmarkRecord
from primforge.bench._result import BenchmarkResult
from primforge.bench._run import benchmark_kernel, compare_outputs, reference_backend

__all__ = [
    "STATS",
    "BenchmarkConfig",
    "BenchmarkDataFnNotProvidedError",
    "BenchmarkMismatchWarning",
    "BenchmarkRecord",
    "BenchmarkResult",
    "benchmark_kernel",
    "compare_outputs",
    "format_seconds",
    "reference_backend",
]
