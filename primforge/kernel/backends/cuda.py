"""CUDA source backend ('cuda_raw'): C++/CUDA compiled by nvcc, served on the typed XLA FFI.

* Availability: on 'gpu' an ``nvcc`` is needed; on 'cpu' (the C++ twin) a host C++
  compiler. Compilers are looked up at absolute locations only, never relative to the
  current directory or ``sys.path``: ``$PRIMFORGE_NVCC`` (an absolute path), the absolute
  entries of ``PATH``, ``$CUDA_HOME``/``$CUDA_PATH``, ``/usr/local/cuda`` and the NVIDIA
  pip packages (``nvidia-cuda-nvcc``, extra ``primforge[cuda]``) found through their
  installed metadata in site-packages. Nothing is imported or run until a kernel asks.
* Platforms: 'gpu' (:func:`load_cuda_inline`, :func:`load_cuda_file`) and 'cpu' (the C++
  twin :func:`load_cpp_inline`, compiled by the host C++ compiler).
* Source: handlers written against XLA's FFI headers
  (``XLA_FFI_DEFINE_HANDLER_SYMBOL``), which take the CUDA stream from the call context
  (``ffi::PlatformStream<cudaStream_t>``), so a launch never synchronises the host. Each
  handler is registered (as an FFI target named after the module, the build key and the
  handler) through a small generated wrapper, compiled into the same library, that puts
  the module and handler names in front of any error the handler returns.
* Disk cache (``primforge._cache``, sub-folder ``cuda``): a library is stored under a key
  made of everything that decides its machine code (source, every local header it
  includes, followed recursively, flags, include folders, GPU architecture, compiler path
  and version, jax/jaxlib versions, platform); it is written atomically with its digest
  and loaded only after the digest checks out, right before ``dlopen``. A planted,
  truncated or corrupted library is rebuilt (one warning), never loaded. An untrusted
  cache folder, ``PRIMFORGE_CACHE=0``, a full disk or a read-only folder make builds run
  uncached: compiled in a private temporary folder and loaded from there.
* In memory: a loaded library is kept for the life of the process (XLA may call it at
  any time, so it is never unloaded); loading the same build again returns it without
  recompiling or reloading.
* Product: the generator returns a traceable function (typically a closure over
  ``module.call(...)``); it is used as is. A compile error raises :class:`CompileError`
  with the compiler's message and the offending source lines.
* Testing without a GPU: the C++ twin runs the whole route on the CPU, nvcc compiles CUDA
  sources here, and ``lowering_platforms=('cuda',)`` checks the GPU lowering.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import dataclasses
import functools
import hashlib
import importlib.metadata
import os
import platform as _platform
import re
import shutil
import site
import subprocess
import sys
import sysconfig
import tempfile
import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax

from primforge import _cache
from primforge.kernel.backends import tuple_results

NAME = "cuda_raw"
PLATFORMS = ("cpu", "gpu")
EXTRA = "cuda"

__all__ = [
    "CompileError",
    "FFIModule",
    "cache_dir",
    "find_cxx",
    "find_nvcc",
    "is_available",
    "load_cpp_inline",
    "load_cuda_file",
    "load_cuda_inline",
    "make_callable",
]

_LOCK = threading.Lock()  # the tables below
_BUILD_LOCK = threading.RLock()  # builds and loads
# (build key, module name, platform) -> the registered module. Entries are never dropped:
# XLA may call a registered handler at any time, so its library can't be unloaded.
_LOADED: dict[tuple[str, str, str], FFIModule] = {}
_HANDLER_RE = re.compile(r"XLA_FFI_DEFINE_HANDLER_SYMBOL\s*\(\s*([A-Za-z_]\w*)")
_CACHE_SUB = "cuda"
_KEY_VERSION = "cuda_raw-2"  # bump when the build recipe (flags, wrapper) changes
_WARNED: set[str] = set()


class CompileError(RuntimeError):
    """nvcc (or the C++ compiler) rejected a source; the message quotes it and the lines.

    Example:
        >>> issubclass(CompileError, RuntimeError)
        True
    """


def _warn_once(message: str) -> None:
    with _LOCK:
        if message in _WARNED:
            return
        _WARNED.add(message)
    warnings.warn(message, UserWarning, stacklevel=3)


def _executable(path: str) -> bool:
    return os.path.isabs(path) and os.path.isfile(path) and os.access(path, os.X_OK)


def _which_absolute(name: str) -> str | None:
    """``name`` on the absolute entries of ``PATH`` (empty and relative entries are skipped)."""
    for entry in os.environ.get("PATH", "").split(os.pathsep):
        if not entry or not os.path.isabs(entry):
            continue
        cand = os.path.join(entry, name)
        if _executable(cand):
            return cand
    return None


def _site_dirs() -> list[str]:
    """The absolute site-packages folders of this interpreter (not ``sys.path``)."""
    dirs = []
    paths = sysconfig.get_paths()
    dirs += [paths.get("purelib"), paths.get("platlib")]
    with contextlib.suppress(AttributeError, OSError):  # some embedded interpreters
        dirs += list(site.getsitepackages())
    if site.ENABLE_USER_SITE:
        with contextlib.suppress(AttributeError, OSError):
            dirs.append(site.getusersitepackages())
    out = []
    for d in dirs:
        if d and os.path.isabs(d) and os.path.isdir(d) and d not in out:
            out.append(d)
    return out


def _pip_nvcc() -> list[str]:
    """``nvcc`` executables shipped by installed NVIDIA pip packages (from their metadata)."""
    return [p for p in _pip_nvcc_in(tuple(_site_dirs())) if _executable(p)]


@functools.cache
def _pip_nvcc_in(site_dirs: tuple[str, ...]) -> tuple[str, ...]:
    found = []
    for dist in importlib.metadata.distributions(path=list(site_dirs)):
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if not name.startswith("nvidia-cuda-nvcc"):
            continue
        for f in dist.files or ():
            if f.name == "nvcc" and f.parent.name == "bin":
                path = os.fspath(dist.locate_file(f))
                if os.path.isabs(path):
                    found.append(path)
    return tuple(sorted(found))


def find_nvcc() -> str | None:
    """Absolute path of an ``nvcc`` executable, or None.

    Looks at ``$PRIMFORGE_NVCC`` (must be an absolute path to an executable), the absolute
    entries of ``PATH``, ``$CUDA_HOME/bin``, ``$CUDA_PATH/bin``, ``/usr/local/cuda/bin``
    and the ``bin/nvcc`` of installed NVIDIA pip packages (``nvidia-cuda-nvcc*``), in that
    order. Never the current directory or ``sys.path``.

    Example:
        >>> p = find_nvcc()
        >>> p is None or (os.path.isabs(p) and os.path.basename(p) == 'nvcc')
        True
    """
    env = os.environ.get("PRIMFORGE_NVCC")
    if env:
        if _executable(env):
            return env
        _warn_once(f"$PRIMFORGE_NVCC={env!r} is not an absolute path to an executable; "
                   f"ignoring it")
    found = _which_absolute("nvcc")
    if found:
        return found
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    for r in roots:
        if r and os.path.isabs(r) and _executable(os.path.join(r, "bin", "nvcc")):
            return os.path.join(r, "bin", "nvcc")
    pip = _pip_nvcc()
    return pip[0] if pip else None


def find_cxx() -> str | None:
    """Absolute path of the host C++ compiler, or None.

    ``$CXX`` when it is an absolute path to an executable or a bare name found on an
    absolute ``PATH`` entry, else ``g++``, ``c++`` or ``clang++`` from the absolute
    entries of ``PATH``. Never the current directory.

    Example:
        >>> p = find_cxx()
        >>> p is None or os.path.isabs(p)
        True
    """
    env = os.environ.get("CXX")
    if env:
        if _executable(env):
            return env
        if os.sep not in env:
            found = _which_absolute(env)
            if found:
                return found
        _warn_once(f"$CXX={env!r} is neither an absolute path to an executable nor a "
                   f"compiler on PATH; ignoring it")
    for cand in ("g++", "c++", "clang++"):
        found = _which_absolute(cand)
        if found:
            return found
    return None


def is_available(platform: str | None = None) -> bool:
    """Whether kernels of this backend can be built for ``platform``.

    'gpu' needs nvcc, 'cpu' (the C++ twin) a host C++ compiler; without a platform,
    either.

    Example:
        >>> isinstance(is_available('cpu'), bool), isinstance(is_available(), bool)
        (True, True)
    """
    if platform in ("gpu", "cuda"):
        return find_nvcc() is not None
    if platform == "cpu":
        return find_cxx() is not None
    return find_nvcc() is not None or find_cxx() is not None


def cache_dir() -> str | None:
    """Folder of cached compiled libraries (``<cache root>/cuda``), or None when uncached.

    None when ``PRIMFORGE_CACHE=0`` or the folder can't be trusted (then with one
    ``primforge._cache.CacheWarning``); libraries are then built in a private temporary
    folder.

    Example:
        >>> d = cache_dir()
        >>> d is None or d.endswith('cuda')
        True
    """
    return _cache.directory(_CACHE_SUB)


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


_INCLUDE_RE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*([<"])([^">\n]+)[">]', re.MULTILINE)
_DIR_FLAGS = ("-I", "-isystem", "-iquote", "-idirafter", "--include-path")
_FILE_FLAGS = ("-include", "--pre-include", "-imacros")


def _flag_paths(flags: Sequence[str]) -> tuple[list[str], list[str]]:
    """Include folders and forced-include files named in compiler ``flags``.

    Example:
        >>> _flag_paths(['-I/a', '-isystem', '/b', '-include', 'c.h', '-O2'])
        (['/a', '/b'], ['c.h'])
    """
    dirs: list[str] = []
    files: list[str] = []
    flags = list(flags)
    i = 0
    while i < len(flags):
        f = flags[i]
        for names, out in ((_DIR_FLAGS, dirs), (_FILE_FLAGS, files)):
            hit = next((n for n in names if f == n or f.startswith(n)), None)
            if hit is None:
                continue
            if f == hit:
                if i + 1 < len(flags):
                    out.append(flags[i + 1])
                    i += 1
            else:
                out.append(f[len(hit):].lstrip("="))
            break
        i += 1
    return dirs, files


def _local_headers_digest(source: str, include_dirs: Sequence[str],
                          forced: Sequence[str] = ()) -> str:
    """Hash of every local header the source includes, followed recursively.

    Local headers are those found in ``include_dirs`` (and, for ``#include "..."``, the
    including file's folder); ``forced`` are files included by a flag. The cache key must
    change when such a header changes, or an edited header would keep serving the library
    built from its old text. Headers found nowhere here (XLA's, the CUDA toolkit's, the
    system's) are covered by the jaxlib and compiler versions in the key instead. Every
    ``#include`` line counts, even in a branch the preprocessor skips (a superset is safe).

    Example:
        >>> _local_headers_digest('int x;', []) == _local_headers_digest('int y;', [])
        True
    """
    h = hashlib.sha256()
    seen: set[str] = set()
    dirs = [os.fspath(d) for d in include_dirs]

    def add(path: str, label: str, pending: list) -> None:
        path = os.path.realpath(path)
        if path in seen:
            return
        seen.add(path)
        try:
            with open(path, "rb") as f:
                body = f.read()
        except OSError as e:  # the compiler will report it; keep the key well defined
            body = f"<unreadable: {e.strerror}>".encode()
        h.update(label.encode() + b"\0" + body + b"\0")
        pending.append((body.decode("utf-8", "replace"), os.path.dirname(path)))

    pending: list[tuple[str, str | None]] = []
    for f in forced:
        f = os.fspath(f)
        if os.path.isfile(f):
            add(f, "forced:" + f, pending)
    pending.append((source, None))
    while pending:
        text, here = pending.pop()
        for quote, name in _INCLUDE_RE.findall(text):
            folders = ([here] if (here and quote == '"') else []) + dirs
            for folder in folders:
                cand = os.path.join(folder, name)
                if os.path.isfile(cand):
                    add(cand, name, pending)
                    break
    return h.hexdigest()


# Generated into every library: a wrapper per handler that names the module and the handler
# in an error the handler returns (XLA reports only the handler's own message otherwise).
# The handler is declared weak so a missing one is reported by primforge, not by dlopen.
_WRAPPER_HEAD = r"""// Generated by primforge: error-naming wrappers around the handlers.
#include <cstring>
#include <string>
#include "xla/ffi/api/c_api.h"

namespace {
XLA_FFI_Error* primforge_error(XLA_FFI_CallFrame* frame, const std::string& message) {
  XLA_FFI_Error_Create_Args create;
  std::memset(&create, 0, sizeof(create));
  create.struct_size = XLA_FFI_Error_Create_Args_STRUCT_SIZE;
  create.message = message.c_str();
  create.errc = XLA_FFI_Error_Code_UNKNOWN;
  return frame->api->XLA_FFI_Error_Create(&create);
}

XLA_FFI_Error* primforge_named(XLA_FFI_CallFrame* frame, XLA_FFI_Error* err,
                               const char* where) {
  if (err == nullptr || frame == nullptr || frame->api == nullptr) return err;
  const XLA_FFI_Api* api = frame->api;
  XLA_FFI_Error_GetMessage_Args get;
  std::memset(&get, 0, sizeof(get));
  get.struct_size = XLA_FFI_Error_GetMessage_Args_STRUCT_SIZE;
  get.error = err;
  api->XLA_FFI_Error_GetMessage(&get);
  std::string message = std::string(where) + (get.message ? get.message : "");
  XLA_FFI_Error_Destroy_Args destroy;
  std::memset(&destroy, 0, sizeof(destroy));
  destroy.struct_size = XLA_FFI_Error_Destroy_Args_STRUCT_SIZE;
  destroy.error = err;
  api->XLA_FFI_Error_Destroy(&destroy);
  return primforge_error(frame, message);
}
}  // namespace
"""

_WRAPPER_ONE = r"""
extern "C" __attribute__((weak)) XLA_FFI_Error* {h}(XLA_FFI_CallFrame*);
extern "C" XLA_FFI_Error* {w}(XLA_FFI_CallFrame* frame) {{
  if ({h} == nullptr) return primforge_error(frame, "{where}not exported by the library");
  return primforge_named(frame, {h}(frame), "{where}");
}}
"""


def _wrapper_symbol(handler: str) -> str:
    return "PrimforgeNamed_" + handler


def _wrapper_source(name: str, handlers: Sequence[str]) -> str:
    """C++ of the error-naming wrappers of ``handlers`` in module ``name``.

    Example:
        >>> 'PrimforgeNamed_Scale' in _wrapper_source('demo', ['Scale'])
        True
    """
    parts = [_WRAPPER_HEAD]
    for h in handlers:
        where = f"cuda_raw module '{name}', handler '{h}': "
        parts.append(_WRAPPER_ONE.format(h=h, w=_wrapper_symbol(h), where=where))
    return "".join(parts)


@dataclasses.dataclass(frozen=True)
class _Recipe:
    """Everything that decides a library's machine code, and the command that builds it."""

    kind: str
    compiler: str
    arch: str
    base_flags: tuple[str, ...]
    flags: tuple[str, ...]
    includes: tuple[str, ...]
    suffix: str
    key: str


def _recipe(source: str, wrapper: str, *, kind: str, flags: Sequence[str], arch: str | None,
            include_dirs: Sequence[str]) -> _Recipe:
    flags = tuple(str(f) for f in flags)
    if kind == "cuda":
        compiler = find_nvcc()
        if compiler is None:
            raise FileNotFoundError(
                "nvcc was not found on PATH, under $CUDA_HOME/$CUDA_PATH, or in the NVIDIA pip "
                "packages: install the CUDA toolkit or pip install 'primforge[cuda]' "
                "(nvidia-cuda-nvcc), or set $PRIMFORGE_NVCC to its absolute path"
            )
        sm = _normalize_arch(arch)
        compute = "compute_" + sm[3:]
        base = ("-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC",
                f"-gencode=arch={compute},code=[{sm},{compute}]")
        suffix = ".cu"
    else:
        compiler = find_cxx()
        if compiler is None:
            raise FileNotFoundError(
                "no C++ compiler was found: set $CXX or put g++, c++ or clang++ on PATH")
        sm = "host"
        base = ("-O3", "-std=c++17", "-shared", "-fPIC")
        suffix = ".cc"
    includes = (jax.ffi.include_dir(), *(os.path.abspath(os.fspath(d)) for d in include_dirs))
    flag_dirs, forced = _flag_paths(flags)
    key_text = "\0".join([
        _KEY_VERSION, kind, source, wrapper, "\x1f".join(base), "\x1f".join(flags), sm,
        "\x1f".join(includes), os.path.realpath(compiler), _compiler_version(compiler),
        jax.__version__, _jaxlib_version(), sys.platform, _platform.machine(),
        _local_headers_digest(source, [*includes[1:], *flag_dirs], forced),
    ])
    key = hashlib.sha256(key_text.encode()).hexdigest()[:32]
    return _Recipe(kind, compiler, sm, base, flags, includes, suffix, key)


def _compile(source: str, wrapper: str, recipe: _Recipe, *, name: str, out: str,
             verbose: bool) -> None:
    """Compile ``source`` plus the wrappers into the shared library ``out`` (its folder is
    private: sources and objects are written next to it)."""
    folder = os.path.dirname(out)
    src_path = os.path.join(folder, name + recipe.suffix)
    wrap_path = os.path.join(folder, name + "_primforge_wrappers.cc")
    for path, text in ((src_path, source), (wrap_path, wrapper)):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0),
                     0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
    # XLA's headers go in as system headers so their warnings do not bury the user's errors.
    inc = ["-isystem", recipe.includes[0], *[f"-I{d}" for d in recipe.includes[1:]]]
    # Relative names (run in the build folder): the output does not depend on where the
    # folder is, so concurrent builders of one key write the same bytes.
    cmd = [recipe.compiler, *recipe.base_flags, *inc, *recipe.flags,
           os.path.basename(src_path), os.path.basename(wrap_path),
           "-o", os.path.basename(out)]
    if verbose:
        print(" ".join(cmd))
    # The compiler runs tools of its own (as, ld, the host compiler under nvcc) found on
    # PATH: only absolute entries, so nothing is picked up from a current directory.
    path_env = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                               if p and os.path.isabs(p))
    env = dict(os.environ, PATH=path_env)
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=folder,
                          env=env)
    if proc.returncode != 0:
        raise CompileError(
            f"{os.path.basename(recipe.compiler)} failed to compile {name!r} "
            f"(exit {proc.returncode}):\n"
            + _quote_errors(proc.stderr + proc.stdout, source, src_path)
        )


_SCRATCH: list[str] = []


def _scratch_dir() -> str:
    """A private (0700) folder of this process for libraries that are not cached."""
    with _LOCK:
        if not _SCRATCH:
            path = tempfile.mkdtemp(prefix="primforge-cuda-")
            _SCRATCH.append(path)
            atexit.register(shutil.rmtree, path, True)
        return _SCRATCH[0]


def _library(source: str, wrapper: str, recipe: _Recipe, *, name: str,
             verbose: bool) -> tuple[str, bool]:
    """(path of a library built from ``recipe``, whether it came from the disk cache).

    A cached library is returned only when its recorded digest checks out (call this right
    before ``dlopen``); anything else is rebuilt. The build runs in a private temporary
    folder; the result goes into the cache when it can be written, else it stays in this
    process's private scratch folder.
    """
    lib_name = f"lib{recipe.key}.so"
    folder = _cache.directory(_CACHE_SUB)
    if folder is not None:
        path = _cache.verified_path(folder, lib_name)
        if path is not None:
            return path, True
    with tempfile.TemporaryDirectory(prefix="primforge-build-") as tmp:
        out = os.path.join(tmp, lib_name)
        _compile(source, wrapper, recipe, name=name, out=out, verbose=verbose)
        with open(out, "rb") as f:
            data = f.read()
        if folder is not None and _cache.write_bytes(folder, lib_name, data):
            path = _cache.verified_path(folder, lib_name)
            if path is not None:
                return path, False
        # Uncached: keep it in this process's private folder, under a fresh name.
        fd, path = tempfile.mkstemp(dir=_scratch_dir(), prefix=f"lib{recipe.key}-",
                                    suffix=".so")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return path, False


def _jaxlib_version() -> str:
    import jaxlib

    return getattr(jaxlib, "__version__", "unknown")


@dataclasses.dataclass
class FFIModule:
    """A compiled library whose XLA FFI handlers are registered as FFI targets.

    Attributes:
        name: the module name (prefix of its target names).
        path: the shared library on disk (in the cache, or in a private temporary folder
            when running uncached).
        platform: 'CUDA' or 'cpu' (what the targets are registered for).
        targets: handler symbol -> registered FFI target name.
        cached: whether the library came from a cache (disk, or this process's table of
            loaded modules) rather than a fresh compile.

    An error a handler returns reaches Python as a ``jax.errors.JaxRuntimeError`` whose
    message starts with ``cuda_raw module '<name>', handler '<handler>':``.

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
        """The FFI target name registered for ``handler``.

        Example:
            >>> FFIModule('demo', '/x.so', 'cpu', {'A': 'demo.A'}).target('A')
            'demo.A'
        """
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

        Example:
            >>> FFIModule('demo', '/x.so', 'cpu', {}).call('Nope', outs=())
            Traceback (most recent call last):
            ...
            KeyError: "module 'demo' has no handler 'Nope'; it exports []"
        """
        return jax.ffi.ffi_call(self.target(handler), outs, vmap_method=vmap_method)(
            *args, **attrs
        )

    def function(self, handler: str, *, outs, vmap_method: str = "sequential", **attrs):
        """A function of the input arrays that calls ``handler`` with fixed ``outs``/attrs.

        Example:
            >>> f = FFIModule('demo', '/x.so', 'cpu', {'A': 'demo.A'}).function('A', outs=())
            >>> callable(f)
            True
        """
        self.target(handler)
        return lambda *args: self.call(handler, *args, outs=outs, vmap_method=vmap_method,
                                       **attrs)


_IDENT_RE = re.compile(r"[A-Za-z_]\w*")


def _load(source: str, *, kind: str, name: str | None, handlers: Sequence[str] | None,
          flags: Sequence[str], arch: str | None, include_dirs: Sequence[str],
          verbose: bool, register: bool, platform: str | None = None) -> FFIModule:
    """Build (or fetch) and, with ``register``, load the library and register its handlers.

    A registered module stays loaded for the life of the process: XLA may call its
    handlers at any time, so its library is never unloaded. Loading the same build again
    (same source, headers, flags, name...) returns the loaded module without compiling or
    opening the library again, so the table grows only with distinct builds.
    """
    if not isinstance(source, str) or not source.strip():
        raise TypeError("source must be a non-empty str of C++/CUDA code")
    if handlers is None:
        handlers = list(dict.fromkeys(_HANDLER_RE.findall(source)))
        if not handlers:
            raise ValueError(
                "no handlers given and none found: define them with "
                "XLA_FFI_DEFINE_HANDLER_SYMBOL(Name, impl, binding) or pass handlers=[...]"
            )
    if isinstance(handlers, str):
        raise TypeError(f"handlers must be a sequence of symbol names, got the str {handlers!r}")
    handlers = [str(h) for h in handlers]
    for h in handlers:
        if not _IDENT_RE.fullmatch(h):
            raise ValueError(f"handlers: {h!r} is not a C identifier")
    name = name or "pf" + hashlib.sha256(source.encode()).hexdigest()[:10]
    if not re.fullmatch(r"[A-Za-z_][\w.]*", name):
        raise ValueError(f"name must be an identifier-like string, got {name!r}")
    wrapper = _wrapper_source(name, handlers)
    recipe = _recipe(source, wrapper, kind=kind, flags=flags, arch=arch,
                     include_dirs=include_dirs)
    platform = platform or ("CUDA" if kind == "cuda" else "cpu")
    table_key = (recipe.key, name, platform)
    with _LOCK:
        known = _LOADED.get(table_key)
    if known is not None:
        return dataclasses.replace(known, cached=True)
    targets = {h: f"{name}.{recipe.key[:8]}.{h}" for h in handlers}
    if not register:
        path, cached = _library(source, wrapper, recipe, name=name, verbose=verbose)
        return FFIModule(name, path, platform, targets, cached)
    with _BUILD_LOCK:  # one builder per process; other processes are safe through the cache
        known = _LOADED.get(table_key)
        if known is not None:
            return dataclasses.replace(known, cached=True)
        path, cached = _library(source, wrapper, recipe, name=name, verbose=verbose)
        lib = ctypes.CDLL(path)  # verified by _library just now
        addresses = {}
        for h in handlers:
            try:
                getattr(lib, h)
            except AttributeError:
                raise ValueError(
                    f"module {name!r} does not export handler {h!r}: declare it with "
                    f"XLA_FFI_DEFINE_HANDLER_SYMBOL({h}, ...)"
                ) from None
            addresses[h] = ctypes.cast(getattr(lib, _wrapper_symbol(h)), ctypes.c_void_p).value
        jax.devices()  # the CPU client must exist before targets are registered
        for h, target in targets.items():
            jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(addresses[h]),
                                        platform=platform)
        module = FFIModule(name, path, platform, targets, cached, lib)
        _LOADED[table_key] = module
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
        An error the handler returns raises ``jax.errors.JaxRuntimeError`` naming the
        module and the handler.

    Raises:
        CompileError: nvcc failed; the message quotes nvcc and the offending lines.

    Caching: the library is kept in the disk cache (see :func:`cache_dir`) under a key of
    everything that decides its machine code, and checked against its recorded digest
    before it is loaded. A loaded library stays loaded for the life of the process (XLA
    may call its handlers at any time, so it can't be unloaded safely); loading the same
    build again returns the same module without compiling or loading anything, so memory
    grows only with the number of distinct builds.

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

    Arguments, caching, error naming and lifetime are those of :func:`load_cuda_inline`
    (no ``arch``; the compiler is :func:`find_cxx`).

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

