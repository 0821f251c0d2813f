"""The binary CSR matrix-vector product reading bit-packed events in the kernel.

:func:`~primforge.ops.binary_csrmv` (and ``CSR``/``CSC`` ``@``) sends a packed event vector
here: the kernel takes ``(data, indices, indptr, words)`` with the static ``n`` (events)
besides ``shape`` and ``transpose``, and gives the same values as the product on the
unpacked events, bit for bit on the numba backend.
"""

from __future__ import annotations

import jax
import numpy as np

from primforge.ops import _scaffold, _sharding
from primforge.ops.csr import api as _api
from primforge.ops.csr import structure as _common
from primforge.ops.packed import PackedEvents

__all__ = ["binary_csrmv_packed", "binary_csrmv_packed_p"]

_WHO = "binary_csrmv"


def _numba_generator(*, ins, shape, transpose, n, **_):
    from primforge.ops.csr import numba as _numba_csr

    del shape
    homo = _common.is_homogeneous(ins[0], ins[1])
    wide = np.dtype(ins[1].dtype).itemsize > 4
    return _numba_csr.packed_mv_kernel(bool(transpose), homo, wide, int(n))


def _shape_rule(data, indices, indptr, words, *, shape, transpose, n, **_):
    m, cols = _scaffold.check_shape(shape, _WHO)
    _common.check_csr_args(_WHO, data, indices, indptr, (m, cols))
    _scaffold.check_packed_words(_WHO, (m, cols), transpose, n, words)
    return jax.ShapeDtypeStruct((cols if transpose else m,), data.dtype)


binary_csrmv_packed_p = _api.FAMILY.build_packed(
    jax_gen=_api._jax_generator, numba_gen=_numba_generator, shape_rule=_shape_rule,
    weight_cotangent=_api._weight_cotangent, tags=("csr",), doc=__doc__)
binary_csrmv_packed_p.def_sharding_rule(_sharding.csr_rule)
binary_csrmv_packed_p.def_benchmark_data(
    _scaffold.lazy_benchmark_data("primforge.ops.csr.bench", "packed"))


def binary_csrmv_packed(data, indices, indptr, events, *, shape, transpose=False,
                        backend=None) -> jax.Array:
    """:func:`~primforge.ops.binary_csrmv` of a packed event vector, read in the kernel.

    ``events`` is a :class:`~primforge.ops.PackedEvents` vector (or a bool vector, packed
    here); ``backend`` 'numba' (CPU default) or 'jax' (the reference, on the CPU). On GPU
    and TPU the words are unpacked and the product runs with ``binary_csrmv``'s backend.

    Example:
        >>> import jax.numpy as jnp
        >>> from primforge.ops import pack_events
        >>> e = pack_events(jnp.array([False, True]))
        >>> binary_csrmv_packed(jnp.array([1., 2., 3.]), jnp.array([0, 2, 1]),
        ...                     jnp.array([0, 2, 3]), e, shape=(2, 3), transpose=True)
        Array([0., 3., 0.], dtype=float32)
    """
    if not isinstance(events, PackedEvents):
        from primforge.ops.packed import pack_events

        events = pack_events(events)
    shape = _scaffold.check_shape(shape, _WHO)
    data = _scaffold.float_weights(data, who=_WHO, name="data")
    indices = _scaffold.index_array(indices, _WHO, "indices")
    indptr = _scaffold.index_array(indptr, _WHO, "indptr")
    return binary_csrmv_packed_p(data, indices, indptr, events.words, shape=shape,
                                 transpose=bool(transpose), n=int(events.n), backend=backend)


binary_csrmv_packed_p.def_call(binary_csrmv_packed)
_api.PACKED_PRODUCT[:] = [binary_csrmv_packed]
