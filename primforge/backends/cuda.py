"""CUDA source backend ('cuda_raw'): C++/CUDA compiled by nvcc, served on the typed XLA FFI.

Platforms: 'gpu' (:func:`load_cuda_inline`, :func:`load_cuda_file`, needs ``nvcc``) and
'cpu' (the C++ twin :func:`load_cpp_inline`, needs a host C++ compiler). The generator
returns a traceable function, typically a closure over ``module.call(...)``.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import hashlib
import os
import re
import threading
from collections.abc import Callable, Sequence
from typing import Any

import jax

from primforge.backends import _common, _contract
from primforge.backends._cuda_build import (  # noqa: F401 - also this module's names
    CACHE_SUB,
    CompileError,
    _library,
    _normalize_arch,
    _recipe,
    _wrapper_source,
    _wrapper_symbol,
)
from primforge.backends._cuda_find import (  # noqa: F401 - also this module's names
    _WARNED,
    find_cxx,
    find_nvcc,
)

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

_LOCK = threading.Lock()  # the table below
_BUILD_LOCK = threading.RLock()  # builds and loads
# (build key, module name, platform) -> the registered module. Entries are never dropped:
# XLA may call a registered handler at any time, so its library can't be unloaded.
_LOADED: dict[tuple[str, str, str], FFIModule] = {}
_HANDLER_RE = re.compile(r"XLA_FFI_DEFINE_HANDLER_SYMBOL\s*\(\s*([A-Za-z_]\w*)")
_IDENT_RE = re.compile(r"[A-Za-z_]\w*")
#: What a registered FFI target is registered for, by primforge platform.
_FFI_PLATFORM = {"cpu": "cpu", "gpu": "CUDA"}


@functools.cache
def is_available(platform: str | None = None) -> bool:
    """Whether kernels of this backend can be built for ``platform`` (cached).

    'gpu' needs nvcc, 'cpu' (the C++ twin) a host C++ compiler; without a platform,
    either. ``is_available.cache_clear()`` looks again (e.g. after installing nvcc).

    Example:
        >>> isinstance(is_available('cpu'), bool), isinstance(is_available(), bool)
        (True, True)
        >>> is_available('tpu')
        False
    """
    if platform in ("gpu", "cuda"):
        return find_nvcc() is not None
    if platform == "cpu":
        return find_cxx() is not None
    if platform is None:
        return find_nvcc() is not None or find_cxx() is not None
    return False


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
    return _common.cache_dir(CACHE_SUB)


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


def _handler_names(source: str, handlers: Sequence[str] | None) -> list[str]:
    """The handler symbols to register: ``handlers``, or those the source defines."""
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
    return handlers


def _register(lib, name: str, targets: dict[str, str], platform: str) -> None:
    """Register each handler's error-naming wrapper in ``lib`` as its FFI target."""
    addresses = {}
    for h in targets:
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
        jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(addresses[h]), platform=platform)


def _load(source: str, *, kind: str, name: str | None, handlers: Sequence[str] | None,
          flags: Sequence[str], arch: str | None, include_dirs: Sequence[str],
          verbose: bool, register: bool, platform: str | None = None) -> FFIModule:
    """Build (or fetch) and, with ``register``, load the library and register its handlers.

    ``platform`` is what the targets are registered for ('CUDA' or 'cpu'; default: 'CUDA'
    for CUDA sources, 'cpu' for C++). A registered module stays loaded for the life of the
    process: XLA may call its handlers at any time, so its library is never unloaded.
    Loading the same build again (same source, headers, flags, name...) returns the
    loaded module without compiling or opening the library again, so the table grows only
    with distinct builds.
    """
    handlers = _handler_names(source, handlers)
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
        _register(lib, name, targets, platform)
        module = FFIModule(name, path, platform, targets, cached, lib)
        with _LOCK:
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
        ValueError: no handlers given and none found: define them with
        XLA_FFI_DEFINE_HANDLER_SYMBOL(Name, impl, binding) or pass handlers=[...]
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
    platform: str = "cpu",
) -> FFIModule:
    """The CPU twin of :func:`load_cuda_inline`: compile C++ with the host compiler.

    Arguments, caching, error naming and lifetime are those of :func:`load_cuda_inline`
    (no ``arch``; the compiler is :func:`find_cxx`). ``platform`` is what the handlers
    are registered for: 'cpu', or 'gpu' for host-only code that serves GPU calls (it gets
    XLA's CUDA stream from the call context, e.g. a launcher that calls the CUDA driver
    API, opened at run time, so it builds without the CUDA toolkit).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> src = '''
        ... #include "xla/ffi/api/ffi.h"
        ... namespace ffi = xla::ffi;
        ... static ffi::Error Impl(ffi::Buffer<ffi::F32> x, ffi::ResultBuffer<ffi::F32> y) {
        ...   for (size_t i = 0; i < x.element_count(); ++i)
        ...     y->typed_data()[i] = 2 * x.typed_data()[i];
        ...   return ffi::Error::Success();
        ... }
        ... XLA_FFI_DEFINE_HANDLER_SYMBOL(Double, Impl,
        ...     ffi::Ffi::Bind().Arg<ffi::Buffer<ffi::F32>>().Ret<ffi::Buffer<ffi::F32>>());
        ... '''
        >>> m = load_cpp_inline(src, name='doc_double')
        >>> m.call('Double', jnp.arange(3.0), outs=jax.ShapeDtypeStruct((3,), jnp.float32))
        Array([0., 2., 4.], dtype=float32)
    """
    if platform not in _FFI_PLATFORM:
        raise ValueError(f"load_cpp_inline: platform must be 'cpu' or 'gpu', got {platform!r}")
    return _load(source, kind="cpp", name=name, handlers=handlers, flags=flags, arch=None,
                 include_dirs=include_dirs, verbose=verbose, register=True,
                 platform=_FFI_PLATFORM[platform])


def make_callable(
    product: Callable[..., Any],
    *,
    ins: Sequence[jax.ShapeDtypeStruct],
    outs: Sequence[jax.ShapeDtypeStruct],
    platform: str,
    name: str,
    **options: Any,
) -> Callable[..., tuple[jax.Array, ...]]:
    """Use the generator's function (a closure over ``FFIModule.call``) as the kernel.

    It takes no options (``batch=()`` only: the FFI call batches as the module's call
    says). Raises :class:`~._common.MissingPackageError` when the platform's compiler is
    missing here (nvcc for 'gpu', a C++ compiler for 'cpu').

    Example:
        >>> import jax, jax.numpy as jnp
        >>> s = jax.ShapeDtypeStruct((2,), jnp.float32)
        >>> make_callable(lambda x: -x, ins=[s], outs=[s], platform='cpu', name='neg')(
        ...     jnp.ones(2))
        (Array([-1., -1.], dtype=float32),)
    """
    needs, extra, hint = (
        ("nvcc (the CUDA compiler)", EXTRA,
         "(or install the CUDA toolkit, or set $PRIMFORGE_NVCC to its absolute path)")
        if platform == "gpu" else
        ("a host C++ compiler", None,
         "(set $CXX, or put g++, c++ or clang++ on an absolute PATH entry)"))
    _common.check_request(NAME, PLATFORMS, extra, is_available, platform=platform,
                          kernel=name, options=options, needs=needs, hint=hint)
    return _contract.traceable(
        product, backend=NAME, name=name,
        expected="a function that calls a module from load_cuda_inline/load_cuda_file/"
                 "load_cpp_inline (e.g. module.function(handler, outs=...))")


class CudaRawBackend(_contract.BackendBase):
    """The CUDA source backend as the registry holds it: this module's hooks, bound once."""

    NAME, PLATFORMS, EXTRA = NAME, PLATFORMS, EXTRA
    is_available = staticmethod(is_available)
    make_callable = staticmethod(make_callable)


#: This module's backend: :func:`primforge.backends.get_backend` registers it on first use.
BACKEND = CudaRawBackend()
