"""Debug mode: the switch that asks every kernel call to check itself.

When it is on (``with primforge.debug_mode():`` around the code that *traces* the call, or
``PRIMFORGE_DEBUG=1`` in the environment), kernels are traced with extra checks; what each
backend and the kernel layer check is documented where they do it (``docs/reliability.md``).
The switch is read at trace time: a function already compiled by ``jax.jit`` keeps the
mode it was traced in.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator

__all__ = ["ENV_DEBUG", "debug_mode", "enabled"]

ENV_DEBUG = "PRIMFORGE_DEBUG"

_MODE: contextvars.ContextVar[bool | None] = contextvars.ContextVar(
    "primforge_debug_mode", default=None
)


def enabled() -> bool:
    """Whether debug mode is on here (the context manager wins over the environment).

    Example:
        >>> with debug_mode():
        ...     enabled()
        True
        >>> with debug_mode(False):
        ...     enabled()
        False
    """
    mode = _MODE.get()
    if mode is not None:
        return mode
    return os.environ.get(ENV_DEBUG, "").strip().lower() not in ("", "0", "false", "no", "off")


@contextlib.contextmanager
def debug_mode(on: bool = True) -> Iterator[None]:
    """Turn debug mode on (or off, with ``on=False``) for the calls traced inside.

    Example:
        >>> import primforge
        >>> with primforge.debug_mode():
        ...     primforge.debug.enabled()
        True
    """
    token = _MODE.set(bool(on))
    try:
        yield
    finally:
        _MODE.reset(token)
