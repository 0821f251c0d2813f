"""Bit-packed binary events: 32 spikes a ``uint32`` word.

Event ``i`` is bit ``i % 32`` of word ``i // 32`` along axis 0; every binary product
accepts a :class:`PackedEvents` wherever it accepts bool events.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from primforge._compat import Tracer
from primforge.utils import dataclass, field

__all__ = ["PackedEvents", "as_events", "pack_events"]

_BITS = 32


@dataclass
class PackedEvents:
    """Binary events packed 32 to a ``uint32`` word along the first axis.

    Attributes:
        words: ``(ceil(n / 32),)`` or ``(ceil(n / 32), cols)`` ``uint32``.
        n: number of events along the packed axis; static.

    Example:
        >>> import jax.numpy as jnp
        >>> p = pack_events(jnp.array([True, False, True] + [False] * 30 + [True]))
        >>> p.n, p.words.tolist()
        (34, [5, 2])
        >>> p.unpack().sum().item()
        3
    """

    words: jax.Array
    n: int = field(static=True)

    def __post_init__(self):
        if hasattr(self.words, "shape"):  # not while JAX rebuilds it from placeholders
            _check_words(self.words, self.n)

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of the unpacked events: ``(n,)`` or ``(n, cols)``.

        Example:
            >>> import jax.numpy as jnp
            >>> from primforge.ops import pack_events
            >>> pack_events(jnp.zeros((40, 3), bool)).shape
            (40, 3)
        """
        return (self.n,) + tuple(self.words.shape[1:])

    def unpack(self) -> jax.Array:
        """The events as a ``bool`` array of :attr:`shape` (traceable).

        Example:
            >>> import jax.numpy as jnp
            >>> pack_events(jnp.array([[True, False], [False, True]])).unpack().tolist()
            [[True, False], [False, True]]
        """
        _check_words(self.words, self.n)
        return _unpack(self.words, int(self.n))


def _check_words(words, n) -> None:
    """Raise unless ``words`` holds exactly ``ceil(n / 32)`` words along its first axis."""
    want = -(-int(n) // _BITS)
    got = tuple(words.shape)
    if not got or got[0] != want:
        raise ValueError(f"PackedEvents: 'words' must have ceil(n / 32) = {want} words along "
                         f"its first axis for n = {n}, got shape {got}")


def pack_events(events: Any) -> PackedEvents:
    """Pack binary events (non-zero = active) 32 to a ``uint32`` word along axis 0.

    Args:
        events: a vector ``(n,)`` or matrix ``(n, cols)`` of bools or numbers.

    Returns:
        A :class:`PackedEvents` with ``ceil(n / 32)`` words along the first axis.

    Example:
        >>> import jax.numpy as jnp
        >>> from primforge import ops
        >>> W = ops.CSR.from_dense(jnp.array([[1., 0.], [0., 2.], [3., 0.]]))
        >>> spikes = jnp.array([True, False, True])
        >>> (ops.pack_events(spikes) @ W).tolist() == (spikes @ W).tolist()
        True
    """
    # NumPy input goes to the compiled program as it is (jnp.asarray would compile a
    # program of its own for each new shape).
    x = events if isinstance(events, (jax.Array, Tracer, np.ndarray)) else np.asarray(events)
    if x.ndim not in (1, 2):
        raise ValueError(f"pack_events: 'events' must be a vector or a matrix, got shape "
                         f"{tuple(x.shape)}")
    return PackedEvents(_pack(x), int(x.shape[0]))


@jax.jit
def _pack(x):
    """The ``uint32`` words of ``x``'s events (one compiled program a shape and dtype)."""
    n = x.shape[0]
    n_words = -(-n // _BITS)
    active = (x != 0).astype(jnp.uint32)
    pad = [(0, n_words * _BITS - n)] + [(0, 0)] * (x.ndim - 1)
    active = jnp.pad(active, pad).reshape((n_words, _BITS) + tuple(x.shape[1:]))
    shifts = jnp.arange(_BITS, dtype=jnp.uint32).reshape((1, _BITS) + (1,) * (x.ndim - 1))
    return jnp.sum(active << shifts, axis=1, dtype=jnp.uint32)


@functools.partial(jax.jit, static_argnums=1)
def _unpack(words, n: int):
    """The first ``n`` events of ``words`` as ``bool`` (one compiled program a shape)."""
    shape = (1, _BITS) + (1,) * (words.ndim - 1)
    shifts = jnp.arange(_BITS, dtype=jnp.uint32).reshape(shape)
    bits = (words[:, None] >> shifts) & jnp.uint32(1)
    flat = bits.reshape((words.shape[0] * _BITS,) + tuple(words.shape[1:]))
    return flat[:n].astype(bool)


def as_events(x: Any) -> Any:
    """``x`` unpacked to ``bool`` when it is a :class:`PackedEvents`, else unchanged.

    Example:
        >>> import numpy as np
        >>> as_events(pack_events(np.array([1, 0, 1]))).tolist(), as_events(np.ones(2)).tolist()
        ([True, False, True], [1.0, 1.0])
    """
    return x.unpack() if isinstance(x, PackedEvents) else x

