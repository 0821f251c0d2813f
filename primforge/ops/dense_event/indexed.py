"""Dense event products whose events arrive as a spike list: firing indices plus a count.

The kernels take ``(weights, spikes, count)``; entries of ``spikes`` at or past ``count``
are ignored, a repeated index counts once per occurrence, and an index outside the
sources or a count outside ``[0, len(spikes)]`` gives NaN everywhere.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from primforge.ops import _scaffold, _spikes
from primforge.ops.dense_event import api as _api

__all__ = [
    "binary_densemm_spikes",
    "binary_densemm_spikes_p",
    "binary_densemv_spikes",
    "binary_densemv_spikes_p",
]

_WHO = "binary_densemv_spikes"
_WHO_MM = "binary_densemm_spikes"


def _sizes(who, weights, *, transpose):
    if len(weights.shape) != 2:
        raise ValueError(f"{who}: 'weights' must be a 2-D (m, n) matrix, got shape "
                         f"{tuple(weights.shape)}")
    if not jnp.issubdtype(weights.dtype, jnp.floating):
        raise TypeError(f"{who}: 'weights' must be floating point, got {weights.dtype}")
    m, n = weights.shape
    return (n, m) if transpose else (m, n)


def _reference(weights, spikes, valid, *, transpose):
    if transpose:  # the listed rows, added
        return jnp.sum(jnp.where(valid[:, None], weights[spikes], 0), axis=0)
    return jnp.sum(jnp.where(valid[None, :], weights[:, spikes], 0), axis=1)


def _numba_generator(matrix: bool):
    def generate(*, transpose, **_):
        from primforge.ops.dense_event import numba as _numba_dense_event

        make = (_numba_dense_event.spikes_mm_kernel if matrix
                else _numba_dense_event.spikes_mv_kernel)
        return make(bool(transpose))

    return generate


_KERNELS = _spikes.build(
    _api.FAMILY.operator, _WHO,
    who=_WHO, who_mm=_WHO_MM, n_struct=0, params=("transpose",),
    reference=_reference, numba_generator=_numba_generator, sizes=_sizes, tags=("dense",),
    bench=("primforge.ops.dense_event.bench", "spikes", "spikes_mm"), doc=__doc__)
binary_densemv_spikes_p = _KERNELS[0]
binary_densemm_spikes_p = _KERNELS[1]


def _call(who, matrix, weights, spike_indices, spike_count, transpose, backend):
    weights = _scaffold.float_weights(weights, scalar_as_vector=False, who=who)
    out, size = _sizes(who, weights, transpose=bool(transpose))
    del out
    spikes, count = _spikes.list_args(who, spike_indices, spike_count, size, matrix)
    prim = binary_densemm_spikes_p if matrix else binary_densemv_spikes_p
    return prim(weights, spikes, count, transpose=bool(transpose), backend=backend)


def binary_densemv_spikes(weights: Any, spike_indices: Any, spike_count: Any = None, *,
                          transpose: bool = False, backend: str | None = None) -> jax.Array:
    """Dense product with events given as a spike list: ``W @ e`` (or ``e @ W``).

    ``e`` counts how often each index occurs among the first ``spike_count`` entries of
    ``spike_indices``; with distinct indices the result equals
    :func:`~primforge.ops.binary_densemv` on the matching bool vector. With
    ``transpose=True`` the indices are rows of ``W`` and only those rows are read (work:
    spikes times columns); without, each row of ``W`` sums its listed columns.

    Args:
        weights: dense ``(m, n)`` float matrix ``W``.
        spike_indices: 1-D integer array of firing indices (rows when ``transpose``,
            else columns); see :func:`~primforge.ops.spike_list`.
        spike_count: how many leading entries are valid (default: all).
        transpose: compute ``W.T @ e`` (= ``e @ W``).
        backend: 'numba' (CPU default) or 'jax' (reference; GPU/TPU default).

    Returns:
        The product, dtype of ``weights``. A valid index outside the sources raises
        ``IndexError`` on concrete input and gives NaN everywhere under ``jit``, as does a
        count outside ``[0, len(spike_indices)]`` (``ValueError`` eagerly).

    Example:
        >>> import jax.numpy as jnp
        >>> W = jnp.array([[1., 2.], [3., 4.]])
        >>> binary_densemv_spikes(W, jnp.array([1, 1, 0]), 2, transpose=True)  # row 1 twice
        Array([6., 8.], dtype=float32)
    """
    return _call(_WHO, False, weights, spike_indices, spike_count, transpose, backend)


def binary_densemm_spikes(weights: Any, spike_indices: Any, spike_count: Any = None, *,
                          transpose: bool = False, backend: str | None = None) -> jax.Array:
    """:func:`binary_densemv_spikes` for several spike lists of one length at once.

    Row ``b`` of the result is the product with list ``spike_indices[b]`` and count
    ``spike_count[b]`` (``vmap`` of the vector form over the lists calls this kernel); a
    bad list makes its own row NaN under ``jit``.

    Args:
        weights: dense ``(m, n)`` float matrix ``W``.
        spike_indices: integer array ``(lists, length)``.
        spike_count: the valid length of each list, shape ``(lists,)``, or one int for all
            (default: every entry is valid).
        transpose: the lists hold rows of ``W`` and each product is ``W.T @ e``.
        backend: 'numba' (CPU default) or 'jax'.

    Returns:
        The ``(lists, n)`` (``(lists, m)`` without ``transpose``) products.

    Example:
        >>> import jax.numpy as jnp
        >>> W = jnp.array([[1., 2.], [3., 4.]])
        >>> binary_densemm_spikes(W, jnp.array([[0, 1], [1, 0]]), jnp.array([2, 1]))
        Array([[3., 7.],
               [2., 4.]], dtype=float32)
    """
    return _call(_WHO_MM, True, weights, spike_indices, spike_count, transpose, backend)


binary_densemv_spikes_p.def_call(binary_densemv_spikes)
binary_densemm_spikes_p.def_call(binary_densemm_spikes)
