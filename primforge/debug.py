"""Debug mode: the switch that asks every kernel call to check itself.

Turn it on with ``with primforge.debug_mode():`` around the code that *traces* the calls,
or with ``PRIMFORGE_DEBUG=1`` in the environment (the context manager wins; ``0``,
``false``, ``no``, ``off`` or empty mean off). It is read when a call is traced and
recorded in the call, so it follows the call into its JVP, transpose and batching rules;
a function already compiled by ``jax.jit`` keeps the mode it was traced in.

What a kernel call checks in debug mode:

* Numba kernels, however registered, are compiled with bounds checking, and so is every
  ``@njit`` function they call (reached through globals, closure cells or a module's
  attributes): an out-of-range index raises an ``IndexError`` naming the index, the axis
  and its size, instead of reading or writing over memory. ``NUMBA_BOUNDSCHECK=0`` turns that off everywhere (debug mode warns).
  A ``parallel=True`` kernel runs serially (Numba drops an exception raised on a worker
  thread).
* Output coverage (Numba kernels, also those of a backend whose generator returns
  ``numba_kernel(...)``): the output buffers a kernel receives are pre-filled,
  and the kernel runs twice with two different fill patterns (NaN-like, then another bit
  pattern). An element that differs between the two runs was never written by the
  kernel, or its value depended on what the buffer held before (for example ``out[i] +=
  ...`` on a buffer assumed to be zero): both are errors. A kernel whose results change
  from run to run (an unordered parallel reduction) is reported the same way. Outside
  debug mode output buffers are *uninitialised*: a kernel must write every element of
  every output. Outputs aliased to inputs (``input_output_aliases``) start from those
  inputs by design and are not checked.
* Reference comparison: when the kernel has a ``jax`` backend on the platform, the call
  also runs it on the same inputs and compares every output, with a tolerance per dtype
  (:data:`TOLERANCES`; integers and booleans exactly, NaN equals NaN).
* Failures raise :class:`primforge.KernelError` naming the kernel, the backend, the output
  and the first bad index (batch dimensions first under ``vmap``), with the values for a
  mismatch. Eager calls raise the ``KernelError`` itself; inside a function compiled with
  ``jax.jit`` the error arrives as a ``jax.errors.JaxRuntimeError`` whose message starts
  with the ``KernelError``'s.

The price: a Numba call runs twice and the reference once more, values travel to the host
for the report, and sharded calls run gathered (not partitioned). Checks that hold in
every mode (``outs`` against the ``jax`` reference's ``jax.eval_shape``, integer shapes,
known static params) are not debug-only.

Example:
    >>> import jax, jax.numpy as jnp, primforge
    >>> k = primforge.XLACustomKernel('doc_debug_mode_demo')
    >>> k.def_kernel('fast', 'cpu', lambda **kw: lambda x: x.at[0].set(7.0))
    >>> k.def_kernel('jax', 'cpu', lambda **kw: lambda x: x)
    >>> with primforge.debug_mode():
    ...     k(jnp.zeros(3), outs=jax.ShapeDtypeStruct((3,), jnp.float32))
    Traceback (most recent call last):
    ...
    primforge.kernel.errors.KernelError: kernel 'doc_debug_mode_demo' (backend 'fast'), debug mode: output 0 (float32[3]) differs from the 'jax' reference backend; first differing index (0,): got 7.0, reference 0.0 (rtol=0.0001, atol=1e-06) [primforge debug #...]
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
