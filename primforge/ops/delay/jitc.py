"""The delayed product of a just-in-time matrix: binary events, each synapse's delay drawn.

The kernel takes ``(theta, seed, table, events, buffer, slot)`` and returns the buffer:
the synapses and weights of ``binary_jitc_matvec`` with the same arguments, each synapse's
delay drawn from ``(seed, row, column)`` (:func:`~primforge.ops.jitconn.generator.delay_draws`).
"""

from __future__ import annotations

import operator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from primforge import _compat
from primforge.ops import _scaffold, _sharding
from primforge.ops.delay import ring as _ring
from primforge.ops.jitconn import generator as _gen
from primforge.ops.jitconn.api import check_operands, jitc_todense
from primforge.ops.jitconn.structure import seed_word, weight_params

__all__ = [
    "binary_delayed_jitc_matvec",
    "binary_delayed_jitc_matvec_p",
    "jitc_delays_todense",
]

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
    m, n = check_operands(_JITC, theta, seed, table, shape=shape, prob=prob,
                          weight_kind=weight_kind)
    n_src, n_dst = (m, n) if transpose else (n, m)
    if tuple(events.shape) != (n_src,):
        raise ValueError(f"{_JITC}: 'events' must have shape ({n_src},) (the sources), got "
                         f"{tuple(events.shape)}")
    _ring.check_buffer_and_slot(_JITC, buffer, slot, n_dst, theta.dtype, "the weights")
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


def _jitc_transpose(cts, *primals, outs, backend=None, **params):
    theta, seed, table, events, _, slot = primals
    ct, out = _ring.buffer_cotangent(cts, primals, 4, (1, 2, 3, 5),
                                     f"{_JITC} is linear in the weights and the buffer only")
    if ct is not None and _compat.is_undefined_primal(theta):
        zero = jnp.zeros(ct.shape, ct.dtype)
        out[0] = _scaffold.unit_weight_cotangent(
            lambda e: binary_delayed_jitc_matvec_p(e, seed, table, events, zero, slot,
                                                   backend=backend, **params),
            ct, theta.aval.dtype, theta.aval.shape[0])
    return out


binary_delayed_jitc_matvec_p = _ring.define(
    _ring.DELAYED.form(_JITC, doc=__doc__, format="jitc", events="bool"), reference=_jitc_jax,
    numba=_jitc_numba, shapes=_jitc_shapes, jvp=_jitc_jvp, transpose=_jitc_transpose,
    sharding=_sharding.delayed_jitc_rule, tags=("event", "matvec"))


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
        >>> from primforge.ops import delay_buffer
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
    buffer = _ring.buffer_array(who, buffer)
    depth = buffer.shape[0]
    dmin, dmax = _check_delay_range(who, delay_range, depth)
    theta = weight_params(weight, weight_kind, who).astype(buffer.dtype)
    _, events = _scaffold.promote_input(theta, events, True, who=who, name="events")
    table = jnp.asarray(_gen.cached_table(prob))
    return binary_delayed_jitc_matvec_p(
        theta, seed_word(seed, who), table, events, buffer, _ring.step_row(who, t, depth),
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


binary_delayed_jitc_matvec_p.def_call(binary_delayed_jitc_matvec)
binary_delayed_jitc_matvec_p.def_benchmark_data(
    _scaffold.lazy_benchmark_data("primforge.ops.delay.bench", "jitc_events"))
