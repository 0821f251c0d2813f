"""The ring buffer of pending input that the delayed products add into, and its arguments.

A synapse ``k`` from ``i`` to ``j`` with delay ``d_k`` (in steps) adds ``w_k x_i`` into
row ``(t + d_k) % D`` of a ``(D, n_post)`` buffer; :func:`~primforge.ops.delay_read` takes
row ``t % D`` and zeroes it. Here: the empty buffer (:func:`delay_buffer`), the checks of the
arguments every delayed kernel shares (the buffer, the step ``t`` as the ``(1,)`` row
``slot`` the kernels take), what their rules share (:func:`define`, the buffer's cotangent)
and :data:`DELAYED`, the one kernel whose forms are the delayed products (``csr``: stored
synapses, ``jitc``: a just-in-time matrix).
"""

from __future__ import annotations

import operator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from primforge import _compat
from primforge.ops._operator import Operator

__all__ = ["DELAYED", "delay_buffer"]

#: One kernel for every delayed product: its forms are the format and the events.
DELAYED = Operator("delayed", keys=("format", "events"), doc=__doc__)


def buffer_array(who: str, buffer: Any) -> jax.Array:
    """``buffer`` as a float array ``(D, n_post)`` with ``D >= 1``, or an error naming it."""
    buffer = jnp.asarray(buffer)
    if buffer.ndim != 2 or buffer.shape[0] < 1:
        raise ValueError(f"{who}: 'buffer' must be a (D, n_post) array with D >= 1 (see "
                         f"delay_buffer), got shape {tuple(buffer.shape)}")
    if not jnp.issubdtype(buffer.dtype, jnp.floating):
        raise TypeError(f"{who}: 'buffer' must be floating point, got {buffer.dtype}")
    return buffer


def step_row(who: str, t: Any, depth: int) -> jax.Array:
    """The buffer row of step ``t`` (``t mod D``) as a ``(1,)`` int32 array.

    A concrete step (a Python or NumPy integer of any width, a 0-d array) is reduced on the
    host in Python integers, so every integer value gives its exact row. A traced step is
    reduced in its own integer type (at least 32 bits), which cannot overflow.
    """
    if isinstance(t, _compat.Tracer):
        if t.ndim != 0 or not jnp.issubdtype(t.dtype, jnp.integer):
            raise TypeError(f"{who}: 't' must be an integer scalar (the step), got "
                            f"{t.dtype}{list(t.shape)}")
        if t.dtype.itemsize < 4:  # widened first: D may not fit a narrow type
            t = t.astype(jnp.int32)
        return jnp.mod(t, jnp.asarray(depth, t.dtype)).astype(jnp.int32).reshape(1)
    if isinstance(t, int) and not isinstance(t, bool):
        value = t
    else:
        a = np.asarray(t)
        if a.ndim != 0 or a.dtype.kind not in "iu":
            raise TypeError(f"{who}: 't' must be an integer scalar (the step), got "
                            f"{a.dtype}{list(a.shape)}")
        value = int(a)
    return jnp.asarray([value % depth], jnp.int32)


def check_buffer_and_slot(who: str, buffer, slot, n_dst: int, dtype, weights: str) -> None:
    """The ring buffer ``(D, n_dst)`` in the weights' dtype and the ``(1,)`` integer slot."""
    if len(buffer.shape) != 2 or buffer.shape[1] != n_dst or buffer.shape[0] < 1:
        raise ValueError(f"{who}: 'buffer' must have shape (D, {n_dst}) with D >= 1, got "
                         f"{tuple(buffer.shape)}")
    if buffer.dtype != dtype:
        raise TypeError(f"{who}: 'buffer' ({buffer.dtype}) and {weights} ({dtype}) must "
                        f"share one floating dtype")
    if tuple(slot.shape) != (1,) or not jnp.issubdtype(slot.dtype, jnp.integer):
        raise TypeError(f"{who}: 'slot' must be an integer array of shape (1,), got "
                        f"{slot.dtype}{list(slot.shape)}")


def define(kernel: Any, *, reference: Any, numba: Any, shapes: Any, jvp: Any, transpose: Any,
           sharding: Any, tags: tuple[str, ...]) -> Any:
    """Give ``kernel`` (a form of :data:`DELAYED`, or the read) its generators and rules.

    The ``jax`` reference on every platform, the ``numba`` kernel (in place on the buffer)
    the CPU default, batching by the general rule, the tag ``delay`` and ``tags``.
    """
    for platform in ("cpu", "gpu", "tpu"):
        kernel.def_kernel("jax", platform, reference)
    kernel.def_numba_kernel(numba, asdefault=True)
    kernel.def_abstract_eval(shapes)
    kernel.def_jvp_rule(jvp)
    kernel.def_transpose_rule(transpose)
    kernel.register_general_batching()
    kernel.def_tags("delay", *tags)
    kernel.def_sharding_rule(sharding)
    return kernel


def buffer_cotangent(cts: Any, primals: tuple, buffer_at: int, constants: tuple[int, ...],
                     message: str) -> tuple[Any, list]:
    """The start of a delayed product's transpose rule: ``(ct, out)``.

    A product adds into its buffer, so the buffer's cotangent is the output's ``ct``: set in
    ``out[buffer_at]`` when the buffer is a linear input. ``ct`` is None (every cotangent
    zero) when the output's is; an input in ``constants`` (the structure, the seed, the
    slot) that is a linear input raises ``ValueError(message)``.
    """
    (ct,) = cts
    out = [None] * len(primals)
    if type(ct) is _compat.Zero:
        return None, out
    if any(_compat.is_undefined_primal(primals[i]) for i in constants):
        raise ValueError(message)
    ct = jnp.asarray(ct)
    if _compat.is_undefined_primal(primals[buffer_at]):
        out[buffer_at] = ct
    return ct, out


def delay_buffer(max_delay: int, n_post: int, dtype: Any = None) -> jax.Array:
    """An empty ring buffer for delays ``0 .. max_delay`` steps: zeros ``(max_delay + 1, n_post)``.

    Args:
        max_delay: the longest delay in steps (non-negative).
        n_post: the number of targets.
        dtype: a floating dtype (default: JAX's default float).

    Example:
        >>> delay_buffer(2, 3).shape
        (3, 3)
    """
    try:
        if isinstance(max_delay, (bool, np.bool_)) or isinstance(n_post, (bool, np.bool_)):
            raise TypeError
        max_delay, n_post = operator.index(max_delay), operator.index(n_post)
    except TypeError:
        raise TypeError(f"delay_buffer: 'max_delay' and 'n_post' must be ints, got "
                        f"{max_delay!r}, {n_post!r}") from None
    if max_delay < 0 or n_post < 0:
        raise ValueError(f"delay_buffer: 'max_delay' and 'n_post' must be non-negative, got "
                         f"{max_delay}, {n_post}")
    dtype = jnp.result_type(float) if dtype is None else jnp.dtype(dtype)
    if not jnp.issubdtype(dtype, jnp.floating):
        raise TypeError(f"delay_buffer: 'dtype' must be floating point, got {dtype}")
    return jnp.zeros((max_delay + 1, n_post), dtype)
