"""Running a kernel's benchmark: compile once, warm up, time, compare with a reference.

The kernel is used through its public methods only; this package never imports the
kernel layer.
"""

from __future__ import annotations

import sys
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any, TextIO

import jax
import numpy as np

from primforge.backends._platforms import canonical_platform
from primforge.bench._config import (
    BenchmarkConfig,
    BenchmarkDataFnNotProvidedError,
    BenchmarkMismatchWarning,
)
from primforge.bench._format import format_seconds
from primforge.bench._record import BenchmarkRecord
from primforge.bench._result import BenchmarkResult
from primforge.utils._suggest import did_you_mean

__all__ = ["benchmark_kernel", "compare_outputs", "reference_backend"]

_UNTRACEABLE = (
    jax.errors.ConcretizationTypeError,
    jax.errors.TracerArrayConversionError,
    jax.errors.TracerBoolConversionError,
    jax.errors.TracerIntegerConversionError,
)


class _Progress:
    """A one-line progress bar on a terminal; silent elsewhere."""

    def __init__(self, total: int, enabled: bool | None, stream: TextIO | None = None):
        self.stream = stream if stream is not None else sys.stderr
        if enabled is None:
            isatty = getattr(self.stream, "isatty", None)
            enabled = bool(isatty and isatty())
        self.enabled = enabled and total > 0
        self.total = total
        self.done = 0
        self._width = 0

    def step(self, label: str) -> None:
        if not self.enabled:
            return
        filled = int(24 * self.done / self.total)
        text = f"[{'#' * filled}{'.' * (24 - filled)}] {self.done}/{self.total} {label}"
        pad = " " * max(0, self._width - len(text))
        self._width = len(text)
        self.stream.write("\r" + text + pad)
        self.stream.flush()

    def advance(self) -> None:
        self.done += 1

    def close(self) -> None:
        if self.enabled and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()


def reference_backend(kernel: Any, platform: str) -> str | None:
    """The backend other backends are checked against: 'jax' if registered, else the default.

    Example:
        >>> import primforge
        >>> k = primforge.XLACustomKernel('doc_reference_backend')
        >>> k.def_kernel('fast', 'cpu', lambda **kw: lambda x: x)
        >>> k.def_kernel('jax', 'cpu', lambda **kw: lambda x: x)
        >>> reference_backend(k, 'cpu')
        'jax'
    """
    available = kernel.available_backends(platform)
    if "jax" in available:
        return "jax"
    return kernel.get_default(platform) if available else None


def compare_outputs(
    expected: Any, actual: Any, *, rtol: float = 1e-3, atol: float = 1e-3
) -> tuple[bool, float | None, str | None]:
    """Compare two output pytrees leaf by leaf.

    Returns:
        ``(match, max_abs_diff, description)``: ``description`` says what differs (None
        when they match); ``max_abs_diff`` is the largest absolute difference over
        comparable leaves (None when no leaf could be compared numerically).

    Example:
        >>> import numpy as np
        >>> compare_outputs([np.ones(3)], [np.ones(3) + 1e-5])[0]
        True
        >>> compare_outputs([np.ones(3)], [np.zeros(3)])
        (False, 1.0, 'output 0: 3 of 3 elements differ (max |diff| 1)')
        >>> compare_outputs(np.ones(2), np.ones(3))[2]
        'output 0: shape (3,) differs from the reference shape (2,)'
    """
    e_leaves, e_tree = jax.tree.flatten(expected)
    a_leaves, a_tree = jax.tree.flatten(actual)
    if e_tree != a_tree:
        return False, None, f"output structure {a_tree} differs from the reference {e_tree}"
    worst: float | None = None
    problems = []
    for i, (e, a) in enumerate(zip(e_leaves, a_leaves)):
        e, a = np.asarray(e), np.asarray(a)
        if e.shape != a.shape:
            problems.append(
                f"output {i}: shape {a.shape} differs from the reference shape {e.shape}")
            continue
        if e.dtype != a.dtype:
            problems.append(f"output {i}: dtype {a.dtype} differs from the reference {e.dtype}")
            continue
        if e.dtype.kind not in "biufc":
            if not np.array_equal(e, a):
                problems.append(f"output {i}: values differ")
            continue
        e64 = e.astype(np.complex128 if e.dtype.kind == "c" else np.float64)
        a64 = a.astype(e64.dtype)
        with np.errstate(invalid="ignore", over="ignore"):
            close = np.isclose(a64, e64, rtol=rtol, atol=atol, equal_nan=True)
            diff = np.abs(a64 - e64).astype(np.float64)
        # Matching infinities and NaNs count as no difference; any other NaN as infinite.
        diff = np.where(close & ~np.isfinite(diff), 0.0, diff)
        diff = np.nan_to_num(diff, nan=np.inf, posinf=np.inf)
        d = float(diff.max()) if diff.size else 0.0
        worst = d if worst is None else max(worst, d)
        if not close.all():
            bad = int((~close).sum())
            problems.append(
                f"output {i}: {bad} of {close.size} elements differ (max |diff| {d:.3g})"
            )
    return (not problems), worst, ("; ".join(problems) or None)


def _is_array(x: Any) -> bool:
    return isinstance(x, (jax.Array, np.ndarray))


def _accepts_backend(kernel) -> bool:
    """Whether the kernel's call function takes ``backend=`` (unreadable: assume it does)."""
    try:
        params = kernel.call_signature().parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.name == "backend" or p.kind is p.VAR_KEYWORD for p in params)


def _device_for(platform: str):
    try:
        return jax.devices(platform)[0]
    except RuntimeError as e:
        have = sorted({d.platform for d in jax.devices()})
        raise ValueError(
            f"benchmark: platform {platform!r} is not available here (JAX devices: {have})"
        ) from e


class _Runner:
    """Compiles one (config, backend) pair and runs it."""

    def __init__(self, kernel, backend: str, platform: str, config: BenchmarkConfig, device):
        leaves, treedef = jax.tree.flatten(config.args)
        self.dynamic = [i for i, x in enumerate(leaves) if _is_array(x)]
        self.inputs = [jax.device_put(leaves[i], device) for i in self.dynamic]
        kwargs = dict(config.kwargs)
        if _accepts_backend(kernel):
            kwargs["backend"] = backend

        def fn(*arrays):
            full = list(leaves)
            for i, a in zip(self.dynamic, arrays):
                full[i] = a
            return kernel.call(*jax.tree.unflatten(treedef, full), **kwargs)

        self.fn = fn
        self.kernel, self.backend, self.platform = kernel, backend, platform
        self.run: Callable[[], Any] | None = None
        self.jitted = True

    def compile(self) -> float:
        t0 = time.perf_counter()
        try:
            with self.kernel.use_backend(self.platform, self.backend):
                compiled = jax.jit(self.fn).trace(*self.inputs).lower().compile()
        except _UNTRACEABLE:
            # The call function needs concrete values: time it eagerly instead.
            self.jitted = False

            def eager():
                with self.kernel.use_backend(self.platform, self.backend):
                    return self.fn(*self.inputs)

            self.run = eager
            t0 = time.perf_counter()
            jax.block_until_ready(eager())
            return time.perf_counter() - t0
        inputs = self.inputs
        self.run = lambda: compiled(*inputs)
        return time.perf_counter() - t0


def _measure(runner: _Runner, n_warmup: int, n_runs: int, n_batch: int):
    compile_time = runner.compile()
    run = runner.run
    first = None
    for _ in range(n_warmup):
        out = jax.block_until_ready(run())
        if first is None:
            first = out
    times = []
    for _ in range(n_runs):
        t0 = time.perf_counter()
        outs = [run() for _ in range(n_batch)]
        jax.block_until_ready(outs)
        times.append((time.perf_counter() - t0) / n_batch)
        if first is None:
            first = outs[0]
    return compile_time, tuple(times), jax.device_get(first)


def _check_count(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"benchmark: {name!r} must be an int >= {minimum}, got {value!r}")
    return int(value)


def benchmark_kernel(
    kernel: Any,
    *,
    platform: str,
    n_warmup: int = 5,
    n_runs: int = 20,
    n_batch_per_run: int = 1,
    compare_results: bool = True,
    rtol: float = 1e-3,
    atol: float = 1e-3,
    verbose: bool = False,
    catch_errors: bool = True,
    backends: Sequence[str] | None = None,
    reference: str | None = None,
    progress: bool | None = None,
) -> BenchmarkResult:
    """Time every backend of ``kernel`` on every config of its benchmark data.

    This is ``XLACustomKernel.benchmark``. The kernel's call function (``def_call``) is
    called as ``call(*config.args, backend=name, **config.kwargs)`` under
    ``kernel.use_backend(platform, name)``, so call functions without a ``backend``
    argument are benchmarked too.

    Args:
        kernel: an ``XLACustomKernel`` with a call function and benchmark data.
        platform: 'cpu', 'gpu' or 'tpu'.
        n_warmup: untimed calls before timing.
        n_runs: timed runs per (config, backend).
        n_batch_per_run: back-to-back calls per timed run; times are reported per call.
        compare_results: compare each backend's output with the reference backend's.
        rtol: relative tolerance of the comparison.
        atol: absolute tolerance of the comparison.
        verbose: print one timing line per (config, backend).
        catch_errors: record a failing backend (``success=False``) and go on; False
            re-raises at once.
        backends: the backends to time (default: all registered for ``platform``).
        reference: the backend outputs are compared with (default: 'jax' if registered,
            else the platform's default); it is run even when not in ``backends``.
        progress: show a progress bar on stderr (default: only when stderr is a terminal).

    Returns:
        a :class:`BenchmarkResult` with one record per config and backend.

    Raises:
        BenchmarkDataFnNotProvidedError: no ``def_benchmark_data`` function.
        ValueError: no call function, no backend on ``platform``, an unknown backend.

    Example:
        >>> import jax, jax.numpy as jnp, primforge
        >>> from primforge.bench import BenchmarkConfig, benchmark_kernel
        >>> k = primforge.XLACustomKernel('doc_bench_double')
        >>> k.def_kernel('jax', 'cpu', lambda **kw: lambda x: 2 * x)
        >>> k.def_kernel('add', 'cpu', lambda **kw: lambda x: x + x)
        >>> _ = k.def_call(lambda x, backend=None: k(
        ...     x, outs=jax.ShapeDtypeStruct(x.shape, x.dtype), backend=backend))
        >>> _ = k.def_benchmark_data(lambda *, platform: [
        ...     BenchmarkConfig(args=(jnp.ones(n),), n=n) for n in (10, 1000)])
        >>> res = benchmark_kernel(k, platform='cpu', n_warmup=1, n_runs=3)
        >>> [(r.config, r.backend, r.success, r.matches_reference) for r in res]
        [('n=10', 'jax', True, None), ('n=10', 'add', True, True),
         ('n=1000', 'jax', True, None), ('n=1000', 'add', True, True)]
    """
    platform = canonical_platform(platform)
    n_warmup = _check_count("n_warmup", n_warmup, 0)
    n_runs = _check_count("n_runs", n_runs, 1)
    n_batch_per_run = _check_count("n_batch_per_run", n_batch_per_run, 1)
    chosen, ref = _plan(kernel, platform, backends, reference if compare_results else False)
    order = ([ref] if ref is not None else []) + [b for b in chosen if b != ref]
    configs = _configs(kernel, platform)
    timing = (n_warmup, n_runs, n_batch_per_run, catch_errors)
    bar = _Progress(len(configs) * len(order), progress)
    records: list[BenchmarkRecord] = []
    try:
        for config in configs:
            records += _run_config(kernel, config, platform, order, chosen, ref, timing,
                                   tolerance=(rtol, atol), bar=bar, verbose=verbose)
    finally:
        bar.close()
    return BenchmarkResult(
        records,
        platform=platform,
        meta={"jax_version": jax.__version__, "n_warmup": n_warmup, "n_runs": n_runs,
              "n_batch_per_run": n_batch_per_run, "rtol": rtol, "atol": atol},
    )


def _plan(kernel, platform: str, backends, reference) -> tuple[list[str], str | None]:
    """The backends to time and the reference (``reference=False``: compare nothing)."""
    if not kernel.has_benchmark_data():
        raise BenchmarkDataFnNotProvidedError(
            f"kernel {kernel.name!r} has no benchmark data: register a function "
            f"fn(*, platform) -> list[BenchmarkConfig] with kernel.def_benchmark_data(fn)"
        )
    if not kernel.has_call():
        raise ValueError(
            f"kernel {kernel.name!r} has no call function to benchmark: register one with "
            f"kernel.def_call(fn)"
        )
    available = kernel.available_backends(platform)
    if not available:
        raise ValueError(
            f"kernel {kernel.name!r} has no backend registered for platform {platform!r}"
        )
    if backends is None:
        chosen = list(available)
    else:
        if isinstance(backends, str):
            backends = [backends]
        unknown = [b for b in backends if b not in available]
        if unknown:
            raise ValueError(
                f"benchmark: backends {unknown} are not registered for kernel {kernel.name!r} "
                f"on {platform!r}{did_you_mean(unknown[0], available)}; available: {available}"
            )
        chosen = list(dict.fromkeys(backends))
    if reference is False:
        return chosen, None
    ref = reference if reference is not None else reference_backend(kernel, platform)
    if ref not in available:
        raise ValueError(
            f"benchmark: reference={ref!r} is not registered for kernel {kernel.name!r} on "
            f"{platform!r}; available: {available}"
        )
    return chosen, (ref if len(set(chosen) | {ref}) >= 2 else None)  # None: nothing to compare


def _configs(kernel, platform: str) -> list[BenchmarkConfig]:
    configs = kernel.benchmark_data(platform=platform)
    for i, c in enumerate(configs):
        if not isinstance(c, BenchmarkConfig):
            raise TypeError(
                f"kernel {kernel.name!r}: the benchmark data function must return "
                f"BenchmarkConfig objects; item {i} is {type(c).__name__}"
            )
    return configs


def _run_config(kernel, config, platform, order, chosen, ref, timing, *, tolerance, bar,
                verbose) -> list[BenchmarkRecord]:
    """Records of one config: every backend in ``order`` (the reference first)."""
    device = _device_for(platform)
    records, ref_out, ref_ok = [], None, False
    for backend in order:
        bar.step(f"{kernel.name} {config.name} {backend}")
        rec, out = _one(kernel, backend, platform, config, device, *timing)
        bar.advance()
        if rec is None:  # the backend has no kernel for this config's form
            continue
        if backend == ref:
            ref_out, ref_ok = out, rec.success
            rec = _replace(rec, reference=ref)
        elif ref is not None and rec.success:
            rec = _compared(kernel, config, rec, ref, ref_out if ref_ok else None, out,
                            tolerance)
        if backend in chosen:
            records.append(rec)
            if verbose:
                bar.close()
                print(_summary(rec), flush=True)
    return records


def _compared(kernel, config, rec, ref, ref_out, out, tolerance) -> BenchmarkRecord:
    """``rec`` with its comparison against the reference output (None: reference failed)."""
    if ref_out is None:
        return _replace(rec, reference=ref)
    rtol, atol = tolerance
    match, diff, why = compare_outputs(ref_out, out, rtol=rtol, atol=atol)
    if not match:
        warnings.warn(
            f"kernel {kernel.name!r}, config {config.name!r}: backend "
            f"{rec.backend!r} disagrees with reference {ref!r}: {why}",
            BenchmarkMismatchWarning,
            stacklevel=4,
        )
    return _replace(rec, reference=ref, matches_reference=match, max_abs_diff=diff,
                    mismatch=why)


def _replace(rec: BenchmarkRecord, **changes) -> BenchmarkRecord:
    import dataclasses

    return dataclasses.replace(rec, **changes)


def _one(kernel, backend, platform, config, device, n_warmup, n_runs, n_batch, catch_errors):
    base = {
        "kernel": kernel.name, "config": config.name, "backend": backend,
        "platform": platform, "params": config.params, "n_warmup": n_warmup,
        "n_batch_per_run": n_batch,
    }
    try:
        runner = _Runner(kernel, backend, platform, config, device)
        compile_time, times, out = _measure(runner, n_warmup, n_runs, n_batch)
    except Exception as e:
        if getattr(e, "backend_declined", False):  # no kernel for this form: no record
            return None, None
        if not catch_errors:
            raise
        return BenchmarkRecord(**base, success=False, error=f"{type(e).__name__}: {e}"), None
    return BenchmarkRecord(**base, times=times, compile_time=compile_time), out


def _summary(r: BenchmarkRecord) -> str:
    head = f"{r.kernel} [{r.config}] {r.backend}:"
    if not r.success:
        return f"{head} FAILED: {r.error}"
    text = (
        f"{head} median {format_seconds(r.median)} (min {format_seconds(r.min)}, p90 "
        f"{format_seconds(r.p90)}), compile {format_seconds(r.compile_time)}"
    )
    if r.matches_reference is False:
        text += f"; MISMATCH vs {r.reference}: {r.mismatch}"
    return text
