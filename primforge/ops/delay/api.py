"""Delayed event products, the public surface: :func:`delayed_matvec` over the formats.

The products add each synapse's weight (times its input) into a ring buffer of pending input
(:mod:`~primforge.ops.delay.ring`), one buffer row per step of delay; ``delayed_matvec``
takes a matrix object (CSR, CSC or FixedNum) and hands its arrays to the CSR form
(:mod:`~primforge.ops.delay.csr`); the just-in-time form is
:func:`~primforge.ops.binary_delayed_jitc_matvec`, the read :func:`~primforge.ops.delay_read`.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from primforge import _compat
from primforge.ops import _scaffold
from primforge.ops.csr import structure as _common
from primforge.ops.csr.matrix import CSC, CSR
from primforge.ops.delay.csr import csr_call, delay_values, n_stored
from primforge.ops.delay.ring import buffer_array, step_row
from primforge.ops.fixed_num.matrix import FixedNum
from primforge.ops.packed import as_events

__all__ = ["delayed_matvec"]


def _structure(W, who):
    """``(data, indices, indptr, stored shape, transpose, delay shape)`` of ``W``."""
    if isinstance(W, (CSR, CSC)):
        indices = _scaffold.index_array(W.indices, who, "indices")
        indptr = _scaffold.index_array(W.indptr, who, "indptr")
        return W.data, indices, indptr, W._csr_shape, isinstance(W, CSR), tuple(indices.shape)
    if isinstance(W, FixedNum):
        rows, k = W.indices.shape
        indices = _scaffold.index_array(W.indices, who, "indices").reshape(-1)
        indptr = jnp.arange(rows + 1, dtype=indices.dtype) * k
        data = W.weights if W.homogeneous else W.weights.reshape(-1)
        return data, indices, indptr, W._stored_shape, W.per == "pre", (rows, k)
    raise TypeError(f"{who}: 'W' must be a CSR, CSC or FixedNum matrix, got "
                    f"{type(W).__name__}")


def _any_visited(x, indices, indptr, rows_are_sources: bool) -> jax.Array:
    """Does an active input reach a stored synapse (padding excluded)?"""
    nnz = indices.shape[0]
    src = _common.row_ids(indptr, nnz) if rows_are_sources else indices
    got = (x != 0).at[src].get(mode="fill", fill_value=False)
    return jnp.any(got & _common.live_entries(indptr, nnz))


def delayed_matvec(W: Any, x: Any, delays: Any, buffer: Any, t: Any, *,
                   backend: str | None = None) -> jax.Array:
    """Add the delayed input ``x @ W`` of step ``t`` into the ring buffer: the buffer updated.

    Synapse ``i -> j`` with delay ``d`` adds ``W[i, j] * x[i]`` into
    ``buffer[(t + d) % D, j]``; read the input arriving at a step with :func:`delay_read`
    after adding that step's spikes. Bool or integer ``x`` are events (their weights are
    added); float ``x`` is multiplied in. Linear in the weights, ``x`` and ``buffer``:
    ``jax.grad``, ``jax.jvp`` and ``jax.vmap`` go through.

    Args:
        W: ``(n_pre, n_post)`` :class:`~primforge.ops.CSR` (event-driven: only the rows of
            active inputs are visited), :class:`~primforge.ops.CSC` or
            :class:`~primforge.ops.FixedNum`.
        x: ``(n_pre,)`` events or floats.
        delays: one integer for every synapse (the homogeneous case: one row of the buffer
            gets ``x @ W`` through the ordinary product, ``W.rmatmul``), or an integer
            array aligned with the stored weights (``W.data`` of a CSR or CSC,
            ``W.indices`` of a FixedNum). Each in ``[0, D)``: 0 arrives in the same step.
        buffer: ``(D, n_post)`` float buffer from :func:`delay_buffer`.
        t: integer step.
        backend: 'numba' (CPU default) or 'jax'.

    Returns:
        The updated ``(D, n_post)`` buffer.

    Example:
        >>> import jax.numpy as jnp
        >>> from primforge.ops import CSR, delay_buffer, delay_read
        >>> W = CSR.from_dense([[1., 2.], [0., 3.]])
        >>> buf = delayed_matvec(W, jnp.array([True, True]), jnp.array([0, 2, 1]),
        ...                      delay_buffer(2, 2), 0)
        >>> now, buf = delay_read(buf, 0)
        >>> now.tolist(), buf.tolist()
        ([1.0, 0.0], [[0.0, 0.0], [0.0, 3.0], [0.0, 2.0]])
    """
    who = "delayed_matvec"
    buffer = buffer_array(who, buffer)
    depth = buffer.shape[0]
    data, indices, indptr, shape, rows_are_sources, dshape = _structure(W, who)
    n_pre, n_post = W.shape
    if buffer.shape[1] != n_post:
        raise ValueError(f"{who}: 'buffer' must have shape (D, {n_post}) for W of shape "
                         f"{tuple(W.shape)}, got {tuple(buffer.shape)}")
    x = jnp.asarray(as_events(x))
    if x.shape != (n_pre,):
        raise ValueError(f"{who}: 'x' must have shape ({n_pre},) for W of shape "
                         f"{tuple(W.shape)}, got {tuple(x.shape)}")
    n_live = (indices.shape[0] if isinstance(W, FixedNum)
              else n_stored(W.indptr, indices.shape[0]))
    traced = isinstance(delays, _compat.Tracer)
    delays = delay_values(who, delays, depth, dshape, n_live)
    binary = not jnp.issubdtype(x.dtype, jnp.inexact)
    if delays.ndim == 0:
        # One delay for all: the ordinary event-driven product, added into one row.
        s = step_row(who, t, depth)[0]
        d = jnp.clip(delays, 0, depth - 1)
        slot = jnp.where(d >= depth - s, d - (depth - s), s + d)  # (t + d) mod D, no overflow
        weights = W.weights if isinstance(W, FixedNum) else W.data
        W = W.with_data(weights.astype(buffer.dtype))
        y = W.rmatmul(x if binary else x.astype(buffer.dtype), backend=backend)
        row = jax.lax.dynamic_index_in_dim(buffer, slot, 0, keepdims=False)
        new = jax.lax.dynamic_update_slice_in_dim(buffer, (row + y)[None], slot, 0)
        if not traced:
            return new
        # A traced delay outside [0, D) poisons the buffer once a synapse is visited, as in
        # the per-synapse kernels.
        poisoned = (((delays < 0) | (delays >= depth))
                    & _any_visited(x, indices, indptr, rows_are_sources))
        return jnp.where(poisoned, jnp.nan, new).astype(buffer.dtype)
    call = csr_call(binary)
    return call(data, indices, indptr, delays.reshape(-1), x, buffer, t, shape=shape,
                transpose=rows_are_sources, backend=backend)
