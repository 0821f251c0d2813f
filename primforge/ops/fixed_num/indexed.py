"""Fixed-number products whose events arrive as a spike list: firing indices plus a count.

The kernels take ``(weights, indices, spikes, count)``; entries of ``spikes`` at or past
``count`` are ignored, a repeated index counts once per occurrence, and an index outside
the sources or a count outside ``[0, len(spikes)]`` gives NaN everywhere.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from primforge.ops import _scaffold, _spikes
from primforge.ops.fixed_num import api as _api
from primforge.ops.fixed_num.api import check_structure_args, safe_indices

__all__ = [
    "binary_fixed_num_mm_spikes",
    "binary_fixed_num_mm_spikes_p",
    "binary_fixed_num_mv_spikes",
    "binary_fixed_num_mv_spikes_p",
]

_WHO = "binary_fixed_num_mv_spikes"
_WHO_MM = "binary_fixed_num_mm_spikes"


def _sizes(who, weights, indices, *, shape, transpose):
    m, n = _scaffold.check_shape(shape, who)
    check_structure_args(who, weights, indices, (m, n))
    return (n, m) if transpose else (m, n)


def _reference(weights, indices, spikes, valid, *, shape, transpose):
    _m, n = shape
    homo = len(weights.shape) == 1  # one shared weight, (1,)
    dtype = weights.dtype
    if transpose:  # the listed rows scatter their entries
        cols = indices[spikes]
        w = jnp.broadcast_to(weights[0], cols.shape) if homo else weights[spikes]
        safe, _ = safe_indices(cols, n)
        contrib = jnp.where(valid[:, None], w, 0)
        return jnp.zeros((n,), dtype).at[safe].add(contrib, mode="drop")
    times = jnp.zeros((n,), dtype).at[spikes].add(valid.astype(dtype))
    safe, _ = safe_indices(indices, n)
    got = _scaffold.take_fill(times, safe)
    w = weights[0] if homo else weights
    return jnp.sum(jnp.where(got != 0, w * got, 0), axis=1)


def _numba_generator(matrix: bool):
    def generate(*, ins, shape, transpose, **_):
        from primforge.ops.fixed_num import numba as _numba_fixed_num

        make = _numba_fixed_num.spikes_mm_kernel if matrix else _numba_fixed_num.spikes_mv_kernel
        return make(bool(transpose), len(ins[0].shape) == 1, int(shape[1]))

    return generate


_KERNELS = _spikes.build(
    _api.FAMILY.operator, _WHO,
    who=_WHO, who_mm=_WHO_MM, n_struct=1, params=("shape", "transpose"),
    reference=_reference, numba_generator=_numba_generator, sizes=_sizes,
    tags=("fixed_num", "sparse"),
    bench=("primforge.ops.fixed_num.bench", "spikes", "spikes_mm"), doc=__doc__)
binary_fixed_num_mv_spikes_p = _KERNELS[0]
binary_fixed_num_mm_spikes_p = _KERNELS[1]


def _call(who, matrix, weights, indices, spike_indices, spike_count, shape, transpose,
          backend):
    shape = _scaffold.check_shape(shape, who)
    weights = _scaffold.float_weights(weights, who=who)
    indices = _scaffold.index_array(indices, who, "indices")
    size = shape[0] if transpose else shape[1]
    spikes, count = _spikes.list_args(who, spike_indices, spike_count, size, matrix)
    prim = binary_fixed_num_mm_spikes_p if matrix else binary_fixed_num_mv_spikes_p
    return prim(weights, indices, spikes, count, shape=shape, transpose=bool(transpose),
                backend=backend)


def binary_fixed_num_mv_spikes(weights: Any, indices: Any, spike_indices: Any,
                               spike_count: Any = None, *, shape: tuple[int, int],
                               transpose: bool = False,
                               backend: str | None = None) -> jax.Array:
    """Fixed-number product with events given as a spike list: ``A @ e`` (or ``A.T @ e``).

    ``e`` counts how often each index occurs among the first ``spike_count`` entries of
    ``spike_indices``; with distinct indices the result equals
    :func:`~primforge.ops.binary_fixed_num_mv` on the matching bool vector. With
    ``transpose=True`` the indices are rows of ``A`` (the firing sources) and the numba
    kernel visits only their ``k`` entries each: work proportional to spikes times ``k``.
    Without, they are columns: one table of counts, then every row's ``k`` entries.

    Args:
        weights: one weight per entry, shape ``(m, k)`` like ``indices``, or a scalar /
            ``(1,)`` shared by every entry.
        indices: ``(m, k)`` integers: row ``i`` of ``A`` has entries in columns
            ``indices[i, :]``; an index outside ``[0, n)`` is masked, as in
            :func:`~primforge.ops.binary_fixed_num_mv`.
        spike_indices: 1-D integer array of firing indices (rows when ``transpose``,
            else columns); see :func:`~primforge.ops.spike_list`.
        spike_count: how many leading entries are valid (default: all).
        shape: ``(m, n)`` of the stored matrix ``A``.
        transpose: compute ``A.T @ e``.
        backend: 'numba' (CPU default) or 'jax' (reference; GPU/TPU default).

    Returns:
        The product, dtype of ``weights``. A valid index outside the sources raises
        ``IndexError`` on concrete input and gives NaN everywhere under ``jit``, as does a
        count outside ``[0, len(spike_indices)]`` (``ValueError`` eagerly).

    Example:
        >>> import jax.numpy as jnp
        >>> # A = [[0, .5, .5], [.5, 0, .5]]; row 1 fires; the entry past the count is ignored
        >>> binary_fixed_num_mv_spikes(0.5, jnp.array([[1, 2], [0, 2]]), jnp.array([1, 0]),
        ...                            1, shape=(2, 3), transpose=True)
        Array([0.5, 0. , 0.5], dtype=float32)
    """
    return _call(_WHO, False, weights, indices, spike_indices, spike_count, shape, transpose,
                 backend)


def binary_fixed_num_mm_spikes(weights: Any, indices: Any, spike_indices: Any,
                               spike_count: Any = None, *, shape: tuple[int, int],
                               transpose: bool = False,
                               backend: str | None = None) -> jax.Array:
    """:func:`binary_fixed_num_mv_spikes` for several spike lists of one length at once.

    Row ``b`` of the result is the product with list ``spike_indices[b]`` and count
    ``spike_count[b]`` (``vmap`` of the vector form over the lists calls this kernel); a
    bad list makes its own row NaN under ``jit``.

    Args:
        weights: ``(m, k)`` per-entry weights, or a scalar / ``(1,)`` shared weight.
        indices: ``(m, k)`` integers (masked outside ``[0, n)``).
        spike_indices: integer array ``(lists, length)``.
        spike_count: the valid length of each list, shape ``(lists,)``, or one int for all
            (default: every entry is valid).
        shape: ``(m, n)`` of the stored matrix ``A``.
        transpose: the lists hold rows of ``A`` and each product is ``A.T @ e``.
        backend: 'numba' (CPU default) or 'jax'.

    Returns:
        The ``(lists, n)`` (``(lists, m)`` without ``transpose``) products.

    Example:
        >>> import jax.numpy as jnp
        >>> binary_fixed_num_mm_spikes(1.0, jnp.array([[1, 2], [0, 2]]),
        ...                            jnp.array([[1, 1], [0, 1]]), jnp.array([2, 1]),
        ...                            shape=(2, 3), transpose=True)
        Array([[2., 0., 2.],
               [0., 1., 1.]], dtype=float32)
    """
    return _call(_WHO_MM, True, weights, indices, spike_indices, spike_count, shape,
                 transpose, backend)


binary_fixed_num_mv_spikes_p.def_call(binary_fixed_num_mv_spikes)
binary_fixed_num_mm_spikes_p.def_call(binary_fixed_num_mm_spikes)
