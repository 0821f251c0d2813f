"""The binary fixed-number matrix-vector product reading bit-packed events in the kernel.

:func:`~primforge.ops.binary_fixed_num_mv` (and ``FixedNum`` ``@``) sends a packed event
vector here: the kernel takes ``(weights, indices, words)`` with the static ``n`` (events)
besides ``shape`` and ``transpose``, and gives the same values as the product on the
unpacked events, bit for bit on the numba backend.
"""

from __future__ import annotations

import jax

from primforge.ops import _scaffold, _sharding
from primforge.ops.fixed_num import api as _api
from primforge.ops.packed import PackedEvents

__all__ = ["binary_fixed_num_mv_packed", "binary_fixed_num_mv_packed_p"]

_WHO = "binary_fixed_num_mv"


def _numba_generator(*, ins, transpose, n, **_):
    from primforge.ops.fixed_num import numba as _numba_fixed_num

    return _numba_fixed_num.packed_mv_kernel(bool(transpose), len(ins[0].shape) == 1, int(n))


def _shape_rule(weights, indices, words, *, shape, transpose, n, **_):
    m, cols = _scaffold.check_shape(shape, _WHO)
    _api.check_structure_args(_WHO, weights, indices, (m, cols))
    _scaffold.check_packed_words(_WHO, (m, cols), transpose, n, words)
    return jax.ShapeDtypeStruct((cols if transpose else m,), weights.dtype)


binary_fixed_num_mv_packed_p = _api.FAMILY.build_packed(
    jax_gen=_api._jax_generator, numba_gen=_numba_generator, shape_rule=_shape_rule,
    weight_cotangent=_api._weight_cotangent, tags=("fixed_num",), doc=__doc__)
binary_fixed_num_mv_packed_p.def_sharding_rule(_sharding.fixed_num_packed_rule)
binary_fixed_num_mv_packed_p.def_benchmark_data(
    _scaffold.lazy_benchmark_data("primforge.ops.fixed_num.bench", "packed"))


def binary_fixed_num_mv_packed(weights, indices, events, *, shape, transpose=False,
                               backend=None) -> jax.Array:
    """:func:`~primforge.ops.binary_fixed_num_mv` of a packed event vector, read in the kernel.

    ``events`` is a :class:`~primforge.ops.PackedEvents` vector (or a bool vector, packed
    here); ``backend`` 'numba' (CPU default) or 'jax' (the reference, on the CPU). On GPU
    and TPU the words are unpacked and the product runs with ``binary_fixed_num_mv``'s
    backend. With ``transpose`` the kernel visits the set bits only (a zero word skips 32
    rows at once), each scattering its row's ``k`` entries.

    Example:
        >>> import jax.numpy as jnp
        >>> from primforge.ops import pack_events
        >>> e = pack_events(jnp.array([False, True]))
        >>> binary_fixed_num_mv_packed(jnp.array([[1., 2.], [3., 4.]]),
        ...                            jnp.array([[0, 2], [1, 2]]), e, shape=(2, 3),
        ...                            transpose=True)
        Array([0., 3., 4.], dtype=float32)
    """
    if not isinstance(events, PackedEvents):
        from primforge.ops.packed import pack_events

        events = pack_events(events)
    shape = _scaffold.check_shape(shape, _WHO)
    weights = _scaffold.float_weights(weights, who=_WHO)
    indices = _scaffold.index_array(indices, _WHO, "indices")
    return binary_fixed_num_mv_packed_p(weights, indices, events.words, shape=shape,
                                        transpose=bool(transpose), n=int(events.n),
                                        backend=backend)


binary_fixed_num_mv_packed_p.def_call(binary_fixed_num_mv_packed)
_api.PACKED_PRODUCT[:] = [binary_fixed_num_mv_packed]
