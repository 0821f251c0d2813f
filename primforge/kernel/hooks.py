"""Kernel events: how the layers above the kernel react to it without the kernel knowing them.

``XLACustomKernel`` emits a :class:`KernelEvent` when a kernel is created
(``'kernel_defined'``) and after each backend is registered (``'backend_defined'``);
subscribers run synchronously, in the order they subscribed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

__all__ = [
    "BACKEND_DEFINED",
    "KERNEL_DEFINED",
    "KernelEvent",
    "emit",
    "off_kernel_event",
    "on_kernel_event",
]

KERNEL_DEFINED = "kernel_defined"
BACKEND_DEFINED = "backend_defined"
EVENTS = (KERNEL_DEFINED, BACKEND_DEFINED)

_SUBSCRIBERS: list[Callable[[KernelEvent], Any]] = []


@dataclasses.dataclass(frozen=True)
class KernelEvent:
    """Something that happened to a kernel.

    Attributes:
        kind: ``'kernel_defined'`` (a kernel was created and registered) or
            ``'backend_defined'`` (``def_kernel`` registered a backend).
        kernel: the ``XLACustomKernel``.
        platform: the platform of the backend (``'backend_defined'`` only).
        backend: the backend's name (``'backend_defined'`` only).

    Example:
        >>> KernelEvent('backend_defined', None, 'cpu', 'jax').backend
        'jax'
    """

    kind: str
    kernel: Any
    platform: str | None = None
    backend: str | None = None


def on_kernel_event(callback: Callable[[KernelEvent], Any]) -> Callable[[KernelEvent], Any]:
    """Call ``callback(event)`` for every kernel event from now on; returns ``callback``.

    Subscribing a callback that is already subscribed changes nothing (it still runs
    once per event). Usable as a decorator.

    Example:
        >>> import primforge
        >>> from primforge.kernel import hooks
        >>> seen = []
        >>> @hooks.on_kernel_event
        ... def record(event):
        ...     seen.append((event.kind, event.kernel.name, event.backend))
        >>> k = primforge.XLACustomKernel('doc_hooks_demo')
        >>> k.def_kernel('jax', 'cpu', lambda **kw: lambda x: x)
        >>> hooks.off_kernel_event(record)
        >>> seen
        [('kernel_defined', 'doc_hooks_demo', None), ('backend_defined', 'doc_hooks_demo', 'jax')]
    """
    if not callable(callback):
        raise TypeError(f"on_kernel_event: 'callback' must be callable, got {callback!r}")
    if callback not in _SUBSCRIBERS:
        _SUBSCRIBERS.append(callback)
    return callback


def off_kernel_event(callback: Callable[[KernelEvent], Any]) -> None:
    """Stop calling ``callback`` (no error when it is not subscribed).

    Example:
        >>> off_kernel_event(print)
    """
    try:
        _SUBSCRIBERS.remove(callback)
    except ValueError:
        pass


def emit(kind: str, kernel: Any, platform: str | None = None, backend: str | None = None) -> None:
    """Send an event to every subscriber (called by ``XLACustomKernel``).

    Example:
        >>> emit('no_such_event', None)
        Traceback (most recent call last):
        ...
        ValueError: emit: unknown event 'no_such_event'; expected one of ('kernel_defined',
        'backend_defined')
    """
    if kind not in EVENTS:
        raise ValueError(f"emit: unknown event {kind!r}; expected one of {EVENTS}")
    event = KernelEvent(kind, kernel, platform, backend)
    for callback in tuple(_SUBSCRIBERS):  # a subscriber may unsubscribe itself
        callback(event)
