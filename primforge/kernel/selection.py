"""Backend selection: per call, per context, by default, then what is installed.

First match wins: the call's ``backend=``, the innermost :func:`use_backend` context
(captured at trace time), then the kernel's default for the platform (:func:`choose`). A
choice whose backend is not installed here falls back to another installed one, warned
once, unless the call asked for it by name (:func:`installed`).
"""

from __future__ import annotations

import contextlib
import itertools
import warnings
import weakref
from collections.abc import Iterator, Mapping

from primforge import _compat
from primforge.backends import (  # noqa: F401 - PLATFORM_ALIASES: re-exported
    ALL_PLATFORMS,
    PLATFORM_ALIASES,
    backend_names,
    canonical_platform,
    get_backend,
    install_hint,
    is_available_on,
    is_known,
)

# Platform names live in the backends layer; imported from here too.
from primforge.kernel.errors import BackendUnavailableWarning, KernelError
from primforge.utils._suggest import did_you_mean

__all__ = ["current_overrides", "restored", "use_backend"]


# Value: (generation, overrides); overrides is a tuple of (kernel_name | None, platform,
# backend), innermost last. The generation changes whenever a default changes.
_STATE = _compat.make_user_context(default_value=(0, ()))
_GENERATION = itertools.count(1)



# Live kernels by name: what use_backend checks kernel and backend names against.
_KERNELS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def note_kernel(kernel) -> None:
    """Record a live kernel (called by ``XLACustomKernel.__init__``) for name checks."""
    _KERNELS[kernel.name] = kernel


def known_backend_names() -> list[str]:
    """Every backend name ``use_backend`` accepts: the backend modules' and the registered.

    Example:
        >>> 'numba' in known_backend_names()
        True
    """
    names = set(backend_names())
    for kernel in list(_KERNELS.values()):
        names.update(b for p in ALL_PLATFORMS for b in kernel.available_backends(p))
    return sorted(names)


def defaults_changed() -> None:
    """Invalidate jit caches that depend on a kernel's kernels, defaults or rules.

    Called whenever a kernel's registration changes (``def_kernel``, ``set_default``, a
    rule setter): jitted functions that call it are re-traced and re-lowered.
    """
    _, overrides = _STATE.get_global()
    _STATE.set_global((next(_GENERATION), overrides))


def current_overrides() -> tuple[tuple[str | None, str, str], ...]:
    """The active :func:`use_backend` overrides, outermost first.

    Example:
        >>> with use_backend('cpu', 'jax'):
        ...     current_overrides()
        ((None, 'cpu', 'jax'),)
    """
    return _STATE.value[1]


def resolve(overrides, kernel_name: str, platform: str, available) -> str | None:
    """The backend ``overrides`` pick for one kernel on ``platform`` (None: no choice).

    The innermost override that names this kernel (or no kernel) and a backend the kernel
    has on ``platform`` wins; an override for a backend the kernel lacks is skipped.

    Example:
        >>> resolve(((None, 'cpu', 'numba'), ('k', 'cpu', 'jax')), 'k', 'cpu', ['jax'])
        'jax'
    """
    for name, plat, backend in reversed(tuple(overrides)):
        if name in (None, kernel_name) and plat == platform and backend in available:
            return backend
    return None


def choose(kernel_name: str, platform: str, entries: Mapping[str, object], *,
           backend: str | None, context, default: str | None) -> str:
    """The backend a call of kernel ``kernel_name`` uses on ``platform``, in order: the
    call's ``backend``, the innermost override in ``context``, the kernel's ``default``.

    Raises ``KernelError`` when the choice is not among ``entries`` (the kernel's backends
    on ``platform``).

    Example:
        >>> choose('k', 'cpu', {'jax': 0, 'alt': 1}, backend=None,
        ...        context=((None, 'cpu', 'alt'),), default='jax')
        'alt'
    """
    choice = backend or resolve(context, kernel_name, platform, entries) or default
    if choice not in entries:
        raise KernelError(
            f"kernel {kernel_name!r} has no {choice!r} backend on {platform!r}; available "
            f"there: {list(entries)}"
        )
    return choice


def installed(kernel_name: str, platform: str, entries: Mapping[str, object], choice: str,
              *, explicit: bool, warned: set[tuple[str, str]]) -> str:
    """``choice`` when its backend is installed here, else the first other installed one
    among ``entries``, with a :class:`BackendUnavailableWarning` once per (platform,
    choice) (``warned`` holds those already warned). A choice the call asked for by name
    (``explicit``) never falls back.

    Example:
        >>> installed('k', 'cpu', {'jax': 0}, 'jax', explicit=False, warned=set())
        'jax'
    """
    module = get_backend(choice)
    if is_available_on(module, platform):
        return choice
    how = install_hint(module.EXTRA) if module.EXTRA else "its package"
    if explicit:
        raise KernelError(
            f"kernel {kernel_name!r}: backend {choice!r} was asked for but its package is not "
            f"installed ({how}). Other backends on {platform!r}: "
            f"{[b for b in entries if b != choice]}"
        )
    for other in entries:
        if other != choice and is_available_on(get_backend(other), platform):
            if (platform, choice) not in warned:
                warned.add((platform, choice))
                warnings.warn(
                    f"kernel {kernel_name!r}: backend {choice!r} is not installed ({how}); "
                    f"using {other!r} on {platform!r} instead.",
                    BackendUnavailableWarning,
                    stacklevel=3,
                )
            return other
    raise KernelError(
        f"kernel {kernel_name!r}: no installed backend on {platform!r}: {list(entries)} "
        f"(install {how})"
    )


@contextlib.contextmanager
def restored(overrides) -> Iterator[None]:
    """Re-establish exactly the overrides captured at a call, e.g. around its rules.

    The overrides active where the rule happens to run do not apply: a call's JVP,
    transpose and batching use the selection the call was made with.

    Example:
        >>> with use_backend('cpu', 'numba'):
        ...     with restored(((None, 'cpu', 'jax'),)):
        ...         current_overrides()
        ((None, 'cpu', 'jax'),)
    """
    overrides = tuple(overrides)
    generation, current = _STATE.value
    if current == overrides:  # already in force
        yield
        return
    with _STATE((generation, overrides)):
        yield


def _check_names(platform: str, backend: str, kernel_name: str | None) -> None:
    if kernel_name is not None and kernel_name not in _KERNELS:
        hint = did_you_mean(kernel_name, _KERNELS)
        raise ValueError(
            f"use_backend: no kernel named {kernel_name!r} (the 'kernel' argument){hint}; "
            f"known kernels: {sorted(_KERNELS) or 'none'}"
        )
    if is_known(backend):
        return
    if kernel_name is not None:
        kernel = _KERNELS[kernel_name]
        table = {p: kernel.available_backends(p) for p in ALL_PLATFORMS}
        table = {p: bs for p, bs in table.items() if bs}
        has = {b for bs in table.values() for b in bs}
        if backend not in has:
            raise ValueError(
                f"use_backend: kernel {kernel_name!r} has no backend {backend!r} (the "
                f"'backend' argument) on any platform"
                f"{did_you_mean(backend, has | set(backend_names()))}; its backends: "
                f"{table}; backend modules: {backend_names()}"
            )
        return
    known = known_backend_names()
    if backend not in known:
        raise ValueError(
            f"use_backend: unknown backend {backend!r} (the 'backend' argument)"
            f"{did_you_mean(backend, known)}: no registered kernel has it and it is not a "
            f"backend module's name; known backends: {known}"
        )


@contextlib.contextmanager
def use_backend(platform: str, backend: str, kernel=None) -> Iterator[None]:
    """Within the block, kernels called on ``platform`` use ``backend`` where they have it.

    Args:
        platform: 'cpu', 'gpu' (or 'cuda') or 'tpu'.
        backend: backend name, e.g. 'jax' or 'numba'. Kernels that have no such backend
            registered for the platform keep their own choice.
        kernel: restrict the override to one kernel (an ``XLACustomKernel`` or its name).

    Raises:
        ValueError: on entering the block, when ``backend`` is neither a backend module's
            name nor registered by any kernel (by ``kernel``, when given), or when no
            kernel is named ``kernel``.

    Example:
        >>> import jax, jax.numpy as jnp, primforge
        >>> k = primforge.XLACustomKernel('doc_use_backend_twice')
        >>> k.def_kernel('jax', 'cpu', lambda **kw: lambda x: 2 * x)
        >>> k.def_kernel('alt', 'cpu', lambda **kw: lambda x: x + x)
        >>> with primforge.use_backend('cpu', 'alt'):
        ...     y = k(jnp.ones(2), outs=jax.ShapeDtypeStruct((2,), jnp.float32))
        >>> y
        Array([2., 2.], dtype=float32)
    """
    if not isinstance(backend, str):
        raise TypeError(f"use_backend: 'backend' must be a str, got {type(backend).__name__}")
    if kernel is not None and not isinstance(kernel, str) and not hasattr(kernel, "name"):
        raise TypeError(
            f"use_backend: 'kernel' must be an XLACustomKernel, its name or None, got "
            f"{type(kernel).__name__}"
        )
    name = kernel if kernel is None or isinstance(kernel, str) else kernel.name
    platform = canonical_platform(platform)
    _check_names(platform, backend, name)
    generation, overrides = _STATE.value
    with _STATE((generation, overrides + ((name, platform, backend),))):
        yield
