"""Autotuning: pick each kernel's fastest backend per platform and remember it.

:func:`tune` measures and stores the choices in ``autotune.json`` under primforge's cache
folder; :func:`load` (or ``PRIMFORGE_AUTOTUNE=1``) applies them as kernel defaults, only
where they were measured (same device kind and JAX version).
"""

from __future__ import annotations

import datetime
import errno
import json
import math
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from primforge import _cache, registry
from primforge.backends._platforms import canonical_platform
from primforge.bench import BenchmarkMismatchWarning, benchmark_kernel
from primforge.kernel import hooks

__all__ = [
    "AutotuneMismatchWarning",
    "applied",
    "apply_pending",
    "cache_path",
    "choices",
    "clear",
    "enabled",
    "load",
    "tune",
]

ENV_CACHE_DIR = "PRIMFORGE_CACHE_DIR"
ENV_AUTOTUNE = "PRIMFORGE_AUTOTUNE"
_CACHE_NAME = "autotune.json"
_FORMAT = "primforge-autotune"
_VERSION = 1

class AutotuneMismatchWarning(UserWarning):
    """Stored autotune choices were skipped: measured on another device kind or JAX version."""


# Choices loaded with load(): kernel -> platform -> backend, and which were applied.
_PENDING: dict[str, dict[str, str]] = {}
_APPLIED: dict[str, dict[str, str]] = {}
_ENV_LOADED = False


def cache_path() -> Path:
    """Where autotune choices are stored.

    Example:
        >>> cache_path().name
        'autotune.json'
    """
    root = os.environ.get(ENV_CACHE_DIR)
    if root:
        return Path(root) / _CACHE_NAME
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "primforge" / _CACHE_NAME


def enabled() -> bool:
    """Whether ``PRIMFORGE_AUTOTUNE`` asks for tuned defaults to be loaded automatically.

    Example:
        >>> isinstance(enabled(), bool)
        True
    """
    return os.environ.get(ENV_AUTOTUNE, "").strip().lower() not in ("", "0", "false", "no")


def _default_folder_ok(path: Path) -> bool:
    """The default file's folder must be private to the user (one warning otherwise)."""
    return _cache.checked_folder(str(path.parent)) is not None


def _read(path: Path | None = None) -> dict[str, Any]:
    default = path is None
    path = Path(path) if path is not None else cache_path()
    empty = {"format": _FORMAT, "version": _VERSION, "kernels": {}}
    if default and (not path.parent.exists() or not _default_folder_ok(path)):
        return empty
    try:
        # Never through a symlink: the file is read only when it is the user's own.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        return empty
    except OSError as e:
        if e.errno == errno.ELOOP:
            _cache._warn_once(str(path), "is a symbolic link; ignoring it")
            return empty
        raise
    with os.fdopen(fd, "rb") as f:
        text = f.read().decode("utf-8", "replace")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(
            f"autotune cache {str(path)!r} is not valid JSON ({e}); delete it or run "
            f"`primforge autotune --clear`"
        ) from None
    if not isinstance(data, dict) or not isinstance(data.get("kernels"), dict):
        raise TypeError(f"autotune cache {str(path)!r} has an unexpected layout; delete it")
    return data


def _write(data: dict[str, Any], path: Path | None = None) -> Path:
    """Write the file atomically (a fresh ``0600`` temporary file, then a rename).

    A full disk or read-only folder, or an untrusted default folder, gives one warning and
    leaves the file as it was: tuning results are then not kept.
    """
    default = path is None
    path = Path(path) if path is not None else cache_path()
    if default and not _default_folder_ok(path):
        return path
    if not default and not path.parent.is_dir():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    text = json.dumps(data, indent=2, sort_keys=True)
    _cache.write_bytes(str(path.parent), path.name, text.encode("utf-8"), digest=False)
    return path


def choices(path: str | os.PathLike | None = None) -> dict[str, dict[str, str]]:
    """The stored choices: kernel name -> platform -> backend.

    Example:
        >>> import tempfile, os
        >>> choices(os.path.join(tempfile.mkdtemp(), 'none.json'))
        {}
    """
    data = _read(Path(path) if path is not None else None)
    return {
        name: {p: entry["backend"] for p, entry in per.items() if "backend" in entry}
        for name, per in data["kernels"].items()
    }


def _device_kind(platform: str) -> str | None:
    import jax

    try:
        return jax.devices(platform)[0].device_kind
    except RuntimeError:  # no such platform here
        return None


def _usable(path: Path | None) -> dict[str, dict[str, str]]:
    """The stored choices measured on this device kind and JAX version (warns about others).

    Choices for a platform this process does not have are left out silently (they could
    not apply here anyway).
    """
    import warnings

    import jax

    data = _read(path)
    kinds: dict[str, str | None] = {}
    usable: dict[str, dict[str, str]] = {}
    skipped: list[str] = []
    for name, per in data["kernels"].items():
        for platform, entry in per.items():
            if not isinstance(entry, dict) or "backend" not in entry:
                continue
            if platform not in kinds:
                kinds[platform] = _device_kind(platform)
            here = kinds[platform]
            if here is None:
                continue
            device, version = entry.get("device"), entry.get("jax_version")
            if device != here or version != jax.__version__:
                skipped.append(
                    f"{name}/{platform} (measured on {device or 'an unrecorded device'} with "
                    f"jax {version or '?'})"
                )
                continue
            usable.setdefault(name, {})[platform] = entry["backend"]
    if skipped:
        more = f" and {len(skipped) - 5} more" if len(skipped) > 5 else ""
        shown = ", ".join(skipped[:5]) + more
        warnings.warn(
            f"autotune: skipped {len(skipped)} stored choice(s) measured elsewhere: {shown}; "
            f"this process runs jax {jax.__version__} on "
            f"{', '.join(f'{p}: {k}' for p, k in sorted(kinds.items()) if k)}. Re-run "
            f"`primforge autotune` here to measure them again.",
            AutotuneMismatchWarning,
            stacklevel=3,
        )
    return usable


def applied() -> dict[str, dict[str, str]]:
    """The tuned defaults applied in this process: kernel name -> platform -> backend.

    Example:
        >>> isinstance(applied(), dict)
        True
    """
    return {k: dict(v) for k, v in _APPLIED.items()}


def apply_pending(kernel: Any, platform: str | None = None) -> None:
    """Make a loaded choice the default of ``kernel`` if its tuned backend is registered.

    Called for every backend a kernel defines (through the kernel's event hook); a no-op
    without a loaded choice.

    Example:
        >>> import primforge
        >>> k = primforge.XLACustomKernel('doc_apply_pending')
        >>> apply_pending(k)
    """
    per = _PENDING.get(kernel.name)
    if not per:
        return
    for p, backend in per.items():
        if platform is not None and p != platform:
            continue
        if backend in kernel.available_backends(p):
            if kernel.get_default(p) != backend:
                kernel.set_default(p, backend)
            _APPLIED.setdefault(kernel.name, {})[p] = backend


def load(
    path: str | os.PathLike | None = None, *, kernels: Iterable[str] | None = None
) -> dict[str, dict[str, str]]:
    """Use the stored choices as kernel defaults, now and for kernels defined later.

    Only choices measured on this device kind and JAX version are used; the others are
    skipped with one :class:`AutotuneMismatchWarning`.

    Args:
        path: the cache file (default :func:`cache_path`).
        kernels: restrict to these kernel names.

    Returns:
        the choices applied now to registered kernels (kernel -> platform -> backend);
        the others wait for their kernel or backend to be defined.

    Example:
        >>> import os, tempfile
        >>> load(os.path.join(tempfile.mkdtemp(), 'autotune.json'))
        {}
    """
    wanted = None if kernels is None else set(kernels)
    stored = _usable(Path(path) if path is not None else None)
    for name, per in stored.items():
        if wanted is None or name in wanted:
            _PENDING.setdefault(name, {}).update(per)
    now: dict[str, dict[str, str]] = {}
    for kernel in registry.list_kernels():
        if kernel.name in stored and (wanted is None or kernel.name in wanted):
            apply_pending(kernel)
            if kernel.name in _APPLIED:
                now[kernel.name] = dict(_APPLIED[kernel.name])
    return now


def _load_from_env() -> None:
    """Load the cache once per process when ``PRIMFORGE_AUTOTUNE`` is set (first kernel)."""
    global _ENV_LOADED
    if _ENV_LOADED or not enabled():
        return
    _ENV_LOADED = True
    try:
        stored = _usable(None)
    except (TypeError, ValueError):
        return  # a damaged cache must not break kernel creation; the CLI reports it
    for name, per in stored.items():
        _PENDING.setdefault(name, {}).update(per)


def clear(
    path: str | os.PathLike | None = None, *, kernels: Iterable[str] | None = None
) -> None:
    """Forget stored choices (all, or those of ``kernels``).

    Example:
        >>> import os, tempfile
        >>> clear(os.path.join(tempfile.mkdtemp(), 'autotune.json'))
    """
    p = Path(path) if path is not None else cache_path()
    if kernels is None:
        p.unlink(missing_ok=True)
        return
    data = _read(p)
    for name in kernels:
        data["kernels"].pop(name, None)
    _write(data, p)


def tune(
    kernels: Iterable[Any] | None = None,
    *,
    platform: str | None = None,
    backends: Iterable[str] | None = None,
    n_warmup: int = 3,
    n_runs: int = 10,
    n_batch_per_run: int = 1,
    rtol: float = 1e-3,
    atol: float = 1e-3,
    save: bool = True,
    apply: bool = True,
    path: str | os.PathLike | None = None,
    progress: bool | None = None,
) -> dict[str, dict[str, Any]]:
    """Benchmark kernels and record the fastest correct backend of each.

    Kernels without benchmark data or a call function, or with a single backend on the
    platform, are skipped. A backend that fails or disagrees with the reference backend
    is never chosen.

    Args:
        kernels: ``XLACustomKernel`` objects or names (default: every registered kernel).
        platform: 'cpu', 'gpu' or 'tpu' (default: JAX's default backend).
        backends: the candidate backends (default: every backend registered on the
            platform, e.g. both ``numba`` and the threaded ``numba_parallel`` of the CSR
            products); those a kernel lacks are left out, and the reference backend is
            always run to check the others against.
        n_warmup: untimed calls per config and backend.
        n_runs: timed runs per config and backend.
        n_batch_per_run: back-to-back calls per timed run.
        rtol: relative tolerance of the check against the reference.
        atol: absolute tolerance of the check against the reference.
        save: write the choices to the cache.
        apply: make the choices the kernels' defaults in this process.
        path: the cache file (default :func:`cache_path`).
        progress: show a progress bar (default: when stderr is a terminal).

    Returns:
        kernel name -> ``{'backend': ..., 'median_s': ..., 'result': BenchmarkResult}``
        for every kernel tuned; ``backend`` is None when no backend qualified.

    Example:
        >>> import jax, jax.numpy as jnp, os, tempfile, primforge
        >>> from primforge.bench import BenchmarkConfig
        >>> k = primforge.XLACustomKernel('doc_tune')
        >>> k.def_kernel('jax', 'cpu', lambda **kw: lambda x: x * 2)
        >>> k.def_kernel('alt', 'cpu', lambda **kw: lambda x: x + x)
        >>> _ = k.def_call(lambda x, backend=None: k(
        ...     x, outs=jax.ShapeDtypeStruct(x.shape, x.dtype), backend=backend))
        >>> _ = k.def_benchmark_data(
        ...     lambda *, platform: [BenchmarkConfig(args=(jnp.ones(8),), n=8)])
        >>> f = os.path.join(tempfile.mkdtemp(), 'autotune.json')
        >>> out = tune([k], platform='cpu', n_runs=2, path=f, apply=False)
        >>> out['doc_tune']['backend'] in ('jax', 'alt'), list(choices(f))
        (True, ['doc_tune'])
    """
    import jax

    platform = canonical_platform(platform or jax.default_backend())
    if kernels is None:
        kernels = registry.list_kernels()
    kernels = [registry.get_kernel(k) if isinstance(k, str) else k for k in kernels]
    timing = {"n_warmup": n_warmup, "n_runs": n_runs, "n_batch_per_run": n_batch_per_run,
              "rtol": rtol, "atol": atol, "progress": progress}
    wanted = None if backends is None else list(backends)
    out = {}
    for kernel in kernels:
        have = kernel.available_backends(platform)
        if wanted is not None:
            have = [b for b in have if b in wanted]
        if kernel.has_benchmark_data() and kernel.has_call() and len(have) >= 2:
            chosen = None if wanted is None else have
            out[kernel.name] = _fastest(kernel, platform, dict(timing, backends=chosen))
    if save and out:
        _store(out, platform, Path(path) if path is not None else None)
    if apply:
        for kernel in kernels:
            best = out.get(kernel.name, {}).get("backend")
            if best is not None:
                _PENDING.setdefault(kernel.name, {})[platform] = best
                apply_pending(kernel, platform)
    return out


def _fastest(kernel, platform: str, timing: dict) -> dict[str, Any]:
    """Benchmark ``kernel``; its fastest correct backend and that backend's geomean time.

    With ``timing['backends']`` set, only those compete (the reference is timed too, as a
    check, but is not chosen unless it is one of them).
    """
    import warnings

    from primforge.bench import BenchmarkResult

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BenchmarkMismatchWarning)
        result = benchmark_kernel(kernel, platform=platform, **timing)
    allowed = timing.get("backends")
    pool = result if allowed is None else BenchmarkResult(
        [r for r in result.records if r.backend in allowed])
    best = pool.fastest_backend(kernel.name) if len(pool) else None
    median = None
    if best is not None:
        logs = [math.log(r.median) for r in result.filter(backend=best)]
        median = math.exp(sum(logs) / len(logs))
    return {"backend": best, "median_s": median, "result": result}


def _store(out: dict[str, dict[str, Any]], platform: str, path: Path | None) -> None:
    """Write the tuned choices of ``out`` for ``platform`` into the cache file."""
    import jax

    try:
        device = jax.devices(platform)[0].device_kind
    except RuntimeError:
        device = None
    data = _read(path)
    stamp = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    for name, info in out.items():
        if info["backend"] is None:
            continue
        data["kernels"].setdefault(name, {})[platform] = {
            "backend": info["backend"],
            "median_s": info["median_s"],
            "device": device,
            "jax_version": jax.__version__,
            "tuned_at": stamp,
        }
    data["format"], data["version"] = _FORMAT, _VERSION
    _write(data, path)


def _on_kernel_event(event: hooks.KernelEvent) -> None:
    """Stored choices reach kernels as they are created and as their backends appear."""
    if event.kind == hooks.KERNEL_DEFINED:
        _load_from_env()
    elif event.kind == hooks.BACKEND_DEFINED:
        apply_pending(event.kernel, event.platform)


hooks.on_kernel_event(_on_kernel_event)
