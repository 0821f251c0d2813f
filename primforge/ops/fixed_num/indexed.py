"""Fixed-number products whose events arrive as a spike list: firing indices plus a count.

The kernels take ``(weights, indices, spikes, count)``; entries of ``spikes`` at or past
``count`` are ignored, a repeated index counts once per occurrence, and an index outside
the sources or a count outside ``[0, len(spikes)]`` gives NaN everywhere.
"""

from __future__ import annotations

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


_DOC = """
    Fixed-number product with events given as a spike list: ``A @ e`` (or ``A.T @ e``).

    ``e`` counts how often each index occurs among the first ``spike_count`` entries of
    ``spike_indices``; with distinct indices the result equals
    :func:`~primforge.ops.binary_fixed_num_mv` on the matching bool vector. With
    ``transpose=True`` the indices are rows of ``A`` (the firing sources) and the numba
    kernel visits only their ``k`` entries each: work proportional to spikes times ``k``.
    Without, they are columns: one table of counts, then every row's ``k`` entries.

    {args}

    Example:
        >>> import jax.numpy as jnp
        >>> # A = [[0, .5, .5], [.5, 0, .5]]; row 1 fires; the entry past the count is ignored
        >>> binary_fixed_num_mv_spikes(0.5, jnp.array([[1, 2], [0, 2]]), jnp.array([1, 0]),
        ...                            1, shape=(2, 3), transpose=True)
        Array([0.5, 0. , 0.5], dtype=float32)
    """
_EXAMPLE_MM = """Example:
        >>> import jax.numpy as jnp
        >>> binary_fixed_num_mm_spikes(1.0, jnp.array([[1, 2], [0, 2]]),
        ...                            jnp.array([[1, 1], [0, 1]]), jnp.array([2, 1]),
        ...                            shape=(2, 3), transpose=True)
        Array([[2., 0., 2.],
               [0., 1., 1.]], dtype=float32)
    """
_KERNELS, _CALLS = _spikes.forms(
    _api.FAMILY, ("binary_fixed_num_mv_spikes", "binary_fixed_num_mm_spikes"),
    module=__name__, params=("shape", "transpose"), reference=_reference,
    numba_generator=_numba_generator, sizes=_sizes, tags=("fixed_num", "sparse"),
    bench=("primforge.ops.fixed_num.bench", "spikes", "spikes_mm"), docs=(_DOC, _EXAMPLE_MM),
    doc=__doc__)
binary_fixed_num_mv_spikes_p = _KERNELS[0]
binary_fixed_num_mm_spikes_p = _KERNELS[1]
binary_fixed_num_mv_spikes = _CALLS[0]
binary_fixed_num_mm_spikes = _CALLS[1]
