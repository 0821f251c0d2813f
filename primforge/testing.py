"""Compile a function for a GPU that is not there: what XLA:GPU makes of it, on any machine.

Design. XLA:GPU needs a device description, not a device, to compile. JAX exposes that as a
compile-only topology (``jax.experimental.topologies``) built from a text-format
``GpuTargetConfigProto``; arguments placed on its devices (``ShapeDtypeStruct`` with a
sharding) make ``jax.jit(fn).lower(...).compile()`` run XLA:GPU's whole pipeline (HLO passes,
fusion, Triton, LLVM, ptxas) and stop short of running anything. Each compile is told to dump
into a private temporary folder (compiler option ``xla_dump_to``, read per compile, so no
global ``XLA_FLAGS``), and the kernel list (XLA's thunk sequence: every launch with its grid,
block and shared memory) and the PTX are read back from there.

Requirements: ``pip install 'primforge[gpu-compile]'`` (the ``jax-cuda12-plugin`` of the
installed jax version, and ``ptxas``), and, on a machine with no GPU driver,
``JAX_PLATFORMS=cpu`` set before JAX starts (otherwise the plugin fails to initialise and no
CUDA topology can be made). What this proves: XLA:GPU accepts every kernel of the function
for that target (custom calls resolve, Triton kernels compile, PTX assembles). What it does
not: that anything runs (launch, the values an FFI handler decodes at run time, driver
compatibility, speed).

Example (doctests run without the plugin too, so this one only asks):

    >>> from primforge import testing
    >>> sorted(testing.TARGETS)
    ['a100', 'h100']
    >>> reason = testing.unavailable_reason()   # None when compile_for_gpu can run here
    >>> reason is None or 'gpu-compile' in reason
    True
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import importlib.util
import os
import pathlib
import re
import shutil
import tempfile
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np

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

_INSTALL = "pip install 'primforge[gpu-compile]'"
_PLUGINS = ("jax-cuda12-plugin", "jax-cuda13-plugin")


class GpuCompilerUnavailable(RuntimeError):
    """XLA:GPU cannot be run here: the CUDA plugin, its version, ptxas or the setup is wrong.

    Example:
        >>> issubclass(GpuCompilerUnavailable, RuntimeError)
        True
    """


class GpuCompileError(RuntimeError):
    """XLA:GPU rejected the function; ``.result`` is the :class:`GpuCompileResult`.

    Example:
        >>> issubclass(GpuCompileError, RuntimeError)
        True
    """

    def __init__(self, result: GpuCompileResult):
        super().__init__(result.describe())
        self.result = result


@dataclasses.dataclass(frozen=True)
class GpuKernel:
    """One launch XLA:GPU planned: a GPU kernel (with its launch shape) or a custom call.

    Attributes:
        name: the kernel's name (a fusion, a Triton kernel, or the custom call's target).
        kind: XLA's thunk kind, e.g. ``'kKernel'``, ``'kCustomKernel'``, ``'kCustomCall'``.
        grid: blocks per grid ``(x, y, z)``, or None for a custom call (it launches itself).
        block: threads per block ``(x, y, z)``, or None for a custom call.
        shared_memory: dynamic shared memory in bytes, or None for a custom call.

    Example:
        >>> k = GpuKernel('loop_add_fusion', 'kKernel', (8, 1, 1), (128, 1, 1), 0)
        >>> k.threads
        1024
    """

    name: str
    kind: str
    grid: tuple[int, int, int] | None = None
    block: tuple[int, int, int] | None = None
    shared_memory: int | None = None

    @property
    def threads(self) -> int | None:
        """Threads in the whole launch (grid times block), or None for a custom call."""
        if self.grid is None or self.block is None:
            return None
        return int(np.prod(self.grid) * np.prod(self.block))


@dataclasses.dataclass(frozen=True)
class GpuCompileResult:
    """What XLA:GPU made of a function for one target.

    Attributes:
        target: the target as given (``'h100'``, ``'a100'`` or a path).
        device_kind: the device the target describes, e.g. ``'NVIDIA H100 80GB HBM3'``.
        compute_capability: e.g. ``'9.0'``.
        ok: whether XLA:GPU compiled the function.
        error: XLA's error text when it did not, else None.
        failed_kernel: the kernel or custom call the error names, when it names one.
        kernels: every launch of the compiled program, in order (empty on failure).
        custom_calls: the custom-call targets of the lowered program (FFI handlers, Triton).
        ptx: kernel entry name -> the PTX module holding it (only with ``ptx=True``).
        hlo: XLA's optimised HLO text (on success).

    Example:
        >>> r = GpuCompileResult('h100', 'NVIDIA H100 80GB HBM3', '9.0', ok=False,
        ...                      error='bad', failed_kernel='k')
        >>> r.describe().splitlines()[0]
        "XLA:GPU failed to compile for h100 (NVIDIA H100 80GB HBM3, sm_90), in kernel 'k':"
    """

    target: str
    device_kind: str
    compute_capability: str
    ok: bool
    error: str | None = None
    failed_kernel: str | None = None
    kernels: tuple[GpuKernel, ...] = ()
    custom_calls: tuple[str, ...] = ()
    ptx: Mapping[str, str] = dataclasses.field(default_factory=dict)
    hlo: str | None = None

    @property
    def sm(self) -> str:
        """The target architecture as ``'sm_XY'``."""
        return "sm_" + self.compute_capability.replace(".", "")

    def describe(self) -> str:
        """A human-readable summary: the error, or the kernels with their launch shapes."""
        where = f"{self.target} ({self.device_kind}, {self.sm})"
        if not self.ok:
            named = f", in kernel {self.failed_kernel!r}" if self.failed_kernel else ""
            calls = (f"\ncustom calls in the program: {', '.join(self.custom_calls)}"
                     if self.custom_calls else "")
            return f"XLA:GPU failed to compile for {where}{named}:\n{self.error}{calls}"
        lines = [f"XLA:GPU compiled for {where}: {len(self.kernels)} launch(es)"]
        for k in self.kernels:
            if k.grid is None:
                lines.append(f"  {k.kind:14s} {k.name}")
            else:
                lines.append(f"  {k.kind:14s} {k.name} grid={k.grid} block={k.block} "
                             f"shared={k.shared_memory}")
        return "\n".join(lines)

    def check(self) -> GpuCompileResult:
        """Raise :class:`GpuCompileError` unless the compile succeeded; return self."""
        if not self.ok:
            raise GpuCompileError(self)
        return self


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
        dirs.extend(spec.submodule_search_locations or [] if spec else [])
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
    plugin = _plugin_version()
    if plugin is None:
        return (f"compiling for a GPU target needs JAX's CUDA plugin (jax-cuda12-plugin of "
                f"the installed jax version, {jax.__version__}) and ptxas: {_INSTALL}")
    dist, version = plugin
    if version != jax.__version__:
        return (f"{dist} {version} does not match jax {jax.__version__}: install the same "
                f"version (pip install '{dist}=={jax.__version__}' or {_INSTALL})")
    if _cuda_dir() is None:
        return ("compiling for a GPU target needs ptxas (not found on PATH, in CUDA_ROOT, "
                f"CUDA_HOME or /usr/local/cuda, nor from pip's nvidia-cuda-nvcc): {_INSTALL}")
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
        ValueError: target='v100': expected one of 'a100', 'h100' or the path of a text-format GpuTargetConfigProto file (.txtpb)
    """
    if isinstance(target, str) and target.lower() in TARGETS:
        return TARGETS[target.lower()].read_text()
    path = pathlib.Path(target)
    if not path.is_file():
        raise ValueError(
            f"target={str(target)!r}: expected one of {', '.join(repr(t) for t in sorted(TARGETS))}"
            f" or the path of a text-format GpuTargetConfigProto file (.txtpb)")
    return path.read_text()


@functools.cache
def _topology(config: str):
    """Compile-only CUDA devices for one target description (and a one-device mesh)."""
    from jax.experimental import topologies

    try:
        topo = topologies.get_topology_desc(platform="cuda", topology="1x1x1",
                                            target_config=config)
    except NotImplementedError as e:
        raise GpuCompilerUnavailable(
            "JAX's CUDA plugin is installed but did not start (no GPU driver here?), so no "
            "CUDA topology can be made. On a machine without a GPU, set JAX_PLATFORMS=cpu "
            f"before JAX starts (the plugin then loads for compiling only). JAX said: {e}"
        ) from e
    except Exception as e:  # noqa: BLE001 - XLA's own error type varies across versions
        if "GpuTargetConfigProto" in str(e):
            raise ValueError(f"the target description does not parse: {e}") from e
        raise
    return topologies.make_mesh(topo, (1,), ("x",))


def _require() -> None:
    reason = unavailable_reason()
    if reason is not None:
        raise GpuCompilerUnavailable(reason)


# --------------------------------------------------------------------------- compile
def _place(args, sharding):
    """Every array-like leaf as a ShapeDtypeStruct on the compile-only device."""

    def leaf(x):
        if isinstance(x, jax.ShapeDtypeStruct):
            return jax.ShapeDtypeStruct(x.shape, x.dtype, weak_type=x.weak_type,
                                        sharding=sharding)
        aval = jax.typeof(x)
        return jax.ShapeDtypeStruct(aval.shape, aval.dtype, weak_type=aval.weak_type,
                                    sharding=sharding)

    return jax.tree.map(leaf, args, is_leaf=lambda x: isinstance(x, jax.ShapeDtypeStruct))


_THUNK = re.compile(
    r"^(?P<id>\d+):\s+(?P<kind>k\w+)\s+\[[^\]]*\]\s+(?P<name>\S+)"
    r"(?:\s+grid:\s*\[(?P<grid>[\d,\s]+)\]\s+threads:\s*\[(?P<block>[\d,\s]+)\]"
    r"\s+shared_memory:\s*(?P<smem>\d+))?")
_THUNK_META = re.compile(
    r'profile_annotation:\s*"(?P<name>[^"]*)"\s*thunk_id:\s*(?P<id>\d+)\s*\}\s*'
    r'thunk_kind:\s*"(?P<kind>\w+)"')
_CUSTOM_CALL_HLO = re.compile(r'%(?P<inst>[\w.\-]+) = [^\n]*?custom-call\([^\n]*?'
                              r'custom_call_target="(?P<target>[^"]+)"')
_CUSTOM_CALL_MLIR = re.compile(r"stablehlo\.custom_call @([\w.$\-]+)")
_TRITON_NAME = re.compile(r'name\s*=\s*"([^"]+)"')


def _dims(text: str) -> tuple[int, int, int]:
    vals = [int(v) for v in text.replace(" ", "").split(",") if v]
    return tuple((vals + [1, 1, 1])[:3])  # type: ignore[return-value]


def _parse_thunks(sequence: str, metadata: str, hlo: str) -> tuple[GpuKernel, ...]:
    """Launches from XLA's thunk sequence; custom calls named by their target."""
    annotation = {m["id"]: m["name"] for m in _THUNK_META.finditer(metadata)}
    targets = {m["inst"]: m["target"] for m in _CUSTOM_CALL_HLO.finditer(hlo)}
    kernels = []
    for line in sequence.splitlines():
        m = _THUNK.match(line.strip())
        if m is None:
            continue
        if m["grid"] is not None:
            kernels.append(GpuKernel(m["name"], m["kind"], _dims(m["grid"]), _dims(m["block"]),
                                     int(m["smem"])))
            continue
        inst = annotation.get(str(int(m["id"])), m["name"])
        kernels.append(GpuKernel(targets.get(inst, inst), m["kind"]))
    return tuple(kernels)


def _read_dump(folder: str, hlo: str, want_ptx: bool):
    files = {name: pathlib.Path(folder, name) for name in sorted(os.listdir(folder))}
    kernels: tuple[GpuKernel, ...] = ()
    ptx: dict[str, str] = {}
    for name, path in files.items():
        if name.endswith(".thunk_sequence.txt"):
            meta = files.get(name.replace(".thunk_sequence.txt", ".thunk_metadata.txt"))
            kernels += _parse_thunks(path.read_text(), meta.read_text() if meta else "", hlo)
        elif want_ptx and name.endswith(".ptx"):
            text = path.read_text()
            for entry in re.findall(r"\.entry\s+([\w$]+)\s*\(", text):
                ptx[entry] = text
    return kernels, ptx


def _named_in(error: str, names) -> str | None:
    hits = [n for n in names if n and n in error]
    return max(hits, key=len) if hits else None


# --------------------------------------------------------------------------- PTX in attributes
def _custom_calls(module) -> list[tuple[str, dict[str, Any]]]:
    """(target, backend_config attributes) of every custom call in a lowered module."""
    found: list[tuple[str, dict[str, Any]]] = []

    def walk(op):
        for region in op.regions:
            for block in region.blocks:
                for inner in block.operations:
                    o = inner.operation
                    if o.name == "stablehlo.custom_call":
                        attrs = o.attributes
                        target = attrs["call_target_name"].value
                        config = {}
                        if "mhlo.backend_config" in attrs:
                            try:
                                config = {a.name: a.attr for a in attrs["mhlo.backend_config"]}
                            except TypeError:  # a string backend_config (e.g. Triton's)
                                config = {}
                        found.append((target, config))
                    walk(o)

    walk(module.operation)
    return found


def _attr_value(attr):
    for getter in ("value",):
        if hasattr(attr, getter):
            return getattr(attr, getter)
    return [int(v) for v in attr] if hasattr(attr, "__iter__") else None


def _assemble_embedded_ptx(module, sm: str) -> tuple[list[GpuKernel], str | None, str | None]:
    """Assemble, with ptxas for ``sm``, the PTX that custom calls carry as an attribute.

    primforge's PTX launcher (the numba_cuda backend) hands the driver PTX at run time; XLA
    never sees inside it, so ptxas is what proves it assembles for the target.
    """
    import subprocess

    kernels, ptxas = [], os.path.join(_cuda_dir() or "", "bin", "ptxas")
    for target, config in _custom_calls(module):
        if "ptx" not in config or "kernel" not in config:
            continue
        name = _attr_value(config["kernel"])
        grid = tuple(int(v) for v in np.asarray(config["grid"])) if "grid" in config else None
        block = tuple(int(v) for v in np.asarray(config["block"])) if "block" in config else None
        smem = int(_attr_value(config["shared_mem"])) if "shared_mem" in config else None
        with tempfile.TemporaryDirectory(prefix="primforge-ptxas-") as tmp:
            src = pathlib.Path(tmp, "k.ptx")
            src.write_text(_attr_value(config["ptx"]))
            proc = subprocess.run([ptxas, f"-arch={sm}", str(src), "-o",
                                   str(pathlib.Path(tmp, "k.cubin"))],
                                  capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            return kernels, name, f"ptxas -arch={sm} rejected the PTX of {name!r} " \
                                  f"(custom call {target}):\n{proc.stderr.strip()}"
        kernels.append(GpuKernel(name, "embedded-ptx", grid, block, smem))
    return kernels, None, None


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
        ptx: also return the PTX of every kernel XLA generated (``result.ptx``).
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
    config = target_config(target)
    mesh = _topology(config)
    device = mesh.devices.flat[0]
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    lowered = jax.jit(fn).lower(*_place(args, sharding))
    lowered_text = lowered.as_text()
    calls = tuple(dict.fromkeys(_CUSTOM_CALL_MLIR.findall(lowered_text)))
    kernel_names = set(_TRITON_NAME.findall(lowered_text)) | set(calls)
    info: dict[str, Any] = dict(
        target=str(target), device_kind=device.device_kind,
        compute_capability=str(getattr(device, "compute_capability", "?")), custom_calls=calls)
    sm = "sm_" + info["compute_capability"].replace(".", "")

    def failed(error: str, kernel: str | None) -> GpuCompileResult:
        result = GpuCompileResult(ok=False, error=error, failed_kernel=kernel, **info)
        return result.check() if check else result

    options = {"xla_gpu_cuda_data_dir": _cuda_dir() or ""}
    with tempfile.TemporaryDirectory(prefix="primforge-gpu-compile-") as dump:
        options["xla_dump_to"] = dump
        try:
            compiled = lowered.compile(compiler_options=options)
        except Exception as e:  # noqa: BLE001 - XLA raises its own runtime error types
            error = str(e)
            if "ptxas" in error and ("not found" in error.lower() or "No such" in error):
                raise GpuCompilerUnavailable(f"XLA:GPU could not run ptxas: {_INSTALL}\n"
                                             f"{error}") from e
            return failed(error, _named_in(error, kernel_names))
        hlo = compiled.as_text()
        kernels, ptx_map = _read_dump(dump, hlo, ptx)
    embedded, bad_kernel, error = _assemble_embedded_ptx(lowered.compiler_ir("stablehlo"), sm)
    if error is not None:
        return failed(error, bad_kernel)
    return GpuCompileResult(ok=True, kernels=kernels + tuple(embedded), ptx=ptx_map, hlo=hlo,
                            **info)
