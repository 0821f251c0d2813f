"""Debug mode: the switch that asks every kernel call to check itself.

Turn it on with ``with primforge.debug_mode():`` around the code that *traces* the calls,
or with ``PRIMFORGE_DEBUG=1`` (the context manager wins; ``0``, ``false``, ``no``, ``off``
or empty mean off). It is read when a call is traced and follows the call into its JVP,
transpose and batching rules; a function already compiled keeps the mode it was traced in.

In debug mode Numba kernels are compiled with bounds checking and run twice on pre-filled
outputs (an element that differs was never written), and every backend is compared with
the kernel's ``jax`` backend (tolerances in :data:`TOLERANCES`). A failure raises
:class:`primforge.KernelError` naming the kernel, backend, output and first bad index
(inside ``jax.jit``, a ``jax.errors.JaxRuntimeError`` carrying its message).

Example:
    >>> import jax, jax.numpy as jnp, primforge
    >>> k = primforge.XLACustomKernel('doc_debug_mode_demo')
    >>> k.def_kernel('fast', 'cpu', lambda **kw: lambda x: x.at[0].set(7.0))
    >>> k.def_kernel('jax', 'cpu', lambda **kw: lambda x: x)
    >>> with primforge.debug_mode():
    ...     k(jnp.zeros(3), outs=jax.ShapeDtypeStruct((3,), jnp.float32))
    Traceback (most recent call last):
    ...
    primforge.kernel.errors.KernelError: kernel 'doc_debug_mode_demo' (backend 'fast'),
    debug mode: output 0 (float32[3]) differs from the 'jax' reference backend; first
    differing index (0,): got 7.0, reference 0.0 (rtol=0.0001, atol=1e-06)
    [primforge debug #...]
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator

__all__ = ["ENV_DEBUG", "TOLERANCES", "debug_mode", "enabled"]

ENV_DEBUG = "PRIMFORGE_DEBUG"

#: ``(rtol, atol)`` per floating dtype name for the reference comparison; other floating
#: formats (8-bit floats) use ``(0.1, 0.1)``; integers and booleans must match exactly.
#: Change an entry to loosen or tighten the check for the calls traced afterwards.
TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-9, 1e-12),
    "complex128": (1e-9, 1e-12),
    "float32": (1e-4, 1e-6),
    "complex64": (1e-4, 1e-6),
    "float16": (1e-2, 1e-3),
    "bfloat16": (2e-2, 1e-2),
}

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
