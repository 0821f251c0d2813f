"""The read of the ring buffer: the input arriving at a step, and the buffer with its row zeroed.

A kernel of its own (numba: in place), not a slice plus a dynamic_update_slice: after a
product's custom call XLA would copy the whole buffer to zero one row.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from primforge import _compat
from primforge.kernel.kernel import XLACustomKernel
from primforge.ops import _scaffold, _sharding
from primforge.ops.delay.ring import buffer_array, define, step_row

__all__ = ["delay_read", "delay_read_p"]


def _read_jax(**_):
    def kernel(buffer, slot):
        s = slot[0]
        ok = (s >= 0) & (s < buffer.shape[0])
        now = jax.lax.dynamic_index_in_dim(buffer, s, 0, keepdims=False)
        zero = jnp.zeros((1, buffer.shape[1]), buffer.dtype)
        new = jax.lax.dynamic_update_slice_in_dim(buffer, zero, s, 0)
        return jnp.where(ok, now, jnp.nan), jnp.where(ok, new, jnp.nan)

    return kernel


def _read_numba(*, outs, **_):
    from primforge.backends.numba import numba_kernel
    from primforge.ops.delay import numba as _numba_delay

    return numba_kernel(_numba_delay.read_kernel(), outs=list(outs), input_output_aliases={0: 1})


def _read_shapes(buffer, slot, **_):
    if len(buffer.shape) != 2 or not jnp.issubdtype(buffer.dtype, jnp.floating):
        raise TypeError(f"delay_read: 'buffer' must be a 2-D float array, got "
                        f"{buffer.dtype}{list(buffer.shape)}")
    return (jax.ShapeDtypeStruct(buffer.shape[1:], buffer.dtype),
            jax.ShapeDtypeStruct(buffer.shape, buffer.dtype))


def _read_jvp(primals, tangents, *, outs, backend=None, **_):
    buffer, slot = primals
    d_buf = tangents[0]
    y = list(delay_read_p(buffer, slot, backend=backend))
    if type(d_buf) is _compat.Zero:
        zero_now = jnp.zeros(buffer.shape[1:], buffer.dtype)
        return y, [zero_now, jnp.zeros_like(buffer)]
    return y, list(delay_read_p(d_buf, slot, backend=backend))


def _read_transpose(cts, buffer, slot, *, outs, backend=None, **_):
    ct_now, ct_buf = cts
    if _compat.is_undefined_primal(slot):
        raise ValueError("delay_read is not linear in the slot")
    shape, dtype = buffer.aval.shape, buffer.aval.dtype
    ct_buf = jnp.zeros(shape, dtype) if type(ct_buf) is _compat.Zero else jnp.asarray(ct_buf)
    row = (jnp.zeros(shape[1:], dtype) if type(ct_now) is _compat.Zero
           else jnp.asarray(ct_now).astype(dtype))
    return [jax.lax.dynamic_update_slice_in_dim(ct_buf, row[None], slot[0], 0), None]


delay_read_p = define(
    XLACustomKernel("primforge.ops.delay_read", doc=__doc__, replace=True), reference=_read_jax,
    numba=_read_numba, shapes=_read_shapes, jvp=_read_jvp, transpose=_read_transpose,
    sharding=_sharding.delay_read_rule, tags=())


def delay_read(buffer: Any, t: Any, *, backend: str | None = None
               ) -> tuple[jax.Array, jax.Array]:
    """The input arriving at step ``t`` (row ``t % D``) and the buffer with that row zeroed.

    Within a step, add the step's spikes first (:func:`delayed_matvec`), then read: a delay
    of 0 then arrives in the same step, and a delay of ``d`` steps ``d`` reads later. One
    kernel (``delay_read_p``; numba: the row is zeroed in place, no copy of the buffer).

    Example:
        >>> import jax.numpy as jnp
        >>> now, buf = delay_read(jnp.array([[1., 2.], [3., 4.]]), 3)
        >>> now.tolist(), buf.tolist()
        ([3.0, 4.0], [[1.0, 2.0], [0.0, 0.0]])
    """
    buffer = buffer_array("delay_read", buffer)
    now, new = delay_read_p(buffer, step_row("delay_read", t, buffer.shape[0]), backend=backend)
    return now, new


delay_read_p.def_call(delay_read)
delay_read_p.def_benchmark_data(_scaffold.lazy_benchmark_data("primforge.ops.delay.bench",
                                                              "reads"))
