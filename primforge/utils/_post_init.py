"""Switchable ``__post_init__`` validation, opted into per method.

One context variable (per thread and asyncio task, nesting) holds whether opted-in
validation runs; JAX's own rebuilds never run ``__post_init__``.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable, Iterator
from typing import Any

__all__ = [
    "enable_post_init",
    "is_post_init_enabled",
    "no_post_init",
    "skip_post_init_if_disabled",
]

_POST_INIT_ENABLED: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "primforge_post_init_enabled", default=True
)


def is_post_init_enabled() -> bool:
    """Whether ``__post_init__`` methods decorated with
    :func:`skip_post_init_if_disabled` currently run.

    Returns:
        True outside any :func:`no_post_init` block (or inside :func:`enable_post_init`).

    Example:
        >>> from primforge.utils import is_post_init_enabled, no_post_init
        >>> with no_post_init():
        ...     is_post_init_enabled()
        False
    """
    return _POST_INIT_ENABLED.get()


@contextlib.contextmanager
def _post_init_state(enabled: bool) -> Iterator[None]:
    token = _POST_INIT_ENABLED.set(enabled)
    try:
        yield
    finally:
        _POST_INIT_ENABLED.reset(token)


def no_post_init() -> contextlib.AbstractContextManager[None]:
    """Context manager that switches off opted-in ``__post_init__`` validation.

    Inside the block, ``__post_init__`` methods decorated with
    :func:`skip_post_init_if_disabled` return immediately. The state is a context variable:
    it is per thread and per asyncio task, and nests (the previous state is restored on
    exit). Use it while building intermediate objects that break invariants on purpose.

    Returns:
        A context manager.

    Example:
        >>> from primforge.utils import dataclass, no_post_init, skip_post_init_if_disabled
        >>> @dataclass
        ... class Positive:
        ...     x: float
        ...     @skip_post_init_if_disabled
        ...     def __post_init__(self):
        ...         if self.x <= 0:
        ...             raise ValueError("x must be positive")
        >>> with no_post_init():
        ...     Positive(-1.0)
        Positive(x=-1.0)
    """
    return _post_init_state(False)


def enable_post_init() -> contextlib.AbstractContextManager[None]:
    """Context manager that switches opted-in ``__post_init__`` validation back on.

    The counterpart of :func:`no_post_init`, for a region inside one that must validate.

    Returns:
        A context manager.

    Example:
        >>> from primforge.utils import enable_post_init, is_post_init_enabled, no_post_init
        >>> with no_post_init(), enable_post_init():
        ...     is_post_init_enabled()
        True
    """
    return _post_init_state(True)


def skip_post_init_if_disabled(post_init: Callable[..., None]) -> Callable[..., None]:
    """Decorate a ``__post_init__`` so that it is skipped inside :func:`no_post_init`.

    Args:
        post_init: The ``__post_init__`` method (``InitVar`` arguments are forwarded).

    Returns:
        The wrapped method; outside :func:`no_post_init` it behaves exactly as before.

    Example:
        >>> from primforge.utils import dataclass, no_post_init, skip_post_init_if_disabled
        >>> @dataclass
        ... class Sorted:
        ...     keys: tuple
        ...     @skip_post_init_if_disabled
        ...     def __post_init__(self):
        ...         if list(self.keys) != sorted(self.keys):
        ...             raise ValueError("keys must be sorted")
        >>> Sorted((2, 1))
        Traceback (most recent call last):
            ...
        ValueError: keys must be sorted
        >>> with no_post_init():
        ...     Sorted((2, 1)).keys
        (2, 1)
    """

    @functools.wraps(post_init)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> None:
        if _POST_INIT_ENABLED.get():
            post_init(self, *args, **kwargs)

    return wrapper
