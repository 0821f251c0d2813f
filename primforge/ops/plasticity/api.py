"""Plasticity: event-driven weight updates driven by pre- and postsynaptic spikes.

:func:`update_on_pre` and :func:`update_on_post` return new weights for compressed
(``CSR``, ``CSC``, ``FixedNum``) and dense storage, one kernel per storage and side, with
``jax``, ``numba`` and (compressed storage) ``pallas`` backends. A ``FixedNum`` reaches
the compressed kernel as its ``(m, k)`` rows, which shard like the rows of its products.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from primforge import _compat
from primforge.ops import _scaffold, _sharding
from primforge.ops._operator import Form, Operator
from primforge.ops.column_index import ColumnIndexed
from primforge.ops.csr import structure as _common
from primforge.ops.csr.matrix import CSC, CSR
from primforge.ops.fixed_num.matrix import FixedNum
from primforge.ops.packed import as_events

__all__ = [
    "compressed_update_p",
    "dense_update_p",
    "update_on_post",
    "update_on_pre",
]


def _bound(value):
    if isinstance(value, (np.generic, np.ndarray)) and np.ndim(value) == 0:
        return value.item()
    return value


def _cast_bound(bound, dtype):
    return None if bound is None else np.dtype(dtype).type(bound)


# ----------------------------------------------------------------------------- reference
def _compressed_masks(data, indices, indptr, spikes, *, shape, on_rows, masked):
    """(touched, safe column, row of each entry, poisoned) for compressed storage."""
    _, n = shape
    nnz = indices.shape[0]
    rows = _common.row_ids(indptr, nnz)
    # Padding past indptr[-1] is neither a synapse nor an error.
    live = _common.live_entries(indptr, nnz)
    valid = (indices >= 0) & (indices < n) & live
    safe = jnp.where(valid, indices, 0)
    if on_rows:
        touched = _scaffold.take_fill(spikes, rows) != 0
    else:
        touched = spikes[safe] != 0
    if masked:
        touched = touched & valid
        poisoned = jnp.array(False)
    else:
        # The update on columns visits every entry, unless no column fired at all.
        visited = touched if on_rows else jnp.broadcast_to(jnp.any(spikes != 0), (nnz,))
        poisoned = ~_common.indptr_ok(indptr, nnz) | jnp.any(visited & live & ~valid)
        touched = touched & valid
    return touched, safe, rows, poisoned


def _compressed_reference(data, indices, indptr, spikes, trace, *, shape, on_rows, masked,
                          w_min, w_max):
    touched, safe, rows, poisoned = _compressed_masks(
        data, indices, indptr, spikes, shape=shape, on_rows=on_rows, masked=masked)
    add = trace[safe] if on_rows else _scaffold.take_fill(trace, rows)
    new = jnp.where(touched, _common.clip_to(data + add.astype(data.dtype), w_min, w_max), data)
    return jnp.where(poisoned, jnp.nan, new).astype(data.dtype)


def _dense_reference(weights, spikes, trace, *, on_rows, w_min, w_max):
    active = spikes != 0
    if on_rows:
        touched, add = active[:, None], trace[None, :]
    else:
        touched, add = active[None, :], trace[:, None]
    updated = _common.clip_to(weights + add.astype(weights.dtype), w_min, w_max)
    return jnp.where(touched, updated, weights).astype(weights.dtype)


# ----------------------------------------------------------------------------- generators
def _on_fixed_rows(generate):
    """``generate`` (of the flat form) also serving the ``(weights, indices, spikes, trace)``
    form of fixed-number rows, with the ``(m, k)`` shape of the operands it is built for."""

    def gen(*, ins, outs, shape, masked, **kw):
        if len(ins) != _N_ROWS:
            return generate(ins=ins, outs=outs, shape=shape, masked=masked, **kw)
        weights, indices = ins[0], ins[1]
        m, k = indices.shape
        flat = (jax.ShapeDtypeStruct((m * k,), weights.dtype),
                jax.ShapeDtypeStruct((m * k,), indices.dtype),
                jax.ShapeDtypeStruct((m + 1,), indices.dtype), ins[2], ins[3])
        inner = generate(ins=flat, outs=(jax.ShapeDtypeStruct((m * k,), outs[0].dtype),),
                         shape=(m, shape[1]), masked=True, **kw)

        def kernel(weights, indices, spikes, trace):
            indptr = jnp.arange(m + 1, dtype=indices.dtype) * k
            return inner(weights.reshape(-1), indices.reshape(-1), indptr, spikes,
                         trace).reshape(m, k)

        return kernel

    return gen


def _jax_compressed(*, shape, on_rows, masked, w_min, w_max, **_):
    def kernel(data, indices, indptr, spikes, trace, *index):
        del index  # the result does not depend on it
        return _compressed_reference(data, indices, indptr, spikes, trace, shape=shape,
                                     on_rows=on_rows, masked=masked, w_min=w_min, w_max=w_max)

    return kernel


def _in_place(fn, outs):
    """The numba kernel ``fn`` writing into the weights' buffer (input 0 is output 0)."""
    from primforge.backends.numba import numba_kernel

    return numba_kernel(fn, outs=list(outs), input_output_aliases={0: 0})


def _numba_compressed(*, ins, outs, on_rows, masked, w_min, w_max, **_):
    from primforge.ops.plasticity import numba as _numba_plasticity

    dtype = outs[0].dtype
    lo, hi = _cast_bound(w_min, dtype), _cast_bound(w_max, dtype)
    if len(ins) == _N_ROWS:
        return _in_place(_numba_plasticity.fixed_rows_kernel(bool(on_rows), lo, hi), outs)
    if len(ins) == _N_INDEXED:
        return _in_place(_numba_plasticity.indexed_kernel(bool(masked), lo, hi), outs)
    return _in_place(_numba_plasticity.compressed_kernel(bool(on_rows), bool(masked), lo, hi),
                     outs)


def _jax_dense(*, on_rows, w_min, w_max, **_):
    def kernel(weights, spikes, trace):
        return _dense_reference(weights, spikes, trace, on_rows=on_rows, w_min=w_min,
                                w_max=w_max)

    return kernel


def _numba_dense(*, outs, on_rows, w_min, w_max, **_):
    from primforge.ops.plasticity import numba as _numba_plasticity

    dtype = outs[0].dtype
    return _in_place(_numba_plasticity.dense_kernel(bool(on_rows), _cast_bound(w_min, dtype),
                                                    _cast_bound(w_max, dtype)), outs)


# ----------------------------------------------------------------------------- shape rules
def _check_vector(who, name, x, length, *, floating):
    if len(x.shape) != 1 or x.shape[0] != length:
        raise ValueError(f"{who}: {name!r} must have shape ({length},), got {tuple(x.shape)}")
    if floating and not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"{who}: {name!r} must be floating point, got {x.dtype}")


_N_INDEXED = 8  # operands of a call with a column index
_N_ROWS = 4  # operands of a call on fixed-number rows: (weights, indices, spikes, trace)


def _compressed_shape_rule(*ins, shape, on_rows, **_):
    if len(ins) == _N_ROWS:
        return _rows_shape_rule(*ins, shape=shape, on_rows=on_rows)
    return _flat_shape_rule(*ins, shape=shape, on_rows=on_rows)


def _rows_shape_rule(weights, indices, spikes, trace, *, shape, on_rows):
    who = "compressed_update"
    m, n = shape
    if len(indices.shape) != 2 or indices.shape[0] != m:
        raise ValueError(f"{who}: fixed-number 'indices' must be {m} rows, shape ({m}, k), "
                         f"got {tuple(indices.shape)}")
    if weights.shape != indices.shape:
        raise ValueError(f"{who}: 'weights' must hold one weight per entry, shape "
                         f"{tuple(indices.shape)}, got {tuple(weights.shape)}")
    if not jnp.issubdtype(weights.dtype, jnp.floating):
        raise TypeError(f"{who}: 'weights' must be floating point, got {weights.dtype}")
    spike_len, trace_len = (m, n) if on_rows else (n, m)
    _check_vector(who, "spikes", spikes, spike_len, floating=False)
    _check_vector(who, "trace", trace, trace_len, floating=True)
    return jax.ShapeDtypeStruct(weights.shape, weights.dtype)


def _flat_shape_rule(data, indices, indptr, spikes, trace, *index, shape, on_rows):
    who = "compressed_update"
    m, n = shape
    if index:
        _check_index(who, index, nnz=indices.shape[0] if indices.shape else 0, n=n,
                     on_rows=on_rows)
    if len(data.shape) != 1 or data.shape != indices.shape:
        raise ValueError(f"{who}: 'data' must hold one weight per stored synapse, shape "
                         f"{tuple(indices.shape)}, got {tuple(data.shape)}")
    if not jnp.issubdtype(data.dtype, jnp.floating):
        raise TypeError(f"{who}: 'data' must be floating point, got {data.dtype}")
    _check_vector(who, "indptr", indptr, m + 1, floating=False)
    spike_len, trace_len = (m, n) if on_rows else (n, m)
    _check_vector(who, "spikes", spikes, spike_len, floating=False)
    _check_vector(who, "trace", trace, trace_len, floating=True)
    return jax.ShapeDtypeStruct(data.shape, data.dtype)


def _check_index(who, index, *, nnz, n, on_rows):
    if len(index) != 3:
        raise ValueError(f"{who}: a column index is three operands (colptr, perm, rows), got "
                         f"{len(index)}")
    if on_rows:
        raise ValueError(f"{who}: a column index serves the update on columns only "
                         f"(on_rows=False)")
    for name, x, length in zip(("colptr", "perm", "rows"), index, (n + 1, nnz, nnz)):
        _check_vector(who, name, x, length, floating=False)
        if x.dtype != jnp.int32:
            raise TypeError(f"{who}: {name!r} must be int32, got {x.dtype}")


def _dense_shape_rule(weights, spikes, trace, *, on_rows, **_):
    who = "dense_update"
    if len(weights.shape) != 2 or not jnp.issubdtype(weights.dtype, jnp.floating):
        raise ValueError(f"{who}: 'weights' must be a 2-D float matrix, got "
                         f"{weights.dtype}{list(weights.shape)}")
    m, n = weights.shape
    spike_len, trace_len = (m, n) if on_rows else (n, m)
    _check_vector(who, "spikes", spikes, spike_len, floating=False)
    _check_vector(who, "trace", trace, trace_len, floating=True)
    return jax.ShapeDtypeStruct(weights.shape, weights.dtype)


# ----------------------------------------------------------------------------- autodiff
def _inside(w, lo, hi):
    ok = jnp.ones(w.shape, bool)
    if lo is not None:
        ok = ok & (w >= jnp.asarray(lo, w.dtype))
    if hi is not None:
        ok = ok & (w <= jnp.asarray(hi, w.dtype))
    return ok


def _is_zero(t) -> bool:
    return type(t) is _compat.Zero


def _compressed_jvp(primals, tangents, *, outs, shape, on_rows, masked, w_min, w_max,
                    backend=None, **_):
    del outs
    y = _compressed_call(*primals, shape=shape, on_rows=on_rows, masked=masked, w_min=w_min,
                         w_max=w_max, backend=backend)
    if len(primals) == _N_ROWS:  # the same update on the flattened rows
        weights, indices, spikes, trace = primals
        d_w, _, _, d_trace = tangents
        m, k = indices.shape
        indptr = jnp.arange(m + 1, dtype=indices.dtype) * k
        t = _compressed_tangent(weights.reshape(-1), indices.reshape(-1), indptr, spikes,
                                trace, d_w if _is_zero(d_w) else d_w.reshape(-1), d_trace,
                                shape=shape, on_rows=on_rows, masked=True, w_min=w_min,
                                w_max=w_max)
        return [y], [None if t is None else t.reshape(m, k)]
    data, indices, indptr, spikes, trace, *_ = primals
    d_data, _, _, _, d_trace, *_ = tangents
    return [y], [_compressed_tangent(data, indices, indptr, spikes, trace, d_data, d_trace,
                                     shape=shape, on_rows=on_rows, masked=masked,
                                     w_min=w_min, w_max=w_max)]


def _compressed_tangent(data, indices, indptr, spikes, trace, d_data, d_trace, *, shape,
                        on_rows, masked, w_min, w_max):
    touched, safe, rows, _ = _compressed_masks(data, indices, indptr, spikes, shape=shape,
                                               on_rows=on_rows, masked=masked)
    gather = (lambda t: t[safe]) if on_rows else (lambda t: t.at[rows].get(mode="fill",
                                                                            fill_value=0))
    raw = data + gather(trace).astype(data.dtype)
    moves = touched & _inside(raw, w_min, w_max)  # d(new)/d(raw) = 1 here, 0 when clipped
    t = None
    if not _is_zero(d_data):
        t = jnp.where(~touched | moves, d_data, 0).astype(data.dtype)
    if not _is_zero(d_trace):
        td = jnp.where(moves, gather(d_trace).astype(data.dtype), 0)
        t = td if t is None else t + td
    return t


def _dense_jvp(primals, tangents, *, outs, on_rows, w_min, w_max, backend=None, **_):
    weights, spikes, trace = primals
    d_w, _, d_trace = tangents
    del outs
    y = _dense_call(weights, spikes, trace, on_rows=on_rows, w_min=w_min, w_max=w_max,
                    backend=backend)
    active = spikes != 0
    touched = active[:, None] if on_rows else active[None, :]
    shape_trace = (lambda t: t[None, :]) if on_rows else (lambda t: t[:, None])
    raw = weights + shape_trace(trace).astype(weights.dtype)
    moves = touched & _inside(raw, w_min, w_max)
    t = None
    if not _is_zero(d_w):
        t = jnp.where(~touched | moves, d_w, 0).astype(weights.dtype)
    if not _is_zero(d_trace):
        td = jnp.where(moves, shape_trace(d_trace).astype(weights.dtype), 0)
        t = td if t is None else t + td
    return [y], [t]


# ----------------------------------------------------------------------------- kernels
def _pallas_compressed(**kw):
    from primforge.ops.plasticity import pallas as _pallas_plasticity

    return _on_fixed_rows(_pallas_plasticity.generator(_jax_compressed))(**kw)


#: One kernel for the plasticity updates: its form is the weights' format.
PLASTICITY = Operator("plasticity", keys=("format",), doc=__doc__)


def _make(name, jax_gen, numba_gen, shape_rule, jvp, tags, pallas_gen=None) -> Form:
    kernel = PLASTICITY.form(name, doc=__doc__, format=name.split("_")[0])
    for platform in ("cpu", "gpu", "tpu"):
        kernel.def_kernel("jax", platform, jax_gen)
    kernel.def_numba_kernel(numba_gen, asdefault=True)
    if pallas_gen is not None:  # opt-in: 'gpu', and 'cpu' in interpret mode
        kernel.def_pallas_kernel("gpu", pallas_gen)
        kernel.def_pallas_kernel("cpu", pallas_gen)
    kernel.def_abstract_eval(shape_rule)
    kernel.def_jvp_rule(jvp)
    kernel.def_tags("plasticity", *tags)
    return kernel


compressed_update_p = _make("compressed_update", _on_fixed_rows(_jax_compressed),
                            _numba_compressed,
                            _compressed_shape_rule, _compressed_jvp, ("compressed",),
                            pallas_gen=_pallas_compressed)
dense_update_p = _make("dense_update", _jax_dense, _numba_dense, _dense_shape_rule,
                       _dense_jvp, ("dense_weights",))
compressed_update_p.def_sharding_rule(_sharding.compressed_update_rule)
dense_update_p.def_sharding_rule(_sharding.dense_update_rule)


def _compressed_call(data, *operands, shape, on_rows, masked=False, w_min=None, w_max=None,
                     backend=None):
    out = jax.ShapeDtypeStruct(data.shape, data.dtype)
    return compressed_update_p(data, *operands, outs=out,
                               shape=tuple(int(s) for s in shape), on_rows=bool(on_rows),
                               masked=bool(masked), w_min=w_min, w_max=w_max,
                               backend=backend)


def _dense_call(weights, spikes, trace, *, on_rows, w_min=None, w_max=None, backend=None):
    out = jax.ShapeDtypeStruct(weights.shape, weights.dtype)
    return dense_update_p(weights, spikes, trace, outs=out, on_rows=bool(on_rows),
                          w_min=w_min, w_max=w_max, backend=backend)


# ----------------------------------------------------------------------------- public API
def _bounds(who, w_min, w_max):
    lo, hi = _bound(w_min), _bound(w_max)
    for name, b in (("w_min", lo), ("w_max", hi)):
        if b is not None and not isinstance(b, (int, float)):
            raise TypeError(f"{who}: {name!r} must be a Python number or None (a static "
                            f"bound), got {type(b).__name__}")
    lo = None if lo is None else float(lo)
    hi = None if hi is None else float(hi)
    if lo is not None and hi is not None and lo > hi:
        raise ValueError(f"{who}: w_min ({lo}) must not exceed w_max ({hi})")
    return lo, hi


def _events(who, name, x):
    x = jnp.asarray(as_events(x))
    if x.ndim != 1:
        raise ValueError(f"{who}: {name!r} must be a vector, got shape {tuple(x.shape)}")
    return x


def _shared_error(who):
    return ValueError(f"{who}: the matrix shares one weight across its synapses; plasticity "
                      f"needs one weight per synapse: give it a full weight array first "
                      f"(e.g. W.with_data(jnp.full(..., w)))")


def _update(W, spikes, trace, *, pre: bool, w_min, w_max, backend, who):
    if isinstance(W, ColumnIndexed):
        index = tuple(_scaffold.index_array(a, who, name)
                      for a, name in zip(W.index, ("colptr", "perm", "rows")))
        new = _update_matrix(W.matrix, spikes, trace, pre=pre, w_min=w_min, w_max=w_max,
                             backend=backend, who=who, index=index)
        return W._rewrap(new)
    return _update_matrix(W, spikes, trace, pre=pre, w_min=w_min, w_max=w_max,
                          backend=backend, who=who)


def _update_matrix(W, spikes, trace, *, pre: bool, w_min, w_max, backend, who, index=()):
    lo, hi = _bounds(who, w_min, w_max)
    spikes = _events(who, "pre_spikes" if pre else "post_spikes", spikes)
    trace = _events(who, "post_trace" if pre else "pre_trace", trace)
    if isinstance(W, (CSR, CSC)):
        if W.homogeneous:
            raise _shared_error(who)
        trace = trace.astype(W.dtype)
        # CSR rows are presynaptic; a CSC stores the rows of its transpose (postsynaptic).
        on_rows = pre != isinstance(W, CSC)
        new = _compressed_call(W.data, _scaffold.index_array(W.indices, who, "indices"),
                               _scaffold.index_array(W.indptr, who, "indptr"), spikes, trace,
                               *(() if on_rows else index), shape=W._csr_shape,
                               on_rows=on_rows, w_min=lo, w_max=hi, backend=backend)
        return type(W)._unchecked(new, W.indices, W.indptr, W.shape)
    if isinstance(W, FixedNum):
        if W.homogeneous:
            raise _shared_error(who)
        trace = trace.astype(W.dtype)
        rows, k = W.indices.shape
        indices = _scaffold.index_array(W.indices, who, "indices")
        on_rows = pre == (W.per == "pre")
        if on_rows or not index:  # the (m, k) rows: they shard like the products' rows
            new = _compressed_call(W.weights, indices, spikes, trace, shape=W._stored_shape,
                                   on_rows=on_rows, masked=True, w_min=lo, w_max=hi,
                                   backend=backend)
            return W.with_data(new)
        indptr = jnp.arange(rows + 1, dtype=indices.dtype) * k
        new = _compressed_call(W.weights.reshape(-1), indices.reshape(-1), indptr, spikes,
                               trace, *index, shape=W._stored_shape, on_rows=on_rows,
                               masked=True, w_min=lo, w_max=hi, backend=backend)
        return W.with_data(new.reshape(rows, k))
    weights = jnp.asarray(W)
    if not jnp.issubdtype(weights.dtype, jnp.floating):
        raise TypeError(f"{who}: W must be a CSR, CSC, FixedNum or a float dense matrix, got "
                        f"{type(W).__name__} of {weights.dtype}")
    return _dense_call(weights, spikes, trace.astype(weights.dtype), on_rows=pre, w_min=lo,
                       w_max=hi, backend=backend)


def update_on_pre(W: Any, pre_spikes: Any, post_trace: Any, *, w_min: float | None = None,
                  w_max: float | None = None, backend: str | None = None) -> Any:
    """New weights after presynaptic spikes: ``w[i, j] += post_trace[j]`` where ``pre_spikes[i]``.

    The potentiation half of pair-based STDP (with ``post_trace`` the decaying trace of
    postsynaptic spikes). Only stored synapses of the firing presynaptic neurons change,
    and those are clipped to ``[w_min, w_max]``.

    Args:
        W: ``(n_pre, n_post)`` weights: a :class:`CSR`, :class:`CSC` or :class:`FixedNum`
            with one weight per synapse (optionally with a column index, see
            :func:`with_column_index`), or a dense float array.
        pre_spikes: ``(n_pre,)`` events (bool, or numbers: non-zero fires, or
            :class:`PackedEvents`).
        post_trace: ``(n_post,)`` floats.
        w_min: optional static lower bound for the updated weights.
        w_max: optional static upper bound for the updated weights.
        backend: 'numba' (CPU default), 'jax' (reference; GPU/TPU default) or, for
            compressed storage, 'pallas'.

    Returns:
        The same kind of matrix as ``W`` (same structure), with the new weights.

    Example:
        >>> import jax.numpy as jnp
        >>> from primforge import ops
        >>> W = ops.CSR.from_dense(jnp.array([[1., 0., 2.], [0., 3., 0.]]))
        >>> new = ops.update_on_pre(W, jnp.array([True, False]), jnp.array([.5, .5, .5]),
        ...                         w_max=2.2)
        >>> new.todense().tolist()
        [[1.5, 0.0, 2.200000047683716], [0.0, 3.0, 0.0]]
    """
    return _update(W, pre_spikes, post_trace, pre=True, w_min=w_min, w_max=w_max,
                   backend=backend, who="update_on_pre")


def update_on_post(W: Any, post_spikes: Any, pre_trace: Any, *, w_min: float | None = None,
                   w_max: float | None = None, backend: str | None = None) -> Any:
    """New weights after postsynaptic spikes: ``w[i, j] += pre_trace[i]`` where ``post_spikes[j]``.

    With a negative ``pre_trace`` (or a trace scaled by a negative amplitude) this is the
    depression half of pair-based STDP. Only stored synapses onto the firing postsynaptic
    neurons change, and those are clipped to ``[w_min, w_max]``.

    Args:
        W: ``(n_pre, n_post)`` weights: a :class:`CSR`, :class:`CSC` or :class:`FixedNum`
            with one weight per synapse (optionally with a column index, see
            :func:`with_column_index`), or a dense float array.
        post_spikes: ``(n_post,)`` events (bool, or numbers: non-zero fires, or
            :class:`PackedEvents`).
        pre_trace: ``(n_pre,)`` floats.
        w_min: optional static lower bound for the updated weights.
        w_max: optional static upper bound for the updated weights.
        backend: 'numba' (CPU default), 'jax' (reference; GPU/TPU default) or, for
            compressed storage, 'pallas'.

    Returns:
        The same kind of matrix as ``W`` (same structure), with the new weights.

    Example:
        >>> import jax.numpy as jnp
        >>> from primforge import ops
        >>> W = jnp.array([[1., 1.], [1., 1.]])
        >>> ops.update_on_post(W, jnp.array([False, True]), jnp.array([-.25, -2.]),
        ...                    w_min=0.)
        Array([[1.  , 0.75],
               [1.  , 0.  ]], dtype=float32)
    """
    return _update(W, post_spikes, pre_trace, pre=False, w_min=w_min, w_max=w_max,
                   backend=backend, who="update_on_post")


# ----------------------------------------------------------------------------- benchmark hooks
compressed_update_p.def_call(_compressed_call)
compressed_update_p.def_benchmark_data(
    _scaffold.lazy_benchmark_data("primforge.ops.plasticity.bench", "compressed"))
dense_update_p.def_call(_dense_call)
dense_update_p.def_benchmark_data(
    _scaffold.lazy_benchmark_data("primforge.ops.plasticity.bench", "dense"))
