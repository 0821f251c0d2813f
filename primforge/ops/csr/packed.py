"""The binary CSR matrix-vector product reading bit-packed events in the kernel.

:func:`~primforge.ops.binary_csrmv` (and ``CSR``/``CSC`` ``@``) sends a packed event vector
here: the kernel takes ``(data, indices, indptr, words)`` with the static ``n`` (events)
besides ``shape`` and ``transpose``, and gives the same values as the product on the
unpacked events, bit for bit on the numba backend.
"""

from __future__ import annotations

import numpy as np

from primforge.ops import _sharding, _spikes
from primforge.ops.csr import api as _api
from primforge.ops.csr import structure as _common

__all__ = ["binary_csrmv_packed", "binary_csrmv_packed_p"]


def _numba_generator(*, ins, transpose, n, **_):
    from primforge.ops.csr import numba as _numba_csr

    homo = _common.is_homogeneous(ins[0], ins[1])
    wide = np.dtype(ins[1].dtype).itemsize > 4
    return _numba_csr.packed_mv_kernel(bool(transpose), homo, wide, int(n))


_PACKED = _spikes.packed(
    _api.FAMILY, module=__name__, numba_generator=_numba_generator, tags=("csr",),
    sharding=_sharding.csr_rule, bench="primforge.ops.csr.bench", doc=__doc__, call_doc="""
    :func:`~primforge.ops.binary_csrmv` of a packed event vector, read in the kernel.

    {args}

    Example:
        >>> import jax.numpy as jnp
        >>> from primforge.ops import pack_events
        >>> e = pack_events(jnp.array([False, True]))
        >>> binary_csrmv_packed(jnp.array([1., 2., 3.]), jnp.array([0, 2, 1]),
        ...                     jnp.array([0, 2, 3]), e, shape=(2, 3), transpose=True)
        Array([0., 3., 0.], dtype=float32)
    """)
binary_csrmv_packed_p = _PACKED[0]
binary_csrmv_packed = _PACKED[1]
