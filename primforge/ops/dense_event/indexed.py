"""Dense event products whose events arrive as a spike list: firing indices plus a count.

The kernels take ``(weights, spikes, count)``; entries of ``spikes`` at or past ``count``
are ignored, a repeated index counts once per occurrence, and an index outside the
sources or a count outside ``[0, len(spikes)]`` gives NaN everywhere.
"""

from __future__ import annotations

import jax.numpy as jnp

from primforge.ops import _spikes
from primforge.ops.dense_event import api as _api

__all__ = [
    "binary_densemm_spikes",
    "binary_densemm_spikes_p",
    "binary_densemv_spikes",
    "binary_densemv_spikes_p",
]


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


_DOC = """
    Dense product with events given as a spike list: ``W @ e`` (or ``e @ W``).

    ``e`` counts how often each index occurs among the first ``spike_count`` entries of
    ``spike_indices``; with distinct indices the result equals
    :func:`~primforge.ops.binary_densemv` on the matching bool vector. With
    ``transpose=True`` the indices are rows of ``W`` and only those rows are read (work:
    spikes times columns); without, each row of ``W`` sums its listed columns.

    {args}

    Example:
        >>> import jax.numpy as jnp
        >>> W = jnp.array([[1., 2.], [3., 4.]])
        >>> binary_densemv_spikes(W, jnp.array([1, 1, 0]), 2, transpose=True)  # row 1 twice
        Array([6., 8.], dtype=float32)
    """
_EXAMPLE_MM = """Example:
        >>> import jax.numpy as jnp
        >>> W = jnp.array([[1., 2.], [3., 4.]])
        >>> binary_densemm_spikes(W, jnp.array([[0, 1], [1, 0]]), jnp.array([2, 1]))
        Array([[3., 7.],
               [2., 4.]], dtype=float32)
    """
_KERNELS, _CALLS = _spikes.forms(
    _api.FAMILY, ("binary_densemv_spikes", "binary_densemm_spikes"), module=__name__,
    params=("transpose",), reference=_reference, numba_generator=_numba_generator,
    sizes=_sizes, tags=("dense",), bench=("primforge.ops.dense_event.bench", "spikes",
                                           "spikes_mm"), docs=(_DOC, _EXAMPLE_MM), doc=__doc__)
binary_densemv_spikes_p = _KERNELS[0]
binary_densemm_spikes_p = _KERNELS[1]
binary_densemv_spikes = _CALLS[0]
binary_densemm_spikes = _CALLS[1]
