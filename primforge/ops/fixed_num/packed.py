"""The binary fixed-number matrix-vector product reading bit-packed events in the kernel.

:func:`~primforge.ops.binary_fixed_num_mv` (and ``FixedNum`` ``@``) sends a packed event
vector here: the kernel takes ``(weights, indices, words)`` with the static ``n`` (events)
besides ``shape`` and ``transpose``, and gives the same values as the product on the
unpacked events, bit for bit on the numba backend.
"""

from __future__ import annotations

from primforge.ops import _sharding, _spikes
from primforge.ops.fixed_num import api as _api

__all__ = ["binary_fixed_num_mv_packed", "binary_fixed_num_mv_packed_p"]


def _numba_generator(*, ins, transpose, n, **_):
    from primforge.ops.fixed_num import numba as _numba_fixed_num

    return _numba_fixed_num.packed_mv_kernel(bool(transpose), len(ins[0].shape) == 1, int(n))


_PACKED = _spikes.packed(
    _api.FAMILY, module=__name__, numba_generator=_numba_generator, tags=("fixed_num",),
    sharding=_sharding.fixed_num_packed_rule, bench="primforge.ops.fixed_num.bench",
    doc=__doc__, call_doc="""
    :func:`~primforge.ops.binary_fixed_num_mv` of a packed event vector, read in the kernel.

    With ``transpose`` the kernel visits the set bits only (a zero word skips 32 rows at
    once), each scattering its row's ``k`` entries.

    {args}

    Example:
        >>> import jax.numpy as jnp
        >>> from primforge.ops import pack_events
        >>> e = pack_events(jnp.array([False, True]))
        >>> binary_fixed_num_mv_packed(jnp.array([[1., 2.], [3., 4.]]),
        ...                            jnp.array([[0, 2], [1, 2]]), e, shape=(2, 3),
        ...                            transpose=True)
        Array([0., 3., 4.], dtype=float32)
    """)
binary_fixed_num_mv_packed_p = _PACKED[0]
binary_fixed_num_mv_packed = _PACKED[1]
