"""The kernel's user-facing call function and benchmark data, and benchmarking.

The kernel only stores the two functions; timing, comparing backends and reporting are
``primforge.bench``'s, which :meth:`BenchmarkingMixin.benchmark` calls with the kernel.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from primforge.bench import benchmark_kernel
from primforge.kernel.state import KernelState

__all__ = ["BenchmarkingMixin"]


class BenchmarkingMixin(KernelState):
    """The call function and benchmark configs the benchmark runner uses.

    Part of :class:`primforge.XLACustomKernel`; owns ``_call_fn`` and
    ``_benchmark_data_fn``.
    """

    def _init_state(self) -> None:
        super()._init_state()
        self._call_fn: Callable | None = None
        self._benchmark_data_fn: Callable | None = None

    def def_call(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Store the user-facing call function used by :meth:`call` and benchmarking.

        Example:
            >>> import primforge
            >>> k = primforge.XLACustomKernel('doc_def_call')
            >>> _ = k.def_call(lambda x, backend=None: x + 1)
            >>> k.call(1)
            2
        """
        if not callable(fn):
            raise TypeError("def_call: fn must be callable")
        self._call_fn = fn
        return fn

    def call(self, *args, **kwargs):
        """Invoke the function registered with :meth:`def_call`.

        Raises:
            ValueError: if no call function is registered.

        Example:
            >>> import primforge
            >>> k = primforge.XLACustomKernel('doc_call_missing')
            >>> k.call(1)
            Traceback (most recent call last):
            ...
            ValueError: kernel 'doc_call_missing' has no call function; register one with
            kernel.def_call(fn)
        """
        if self._call_fn is None:
            raise ValueError(
                f"kernel {self.name!r} has no call function; register one with "
                f"kernel.def_call(fn)"
            )
        return self._call_fn(*args, **kwargs)

    def has_call(self) -> bool:
        """Whether a call function is registered (:meth:`def_call`).

        Example:
            >>> import primforge
            >>> k = primforge.XLACustomKernel('doc_has_call')
            >>> k.has_call()
            False
            >>> _ = k.def_call(lambda x, backend=None: x)
            >>> k.has_call()
            True
        """
        return self._call_fn is not None

    def call_signature(self) -> inspect.Signature:
        """The signature of the function registered with :meth:`def_call`.

        Raises:
            ValueError: if no call function is registered, or its signature cannot be read.

        Example:
            >>> import primforge
            >>> k = primforge.XLACustomKernel('doc_call_signature')
            >>> _ = k.def_call(lambda x, backend=None: x)
            >>> 'backend' in k.call_signature().parameters
            True
        """
        if self._call_fn is None:
            raise ValueError(
                f"kernel {self.name!r} has no call function; register one with "
                f"kernel.def_call(fn)"
            )
        return inspect.signature(self._call_fn)

    def has_benchmark_data(self) -> bool:
        """Whether a benchmark data function is registered (:meth:`def_benchmark_data`).

        Example:
            >>> import primforge
            >>> k = primforge.XLACustomKernel('doc_has_benchmark_data')
            >>> k.has_benchmark_data()
            False
            >>> _ = k.def_benchmark_data(lambda *, platform: [])
            >>> k.has_benchmark_data()
            True
        """
        return self._benchmark_data_fn is not None

    def benchmark_data(self, *, platform: str) -> list:
        """The benchmark configs for ``platform``, from :meth:`def_benchmark_data`'s function.

        Raises:
            ValueError: if no benchmark data function is registered.

        Example:
            >>> import jax.numpy as jnp, primforge
            >>> k = primforge.XLACustomKernel('doc_benchmark_data')
            >>> _ = k.def_benchmark_data(lambda *, platform: [
            ...     primforge.BenchmarkConfig(args=(jnp.ones(4),), n=4)])
            >>> [c.name for c in k.benchmark_data(platform='cpu')]
            ['n=4']
        """
        if self._benchmark_data_fn is None:
            raise ValueError(
                f"kernel {self.name!r} has no benchmark data: register a function "
                f"fn(*, platform) -> list[BenchmarkConfig] with kernel.def_benchmark_data(fn)"
            )
        return list(self._benchmark_data_fn(platform=platform))

    def benchmark(self, *, platform: str, **options: Any) -> Any:
        """Time every backend on every benchmark config; the work is ``primforge.bench``'s.

        A thin call to :func:`primforge.bench.benchmark_kernel`, whose keyword arguments
        ``options`` are (``n_warmup=5``, ``n_runs=20``, ``n_batch_per_run=1``,
        ``compare_results=True``, ``rtol=atol=1e-3``, ``verbose``, ``catch_errors=True``,
        ``backends``, ``reference``, ``progress``). Needs :meth:`def_call` and
        :meth:`def_benchmark_data`. Returns a ``BenchmarkResult`` with one record per
        (config, backend); each backend's output is compared with the reference backend
        (``reference=``, default 'jax' where registered).

        Example:
            >>> import jax, jax.numpy as jnp, primforge
            >>> k = primforge.XLACustomKernel('doc_benchmark_method')
            >>> k.def_kernel('jax', 'cpu', lambda **kw: lambda x: x * 2)
            >>> k.def_kernel('twice', 'cpu', lambda **kw: lambda x: x + x)
            >>> _ = k.def_call(lambda x, backend=None: k(
            ...     x, outs=jax.ShapeDtypeStruct(x.shape, x.dtype), backend=backend))
            >>> _ = k.def_benchmark_data(
            ...     lambda *, platform: [primforge.BenchmarkConfig(args=(jnp.ones(8),))])
            >>> result = k.benchmark(platform='cpu', n_warmup=1, n_runs=2)
            >>> sorted(r.backend for r in result.records)
            ['jax', 'twice']
        """
        return benchmark_kernel(self, platform=platform, **options)

    def def_benchmark_data(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Register ``fn(*, platform) -> list[BenchmarkConfig]`` for :meth:`benchmark`.

        Example:
            >>> import primforge
            >>> k = primforge.XLACustomKernel('doc_def_bench_data')
            >>> _ = k.def_benchmark_data(lambda *, platform: [])
        """
        if not callable(fn):
            raise TypeError("def_benchmark_data: fn must be callable")
        self._benchmark_data_fn = fn
        return fn
