"""Values that XLA computes once, however many operations read them.

XLA's CPU compiler fuses a cheap elementwise computation into each operation that reads
its result, and forms no fusion with several outputs over arrays of this kind: a neuron
update whose voltage, spikes and refractory counter are read by the reset, the counter's
update, two event products and a spike count is computed once in each of those fusions,
each pass reading the whole state again. :func:`evaluate_once` calls a function as one
branch of a conditional whose predicate is known only at run time, both branches the same
function: XLA can neither fuse through a conditional nor drop it, so the function's
results are written to memory once and every reader loads them. The predicate is read
from the first element of the first array argument; whichever branch runs, the result is
``fn(*args)``.

Only the CPU lowering does this: on GPU and TPU, where XLA forms multi-output fusions and a
conditional costs a transfer of its predicate to the host, the function is called as it is
(``jax.lax.platform_dependent`` chooses at lowering time). Autodiff and ``jit`` go through
JAX's own ``cond``. Under ``vmap`` the predicate is read from the first member of the batch
(a ``custom_vmap`` rule), so that it stays one scalar and the conditional a conditional over
the whole batch: a batched predicate would make JAX compute both branches and select.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.custom_batching import custom_vmap

__all__ = ["evaluate_once"]


@custom_vmap
def _nonzero(x):
    """``x != 0`` for a scalar ``x``; under ``vmap``, of the batch's first member only."""
    return x != 0


@_nonzero.def_vmap
def _nonzero_vmap(axis_size, in_batched, x):
    del axis_size
    (batched,) = in_batched
    # Through _nonzero again, so that an outer vmap also gets one scalar.
    return _nonzero(x[0] if batched else x), False


def _predicate(args):
    """A boolean scalar read from the first non-empty numeric or boolean array among
    ``args``, or ``None`` where there is none."""
    for leaf in jax.tree_util.tree_leaves(args):
        if not isinstance(leaf, (jax.Array, np.ndarray)) or leaf.size == 0:
            continue
        if jnp.issubdtype(leaf.dtype, jnp.bool_) or jnp.issubdtype(leaf.dtype, jnp.number):
            return _nonzero(lax.stop_gradient(jnp.ravel(leaf)[0]))
    return None


def evaluate_once(fn, *args, **kwargs):
    """Return ``fn(*args, **kwargs)``, computed once into memory on CPU.

    Wrap the part of a step whose results several operations read, so that XLA's CPU
    compiler computes it once instead of inside each reader's fusion (the module's
    docstring says why it would). On other platforms, and where ``args`` hold no array to
    read a predicate from, this is ``fn(*args, **kwargs)``. The results are the same either
    way; the difference is speed, which depends on how many operations read them:
    measure.

    Args:
      fn: the function; it must return a pytree of arrays, and be a pure function of its
        arguments (it is traced twice, as both branches of a ``lax.cond``).
      *args: its positional arguments, pytrees of arrays (the conditional's operands).
      **kwargs: its keyword arguments, passed as they are (closed over, so they may be
        static values such as Python numbers or strings).

    Raises:
      TypeError: ``fn`` is not callable.

    Example: a neuron update read by three operations.

    >>> import jax, jax.numpy as jnp
    >>> from primforge.sim import evaluate_once
    >>> def update(v, i):
    ...     v = v + 0.1 * (i - v)
    ...     return v, v > 1.0
    >>> @jax.jit
    ... def step(v, i):
    ...     v, spike = evaluate_once(update, v, i)
    ...     return jnp.where(spike, 0.0, v), spike.sum(), spike
    >>> v, count, spike = step(jnp.array([0.95, 1.5, 0.2]), jnp.array([2.0, 2.0, 0.0]))
    >>> v.tolist(), int(count), spike.tolist()
    ([0.0, 0.0, 0.18000000715255737], 2, [True, True, False])
    """
    if not callable(fn):
        raise TypeError(f"evaluate_once: fn must be callable, got {type(fn).__name__} "
                        f"{fn!r}")

    def call(*operands):
        return fn(*operands, **kwargs)

    pred = _predicate(args)
    if pred is None:
        return call(*args)

    def once(*operands):
        return lax.cond(pred, call, call, *operands)

    return lax.platform_dependent(*args, cpu=once, default=call)
