"""Pure-JAX reference backend.

The kernel generator returns a function written in ``jax.numpy``/``lax``; it runs on every
platform and is the oracle every other backend is tested against. Batching is JAX's own
``vmap`` of that function, so it is always native.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax

from primforge.backends import _common, _contract

NAME = "jax"
PLATFORMS = ("cpu", "gpu", "tpu")
EXTRA = None


@functools.cache
def is_available(platform: str | None = None) -> bool:
    """The JAX backend needs nothing beyond JAX itself: True on every platform it serves.

    Example:
        >>> is_available(), is_available('gpu'), is_available('fpga')
        (True, True, False)
    """
    return platform is None or platform in PLATFORMS


def make_callable(
    product: Callable[..., Any],
    *,
    ins: Sequence[jax.ShapeDtypeStruct],
    outs: Sequence[jax.ShapeDtypeStruct],
    platform: str,
    name: str,
    **options: Any,
) -> Callable[..., tuple[jax.Array, ...]]:
    """Wrap a ``jax.numpy`` function so it returns a tuple of outputs matching ``outs``.

    It takes no options (``batch=()`` only: JAX's ``vmap`` batches the function).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> f = make_callable(lambda x: 2 * x, ins=[jax.ShapeDtypeStruct((3,), jnp.float32)],
        ...                   outs=[jax.ShapeDtypeStruct((3,), jnp.float32)], platform='cpu',
        ...                   name='double')
        >>> f(jnp.ones(3))
        (Array([2., 2., 2.], dtype=float32),)
    """
    _common.check_request(NAME, PLATFORMS, EXTRA, is_available, platform=platform,
                          kernel=name, options=options, needs="nothing beyond JAX")
    return _contract.traceable(product, backend=NAME, name=name,
                               expected="a callable written in jax.numpy")


class JaxBackend(_contract.BackendBase):
    """The reference backend as the registry holds it: this module's hooks, bound once."""

    NAME, PLATFORMS, EXTRA = NAME, PLATFORMS, EXTRA
    is_available = staticmethod(is_available)
    make_callable = staticmethod(make_callable)


#: This module's backend: :func:`primforge.backends.get_backend` registers it on first use.
BACKEND = JaxBackend()
