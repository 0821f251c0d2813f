"""How the 'cuda_raw' backend builds a library: build key, compile command, disk cache.

A :class:`_Recipe` holds everything that decides a library's machine code, and its key is
a hash of all of it (bumped by ``_KEY_VERSION`` when the recipe changes).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import platform as _platform
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence

import jax

from primforge import _cache
from primforge.backends import _common, _xla_ffi
from primforge.backends._common import install_hint
from primforge.backends._cuda_find import compiler_version, find_cxx, find_nvcc

#: The backend's sub-folder of the on-disk cache.
CACHE_SUB = "cuda"
_KEY_VERSION = "cuda_raw-2"  # bump when the build recipe (flags, wrapper) changes


class CompileError(RuntimeError):
    """nvcc (or the C++ compiler) rejected a source; the message quotes it and the lines.

    Example:
        >>> issubclass(CompileError, RuntimeError)
        True
    """


def _normalize_arch(arch: str | int | None) -> str:
    """``'sm_XY'`` for an architecture given as 'sm_90', '9.0' or 90; None: the default.

    The default is the first visible GPU, else :data:`._common.FALLBACK_COMPUTE_CAPABILITY`
    (built with its PTX, so newer GPUs JIT-compile it).
    """
    if arch is None:
        major, minor = _common.default_compute_capability()
        return f"sm_{major}{minor}"
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
    """Include folders and forced-include files named in compiler ``flags``."""
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
    including file's folder); ``forced`` are files included by a flag. Other headers (XLA's,
    the toolkit's, the system's) are covered by the versions in the key. Every ``#include``
    line counts, even in a branch the preprocessor skips (a superset is safe).
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
  @GET@_Args get;
  std::memset(&get, 0, sizeof(get));
  get.struct_size = @GET@_Args_STRUCT_SIZE;
  get.error = err;
  api->@GET@(&get);
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
    """C++ of the error-naming wrappers of ``handlers`` in module ``name``."""
    # The header's name of the call that reads an error's message (it differs by release).
    parts = [_WRAPPER_HEAD.replace("@GET@", _xla_ffi.spelled("error_message"))]
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
                "packages: install the CUDA toolkit or "
                f"{install_hint('cuda')} (nvidia-cuda-nvcc), "
                "or set $PRIMFORGE_NVCC to its absolute path"
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
        "\x1f".join(includes), os.path.realpath(compiler), compiler_version(compiler),
        jax.__version__, _common.jaxlib_version(), sys.platform, _platform.machine(),
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


def _library(source: str, wrapper: str, recipe: _Recipe, *, name: str,
             verbose: bool) -> tuple[str, bool]:
    """(path of a library built from ``recipe``, whether it came from the disk cache).

    A cached library is returned only when its recorded digest checks out (call this right
    before ``dlopen``); anything else is rebuilt. The build runs in a private temporary
    folder; the result goes into the cache when it can be written, else it stays in this
    process's private scratch folder.
    """
    lib_name = f"lib{recipe.key}.so"
    folder = _common.cache_dir(CACHE_SUB)
    if folder is not None:
        path = _cache.verified_path(folder, lib_name)
        if path is not None:
            return path, True
    # In this process's scratch folder: removed by a later process if this one is killed.
    with tempfile.TemporaryDirectory(dir=_common.scratch_dir("primforge-cuda-")) as tmp:
        out = os.path.join(tmp, lib_name)
        _compile(source, wrapper, recipe, name=name, out=out, verbose=verbose)
        with open(out, "rb") as f:
            data = f.read()
        if folder is not None and _cache.write_bytes(folder, lib_name, data):
            path = _cache.verified_path(folder, lib_name)
            if path is not None:
                return path, False
        # Uncached: keep it in this process's private folder, under a fresh name.
        fd, path = tempfile.mkstemp(dir=_common.scratch_dir("primforge-cuda-"),
                                    prefix=f"lib{recipe.key}-", suffix=".so")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return path, False
