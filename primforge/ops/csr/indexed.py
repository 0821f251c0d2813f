"""CSR products whose events arrive as a spike list: firing indices plus a count.

The kernel takes ``(data, indices, indptr, spikes, count)``, ``count`` of shape ``(1,)``;
entries of ``spikes`` at or past ``count`` are ignored, a repeated index counts once per
occurrence, and an index outside the matrix or a count outside ``[0, len(spikes)]`` gives
NaN everywhere, as a malformed structure does.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from primforge.kernel.kernel import XLACustomKernel
from primforge.ops import _scaffold, _sharding, _spikes
from primforge.ops.csr import api as _api
from primforge.ops.csr import structure as _common

__all__ = [
    "binary_csrmm_spikes",
    "binary_csrmm_spikes_p",
    "binary_csrmv_spikes",
    "binary_csrmv_spikes_p",
    "spike_list",
]


def _sizes(who, data, indices, indptr, *, shape, transpose):
    m, n = _scaffold.check_shape(shape, who)
    _common.check_csr_args(who, data, indices, indptr, (m, n))
    return (n, m) if transpose else (m, n)


def _visits(indices, indptr, spikes, valid, size, transpose, dtype):
    """How often each stored entry is visited (the count of its source), and their rows."""
    cnt = jnp.zeros((size,), dtype).at[spikes].add(valid.astype(dtype), mode="drop")
    rows = _common.row_ids(indptr, indices.shape[0])
    return _scaffold.take_fill(cnt, rows if transpose else indices), rows


def _reference(data, indices, indptr, spikes, valid, *, shape, transpose):
    m, n = shape
    times, rows = _visits(indices, indptr, spikes, valid, m if transpose else n, transpose,
                          data.dtype)
    w = data[0] if _common.is_homogeneous(data, indices) else data
    contrib = jnp.where(times != 0, w * times, 0)  # an unvisited weight never enters
    if transpose:
        y = jnp.zeros((n,), data.dtype).at[indices].add(contrib, mode="drop")
    else:
        y = jax.ops.segment_sum(contrib, rows, num_segments=m)
    return jnp.where(_common.structure_ok(indices, indptr, n), y, jnp.nan)


def _weight_cotangent(ct, w_aval, indices, indptr, spikes, count, *, shape, transpose):
    """One list's cotangent of ``data``; NaN everywhere for a bad list or structure."""
    m, n = shape
    dtype, size = w_aval.dtype, m if transpose else n
    spikes, count = _spikes.widen(spikes, count)
    valid, ok = _spikes.valid_entries(spikes, count, size)
    times, rows = _visits(indices, indptr, spikes, valid, size, transpose, dtype)
    target = _scaffold.take_fill(ct.astype(dtype), indices if transpose else rows)
    g = jnp.where(times != 0, times * target, 0)
    if _common.is_homogeneous(w_aval, indices):
        g = jnp.sum(g).reshape(1)
    ok = ok & _common.structure_ok(indices, indptr, n)
    return jnp.where(ok, g, jnp.nan).astype(dtype)


def _numba_generator(matrix: bool):
    def generate(*, ins, outs, shape, transpose, **_):
        from primforge.ops.csr import numba_spikes as _numba_csr

        homo = _common.is_homogeneous(ins[0], ins[1])
        wide = np.dtype(ins[1].dtype).itemsize > 4
        make = _numba_csr.indexed_mm_kernel if matrix else _numba_csr.indexed_mv_kernel
        return make(bool(transpose), homo, wide, int(shape[1]))

    return generate


_DOC = """
    CSR product with events given as a spike list: ``W @ e`` (or ``W.T @ e``).

    ``e`` counts how often each index occurs among the first ``spike_count`` entries of
    ``spike_indices``: a repeated index adds its weights once per occurrence, and with
    distinct indices the result equals :func:`binary_csrmv` on the matching bool vector.
    With ``transpose=True`` the indices are rows of ``W`` (the firing sources) and the numba
    kernel visits only those rows: work proportional to spikes times row length, never to
    the number of neurons. With ``transpose=False`` they are columns and every row is read.

    {args}

    Example:
        >>> import jax.numpy as jnp
        >>> # W = [[1, 0, 2], [0, 3, 0]]; row 1 fires; the entry past the count is ignored
        >>> binary_csrmv_spikes(jnp.array([1., 2., 3.]), jnp.array([0, 2, 1]),
        ...                      jnp.array([0, 2, 3]), jnp.array([1, 0]), 1, shape=(2, 3),
        ...                      transpose=True)
        Array([0., 3., 0.], dtype=float32)
    """
_EXAMPLE_MM = """Example:
        >>> import jax.numpy as jnp
        >>> # W = [[1, 0, 2], [0, 3, 0]]; list 0: row 1 twice; list 1: row 0
        >>> binary_csrmm_spikes(jnp.array([1., 2., 3.]), jnp.array([0, 2, 1]),
        ...                      jnp.array([0, 2, 3]), jnp.array([[1, 1], [0, 1]]),
        ...                      jnp.array([2, 1]), shape=(2, 3), transpose=True)
        Array([[0., 6., 0.],
               [1., 0., 2.]], dtype=float32)
    """
_KERNELS, _CALLS = _spikes.forms(
    _api.FAMILY, ("binary_csrmv_spikes", "binary_csrmm_spikes"), module=__name__,
    params=("shape", "transpose"), reference=_reference, numba_generator=_numba_generator,
    sizes=_sizes, tags=("sparse",), bench=("primforge.ops.csr.bench", "indexed", "indexed_mm"),
    docs=(_DOC, _EXAMPLE_MM), doc=__doc__, weight_cotangent=_weight_cotangent,
    sharding=_sharding.indexed_rule)
binary_csrmv_spikes_p = _KERNELS[0]
binary_csrmm_spikes_p = _KERNELS[1]
binary_csrmv_spikes = _CALLS[0]
binary_csrmm_spikes = _CALLS[1]


def spike_list(events: Any, max_spikes: int, *,
               backend: str | None = None) -> tuple[jax.Array, jax.Array]:
    """The firing indices of a bool vector as a fixed-length list and a count (jit-safe).

    Returns ``(indices, count)``: the first ``min(count, max_spikes)`` entries of ``indices``
    (int32, length ``max_spikes``) are the active positions in increasing order, the rest
    are 0. ``count`` is the number of active entries, even past ``max_spikes``: a list that
    overflows then makes :func:`binary_csrmv_spikes` give NaN (``ValueError`` eagerly)
    rather than silently dropping spikes. ``backend``: 'numba' (the CPU default, one pass)
    or 'jax'.

    Example:
        >>> import jax.numpy as jnp
        >>> idx, n = spike_list(jnp.array([False, True, False, True]), 3)
        >>> idx, n
        (Array([1, 3, 0], dtype=int32), Array(2, dtype=int32))
    """
    events = jnp.asarray(events)
    if events.ndim != 1:
        raise ValueError(f"spike_list: 'events' must be 1-D, got shape {tuple(events.shape)}")
    try:
        max_spikes = int(max_spikes)
    except TypeError:
        raise TypeError("spike_list: 'max_spikes' must be a static int, got "
                        f"{type(max_spikes).__name__}") from None
    if max_spikes < 0:
        raise ValueError(f"spike_list: 'max_spikes' must be non-negative, got {max_spikes}")
    if max_spikes >= 2**31 or events.shape[0] >= 2**31:
        raise ValueError("spike_list: 'events' and 'max_spikes' must stay below 2**31")
    idx, count = _spike_list_p(events, max_spikes=max_spikes, backend=backend)
    return idx, count[0]


def _compact_reference(*, max_spikes, **_):
    def kernel(events):
        active = events != 0
        (idx,) = jnp.nonzero(active, size=max_spikes, fill_value=0)
        return idx.astype(jnp.int32), jnp.sum(active, dtype=jnp.int32).reshape(1)

    return kernel


def _compact_numba(**_):
    from primforge.ops.csr import numba_spikes as _numba_csr

    return _numba_csr.spike_list_kernel()


def _compact_shape(events, *, max_spikes, **_):
    return (jax.ShapeDtypeStruct((max_spikes,), np.dtype(np.int32)),
            jax.ShapeDtypeStruct((1,), np.dtype(np.int32)))


def _compact_batching(args, axes, *, outs, backend=None, max_spikes, **_):
    (events,), (ax,) = args, axes
    one = lambda e: tuple(_spike_list_p(e, max_spikes=max_spikes, backend=backend))
    return list(jax.lax.map(one, jnp.moveaxis(events, ax, 0))), [0, 0]


_spike_list_p = XLACustomKernel("primforge.ops.spike_list", doc="A bool vector compacted into a "
                                "fixed-length list of its active positions and their count.",
                                replace=True)
for _platform in ("cpu", "gpu", "tpu"):
    _spike_list_p.def_kernel("jax", _platform, _compact_reference)
_spike_list_p.def_numba_kernel(_compact_numba, asdefault=True)
_spike_list_p.def_abstract_eval(_compact_shape)
_spike_list_p.def_batching_rule(_compact_batching)
_spike_list_p.def_tags("event", "spike_list")
_spike_list_p.def_sharding_rule(_sharding.indexed_rule)
_spike_list_p.def_call(spike_list)
_spike_list_p.def_benchmark_data(
    _scaffold.lazy_benchmark_data("primforge.ops.csr.bench", "spike_lists"))
del _platform
