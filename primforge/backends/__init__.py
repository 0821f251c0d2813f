"""Backends: the registry of backends, each answering the hooks of one contract.

Every backend is a :class:`BackendBase` held in one registry. A built-in one lives in a
module listed in :data:`KNOWN_BACKENDS` (it imports without its optional package) whose
``BACKEND`` :func:`get_backend` registers on first use; :func:`register_backend` adds one
defined anywhere, through the same checks. See docs/backends.md.
"""

from __future__ import annotations

import importlib
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

from primforge.backends._common import install_hint
from primforge.backends._contract import (
    ALL_PLATFORMS,
    BackendBase,
    problems,
    tuple_results,
)
from primforge.backends._platforms import PLATFORM_ALIASES, canonical_platform

__all__ = [
    "ALL_PLATFORMS",
    "KNOWN_BACKENDS",
    "PLATFORM_ALIASES",
    "REFERENCE",
    "BackendBase",
    "backend_names",
    "canonical_platform",
    "debug_gate",
    "export_checks",
    "get_backend",
    "install_hint",
    "is_available_on",
    "is_known",
    "owner_of",
    "register_backend",
    "tuple_results",
    "unregister_backend",
]

#: Built-in backend name -> module path. Unknown names are still allowed for kernels whose
#: generator already returns a traceable JAX callable (treated like :data:`REFERENCE`).
KNOWN_BACKENDS: dict[str, str] = {
    "jax": "primforge.backends.jax",
    "numba": "primforge.backends.numba",
    "pallas": "primforge.backends.pallas",
    "triton": "primforge.backends.triton",
    "warp": "primforge.backends.warp",
    "cuda_raw": "primforge.backends.cuda",
    "numba_cuda": "primforge.backends.numba_cuda",
}

#: The reference backend: pure JAX, the oracle every other backend is compared with.
REFERENCE = "jax"

_REGISTERED: dict[str, BackendBase] = {}  # built-in ones once used, and plugins
_LOCK = threading.Lock()


def _register(backend: BackendBase, *, replace: bool) -> BackendBase:
    """Check ``backend`` against the contract and hold it under its name."""
    wrong = problems(backend)
    if not isinstance(backend, BackendBase):
        wrong.append(f"it is a {type(backend).__name__}, not a BackendBase instance")
    if wrong:
        raise TypeError(f"register_backend: {backend!r} does not satisfy the backend "
                        f"contract: {'; '.join(wrong)}")
    with _LOCK:
        if backend.NAME in _REGISTERED and not replace:
            raise ValueError(f"register_backend: a backend {backend.NAME!r} is registered "
                             f"already (pass replace=True to replace it)")
        _REGISTERED[backend.NAME] = backend
    return backend


def _plugins() -> dict[str, BackendBase]:
    """The backends registered with :func:`register_backend` (no built-in one)."""
    return {n: b for n, b in _REGISTERED.items() if n not in KNOWN_BACKENDS}


def get_backend(name: str) -> BackendBase:
    """The backend called ``name`` (the reference backend for an unknown name).

    Example:
        >>> from primforge.backends import get_backend
        >>> get_backend('jax').NAME, get_backend('not-a-backend').NAME
        ('jax', 'jax')
    """
    found = _REGISTERED.get(name)
    if found is not None:
        return found
    path = KNOWN_BACKENDS.get(name)
    if path is None:
        return get_backend(REFERENCE)
    # Replacing is harmless: an imported module's BACKEND is always the same object.
    return _register(importlib.import_module(path).BACKEND, replace=True)


def register_backend(backend: BackendBase, *, replace: bool = False) -> BackendBase:
    """Make ``backend`` usable by name in ``def_kernel``, ``use_backend`` and ``backend=``.

    Args:
        backend: a :class:`BackendBase` instance.
        replace: replace a backend registered under the same name; a built-in backend's
            name is never taken. Register a backend before defining kernels that use it.

    Raises:
        TypeError: ``backend`` does not satisfy the contract (the problems are listed).
        ValueError: the name is a built-in backend's, or taken and ``replace`` is False.

    Example:
        >>> import jax, jax.numpy as jnp, primforge
        >>> class Plain(BackendBase):
        ...     NAME = 'doc_plain'
        >>> _ = register_backend(Plain())
        >>> k = primforge.XLACustomKernel('doc_register_backend')
        >>> k.def_kernel('doc_plain', 'cpu', lambda **kw: lambda x: x * 3)
        >>> k(jnp.ones(2), outs=jax.ShapeDtypeStruct((2,), jnp.float32))
        Array([3., 3.], dtype=float32)
        >>> unregister_backend('doc_plain')
    """
    if getattr(backend, "NAME", None) in KNOWN_BACKENDS:
        raise ValueError(f"register_backend: {backend.NAME!r} is a built-in backend's name")
    return _register(backend, replace=replace)


def unregister_backend(name: str) -> None:
    """Forget the backend registered as ``name`` (a no-op for an unknown name).

    Example:
        >>> unregister_backend('never_registered')
    """
    if name in KNOWN_BACKENDS:
        return
    with _LOCK:
        _REGISTERED.pop(name, None)


def is_known(name: str) -> bool:
    """Whether ``name`` is a built-in or registered backend.

    Example:
        >>> is_known('numba'), is_known('mine')
        (True, False)
    """
    return name in KNOWN_BACKENDS or name in _REGISTERED


def backend_names() -> list[str]:
    """The names of the built-in and registered backends, sorted.

    Example:
        >>> 'jax' in backend_names()
        True
    """
    return sorted({*KNOWN_BACKENDS, *_REGISTERED})


def is_available_on(module: Any, platform: str) -> bool:
    """Whether backend ``module`` can serve ``platform`` here (its ``is_available(platform)``).

    Example:
        >>> is_available_on(get_backend('jax'), 'cpu'), is_available_on(get_backend('numba'), 'gpu')
        (True, False)
    """
    return bool(module.is_available(platform))


def _loaded() -> list[BackendBase]:
    """The backends in use in this process: imported built-ins, then registered ones."""
    builtin = [get_backend(n) for n, path in KNOWN_BACKENDS.items() if path in sys.modules]
    return [*builtin, *_plugins().values()]


def owner_of(product: Any) -> BackendBase | None:
    """The backend (among those in use) that claims ``product`` as one of its kernels.

    Example:
        >>> owner_of(lambda x: x) is None
        True
    """
    return next((b for b in _loaded() if b.owns(product)), None)


def debug_gate(outs: Sequence[Any], report: type[Exception], platform: str) -> Callable | None:
    """The first debug-mode error gate a backend offers on ``platform`` (None: none).

    Example:
        >>> callable(debug_gate([], RuntimeError, 'tpu'))
        False
    """
    for name in [*KNOWN_BACKENDS, *_plugins()]:
        backend = get_backend(name)
        if backend.is_available(platform):
            gate = backend.debug_gate(outs, report, platform)
            if gate is not None:
                return gate
    return None


def export_checks(fn: Callable, *specs: Any) -> list[Any]:
    """The ``jax.export`` safety checks to disable for ``fn`` on ``specs``, from every
    backend in use (pass them as ``disabled_checks=``).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> export_checks(jnp.sin, jax.ShapeDtypeStruct((2,), jnp.float32))
        []
    """
    out: list[Any] = []
    for backend in _loaded():
        out += [c for c in backend.export_checks(fn, *specs) if c not in out]
    return out
