"""Delayed event products: spikes enter a ring buffer of pending input, one row per step.

A synapse ``k`` from ``i`` to ``j`` with delay ``d_k`` (in steps) adds ``w_k x_i`` into
row ``(t + d_k) % D`` of a ``(D, n_post)`` buffer; :func:`delay_read` takes row ``t % D``
and zeroes it. The kernels take ``(data, indices, indptr, delays, x, buffer, slot)``
(``slot`` the ``(1,)`` row of step ``t``) and return the updated buffer.
"""

from __future__ import annotations

import operator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from primforge import _compat
from primforge.kernel.kernel import XLACustomKernel
from primforge.ops import _scaffold, _sharding
from primforge.ops._operator import Form, Operator
from primforge.ops.csr import structure as _common
from primforge.ops.csr.matrix import CSC, CSR
from primforge.ops.fixed_num.matrix import FixedNum
from primforge.ops.jitconn import generator as _gen
from primforge.ops.jitconn.api import jitc_todense
from primforge.ops.jitconn.structure import seed_word, weight_params
from primforge.ops.packed import as_events

__all__ = [
    "binary_delayed_csrmv",
    "binary_delayed_csrmv_p",
    "binary_delayed_jitc_matvec",
    "binary_delayed_jitc_matvec_p",
    "delay_buffer",
    "delay_read",
    "delay_read_p",
    "delayed_csrmv",
    "delayed_csrmv_p",
    "delayed_matvec",
    "jitc_delays_todense",
]


# ----------------------------------------------------------------------------- jax reference
def _routes(indices, indptr, delays, slot, depth, transpose):
    """Per stored entry: its source, its target and the buffer row it writes."""
    nnz = indices.shape[0]
    rows = _common.row_ids(indptr, nnz)  # padding entries: row m (dropped, never active)
    src, dst = (rows, indices) if transpose else (indices, rows)
    row = (slot[0] + jnp.clip(delays, 0, depth - 1)) % depth
    return src, dst, row


def _jax_generator(binary: bool):
    def generate(*, ins, outs, shape, transpose, **_):
        homo = _common.is_homogeneous(ins[0], ins[1])
        n_cols = shape[1]

        def kernel(data, indices, indptr, delays, x, buffer, slot):
            depth = buffer.shape[0]
            dtype = buffer.dtype
            src, dst, row = _routes(indices, indptr, delays, slot, depth, transpose)
            ev = (x != 0).astype(dtype) if binary else x.astype(dtype)
            got = ev.at[src].get(mode="fill", fill_value=0)
            w = data[0] if homo else data
            # Only active inputs contribute: a weight (even NaN) of an inactive one never enters.
            contrib = jnp.where(got != 0, w * got, 0).astype(dtype)
            new = buffer.at[row, dst].add(contrib, mode="drop")
            # Padding past indptr[-1] is never visited: its delays are not looked at.
            bad_delay = ((delays < 0) | (delays >= depth)) & _common.live_entries(
                indptr, indices.shape[0])
            ok = (_common.structure_ok(indices, indptr, n_cols) & (slot[0] >= 0)
                  & (slot[0] < depth) & ~jnp.any((got != 0) & bad_delay))
            return jnp.where(ok, new, jnp.nan).astype(dtype)

        return kernel

    return generate


def _numba_generator(binary: bool):
    def generate(*, ins, outs, transpose, **_):
        from primforge.backends.numba import numba_kernel
        from primforge.ops.delay import numba as _numba_delay

        homo = _common.is_homogeneous(ins[0], ins[1])
        fn = _numba_delay.kernel(binary, bool(transpose), homo)
        return numba_kernel(fn, outs=list(outs), input_output_aliases={5: 0})

    return generate


# ----------------------------------------------------------------------------- shape rule
def _name(binary: bool) -> str:
    return "binary_delayed_csrmv" if binary else "delayed_csrmv"


def _check_delays(who: str, delays, nnz: int) -> None:
    if not jnp.issubdtype(delays.dtype, jnp.integer):
        raise TypeError(f"{who}: 'delays' must be an integer array (steps), got {delays.dtype}")
    if tuple(delays.shape) != (nnz,):
        raise ValueError(f"{who}: 'delays' must hold one delay per stored synapse, shape "
                         f"({nnz},), got {tuple(delays.shape)}")


def _check_buffer_and_slot(who: str, buffer, slot, n_dst: int, dtype, weights: str) -> None:
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


def _shape_rule(binary: bool):
    who = _name(binary)

    def rule(data, indices, indptr, delays, x, buffer, slot, *, shape, transpose, **_):
        m, n = _scaffold.check_shape(shape, who)
        _common.check_csr_args(who, data, indices, indptr, (m, n))
        _check_delays(who, delays, indices.shape[0])
        n_src, n_dst = (m, n) if transpose else (n, m)
        if tuple(x.shape) != (n_src,):
            raise ValueError(f"{who}: the input must have shape ({n_src},) (the sources), got "
                             f"{tuple(x.shape)}")
        if not binary and not jnp.issubdtype(x.dtype, jnp.floating):
            raise TypeError(f"{who}: the input must be floating point, got {x.dtype}; use "
                            f"binary_{who} for events")
        _check_buffer_and_slot(who, buffer, slot, n_dst, data.dtype, "'data'")
        return jax.ShapeDtypeStruct(buffer.shape, buffer.dtype)

    return rule


# ----------------------------------------------------------------------------- rules
def _call(binary, *args, shape, transpose, backend=None):
    return KERNELS[binary](*args, shape=shape, transpose=transpose, backend=backend)


def _jvp(binary: bool):
    """Linear in ``(data, buffer)`` and in ``(x, buffer)``: the tangents accumulate in a buffer."""

    def jvp(primals, tangents, *, outs, shape, transpose, backend=None, **_):
        w, indices, indptr, delays, x, buffer, slot = primals
        d_w, d_x, d_buf = tangents[0], tangents[4], tangents[5]
        kw = {"shape": shape, "transpose": transpose, "backend": backend}
        y = _call(binary, w, indices, indptr, delays, x, buffer, slot, **kw)
        acc = jnp.zeros_like(buffer) if type(d_buf) is _compat.Zero else d_buf
        if type(d_w) is not _compat.Zero:
            acc = _call(binary, d_w, indices, indptr, delays, x, acc, slot, **kw)
        if type(d_x) is not _compat.Zero:
            acc = _call(False, w, indices, indptr, delays, d_x.astype(w.dtype), acc, slot, **kw)
        return [y], [acc]

    return jvp


def _transpose(binary: bool):
    def transpose_rule(cts, w, indices, indptr, delays, x, buffer, slot, *, outs, shape,
                       transpose, backend=None, **_):
        (ct,) = cts
        out = [None] * 7
        if type(ct) is _compat.Zero:
            return out
        undefined = _compat.is_undefined_primal
        if any(undefined(a) for a in (indices, indptr, delays, slot)):
            raise ValueError("delayed products are not linear in 'indices', 'indptr', "
                             "'delays' or the slot")
        ct = jnp.asarray(ct)
        if undefined(buffer):
            out[5] = ct
        if undefined(w) and undefined(x):
            raise ValueError("delayed products are bilinear: transpose w.r.t. 'data' or x, "
                             "not both")
        if not (undefined(w) or undefined(x)):
            return out
        depth = ct.shape[0]
        src, dst, row = _routes(indices, indptr, delays, slot, depth, transpose)
        got_ct = ct.at[row, dst].get(mode="fill", fill_value=0)  # each synapse's cotangent
        if undefined(x):
            homo = _common.is_homogeneous(w, indices)
            wk = w[0] if homo else w
            n_src = x.aval.shape[0]
            ct_x = jnp.zeros((n_src,), ct.dtype).at[src].add(wk * got_ct, mode="drop")
            out[4] = ct_x.astype(x.aval.dtype)
        else:
            x = jnp.asarray(x)
            ev = (x != 0).astype(ct.dtype) if binary else x.astype(ct.dtype)
            per = got_ct * ev.at[src].get(mode="fill", fill_value=0)
            homo = _common.is_homogeneous(w.aval, indices)
            out[0] = (jnp.sum(per).reshape(1) if homo else per).astype(w.aval.dtype)
        return out

    return transpose_rule


#: One kernel for every delayed product: its forms are the format and the events.
DELAYED = Operator("delayed", keys=("format", "events"), doc=__doc__)


def _make(binary: bool) -> Form:
    kernel = DELAYED.form(_name(binary), doc=__doc__, format="csr",
                          events="bool" if binary else "float")
    for platform in ("cpu", "gpu", "tpu"):
        kernel.def_kernel("jax", platform, _jax_generator(binary))
    kernel.def_numba_kernel(_numba_generator(binary), asdefault=True)
    kernel.def_abstract_eval(_shape_rule(binary))
    kernel.def_jvp_rule(_jvp(binary))
    kernel.def_transpose_rule(_transpose(binary))
    kernel.register_general_batching()
    kernel.def_tags("delay", "event" if binary else "float", "matvec")
    return kernel


KERNELS = {False: _make(False), True: _make(True)}
_sharding.install(KERNELS.values(), _sharding.delayed_rule)
delayed_csrmv_p = KERNELS[False]
binary_delayed_csrmv_p = KERNELS[True]


# ----------------------------------------------------------------------------- the read
# A kernel of its own (numba: in place), not a slice plus a dynamic_update_slice: after a
# product's custom call XLA would copy the whole buffer to zero one row.
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


delay_read_p = XLACustomKernel("primforge.ops.delay_read", doc=__doc__, replace=True)
for _platform in ("cpu", "gpu", "tpu"):
    delay_read_p.def_kernel("jax", _platform, _read_jax)
del _platform
delay_read_p.def_numba_kernel(_read_numba, asdefault=True)
delay_read_p.def_abstract_eval(_read_shapes)
delay_read_p.def_jvp_rule(_read_jvp)
delay_read_p.def_transpose_rule(_read_transpose)
delay_read_p.register_general_batching()
delay_read_p.def_tags("delay")
delay_read_p.def_sharding_rule(_sharding.delay_read_rule)


# ----------------------------------------------------------------------------- argument checks
def _buffer(who: str, buffer: Any) -> jax.Array:
    buffer = jnp.asarray(buffer)
    if buffer.ndim != 2 or buffer.shape[0] < 1:
        raise ValueError(f"{who}: 'buffer' must be a (D, n_post) array with D >= 1 (see "
                         f"delay_buffer), got shape {tuple(buffer.shape)}")
    if not jnp.issubdtype(buffer.dtype, jnp.floating):
        raise TypeError(f"{who}: 'buffer' must be floating point, got {buffer.dtype}")
    return buffer


def _step(who: str, t: Any, depth: int) -> jax.Array:
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


def _n_live(indptr: Any, nnz: int) -> int | None:
    """The stored entries before the padding: ``indptr[-1]`` within ``[0, nnz]``, from the
    argument as given (a NumPy array captured under jit is still known); None when traced."""
    if isinstance(indptr, _compat.Tracer):
        return None
    indptr = np.asarray(indptr)
    if indptr.ndim != 1 or indptr.shape[0] == 0 or indptr.dtype.kind not in "iu":
        return nnz  # refused by the structure checks
    return min(max(int(indptr[-1]), 0), nnz)


def _delay_values(who: str, delays: Any, depth: int, shape: tuple[int, ...] | None,
                  n_live: int | None):
    """``delays`` as an int32 JAX array; concrete values checked against ``[0, D)``.

    Only the first ``n_live`` entries of a per-synapse array are stored synapses; the rest
    is padding past ``indptr[-1]``, never read (``None``: not known, ``indptr`` is traced,
    and the kernels check them). A value outside ``[0, D)`` left unchecked here (padding, a
    traced delay) stays outside it in int32 (-1 where the cast could wrap it): a bad delay
    to the kernels (NaN where a visited synapse has it), never a valid-looking one.
    """
    if isinstance(delays, (bool, float, complex)) or (
            hasattr(delays, "dtype") and not jnp.issubdtype(delays.dtype, jnp.integer)):
        raise TypeError(f"{who}: 'delays' must be integers (steps), got "
                        f"{getattr(delays, 'dtype', type(delays).__name__)}")
    if isinstance(delays, int) and not 0 <= delays < depth:  # a Python int of any size
        _out_of_range(who, delays, depth)
    if isinstance(delays, _compat.Tracer):
        arr = delays
    else:
        try:
            arr = np.asarray(delays)
        except (TypeError, ValueError, OverflowError):
            raise TypeError(f"{who}: 'delays' must be integers (steps), got "
                            f"{type(delays).__name__}") from None
        if arr.dtype.kind not in "iu":
            raise TypeError(f"{who}: 'delays' must be integers (steps), got {arr.dtype}")
    if shape is not None and arr.ndim and tuple(arr.shape) != shape:
        raise ValueError(f"{who}: 'delays' must be one integer or hold one delay per synapse, "
                         f"shape {shape}, got {tuple(arr.shape)}")
    if isinstance(arr, _compat.Tracer):
        if arr.dtype.itemsize < 4:
            return arr.astype(jnp.int32)  # every value kept
        if arr.dtype == jnp.int32:
            return arr
        bad = (arr < 0) | (arr >= depth)
        return jnp.where(bad, -1, arr).astype(jnp.int32)
    checked = arr.reshape(-1)
    if arr.ndim:
        checked = checked[:n_live] if n_live is not None else checked[:0]
    if checked.size:
        lo, hi = int(checked.min()), int(checked.max())
        if lo < 0 or hi >= depth:
            _out_of_range(who, lo if lo < 0 else hi, depth)
    bad = (arr < 0) | (arr >= depth)
    out = np.full(arr.shape, -1, np.int32)
    np.copyto(out, arr, casting="unsafe", where=~bad)  # values in [0, D): exact in int32
    return jnp.asarray(out)


def _out_of_range(who: str, value: int, depth: int):
    raise ValueError(f"{who}: 'delays' holds {value}, outside [0, D) = [0, {depth}) for a "
                     f"buffer of D = {depth} rows; make the buffer with "
                     f"delay_buffer(max_delay, n_post)")


# ----------------------------------------------------------------------------- public calls
def _public(binary: bool):
    who = _name(binary)

    def call(data, indices, indptr, delays, x, buffer, t, *, shape, transpose=True,
             backend=None):
        shape = _scaffold.check_shape(shape, who)
        buffer = _buffer(who, buffer)
        depth = buffer.shape[0]
        data = _scaffold.float_weights(data, who=who, name="data").astype(buffer.dtype)
        _, x = _scaffold.promote_input(data, x, binary, who=who,
                                       name="events" if binary else "vector")
        indices = _scaffold.index_array(indices, who, "indices")
        n_live = _n_live(indptr, indices.shape[0])
        indptr = _scaffold.index_array(indptr, who, "indptr")
        delays = _delay_values(who, delays, depth, tuple(indices.shape), n_live)
        if delays.ndim == 0:
            delays = jnp.broadcast_to(delays, indices.shape)
        return KERNELS[binary](data, indices, indptr, delays, x, buffer, _step(who, t, depth),
                               shape=shape, transpose=bool(transpose), backend=backend)

    return call


def delayed_csrmv(data: Any, indices: Any, indptr: Any, delays: Any, vector: Any, buffer: Any,
                  t: Any, *, shape: tuple[int, int], transpose: bool = True,
                  backend: str | None = None) -> jax.Array:
    """Add a float vector's delayed product into a ring buffer: the buffer updated.

    Stored entry ``k`` (row ``i``, column ``j``) adds ``data[k] * vector[i]`` into
    ``buffer[(t + delays[k]) % D, j]`` (``transpose=True``: rows are the sources, as in
    ``vector @ W``), or ``data[k] * vector[j]`` into ``buffer[(t + delays[k]) % D, i]``
    (``transpose=False``: rows are the targets, as in ``W @ vector``).

    Args:
        data: weights, shape ``(nnz,)``, or a scalar / ``(1,)`` shared by every entry.
        indices: column of each stored entry, shape ``(nnz,)``.
        indptr: row offsets, shape ``(rows + 1,)``.
        delays: integer delay in steps of each stored entry, shape ``(nnz,)``, or one
            integer for all; each in ``[0, D)`` (checked when concrete; a traced one outside
            fills the buffer with NaN).
        vector: float input over the sources.
        buffer: ``(D, n_targets)`` float ring buffer (see :func:`delay_buffer`).
        t: integer step.
        shape: ``(rows, cols)`` of the stored matrix.
        transpose: the stored rows are the sources (the event-driven direction).
        backend: 'numba' (CPU default) or 'jax'.

    Returns:
        The updated buffer, dtype of ``buffer``.

    Example:
        >>> import jax.numpy as jnp
        >>> # W = [[1, 2], [0, 3]]: synapse 0->0 has delay 0, 0->1 delay 2, 1->1 delay 1
        >>> delayed_csrmv(jnp.array([1., 2., 3.]), jnp.array([0, 1, 1]), jnp.array([0, 2, 3]),
        ...               jnp.array([0, 2, 1]), jnp.array([1., 10.]), jnp.zeros((3, 2)), 0,
        ...               shape=(2, 2))
        Array([[ 1.,  0.],
               [ 0., 30.],
               [ 0.,  2.]], dtype=float32)
    """
    return _public(False)(data, indices, indptr, delays, vector, buffer, t, shape=shape,
                          transpose=transpose, backend=backend)


def binary_delayed_csrmv(data: Any, indices: Any, indptr: Any, delays: Any, events: Any,
                         buffer: Any, t: Any, *, shape: tuple[int, int], transpose: bool = True,
                         backend: str | None = None) -> jax.Array:
    """Add the delayed weights of active events into a ring buffer: the buffer updated.

    As :func:`delayed_csrmv` with the input's non-zero entries counting as 1; with
    ``transpose=True`` the numba kernel visits only the rows of active events.

    Args:
        data: weights, shape ``(nnz,)``, or a scalar / ``(1,)`` shared by every entry.
        indices: column of each stored entry, shape ``(nnz,)``.
        indptr: row offsets, shape ``(rows + 1,)``.
        delays: integer delay in steps of each stored entry, shape ``(nnz,)``, or one integer.
        events: bool (or numeric, non-zero = active) vector over the sources.
        buffer: ``(D, n_targets)`` float ring buffer.
        t: integer step.
        shape: ``(rows, cols)`` of the stored matrix.
        transpose: the stored rows are the sources (the event-driven direction).
        backend: 'numba' (CPU default) or 'jax'.

    Returns:
        The updated buffer, dtype of ``buffer``.

    Example:
        >>> import jax.numpy as jnp
        >>> binary_delayed_csrmv(jnp.array([1., 2., 3.]), jnp.array([0, 1, 1]),
        ...                      jnp.array([0, 2, 3]), jnp.array([0, 2, 1]),
        ...                      jnp.array([True, False]), jnp.zeros((3, 2)), 2, shape=(2, 2))
        Array([[0., 0.],
               [0., 2.],
               [1., 0.]], dtype=float32)
    """
    return _public(True)(data, indices, indptr, delays, events, buffer, t, shape=shape,
                         transpose=transpose, backend=backend)


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
    buffer = _buffer("delay_read", buffer)
    now, new = delay_read_p(buffer, _step("delay_read", t, buffer.shape[0]), backend=backend)
    return now, new


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
        >>> from primforge.ops import CSR
        >>> W = CSR.from_dense([[1., 2.], [0., 3.]])
        >>> buf = delayed_matvec(W, jnp.array([True, True]), jnp.array([0, 2, 1]),
        ...                      delay_buffer(2, 2), 0)
        >>> now, buf = delay_read(buf, 0)
        >>> now.tolist(), buf.tolist()
        ([1.0, 0.0], [[0.0, 0.0], [0.0, 3.0], [0.0, 2.0]])
    """
    who = "delayed_matvec"
    buffer = _buffer(who, buffer)
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
              else _n_live(W.indptr, indices.shape[0]))
    traced = isinstance(delays, _compat.Tracer)
    delays = _delay_values(who, delays, depth, dshape, n_live)
    binary = not jnp.issubdtype(x.dtype, jnp.inexact)
    if delays.ndim == 0:
        # One delay for all: the ordinary event-driven product, added into one row.
        s = _step(who, t, depth)[0]
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
    call = _public(binary)
    return call(data, indices, indptr, delays.reshape(-1), x, buffer, t, shape=shape,
                transpose=rows_are_sources, backend=backend)


# ----------------------------------------------------------------------------- jitc delays
# The delayed product of a just-in-time matrix: ``(theta, seed, table, events, buffer, slot)``
# -> buffer; the synapses and weights of ``binary_jitc_matvec`` with the same arguments, each
# synapse's delay drawn from ``(seed, row, column)`` (generator.delay_draws).
_JITC = "binary_delayed_jitc_matvec"


def _jitc_jax(*, ins, outs, shape, transpose, weight_kind, delay_range, **_):
    m, n = shape
    dtype = outs[0].dtype
    k_max = int(ins[2].shape[0]) - 1
    dmin, span = delay_range[0], delay_range[1] - delay_range[0] + 1

    def kernel(theta, seed, table, events, buffer, slot):
        depth = buffer.shape[0]
        ok = (slot[0] >= 0) & (slot[0] < depth)
        if m == 0 or n == 0:
            return jnp.where(ok, buffer, jnp.nan).astype(dtype)
        rows = jnp.arange(m, dtype=jnp.int32)
        stream = _gen.row_streams(seed[0], rows)
        ev = events != 0

        def load(idx):
            return table[idx]

        def body(state):
            s, j, alive, buf = state
            j, alive = _gen.next_column(j, alive, _gen.draw(stream, jnp.uint32(3) * s), load,
                                        k_max, n)
            w = _gen.weights(theta, stream, s, weight_kind, dtype)
            d = _gen.delay_draws(seed[0], rows, stream[1], j, dmin, span)
            r = (slot[0] + d) % depth
            if transpose:  # rows are the sources: only the rows of active events are alive
                hit, target = alive, j
            else:  # rows are the targets: an entry counts where its column's event is active
                hit, target = alive & ev[jnp.clip(j, 0, n - 1)], rows
            buf = buf.at[jnp.where(hit, r, depth), target].add(w, mode="drop")
            return s + jnp.uint32(1), j, alive, buf

        alive0 = ev if transpose else jnp.ones((m,), bool)
        init = (jnp.uint32(0), jnp.full((m,), -1, jnp.int32), alive0, buffer)
        out = jax.lax.while_loop(lambda st: jnp.any(st[2]), body, init)[3]
        return jnp.where(ok, out, jnp.nan).astype(dtype)

    return kernel


def _jitc_numba(*, outs, prob, transpose, weight_kind, delay_range, **_):
    from primforge.backends.numba import numba_kernel
    from primforge.ops.delay import numba as _numba_delay

    dmin, dmax = delay_range
    fn = _numba_delay.jitc_kernel(bool(transpose), weight_kind, float(prob), int(dmin),
                                  int(dmax - dmin + 1))
    return numba_kernel(fn, outs=list(outs), input_output_aliases={4: 0})


def _check_delay_range(who: str, delay_range: Any, depth: int | None) -> tuple[int, int]:
    """``delay_range`` as two ints ``0 <= dmin <= dmax < D``, or an error naming it."""
    try:
        if any(isinstance(v, (bool, np.bool_)) for v in delay_range):
            raise TypeError
        dmin, dmax = (operator.index(v) for v in delay_range)
    except (TypeError, ValueError):
        raise TypeError(f"{who}: 'delay_range' must be a pair of ints (dmin, dmax), in steps, "
                        f"got {delay_range!r}") from None
    if dmin < 0 or dmax < dmin:
        raise ValueError(f"{who}: 'delay_range' = ({dmin}, {dmax}) must satisfy 0 <= dmin <= "
                         f"dmax")
    if dmax - dmin + 1 > 2**16:
        raise ValueError(f"{who}: 'delay_range' = ({dmin}, {dmax}) spans {dmax - dmin + 1} "
                         f"delays; at most {2**16}")
    if depth is not None and dmax >= depth:
        raise ValueError(f"{who}: 'delay_range' = ({dmin}, {dmax}): dmax must be below the "
                         f"buffer's depth D = {depth}; make the buffer with "
                         f"delay_buffer({dmax}, n_post)")
    return dmin, dmax


def _jitc_shapes(theta, seed, table, events, buffer, slot, *, shape, prob, transpose,
                 weight_kind, delay_range, **_):
    m, n = _scaffold.check_shape(shape, _JITC, int32=True)
    p = _gen.check_prob(prob, _JITC)
    _gen.check_kind(weight_kind, _JITC)
    want = (_gen.WEIGHT_KINDS[weight_kind],)
    if tuple(theta.shape) != want or not jnp.issubdtype(theta.dtype, jnp.floating):
        raise ValueError(f"{_JITC}: the weight parameters must be a float array of shape "
                         f"{want}, got {theta.dtype}{list(theta.shape)}")
    if tuple(seed.shape) != (1,) or seed.dtype != jnp.uint32:
        raise ValueError(f"{_JITC}: 'seed' must be a (1,) uint32 array, got "
                         f"{seed.dtype}{list(seed.shape)}")
    if tuple(table.shape) != _gen.cached_table(p).shape or table.dtype != jnp.uint32:
        raise ValueError(f"{_JITC}: 'table' must be threshold_table({p})")
    n_src, n_dst = (m, n) if transpose else (n, m)
    if tuple(events.shape) != (n_src,):
        raise ValueError(f"{_JITC}: 'events' must have shape ({n_src},) (the sources), got "
                         f"{tuple(events.shape)}")
    _check_buffer_and_slot(_JITC, buffer, slot, n_dst, theta.dtype, "the weights")
    _check_delay_range(_JITC, delay_range, buffer.shape[0])
    return jax.ShapeDtypeStruct(buffer.shape, buffer.dtype)


def _jitc_jvp(primals, tangents, *, outs, backend=None, **params):
    """Linear in ``(theta, buffer)``: the tangents accumulate in a buffer."""
    _, seed, table, events, buffer, slot = primals
    d_theta, d_buf = tangents[0], tangents[4]
    y = binary_delayed_jitc_matvec_p(*primals, backend=backend, **params)
    acc = jnp.zeros_like(buffer) if type(d_buf) is _compat.Zero else d_buf
    if type(d_theta) is not _compat.Zero:
        acc = binary_delayed_jitc_matvec_p(d_theta, seed, table, events, acc, slot,
                                           backend=backend, **params)
    return [y], [acc]


def _jitc_transpose(cts, theta, seed, table, events, buffer, slot, *, outs, backend=None,
                    **params):
    (ct,) = cts
    out = [None] * 6
    if type(ct) is _compat.Zero:
        return out
    undefined = _compat.is_undefined_primal
    if any(undefined(a) for a in (seed, table, events, slot)):
        raise ValueError(f"{_JITC} is linear in the weights and the buffer only")
    ct = jnp.asarray(ct)
    if undefined(buffer):
        out[4] = ct
    if undefined(theta):
        zero = jnp.zeros(ct.shape, ct.dtype)
        out[0] = _scaffold.unit_weight_cotangent(
            lambda e: binary_delayed_jitc_matvec_p(e, seed, table, events, zero, slot,
                                                   backend=backend, **params),
            ct, theta.aval.dtype, theta.aval.shape[0])
    return out


binary_delayed_jitc_matvec_p = DELAYED.form(_JITC, doc=__doc__, format="jitc", events="bool")
for _platform in ("cpu", "gpu", "tpu"):
    binary_delayed_jitc_matvec_p.def_kernel("jax", _platform, _jitc_jax)
del _platform
binary_delayed_jitc_matvec_p.def_numba_kernel(_jitc_numba, asdefault=True)
binary_delayed_jitc_matvec_p.def_abstract_eval(_jitc_shapes)
binary_delayed_jitc_matvec_p.def_jvp_rule(_jitc_jvp)
binary_delayed_jitc_matvec_p.def_transpose_rule(_jitc_transpose)
binary_delayed_jitc_matvec_p.register_general_batching()
binary_delayed_jitc_matvec_p.def_tags("delay", "event", "matvec")
binary_delayed_jitc_matvec_p.def_sharding_rule(_sharding.delayed_jitc_rule)


def binary_delayed_jitc_matvec(weight: Any, seed: Any, events: Any, buffer: Any, t: Any, *,
                               shape: tuple[int, int], prob: float,
                               delay_range: tuple[int, int], transpose: bool = True,
                               weight_kind: str = "homo", backend: str | None = None
                               ) -> jax.Array:
    """Add the delayed weights of active events through a just-in-time matrix: the buffer.

    ``W`` is the matrix that :func:`~primforge.ops.binary_jitc_matvec` regenerates from
    ``seed`` (the same synapses and weights, bit for bit); each synapse ``(i, j)`` also has
    an integer delay in ``[dmin, dmax]``, uniform, drawn from ``(seed, i, j)`` by a stream of
    its own (:func:`jitc_delays_todense` gives them all). An active source adds each of its
    synapses' weights into ``buffer[(t + d) % D, target]``; read the buffer with
    :func:`delay_read` after the step's spikes.

    Args:
        weight: ``weight_kind='homo'``: the shared weight; ``'uniform'``: ``(low, high)``;
            ``'normal'``: ``(mean, std)``. Differentiable.
        seed: an integer (Python or traced).
        events: bool (or numeric, non-zero = active) vector over the sources: length
            ``rows`` with ``transpose=True``, ``cols`` otherwise.
        buffer: ``(D, n_targets)`` float ring buffer (see :func:`delay_buffer`), ``D > dmax``.
        t: integer step.
        shape: ``(rows, cols)`` of ``W``.
        prob: probability of each entry, in ``(0, 1]``.
        delay_range: ``(dmin, dmax)`` in steps, ``0 <= dmin <= dmax < D`` (static ints).
        transpose: the rows of ``W`` are the sources (``x @ W``, event-driven: only the
            rows of active events are generated); ``False``: ``W @ x``, the rows are the
            targets.
        weight_kind: 'homo', 'uniform' or 'normal'.
        backend: 'numba' (CPU default) or 'jax'.

    Returns:
        The updated buffer, dtype of ``buffer``.

    Example:
        >>> import numpy as np
        >>> spikes = np.array([True, False, True])
        >>> buf = binary_delayed_jitc_matvec(0.5, 7, spikes, delay_buffer(3, 4), 0,
        ...                                  shape=(3, 4), prob=0.5, delay_range=(1, 3))
        >>> W = jitc_todense(7, (3, 4), 0.5, 0.5)
        >>> D = jitc_delays_todense(7, (3, 4), 0.5, (1, 3))
        >>> want = np.zeros((4, 4))
        >>> for i, j in zip(*np.nonzero(W * spikes[:, None])):
        ...     want[D[i, j], j] += W[i, j]
        >>> np.array_equal(buf, want)
        True
    """
    who = _JITC
    shape = _scaffold.check_shape(shape, who, int32=True)
    prob = _gen.check_prob(prob, who)
    buffer = _buffer(who, buffer)
    depth = buffer.shape[0]
    dmin, dmax = _check_delay_range(who, delay_range, depth)
    theta = weight_params(weight, weight_kind, who).astype(buffer.dtype)
    _, events = _scaffold.promote_input(theta, events, True, who=who, name="events")
    table = jnp.asarray(_gen.cached_table(prob))
    return binary_delayed_jitc_matvec_p(
        theta, seed_word(seed, who), table, events, buffer, _step(who, t, depth),
        shape=shape, prob=prob, transpose=bool(transpose), weight_kind=weight_kind,
        delay_range=(dmin, dmax), backend=backend)


def jitc_delays_todense(seed: int, shape: tuple[int, int], prob: float,
                        delay_range: tuple[int, int]) -> np.ndarray:
    """The delays of the just-in-time matrix's synapses as a dense int64 array (-1: none).

    The synapses are those of :func:`~primforge.ops.jitc_todense` with the same ``seed``,
    ``shape`` and ``prob``; the delays those :func:`binary_delayed_jitc_matvec` uses with
    ``delay_range``. Computed by plain integer arithmetic in NumPy, independent of the
    kernels (for tests and small matrices).

    Example:
        >>> jitc_delays_todense(7, (2, 6), 0.5, (1, 4))
        array([[ 2,  4,  1, -1,  2,  4],
               [ 2,  2,  1,  1, -1, -1]])
    """
    who = "jitc_delays_todense"
    m, n = _scaffold.check_shape(shape, who, int32=True)
    dmin, dmax = _check_delay_range(who, delay_range, None)
    present = jitc_todense(seed, (m, n), prob, 1.0) != 0
    mask = np.uint64(_gen.MASK)

    def mix(v):
        v = v ^ (v >> np.uint64(16))
        v = (v * np.uint64(_gen.MIX_1)) & mask
        v = v ^ (v >> np.uint64(15))
        v = (v * np.uint64(_gen.MIX_2)) & mask
        return v ^ (v >> np.uint64(16))

    s = np.uint64(int(seed) % 2**32)
    i = np.arange(m, dtype=np.uint64)[:, None]
    j = np.arange(n, dtype=np.uint64)[None, :]
    h = mix(i ^ np.uint64(_gen.ROW_SALT))
    gamma = mix(h ^ mix(s ^ np.uint64(_gen.GAMMA_SALT))) | np.uint64(1)
    flips = np.array([int(g ^ (g >> np.uint64(1))).bit_count() for g in gamma.ravel()])
    gamma = np.where(flips[:, None] < _gen.FEW_FLIPS, gamma ^ np.uint64(_gen.FLIP), gamma)
    dstart = mix((h + mix(s ^ np.uint64(_gen.DELAY_SALT))) & mask)
    u = mix((dstart + j * gamma) & mask)  # j * gamma < 2**63: exact in uint64
    d = dmin + ((u * np.uint64(dmax - dmin + 1)) >> np.uint64(32)).astype(np.int64)
    return np.where(present, d, -1)


# ----------------------------------------------------------------------------- benchmark hooks
for _kernel, _public_call, _cases in ((delayed_csrmv_p, delayed_csrmv, "floats"),
                                      (binary_delayed_csrmv_p, binary_delayed_csrmv, "events")):
    _kernel.def_call(_public_call)
    _kernel.def_benchmark_data(_scaffold.lazy_benchmark_data("primforge.ops.delay.bench", _cases))
del _kernel, _public_call, _cases
delay_read_p.def_call(delay_read)
delay_read_p.def_benchmark_data(_scaffold.lazy_benchmark_data("primforge.ops.delay.bench",
                                                              "reads"))
binary_delayed_jitc_matvec_p.def_call(binary_delayed_jitc_matvec)
binary_delayed_jitc_matvec_p.def_benchmark_data(
    _scaffold.lazy_benchmark_data("primforge.ops.delay.bench", "jitc_events"))
