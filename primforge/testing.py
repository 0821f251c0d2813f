"""Compile a function for a GPU that is not there: what XLA:GPU makes of it, on any machine.

Needs ``pip install -e ".[gpu-compile]"`` and, without a GPU driver, ``JAX_PLATFORMS=cpu``
set before JAX starts. This module holds what depends on the machine and
:func:`compile_for_gpu`; the result types live in ``primforge._gpu_compile``.

Example (doctests run without the plugin too, so this one only asks):

    >>> from primforge import testing
    >>> sorted(testing.TARGETS)
    ['a100', 'h100']
    >>> reason = testing.unavailable_reason()   # None when compile_for_gpu can run here
    >>> reason is None or 'gpu-compile' in reason
    True
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import os
import pathlib
import shutil
import tempfile
from collections.abc import Callable, Mapping
from typing import Any

import jax

from primforge import _compat
from primforge._gpu_compile.dump import named_in as _named_in
from primforge._gpu_compile.dump import parse_thunks as _parse_thunks  # noqa: F401 - tests
from primforge._gpu_compile.dump import read_dump as _read_dump
from primforge._gpu_compile.lowered import assemble_embedded_ptx as _assemble_embedded_ptx
from primforge._gpu_compile.lowered import custom_calls as _custom_calls
from primforge._gpu_compile.lowered import kernel_names as _kernel_names
from primforge._gpu_compile.results import (
    GpuCompileError,
    GpuCompileResult,
    GpuCompilerUnavailable,
    GpuKernel,
)
from primforge.backends._common import install_hint

__all__ = [
    "TARGETS",
    "GpuCompileError",
    "GpuCompileResult",
    "GpuCompilerUnavailable",
    "GpuKernel",
    "compile_for_gpu",
    "target_config",
    "unavailable_reason",
]

_TARGET_DIR = pathlib.Path(__file__).parent / "gpu_targets"

#: Built-in targets: name -> target description shipped with primforge (XLA's published specs).
TARGETS: Mapping[str, pathlib.Path] = {
    "h100": _TARGET_DIR / "h100_sxm.txtpb",  # sm_90, H100 SXM 80GB
    "a100": _TARGET_DIR / "a100_sxm_80.txtpb",  # sm_80, A100 SXM 80GB
}

_INSTALL = install_hint("gpu-compile")
_PLUGINS = ("jax-cuda12-plugin", "jax-cuda13-plugin")


# --------------------------------------------------------------------------- availability
def _plugin_version() -> tuple[str, str] | None:
    for dist in _PLUGINS:
        try:
            return dist, importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _cuda_dirs() -> list[str]:
    """Folders that may hold ``bin/ptxas``, in the order primforge hands one to XLA."""
    dirs = []
    if os.environ.get("CUDA_ROOT"):
        dirs.append(os.environ["CUDA_ROOT"])
    for mod in ("nvidia.cuda_nvcc", "nvidia.cu13"):  # the nvcc wheels' layouts
        try:
            spec = importlib.util.find_spec(mod)
        except (ImportError, ValueError):
            spec = None
        if spec is not None and spec.submodule_search_locations:
            dirs.extend(spec.submodule_search_locations)
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            dirs.append(os.environ[var])
    found = shutil.which("ptxas")
    if found:
        dirs.append(str(pathlib.Path(found).parent.parent))
    dirs.append("/usr/local/cuda")
    return dirs


@functools.cache
def _cuda_dir() -> str | None:
    """The folder handed to XLA as ``xla_gpu_cuda_data_dir``: the first with ``bin/ptxas``
    and ``nvvm/libdevice`` (what XLA looks for there), else the first with ``bin/ptxas``."""
    dirs = _cuda_dirs()
    has_ptxas = [d for d in dirs if os.access(os.path.join(d, "bin", "ptxas"), os.X_OK)]
    for d in has_ptxas:
        if os.path.isdir(os.path.join(d, "nvvm", "libdevice")):
            return d
    return has_ptxas[0] if has_ptxas else None


def unavailable_reason() -> str | None:
    """Why :func:`compile_for_gpu` cannot run here (a missing package), or None if it can.

    Only what is missing is reported here (the CUDA plugin, a version mismatch with jax,
    ptxas); a plugin that is installed but cannot start is reported by
    :func:`compile_for_gpu` itself, with what to set.

    Example:
        >>> r = unavailable_reason()
        >>> r is None or isinstance(r, str)
        True
    """
    import jaxlib

    plugin = _plugin_version()
    if plugin is None:
        return (
            f"compiling for a GPU target needs JAX's CUDA plugin (jax-cuda12-plugin of "
            f"the installed jaxlib version, {jaxlib.__version__}) and ptxas: {_INSTALL}"
        )
    dist, version = plugin
    if version != jaxlib.__version__:
        return (
            f"{dist} {version} does not match jaxlib {jaxlib.__version__}: install the "
            f"same version (pip install '{dist}=={jaxlib.__version__}' or {_INSTALL})"
        )
    if _cuda_dir() is None:
        return (
            "compiling for a GPU target needs ptxas (not found on PATH, in CUDA_ROOT, "
            f"CUDA_HOME or /usr/local/cuda, nor from pip's nvidia-cuda-nvcc): {_INSTALL}"
        )
    return None


# --------------------------------------------------------------------------- targets
def target_config(target: str | os.PathLike) -> str:
    """The text-format target description for ``'h100'``, ``'a100'`` or a ``.txtpb`` path.

    Example:
        >>> 'major: 9' in target_config('h100')
        True
        >>> target_config('v100')
        Traceback (most recent call last):
        ...
        ValueError: target='v100': expected one of 'a100', 'h100' or the path of a text-format
        GpuTargetConfigProto file (.txtpb)
    """
    if isinstance(target, str) and target.lower() in TARGETS:
        return TARGETS[target.lower()].read_text()
    path = pathlib.Path(target)
    if not path.is_file():
        raise ValueError(
            f"target={str(target)!r}: expected one of {', '.join(repr(t) for t in sorted(TARGETS))}"
            f" or the path of a text-format GpuTargetConfigProto file (.txtpb)"
        )
    return path.read_text()


@functools.cache
def _topology(config: str):
    """Compile-only CUDA devices for one target description (and a one-device mesh)."""
    from jax.experimental import topologies

    try:
        topo = topologies.get_topology_desc(platform="cuda", topology="1x1x1", target_config=config)
    except NotImplementedError as e:
        raise GpuCompilerUnavailable(
            "JAX's CUDA plugin is installed but did not start (no GPU driver here?), so no "
            "CUDA topology can be made. On a machine without a GPU, set JAX_PLATFORMS=cpu "
            f"before JAX starts (the plugin then loads for compiling only). JAX said: {e}"
        ) from e
    except Exception as e:  # XLA's own error type varies across versions
        if "GpuTargetConfigProto" in str(e):
            raise ValueError(f"the target description does not parse: {e}") from e
        raise
    return topologies.make_mesh(topo, (1,), ("x",))


def _require() -> None:
    reason = unavailable_reason()
    if reason is not None:
        raise GpuCompilerUnavailable(reason)


# --------------------------------------------------------------------------- arguments, dump
def _place(args, sharding):
    """Every array-like leaf as a ShapeDtypeStruct on the compile-only device."""

    def leaf(x):
        if isinstance(x, jax.ShapeDtypeStruct):
            return jax.ShapeDtypeStruct(x.shape, x.dtype, weak_type=x.weak_type, sharding=sharding)
        aval = jax.typeof(x)
        return jax.ShapeDtypeStruct(
            aval.shape, aval.dtype, weak_type=aval.weak_type, sharding=sharding
        )

    return jax.tree.map(leaf, args, is_leaf=lambda x: isinstance(x, jax.ShapeDtypeStruct))


# --------------------------------------------------------------------------- compile
# Long only for its docstring (arguments, results, a runnable example); the code is short.
def compile_for_gpu(
    fn: Callable[..., Any],
    *args: Any,
    target: str | os.PathLike = "h100",
    ptx: bool = False,
    check: bool = False,
) -> GpuCompileResult:
    """Compile ``jax.jit(fn)`` with XLA:GPU for ``target`` on any machine, GPU or not.

    Args:
        fn: the function; it is traced with ``args`` exactly as ``jax.jit(fn)`` would be
            (bind static arguments with ``functools.partial``).
        *args: arrays, ``jax.ShapeDtypeStruct``s or Python scalars (pytrees of them); only
            their shapes and dtypes are used.
        target: ``'h100'`` (sm_90), ``'a100'`` (sm_80), or the path of a text-format
            ``GpuTargetConfigProto`` (XLA publishes them for other GPUs).
        ptx: also return the PTX of every kernel XLA generated (``result.ptx``). The
            PTX of XLA's own kernels is read from XLA's dump, where JAX 0.11's XLA no
            longer writes it: there ``result.ptx`` holds only the kernels primforge
            assembles itself (Numba-CUDA and ``cuda_raw``).
        check: raise :class:`GpuCompileError` (message: XLA's error and the kernel it
            names) instead of returning a failed result.

    Returns:
        A :class:`GpuCompileResult`: ``ok``, XLA's ``error`` and ``failed_kernel`` on
        failure; the ``kernels`` with launch dimensions, ``custom_calls`` and optionally
        ``ptx`` on success. Errors of tracing and lowering (primforge's own checks, bad
        arguments) are raised as usual: they are not GPU compile errors.

    Raises:
        GpuCompilerUnavailable: the CUDA plugin is missing, its version differs from jax's,
            ptxas is missing, or the plugin cannot start (``JAX_PLATFORMS=cpu`` not set on a
            machine without a GPU driver). The message says what to install or set.

    Example (the compile needs ``primforge[gpu-compile]``; without it, the expected
    result is printed instead):

        >>> import jax.numpy as jnp
        >>> def sine_on(target):
        ...     r = compile_for_gpu(jnp.sin, jnp.ones(1024, jnp.float32), target=target)
        ...     return r.ok, r.sm, [(k.grid, k.block) for k in r.kernels]
        >>> if unavailable_reason() is None:
        ...     print(sine_on("a100"))
        ... else:
        ...     print((True, 'sm_80', [((8, 1, 1), (128, 1, 1))]))
        (True, 'sm_80', [((8, 1, 1), (128, 1, 1))])
    """
    _require()
    mesh = _topology(target_config(target))
    device = mesh.devices.flat[0]
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    # out_shardings too: a function without array arguments must still land on the target.
    with _compat.device_less_gpu_lowering(device_kind=device.device_kind):
        lowered = jax.jit(fn, out_shardings=sharding).lower(*_place(args, sharding))
    custom = _custom_calls(lowered.compiler_ir("stablehlo"))
    info: dict[str, Any] = {
        "target": str(target),
        "device_kind": device.device_kind,
        "compute_capability": str(getattr(device, "compute_capability", "?")),
        "custom_calls": tuple(dict.fromkeys(name for name, _ in custom)),
    }

    def failed(error: str, kernel: str | None) -> GpuCompileResult:
        result = GpuCompileResult(ok=False, error=error, failed_kernel=kernel, **info)
        return result.check() if check else result

    error, hlo, kernels, ptx_map = _compile_with_dump(lowered, target, ptx)
    if error is not None:
        return failed(error, _named_in(error, _kernel_names(custom)))
    embedded_ptx: dict[str, str] = {}
    sm = "sm_" + info["compute_capability"].replace(".", "")
    embedded, bad_kernel, error = _assemble_embedded_ptx(custom, sm, embedded_ptx, _cuda_dir())
    if error is not None:
        return failed(error, bad_kernel)
    if ptx:
        ptx_map.update(embedded_ptx)
    return GpuCompileResult(
        ok=True, kernels=kernels + tuple(embedded), ptx=ptx_map, hlo=hlo, **info
    )


def _compile_with_dump(
    lowered: Any, target: str | os.PathLike, want_ptx: bool
) -> tuple[str | None, str | None, tuple[GpuKernel, ...], dict[str, str]]:
    """Compile with XLA:GPU, dumping into a private folder read back before it is removed.

    Returns XLA's error (None on success), the optimised HLO, the launches and the PTX.
    """
    options = {"xla_gpu_cuda_data_dir": _cuda_dir() or ""}
    with tempfile.TemporaryDirectory(prefix="primforge-gpu-compile-") as dump:
        options["xla_dump_to"] = dump
        try:
            compiled = lowered.compile(compiler_options=options)
        except Exception as e:  # XLA raises its own runtime error types
            error = str(e)
            if "ptxas" in error and ("not found" in error.lower() or "No such" in error):
                raise GpuCompilerUnavailable(
                    f"XLA:GPU could not run ptxas: {_INSTALL}\n{error}"
                ) from e
            return error, None, (), {}
        if not any(name.endswith("gpu_after_optimizations.txt") for name in os.listdir(dump)):
            raise RuntimeError(  # a guard: never report another compiler's success as XLA:GPU's
                f"compile_for_gpu: the function was not compiled by XLA:GPU for {target!r} "
                "(its computation went to another device)"
            )
        hlo = compiled.as_text()
        kernels, ptx_map = _read_dump(dump, hlo, want_ptx)
    return None, hlo, kernels, ptx_map
