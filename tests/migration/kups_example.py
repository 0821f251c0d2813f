"""A padded particle buffer and a Monte Carlo style update written the kups way; only the
import changed.

Was:
    from kups.core.utils.jax import (dataclass, field, tree_concat, tree_scatter_set,
        tree_stack, tree_where_broadcast_last, tree_zeros_like)
"""

import jax

from primforge.utils import (
    dataclass,
    field,
    tree_concat,
    tree_scatter_set,
    tree_stack,
    tree_where_broadcast_last,
    tree_zeros_like,
)


@dataclass
class Particles:
    positions: jax.Array  # (n, 3)
    charges: jax.Array  # (n,)


@dataclass
class Buffer:
    """Particles in a fixed-size buffer: an index past the end is a padding slot."""

    particles: Particles
    mode: str = field(default="drop", static=True)

    @property
    def scatter_args(self):
        return {"mode": self.mode}


def insert(buffer: Buffer, new: Particles, slots: jax.Array) -> Buffer:
    """Write ``new`` into ``slots``; slots past the end are dropped (the buffer's args)."""
    return tree_scatter_set(buffer, Buffer(new), slots, {})


def insert_clamped(buffer: Buffer, new: Particles, slots: jax.Array) -> Buffer:
    """The same, with the caller forcing ``mode="clip"`` over the buffer's own mode."""
    return tree_scatter_set(buffer, Buffer(new), slots, {"mode": "clip"})


def accept_moves(old: Particles, proposed: Particles, accept: jax.Array) -> Particles:
    """Keep each particle's proposal where ``accept`` (per particle) is True."""
    return tree_where_broadcast_last(accept, proposed, old)


def history(*states: Particles) -> Particles:
    return tree_stack(*states)


def merged(a: Particles, b: Particles) -> Particles:
    return tree_concat(a, b)


def empty_like(p: Particles) -> Particles:
    return tree_zeros_like(p)
