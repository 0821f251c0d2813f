"""Just-in-time products whose events arrive as a spike list: firing rows plus a count.

The kernels take ``(theta, seed, table, spikes, count)`` and compute ``W.T @ e`` (the
event-driven direction): only the listed rows of ``W`` are generated. Entries of
``spikes`` at or past ``count`` are ignored, a repeated row counts once per occurrence,
and a row outside ``W`` or a count outside ``[0, len(spikes)]`` gives NaN everywhere.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from primforge.ops import _spikes
from primforge.ops.jitconn import api as _api
from primforge.ops.jitconn import generator as _gen

__all__ = [
    "binary_jitc_mm_spikes",
    "binary_jitc_mm_spikes_p",
    "binary_jitc_mv_spikes",
    "binary_jitc_mv_spikes_p",
]


def _sizes(who, theta, seed, table, *, shape, prob, weight_kind):
    m, n = _api.check_operands(who, theta, seed, table, shape=shape, prob=prob,
                               weight_kind=weight_kind)
    return n, m


def _basis(stream, s, kind: str, dtype):
    """The weight of synapse ``s`` of each listed row as ``sum_k theta[k] * basis[k]``:
    ``homo`` ``[1]``, ``uniform`` ``[1 - u, u]``, ``normal`` ``[1, z]``."""
    one = jnp.ones(stream[0].shape, dtype)
    if kind == "homo":
        return one[None]
    three = jnp.uint32(3)
    u1 = _gen.unit(_gen.draw(stream, three * s + jnp.uint32(1))).astype(dtype)
    if kind == "uniform":
        return jnp.stack([1 - u1, u1])
    u2 = _gen.unit(_gen.draw(stream, three * s + jnp.uint32(2))).astype(dtype)
    return jnp.stack([one, jnp.sqrt(-2 * jnp.log(u1)) * jnp.cos((2 * jnp.pi) * u2)])


def _reference(theta, seed, table, spikes, valid, *, shape, prob, weight_kind):
    """The listed rows generated side by side, one synapse of each per step. The result is
    ``theta @ Y`` with ``Y`` the sums of each weight parameter's coefficient (the loop does
    not see ``theta``, so reverse-mode differentiation needs no loop of its own); a column
    no listed row reaches stays 0 whatever ``theta`` holds."""
    del prob
    _m, n = shape
    dtype = theta.dtype
    k_max = int(table.shape[0]) - 1
    stream = _gen.row_streams(seed[0], spikes)
    n_theta = _gen.WEIGHT_KINDS[weight_kind]

    def body(state):
        s, j, alive, y = state
        j, alive = _gen.next_column(j, alive, _gen.draw(stream, jnp.uint32(3) * s),
                                    table.__getitem__, k_max, n)
        basis = jnp.where(alive, _basis(stream, s, weight_kind, dtype), 0)
        y = y.at[:, jnp.where(alive, j, n)].add(basis, mode="drop")
        return s + jnp.uint32(1), j, alive, y

    init = (jnp.uint32(0), jnp.full(spikes.shape, -1, jnp.int32), valid,
            jnp.zeros((n_theta, n), dtype))
    y = jax.lax.while_loop(lambda state: jnp.any(state[2]), body, init)[3]
    reached = y[0] != 0  # a count of synapses, or (uniform) a sum of positive 1 - u
    return jnp.where(reached, theta @ y, 0)


def _numba_generator(matrix: bool):
    def generate(*, shape, prob, weight_kind, **_):
        from primforge.ops.jitconn import numba as _numba_jitconn

        return _numba_jitconn.spikes_kernel(matrix, weight_kind, float(prob), int(shape[0]))

    return generate


_DOC = """
    Just-in-time product with events given as a spike list: ``W.T @ e`` (= ``e @ W``).

    ``W`` is the random matrix that ``seed`` describes (:func:`~primforge.ops.jitc_todense`
    of the same arguments); its rows are the sources. ``e`` counts how often each row
    occurs among the first ``spike_count`` entries of ``spike_indices``; with distinct rows
    the result equals :func:`~primforge.ops.binary_jitc_matvec` with ``transpose=True`` on
    the matching bool vector (bit for bit on the numba backend when the rows are sorted, as
    :func:`~primforge.ops.spike_list` gives them). Only the listed rows are generated: the
    work is the spikes times the synapses of a row, whatever the number of rows.

    {args}

    Example:
        >>> import numpy as np
        >>> from primforge.ops import jitc_todense
        >>> y = binary_jitc_mv_spikes(0.5, 7, np.array([3, 0, 9]), 2, shape=(4, 6), prob=0.5)
        >>> W = jitc_todense(7, (4, 6), 0.5, 0.5)
        >>> np.allclose(y, W[3] + W[0])  # rows 3 and 0 fire; the entry past the count is not read
        True
    """
_EXAMPLE_MM = """Example:
        >>> import numpy as np
        >>> from primforge.ops import jitc_todense
        >>> lists = np.array([[1, 2], [0, 0]])
        >>> y = binary_jitc_mm_spikes((0.0, 1.0), 3, lists, np.array([2, 1]), shape=(3, 5),
        ...                           prob=0.4, weight_kind='uniform')
        >>> W = jitc_todense(3, (3, 5), 0.4, (0.0, 1.0), 'uniform')
        >>> np.allclose(y, [W[1] + W[2], W[0]])
        True
    """
_KERNELS, _CALLS = _spikes.forms(
    _api.FAMILY, ("binary_jitc_mv_spikes", "binary_jitc_mm_spikes"), module=__name__,
    params=("shape", "prob", "weight_kind"), reference=_reference,
    numba_generator=_numba_generator, sizes=_sizes, tags=("jitconn", "sparse"),
    bench=("primforge.ops.jitconn.bench", "spikes", "spikes_mm"), docs=(_DOC, _EXAMPLE_MM),
    doc=__doc__)
binary_jitc_mv_spikes_p = _KERNELS[0]
binary_jitc_mm_spikes_p = _KERNELS[1]
binary_jitc_mv_spikes = _CALLS[0]
binary_jitc_mm_spikes = _CALLS[1]
