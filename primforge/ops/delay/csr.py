"""The delayed product of stored synapses: CSR arrays, each synapse with its own delay.

The kernels take ``(data, indices, indptr, delays, x, buffer, slot)`` (``slot`` the
``(1,)`` buffer row of step ``t``) and return the buffer with each visited synapse ``k``'s
weight (times its input) added into row ``(slot + delays[k]) % D``: float input
(:func:`delayed_csrmv`) or events (:func:`binary_delayed_csrmv`), the stored rows the
sources (``transpose``, event-driven) or the targets.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from primforge import _compat
from primforge.ops import _scaffold, _sharding
from primforge.ops._operator import Form
from primforge.ops.csr import structure as _common
from primforge.ops.delay import ring as _ring

__all__ = [
    "binary_delayed_csrmv",
    "binary_delayed_csrmv_p",
    "delayed_csrmv",
    "delayed_csrmv_p",
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
        _ring.check_buffer_and_slot(who, buffer, slot, n_dst, data.dtype, "'data'")
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
    def transpose_rule(cts, *primals, outs, shape, transpose, backend=None, **_):
        w, indices, indptr, delays, x, _, slot = primals
        ct, out = _ring.buffer_cotangent(
            cts, primals, 5, (1, 2, 3, 6),
            "delayed products are not linear in 'indices', 'indptr', 'delays' or the slot")
        if ct is None:
            return out
        undefined = _compat.is_undefined_primal
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


def _make(binary: bool) -> Form:
    form = _ring.DELAYED.form(_name(binary), doc=__doc__, format="csr",
                              events="bool" if binary else "float")
    return _ring.define(form, reference=_jax_generator(binary), numba=_numba_generator(binary),
                        shapes=_shape_rule(binary), jvp=_jvp(binary),
                        transpose=_transpose(binary), sharding=_sharding.delayed_rule,
                        tags=("event" if binary else "float", "matvec"))


KERNELS = {False: _make(False), True: _make(True)}
delayed_csrmv_p = KERNELS[False]
binary_delayed_csrmv_p = KERNELS[True]


# ----------------------------------------------------------------------------- argument checks
def n_stored(indptr: Any, nnz: int) -> int | None:
    """The stored entries before the padding: ``indptr[-1]`` within ``[0, nnz]``, from the
    argument as given (a NumPy array captured under jit is still known); None when traced."""
    if isinstance(indptr, _compat.Tracer):
        return None
    indptr = np.asarray(indptr)
    if indptr.ndim != 1 or indptr.shape[0] == 0 or indptr.dtype.kind not in "iu":
        return nnz  # refused by the structure checks
    return min(max(int(indptr[-1]), 0), nnz)


def delay_values(who: str, delays: Any, depth: int, shape: tuple[int, ...] | None,
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
def csr_call(binary: bool):
    """The public call of one form: its arguments checked and converted, then the kernel."""
    who = _name(binary)

    def call(data, indices, indptr, delays, x, buffer, t, *, shape, transpose=True,
             backend=None):
        shape = _scaffold.check_shape(shape, who)
        buffer = _ring.buffer_array(who, buffer)
        depth = buffer.shape[0]
        data = _scaffold.float_weights(data, who=who, name="data").astype(buffer.dtype)
        _, x = _scaffold.promote_input(data, x, binary, who=who,
                                       name="events" if binary else "vector")
        indices = _scaffold.index_array(indices, who, "indices")
        n_live = n_stored(indptr, indices.shape[0])
        indptr = _scaffold.index_array(indptr, who, "indptr")
        delays = delay_values(who, delays, depth, tuple(indices.shape), n_live)
        if delays.ndim == 0:
            delays = jnp.broadcast_to(delays, indices.shape)
        slot = _ring.step_row(who, t, depth)
        return KERNELS[binary](data, indices, indptr, delays, x, buffer, slot, shape=shape,
                               transpose=bool(transpose), backend=backend)

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
    return csr_call(False)(data, indices, indptr, delays, vector, buffer, t, shape=shape,
                           transpose=transpose, backend=backend)


def binary_delayed_csrmv(data: Any, indices: Any, indptr: Any, delays: Any, events: Any,
                         buffer: Any, t: Any, *, shape: tuple[int, int], transpose: bool = True,
                         backend: str | None = None) -> jax.Array:
    """Add the delayed weights of active events into a ring buffer: the buffer updated.

    As :func:`delayed_csrmv` with the input's non-zero entries counting as 1; with
    ``transpose=True`` the numba kernel visits only the rows of active events.

    Args:
        events: bool (or numeric, non-zero = active) vector over the sources: the
            ``vector`` of :func:`delayed_csrmv`, whose other arguments this takes as they
            are (the buffer's dtype is that of the weights).

    Example:
        >>> import jax.numpy as jnp
        >>> binary_delayed_csrmv(jnp.array([1., 2., 3.]), jnp.array([0, 1, 1]),
        ...                      jnp.array([0, 2, 3]), jnp.array([0, 2, 1]),
        ...                      jnp.array([True, False]), jnp.zeros((3, 2)), 2, shape=(2, 2))
        Array([[0., 0.],
               [0., 2.],
               [1., 0.]], dtype=float32)
    """
    return csr_call(True)(data, indices, indptr, delays, events, buffer, t, shape=shape,
                          transpose=transpose, backend=backend)


for _kernel, _public_call, _cases in ((delayed_csrmv_p, delayed_csrmv, "floats"),
                                      (binary_delayed_csrmv_p, binary_delayed_csrmv, "events")):
    _kernel.def_call(_public_call)
    _kernel.def_benchmark_data(_scaffold.lazy_benchmark_data("primforge.ops.delay.bench", _cases))
del _kernel, _public_call, _cases
