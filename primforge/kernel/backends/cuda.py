"""CUDA source backend ('cuda_raw'): C++/CUDA compiled by nvcc, served on the typed XLA FFI.

* Availability: an ``nvcc`` is found on ``PATH``, under ``$CUDA_HOME``/``$CUDA_PATH``, or
  in the NVIDIA pip packages (``nvidia-cuda-nvcc``, extra ``primforge[cuda]``). Nothing is
  imported or run until a kernel asks for it.
* Platforms: 'gpu' (:func:`load_cuda_inline`, :func:`load_cuda_file`) and 'cpu' (the C++
  twin :func:`load_cpp_inline`, compiled by the host C++ compiler).
* Source: handlers written against XLA's FFI headers
  (``XLA_FFI_DEFINE_HANDLER_SYMBOL``), which take the CUDA stream from the call context
  (``ffi::PlatformStream<cudaStream_t>``), so a launch never synchronises the host. The
  shared library is cached on disk under a key made of the source, flags, GPU architecture,
  compiler version and jaxlib version; each exported handler is registered as an FFI target
  and called with ``jax.ffi.ffi_call``. A compile error raises :class:`CompileError` with the
  compiler's message and the offending source lines.
* Product: the generator returns a traceable function (typically a closure over
  ``module.call(...)``); it is used as is.
* Testing without a GPU: the C++ twin runs the whole route on the CPU, nvcc compiles CUDA
  sources here, and ``lowering_platforms=('cuda',)`` checks the GPU lowering.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from typing import Any

import jax

from primforge.kernel.backends import tuple_results

NAME = "cuda_raw"
PLATFORMS = ("cpu", "gpu")
EXTRA = "cuda"

__all__ = [
    "CompileError",
    "FFIModule",
    "cache_dir",
    "find_nvcc",
    "is_available",
    "load_cpp_inline",
    "load_cuda_file",
    "load_cuda_inline",
    "make_callable",
]

_LOCK = threading.Lock()
_LOADED: dict[tuple[str, str], FFIModule] = {}  # (library path, name) -> loaded module
_HANDLER_RE = re.compile(r"XLA_FFI_DEFINE_HANDLER_SYMBOL\s*\(\s*([A-Za-z_]\w*)")


class CompileError(RuntimeError):
    """nvcc (or the C++ compiler) rejected a source; the message quotes it and the lines."""


def find_nvcc() -> str | None:
    """Path of an ``nvcc`` executable, or None.

    Looks at ``$PRIMFORGE_NVCC``, ``PATH``, ``$CUDA_HOME/bin``, ``$CUDA_PATH/bin``,
    ``/usr/local/cuda/bin`` and the NVIDIA pip packages (``nvidia/cu*/bin``,
    ``nvidia/cuda_nvcc/bin``), in that order.

    Example:
        >>> p = find_nvcc()
        >>> p is None or os.path.basename(p) == 'nvcc'
        True
    """
    env = os.environ.get("PRIMFORGE_NVCC")
    if env and os.path.isfile(env):
        return env
    found = shutil.which("nvcc")
    if found:
        return found
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    candidates = [os.path.join(r, "bin", "nvcc") for r in roots if r]
    for base in sys.path:
        nv = os.path.join(base, "nvidia")
        if os.path.isdir(nv):
            for sub in sorted(os.listdir(nv)):
                candidates.append(os.path.join(nv, sub, "bin", "nvcc"))
    for c in candidates:
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def _find_cxx() -> str | None:
    for cand in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if cand and shutil.which(cand):
            return shutil.which(cand)
    return None


def is_available() -> bool:
    """Whether nvcc (for GPU sources) or a C++ compiler (for the CPU twin) is present.

    Example:
        >>> isinstance(is_available(), bool)
        True
    """
    return find_nvcc() is not None or _find_cxx() is not None


def cache_dir() -> str:
    """Folder of compiled libraries: ``$PRIMFORGE_CACHE_DIR`` or ``~/.cache/primforge``.

    Example:
        >>> cache_dir().endswith('cuda')
        True
    """
    root = os.environ.get("PRIMFORGE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "primforge"
    )
    return os.path.join(root, "cuda")


@functools.cache
def _compiler_version(compiler: str) -> str:
    try:
        out = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60,
                             check=False)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip()


def _default_arch() -> str:
    """Architecture of the first visible GPU, else sm_80 (with PTX, so newer GPUs JIT it)."""
    try:
        gpus = jax.devices("gpu")
    except RuntimeError:
        gpus = []
    if gpus:
        cc = getattr(gpus[0], "compute_capability", None)
        if cc:
            return "sm_" + str(cc).replace(".", "")
    return "sm_80"


def _normalize_arch(arch: str | int | None) -> str:
    if arch is None:
        return _default_arch()
    s = str(arch).strip().lower().replace(".", "")
    s = s.removeprefix("sm_").removeprefix("compute_")
    if not re.fullmatch(r"\d+[af]?", s):
        raise ValueError(f"arch must look like 'sm_90', '9.0' or 90, got {arch!r}")
    return "sm_" + s


def _quote_errors(log: str, source: str, src_path: str) -> str:
    """Compiler log plus the source lines its errors point at."""
    lines = source.splitlines()
    base = re.escape(os.path.basename(src_path))
    pattern = re.compile(rf"{base}(?:\((\d+)\):|:(\d+):(?:\d+:)?)\s*(?:error|fatal error)")
    quoted = []
    for m in pattern.finditer(log):
        n = int(m.group(1) or m.group(2))
        if 1 <= n <= len(lines) and n not in [q[0] for q in quoted]:
            quoted.append((n, lines[n - 1]))
    text = log.strip().replace(src_path, os.path.basename(src_path))
    if quoted:
        text += "\n\nsource lines:\n" + "\n".join(f"  {n:4d} | {s}" for n, s in quoted)
    return text


_QUOTED_INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.MULTILINE)


def _local_headers_digest(source: str, include_dirs: Sequence[str]) -> str:
    """Hash of every ``#include "..."`` header found in ``include_dirs``, followed recursively.

    The cache key must change when such a header changes, or an edited header would keep
    serving the library built from its old text. Headers not found there (XLA's, the CUDA
    toolkit's) are covered by the jaxlib and compiler versions in the key instead.

    Example:
        >>> _local_headers_digest('int x;', []) == _local_headers_digest('int y;', [])
        True
    """
    h = hashlib.sha256()
    seen: set[str] = set()
    pending = [(source, None)]
    while pending:
        text, here = pending.pop()
        for name in _QUOTED_INCLUDE_RE.findall(text):
            folders = ([here] if here else []) + [os.fspath(d) for d in include_dirs]
            for folder in folders:
                path = os.path.realpath(os.path.join(folder, name))
                if os.path.isfile(path):
                    break
            else:
                continue
            if path in seen:
                continue
            seen.add(path)
            with open(path, encoding="utf-8", errors="replace") as f:
                body = f.read()
            h.update(name.encode() + b"\0" + body.encode() + b"\0")
            pending.append((body, os.path.dirname(path)))
    return h.hexdigest()


def _build(source: str, *, kind: str, name: str, flags: Sequence[str], arch: str | None,
           include_dirs: Sequence[str], verbose: bool) -> tuple[str, bool]:
    """Compile ``source`` into a cached shared library; return (path, was_cached)."""
    flags = tuple(str(f) for f in flags)
    if kind == "cuda":
        compiler = find_nvcc()
        if compiler is None:
            raise FileNotFoundError(
                "nvcc was not found on PATH, under $CUDA_HOME/$CUDA_PATH, or in the NVIDIA pip "
                "packages: install the CUDA toolkit or pip install 'primforge[cuda]' "
                "(nvidia-cuda-nvcc), or set $PRIMFORGE_NVCC"
            )
        sm = _normalize_arch(arch)
        num = sm[3:]
        compute = "compute_" + num
        cmd_flags = [
            "-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC",
            f"-gencode=arch={compute},code=[{sm},{compute}]",
        ]
        suffix = ".cu"
    else:
        compiler = _find_cxx()
        if compiler is None:
            raise FileNotFoundError("no C++ compiler (g++, c++, clang++ or $CXX) was found")
        sm = "host"
        cmd_flags = ["-O3", "-std=c++17", "-shared", "-fPIC"]
        suffix = ".cc"
    includes = [jax.ffi.include_dir(), *include_dirs]
    key_text = "\0".join([
        kind, source, " ".join(flags), sm, " ".join(includes), _compiler_version(compiler),
        jax.__version__, _jaxlib_version(), sys.platform,
        _local_headers_digest(source, include_dirs),
    ])
    digest = hashlib.sha256(key_text.encode()).hexdigest()[:20]
    folder = cache_dir()
    os.makedirs(folder, exist_ok=True)
    lib_path = os.path.join(folder, f"lib{digest}.so")
    if os.path.exists(lib_path):
        return lib_path, True
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        src_path = os.path.join(tmp, name + suffix)
        with open(src_path, "w", encoding="utf-8") as f:
            f.write(source)
        out_tmp = os.path.join(tmp, "out.so")
        # XLA's headers go in as system headers so their warnings do not bury the user's errors.
        inc = ["-isystem", includes[0], *[f"-I{d}" for d in includes[1:]]]
        cmd = [compiler, *cmd_flags, *inc, *flags, src_path,
               "-o", out_tmp]
        if verbose:
            print(" ".join(cmd))
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise CompileError(
                f"{os.path.basename(compiler)} failed to compile {name!r} "
                f"(exit {proc.returncode}):\n"
                + _quote_errors(proc.stderr + proc.stdout, source, src_path)
            )
        os.replace(out_tmp, lib_path)  # atomic: concurrent builders never see half a file
    return lib_path, False


def _jaxlib_version() -> str:
    import jaxlib

    return getattr(jaxlib, "__version__", "unknown")


@dataclasses.dataclass
class FFIModule:
    """A compiled library whose XLA FFI handlers are registered as FFI targets.

    Attributes:
        name: the module name (prefix of its target names).
        path: the shared library on disk (in the cache).
        platform: 'CUDA' or 'cpu' (what the targets are registered for).
        targets: handler symbol -> registered FFI target name.
        cached: whether the library came from the cache rather than a fresh compile.

    Example:
        >>> m = FFIModule('demo', '/nonexistent.so', 'cpu', {'Scale': 'demo.Scale'}, True)
        >>> m.target('Scale')
        'demo.Scale'
    """

    name: str
    path: str
    platform: str
    targets: dict[str, str]
    cached: bool = False
    library: Any = dataclasses.field(default=None, repr=False)

    def target(self, handler: str) -> str:
        """The FFI target name registered for ``handler``."""
        try:
            return self.targets[handler]
        except KeyError:
            raise KeyError(
                f"module {self.name!r} has no handler {handler!r}; it exports {list(self.targets)}"
            ) from None

    def call(self, handler: str, *args, outs, vmap_method: str = "sequential", **attrs):
        """Call ``handler`` through ``jax.ffi.ffi_call`` (traceable, jittable).

        Args:
            handler: an exported handler symbol.
            *args: input arrays.
            outs: a ``jax.ShapeDtypeStruct`` or a sequence of them.
            vmap_method: how the call batches under ``jax.vmap``.
            **attrs: FFI attributes (Python scalars, strings or NumPy arrays).

        Returns:
            The output(s), shaped like ``outs``.
        """
        return jax.ffi.ffi_call(self.target(handler), outs, vmap_method=vmap_method)(
            *args, **attrs
        )

    def function(self, handler: str, *, outs, vmap_method: str = "sequential", **attrs):
        """A function of the input arrays that calls ``handler`` with fixed ``outs``/attrs."""
        self.target(handler)
        return lambda *args: self.call(handler, *args, outs=outs, vmap_method=vmap_method,
                                       **attrs)


def _load(source: str, *, kind: str, name: str | None, handlers: Sequence[str] | None,
          flags: Sequence[str], arch: str | None, include_dirs: Sequence[str],
          verbose: bool, register: bool, platform: str | None = None) -> FFIModule:
    if not isinstance(source, str) or not source.strip():
        raise TypeError("source must be a non-empty str of C++/CUDA code")
    if handlers is None:
        handlers = list(dict.fromkeys(_HANDLER_RE.findall(source)))
        if not handlers:
            raise ValueError(
                "no handlers given and none found: define them with "
                "XLA_FFI_DEFINE_HANDLER_SYMBOL(Name, impl, binding) or pass handlers=[...]"
            )
    handlers = [str(h) for h in handlers]
    name = name or "pf" + hashlib.sha256(source.encode()).hexdigest()[:10]
    if not re.fullmatch(r"[A-Za-z_][\w.]*", name):
        raise ValueError(f"name must be an identifier-like string, got {name!r}")
    path, cached = _build(source, kind=kind, name=name, flags=flags, arch=arch,
                          include_dirs=include_dirs, verbose=verbose)
    platform = platform or ("CUDA" if kind == "cuda" else "cpu")
    with _LOCK:
        known = _LOADED.get((path, name))
        if known is not None:
            known.cached = cached
            return known
        digest = os.path.basename(path)[3:-3]
        targets = {h: f"{name}.{digest[:8]}.{h}" for h in handlers}
        module = FFIModule(name, path, platform, targets, cached)
        if register:
            lib = ctypes.CDLL(path)
            jax.devices()  # the CPU client must exist before targets are registered
            for h, target in targets.items():
                try:
                    fn = getattr(lib, h)
                except AttributeError:
                    raise ValueError(
                        f"module {name!r} does not export handler {h!r}: declare it with "
                        f"XLA_FFI_DEFINE_HANDLER_SYMBOL({h}, ...)"
                    ) from None
                addr = ctypes.cast(fn, ctypes.c_void_p).value
                jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(addr), platform=platform)
            module.library = lib
            _LOADED[(path, name)] = module
        return module


def load_cuda_inline(
    source: str,
    *,
    name: str | None = None,
    handlers: Sequence[str] | None = None,
    flags: Sequence[str] = (),
    arch: str | int | None = None,
    include_dirs: Sequence[str] = (),
    verbose: bool = False,
    register: bool = True,
) -> FFIModule:
    """Compile CUDA C++ with nvcc, load it, and register its XLA FFI handlers for the GPU.

    Handlers are declared in the source with ``XLA_FFI_DEFINE_HANDLER_SYMBOL(Name, impl,
    binding)`` (``#include "xla/ffi/api/ffi.h"``; the include path is added) and should bind
    ``.Ctx<ffi::PlatformStream<cudaStream_t>>()`` so kernels launch on XLA's stream.

    Args:
        source: CUDA C++ source.
        name: module name (default: derived from the source hash).
        handlers: exported handler symbols (default: every
            ``XLA_FFI_DEFINE_HANDLER_SYMBOL`` in the source).
        flags: extra nvcc flags. arch: GPU architecture such as 'sm_90' (default: the
            visible GPU, else sm_80 plus its PTX).
        include_dirs: extra include folders.
        verbose: print the compile command.
        register: load the library and register its handlers (False: compile only).

    Returns:
        An :class:`FFIModule`; call a handler with ``module.call(handler, *args, outs=...)``.

    Raises:
        CompileError: nvcc failed; the message quotes nvcc and the offending lines.

    Example:
        >>> load_cuda_inline('__global__ void k() {}')
        Traceback (most recent call last):
        ...
        ValueError: no handlers given and none found: define them with XLA_FFI_DEFINE_HANDLER_SYMBOL(Name, impl, binding) or pass handlers=[...]
    """
    return _load(source, kind="cuda", name=name, handlers=handlers, flags=flags, arch=arch,
                 include_dirs=include_dirs, verbose=verbose, register=register)


def load_cuda_file(path: str | os.PathLike, **kwargs) -> FFIModule:
    """Like :func:`load_cuda_inline` for a source file (its folder is on the include path).

    Example:
        >>> load_cuda_file('/nonexistent/kernel.cu')
        Traceback (most recent call last):
        ...
        FileNotFoundError: load_cuda_file: no such file '/nonexistent/kernel.cu'
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"load_cuda_file: no such file {path!r}")
    with open(path, encoding="utf-8") as f:
        source = f.read()
    kwargs.setdefault("name", re.sub(r"\W", "_", os.path.splitext(os.path.basename(path))[0]))
    kwargs["include_dirs"] = (os.path.dirname(os.path.abspath(path)),
                              *kwargs.get("include_dirs", ()))
    return load_cuda_inline(source, **kwargs)


def load_cpp_inline(
    source: str,
    *,
    name: str | None = None,
    handlers: Sequence[str] | None = None,
    flags: Sequence[str] = (),
    include_dirs: Sequence[str] = (),
    verbose: bool = False,
) -> FFIModule:
    """The CPU twin of :func:`load_cuda_inline`: compile C++ with the host compiler.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> src = '''
        ... #include "xla/ffi/api/ffi.h"
        ... namespace ffi = xla::ffi;
        ... static ffi::Error Impl(ffi::Buffer<ffi::F32> x, ffi::ResultBuffer<ffi::F32> y) {
        ...   for (size_t i = 0; i < x.element_count(); ++i) y->typed_data()[i] = 2 * x.typed_data()[i];
        ...   return ffi::Error::Success();
        ... }
        ... XLA_FFI_DEFINE_HANDLER_SYMBOL(Double, Impl,
        ...     ffi::Ffi::Bind().Arg<ffi::Buffer<ffi::F32>>().Ret<ffi::Buffer<ffi::F32>>());
        ... '''
        >>> m = load_cpp_inline(src, name='doc_double')
        >>> m.call('Double', jnp.arange(3.0), outs=jax.ShapeDtypeStruct((3,), jnp.float32))
        Array([0., 2., 4.], dtype=float32)
    """
    return _load(source, kind="cpp", name=name, handlers=handlers, flags=flags, arch=None,
                 include_dirs=include_dirs, verbose=verbose, register=True)


def make_callable(
    product: Callable[..., Any],
    *,
    ins: Sequence[jax.ShapeDtypeStruct],
    outs: Sequence[jax.ShapeDtypeStruct],
    platform: str,
    name: str,
) -> Callable[..., tuple[jax.Array, ...]]:
    """Use the generator's function (a closure over ``FFIModule.call``) as the kernel.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> s = jax.ShapeDtypeStruct((2,), jnp.float32)
        >>> make_callable(lambda x: -x, ins=[s], outs=[s], platform='gpu', name='neg')(
        ...     jnp.ones(2))
        (Array([-1., -1.], dtype=float32),)
    """
    if not callable(product):
        raise TypeError(
            f"kernel {name!r}: the 'cuda_raw' kernel generator must return a function that "
            f"calls a module from load_cuda_inline/load_cuda_file/load_cpp_inline (e.g. "
            f"module.function(handler, outs=...)), got {type(product).__name__}"
        )

    return tuple_results(product)

