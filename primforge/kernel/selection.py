"""Backend selection: per call, per context, by default.

Design:
    * The choice is made in three layers, first match wins: the ``backend=`` argument of
      a call, the innermost :func:`use_backend` context active when the kernel is called
      (captured into the primitive's params at trace time, so it survives into a jitted
      function's later lowering), then the kernel's default for the platform (read when the
      kernel is lowered).
    * Both :func:`use_backend` and ``XLACustomKernel.set_default`` change the value of one
      ``jax.make_user_context``, which is part of ``jax.jit``'s cache key: a function jitted
      before the change is re-traced and re-lowered with the new choice, without clearing
      any of JAX's caches.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator

from primforge import _compat

__all__ = ["current_overrides", "use_backend"]

# Value: (generation, overrides); overrides is a tuple of (kernel_name | None, platform,
# backend), innermost last. The generation changes whenever a default changes.
_STATE = _compat.make_user_context(default_value=(0, ()))
_GENERATION = itertools.count(1)

PLATFORM_ALIASES = {"cuda": "gpu", "rocm": "gpu", "gpu": "gpu", "cpu": "cpu", "tpu": "tpu"}


def canonical_platform(platform: str) -> str:
    """Map JAX platform names ('cuda', 'rocm') to primforge's ('gpu').

    Example:
        >>> canonical_platform('cuda')
        'gpu'
    """
    try:
        return PLATFORM_ALIASES[platform]
    except KeyError:
        raise ValueError(
            f"unknown platform {platform!r}: expected one of 'cpu', 'gpu', 'tpu'"
        ) from None


def defaults_changed() -> None:
    """Invalidate jit caches that depend on a kernel default (called by ``set_default``)."""
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


@contextlib.contextmanager
def use_backend(platform: str, backend: str, kernel=None) -> Iterator[None]:
    """Within the block, kernels called on ``platform`` use ``backend`` where they have it.

    Args:
        platform: 'cpu', 'gpu' (or 'cuda') or 'tpu'.
        backend: backend name, e.g. 'jax' or 'numba'. Kernels that have no such backend
            registered for the platform keep their own choice.
        kernel: restrict the override to one kernel (an ``XLACustomKernel`` or its name).

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
    name = kernel if kernel is None or isinstance(kernel, str) else kernel.name
    generation, overrides = _STATE.value
    with _STATE((generation, overrides + ((name, canonical_platform(platform), backend),))):
        yield
