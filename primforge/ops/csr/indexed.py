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

from primforge import _compat
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

_WHO = "binary_csrmv_spikes"
_WHO_MM = "binary_csrmm_spikes"


# ----------------------------------------------------------------------------- jax reference
def _counts(spikes, count, size, dtype):
    """How often each source fires among the valid entries; and whether the list is valid."""
    valid, ok = _spikes.valid_entries(spikes, count, size)
    spikes = _spikes.widen(spikes, count)[0]
    cnt = jnp.zeros((size,), dtype).at[spikes].add(valid.astype(dtype), mode="drop")
    return cnt, ok


def _per_entry(cnt, rows, indices, transpose):
    """How often each stored entry is visited (the count of its source)."""
    return _scaffold.take_fill(cnt, rows if transpose else indices)


def _reference(shape, transpose, dtype, homo):
    m, n = shape

    def kernel(data, indices, indptr, spikes, count):
        cnt, ok = _counts(spikes, count, m if transpose else n, dtype)
        rows = _common.row_ids(indptr, indices.shape[0])
        times = _per_entry(cnt, rows, indices, transpose)
        w = data[0] if homo else data
        contrib = jnp.where(times != 0, w * times, 0)  # an unvisited weight never enters
        if transpose:
            y = jnp.zeros((n,), dtype).at[indices].add(contrib, mode="drop")
        else:
            y = jax.ops.segment_sum(contrib, rows, num_segments=m)
        ok = ok & _common.structure_ok(indices, indptr, n)
        return jnp.where(ok, y, jnp.nan).astype(dtype)

    return kernel


def _jax_generator(*, ins, outs, shape, transpose, **_):
    return _reference(shape, transpose, outs[0].dtype, _common.is_homogeneous(ins[0], ins[1]))


def _jax_generator_mm(*, ins, outs, shape, transpose, **_):
    one = _reference(shape, transpose, outs[0].dtype, _common.is_homogeneous(ins[0], ins[1]))
    many = jax.vmap(one, in_axes=(None, None, None, 0, 0))
    return lambda data, indices, indptr, spikes, counts: many(
        data, indices, indptr, spikes, counts.reshape(-1, 1))


# ----------------------------------------------------------------------------- numba
def _numba_generator(matrix: bool):
    def generate(*, ins, outs, shape, transpose, **_):
        from primforge.ops.csr import numba as _numba_csr

        homo = _common.is_homogeneous(ins[0], ins[1])
        wide = np.dtype(ins[1].dtype).itemsize > 4
        make = _numba_csr.indexed_mm_kernel if matrix else _numba_csr.indexed_mv_kernel
        return make(bool(transpose), homo, wide, int(shape[1]))

    return generate


# ----------------------------------------------------------------------------- rules
def _shape_rule(matrix: bool):
    who = _WHO_MM if matrix else _WHO

    def rule(data, indices, indptr, spikes, count, *, shape, transpose, **_):
        m, n = _scaffold.check_shape(shape, who)
        _common.check_csr_args(who, data, indices, indptr, (m, n))
        _spikes.check_list(who, spikes, count, matrix)
        lead = tuple(spikes.shape[:1]) if matrix else ()
        return jax.ShapeDtypeStruct(lead + (n if transpose else m,), data.dtype)

    return rule


def _weight_cotangent(ct, w_aval, indices, indptr, spikes, count, *, shape, transpose):
    m, n = shape
    dtype = w_aval.dtype
    cnt, ok = _counts(spikes, count, m if transpose else n, dtype)
    rows = _common.row_ids(indptr, indices.shape[0])
    times = _per_entry(cnt, rows, indices, transpose)
    ct = ct.astype(dtype)
    target = _scaffold.take_fill(ct, indices if transpose else rows)
    g = jnp.where(times != 0, times * target, 0)
    if _common.is_homogeneous(w_aval, indices):
        g = jnp.sum(g).reshape(1)
    ok = ok & _common.structure_ok(indices, indptr, n)
    return jnp.where(ok, g, jnp.nan).astype(dtype)


def _jvp_rule(matrix: bool):
    def jvp(primals, tangents, *, outs, backend=None, shape, transpose, **_):
        prim = _KERNELS[matrix]
        y = prim(*primals, shape=shape, transpose=transpose, backend=backend)
        d_w = tangents[0]
        if type(d_w) is _compat.Zero:
            return [y], [jnp.zeros_like(y)]
        t = prim(d_w, *primals[1:], shape=shape, transpose=transpose, backend=backend)
        return [y], [t]

    return jvp


def _transpose_rule(matrix: bool):
    def rule(cts, data, indices, indptr, spikes, count, *, outs, backend=None, shape,
             transpose, **_):
        (ct,) = cts
        none = [None] * 5
        if type(ct) is _compat.Zero:
            return none
        if any(_compat.is_undefined_primal(a) for a in (indices, indptr, spikes, count)):
            raise ValueError(f"{_WHO_MM if matrix else _WHO} is linear in 'data' only")
        if not _compat.is_undefined_primal(data):
            return none
        grad = lambda c, s, k: _weight_cotangent(c, data.aval, indices, indptr, s, k,
                                                 shape=shape, transpose=transpose)
        ct = jnp.asarray(ct)
        if matrix:  # the lists' contributions add up
            ct_w = jnp.sum(jax.vmap(grad)(ct, spikes, count.reshape(-1, 1)), axis=0)
        else:
            ct_w = grad(ct, spikes, count)
        return [ct_w] + none[1:]

    return rule


def _batching_rule(matrix: bool):
    """``vmap``: over spike lists alone, one matrix call; else one call per element."""

    def batch(args, axes, *, outs, backend=None, shape, transpose, **_):
        kw = {"shape": shape, "transpose": transpose, "backend": backend}
        return _spikes.batch_lists(_KERNELS, matrix, args, axes, kw)

    return batch


_KERNELS = {}
for _matrix in (False, True):
    _k = _api.FAMILY.operator.form(_WHO_MM if _matrix else _WHO, doc=__doc__,
                                   events="spikes", matrix=_matrix)
    for _platform in ("cpu", "gpu", "tpu"):
        _k.def_kernel("jax", _platform, _jax_generator_mm if _matrix else _jax_generator)
    _k.def_numba_kernel(_numba_generator(_matrix), asdefault=True)
    _k.def_abstract_eval(_shape_rule(_matrix))
    _k.def_jvp_rule(_jvp_rule(_matrix))
    _k.def_transpose_rule(_transpose_rule(_matrix))
    _k.def_batching_rule(_batching_rule(_matrix))
    _k.def_tags("sparse", "event", "matmat" if _matrix else "matvec", "spike_list")
    _k.def_sharding_rule(_sharding.indexed_rule)
    _k.def_benchmark_data(_scaffold.lazy_benchmark_data(
        "primforge.ops.csr.bench", "indexed_mm" if _matrix else "indexed"))
    _KERNELS[_matrix] = _k
binary_csrmv_spikes_p = _KERNELS[False]
binary_csrmm_spikes_p = _KERNELS[True]
del _platform, _matrix, _k


# ----------------------------------------------------------------------------- public calls
def binary_csrmv_spikes(data: Any, indices: Any, indptr: Any, spike_indices: Any,
                         spike_count: Any = None, *, shape: tuple[int, int],
                         transpose: bool = False, backend: str | None = None) -> jax.Array:
    """CSR product with events given as a spike list: ``W @ e`` (or ``W.T @ e``).

    ``e`` counts how often each index occurs among the first ``spike_count`` entries of
    ``spike_indices``: a repeated index adds its weights once per occurrence, and with
    distinct indices the result equals :func:`binary_csrmv` on the matching bool vector.
    With ``transpose=True`` the indices are rows of ``W`` (the firing sources) and the numba
    kernel visits only those rows: work proportional to spikes times row length, never to
    the number of neurons. With ``transpose=False`` they are columns and every row is read.

    Args:
        data: weights, shape ``(nnz,)``, or a scalar / ``(1,)`` shared by every entry.
        indices: column of each stored entry, shape ``(nnz,)``.
        indptr: row offsets, shape ``(rows + 1,)``.
        spike_indices: 1-D integer array of firing indices (rows when ``transpose``,
            else columns); a fixed length under ``jit`` (see :func:`spike_list`).
        spike_count: how many leading entries are valid (default: all); later ones are
            ignored.
        shape: ``(rows, cols)`` of ``W``.
        transpose: compute ``W.T @ e`` (the same as ``e @ W``).
        backend: force a backend ('numba', 'jax'); default: numba on CPU, jax elsewhere.

    Returns:
        The product, dtype of ``data``. A valid index outside the sources raises
        ``IndexError`` on concrete input and gives NaN everywhere under ``jit``, as does a
        count outside ``[0, len(spike_indices)]`` (``ValueError`` eagerly) or a malformed
        structure.

    Example:
        >>> import jax.numpy as jnp
        >>> # W = [[1, 0, 2], [0, 3, 0]]; row 1 fires; the entry past the count is ignored
        >>> binary_csrmv_spikes(jnp.array([1., 2., 3.]), jnp.array([0, 2, 1]),
        ...                      jnp.array([0, 2, 3]), jnp.array([1, 0]), 1, shape=(2, 3),
        ...                      transpose=True)
        Array([0., 3., 0.], dtype=float32)
    """
    shape = _scaffold.check_shape(shape, _WHO)
    data = _scaffold.float_weights(data, who=_WHO, name="data")
    indices = _scaffold.index_array(indices, _WHO, "indices")
    indptr = _scaffold.index_array(indptr, _WHO, "indptr")
    spikes, count = _spikes.list_args(_WHO, spike_indices, spike_count,
                                      shape[0] if transpose else shape[1], False)
    return binary_csrmv_spikes_p(data, indices, indptr, spikes, count, shape=shape,
                                  transpose=bool(transpose), backend=backend)


binary_csrmv_spikes_p.def_call(binary_csrmv_spikes)


def binary_csrmm_spikes(data: Any, indices: Any, indptr: Any, spike_indices: Any,
                         spike_count: Any = None, *, shape: tuple[int, int],
                         transpose: bool = False, backend: str | None = None) -> jax.Array:
    """:func:`binary_csrmv_spikes` for several spike lists of one length at once.

    Row ``b`` of the result is ``binary_csrmv_spikes`` with list ``spike_indices[b]`` and
    count ``spike_count[b]`` (``vmap`` of that function over the lists calls this kernel);
    a bad list makes its own row NaN under ``jit``.

    Args:
        data: weights, shape ``(nnz,)``, or a scalar / ``(1,)`` shared by every entry.
        indices: column of each stored entry, shape ``(nnz,)``.
        indptr: row offsets, shape ``(rows + 1,)``.
        spike_indices: integer array ``(lists, length)``.
        spike_count: the valid length of each list, shape ``(lists,)``, or one int for all
            (default: every entry is valid).
        shape: ``(rows, cols)`` of ``W``.
        transpose: the lists hold rows of ``W`` and each product is ``W.T @ e``.
        backend: force a backend ('numba', 'jax'); default: numba on CPU, jax elsewhere.

    Returns:
        The ``(lists, cols)`` (``(lists, rows)`` without ``transpose``) products.

    Example:
        >>> import jax.numpy as jnp
        >>> # W = [[1, 0, 2], [0, 3, 0]]; list 0: row 1 twice; list 1: row 0
        >>> binary_csrmm_spikes(jnp.array([1., 2., 3.]), jnp.array([0, 2, 1]),
        ...                      jnp.array([0, 2, 3]), jnp.array([[1, 1], [0, 1]]),
        ...                      jnp.array([2, 1]), shape=(2, 3), transpose=True)
        Array([[0., 6., 0.],
               [1., 0., 2.]], dtype=float32)
    """
    shape = _scaffold.check_shape(shape, _WHO_MM)
    data = _scaffold.float_weights(data, who=_WHO_MM, name="data")
    indices = _scaffold.index_array(indices, _WHO_MM, "indices")
    indptr = _scaffold.index_array(indptr, _WHO_MM, "indptr")
    spikes, count = _spikes.list_args(_WHO_MM, spike_indices, spike_count,
                                      shape[0] if transpose else shape[1], True)
    return binary_csrmm_spikes_p(data, indices, indptr, spikes, count, shape=shape,
                                  transpose=bool(transpose), backend=backend)


binary_csrmm_spikes_p.def_call(binary_csrmm_spikes)


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
    from primforge.ops.csr import numba as _numba_csr

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
