"""Compiler discovery for the 'cuda_raw' backend: nvcc and the host C++ compiler.

Absolute locations only; overrides (``$PRIMFORGE_NVCC``, ``$CXX``) are checked on every
call, the scans behind them cached per value of what they read.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import os
import site
import subprocess
import sysconfig
import threading
import warnings

__all__ = ["find_cxx", "find_nvcc"]

_LOCK = threading.Lock()
_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
    with _LOCK:
        if message in _WARNED:
            return
        _WARNED.add(message)
    warnings.warn(message, UserWarning, stacklevel=3)


def _executable(path: str) -> bool:
    return os.path.isabs(path) and os.path.isfile(path) and os.access(path, os.X_OK)


@functools.cache
def _which_in(name: str, path_env: str) -> str | None:
    """``name`` on the absolute entries of ``path_env`` (empty and relative entries skipped)."""
    for entry in path_env.split(os.pathsep):
        if not entry or not os.path.isabs(entry):
            continue
        cand = os.path.join(entry, name)
        if _executable(cand):
            return cand
    return None


def _which_absolute(name: str) -> str | None:
    """``name`` on the absolute entries of ``PATH``."""
    return _which_in(name, os.environ.get("PATH", ""))


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


@functools.cache
def _pip_nvcc_in(site_dirs: tuple[str, ...]) -> tuple[str, ...]:
    """``bin/nvcc`` files of installed ``nvidia-cuda-nvcc*`` packages (from their metadata)."""
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


@functools.cache
def _scan_nvcc(path_env: str, roots: tuple[str | None, ...],
               site_dirs: tuple[str, ...]) -> str | None:
    found = _which_in("nvcc", path_env)
    if found:
        return found
    for r in roots:
        if r and os.path.isabs(r) and _executable(os.path.join(r, "bin", "nvcc")):
            return os.path.join(r, "bin", "nvcc")
    pip = [p for p in _pip_nvcc_in(site_dirs) if _executable(p)]
    return pip[0] if pip else None


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
    roots = (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda")
    return _scan_nvcc(os.environ.get("PATH", ""), roots, tuple(_site_dirs()))


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


@functools.cache
def compiler_version(compiler: str) -> str:
    """What ``compiler --version`` prints ("unknown" if it does not run); cached per path.

    Example:
        >>> compiler_version('/nonexistent/cc')
        'unknown'
    """
    try:
        out = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60,
                             check=False)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip()
