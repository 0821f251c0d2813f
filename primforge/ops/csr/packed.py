"""The binary CSR matrix-vector product reading bit-packed events in the kernel.

:func:`~primforge.ops.binary_csrmv` (and ``CSR``/``CSC`` ``@``) sends a packed event vector
here: the kernel takes ``(data, indices, indptr, words)`` with the static ``n`` (events)
besides ``shape`` and ``transpose``, and gives the same values as the product on the
unpacked events, bit for bit on the numba backend.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from primforge import _compat
from primforge.kernel.kernel import XLACustomKernel
from primforge.ops import _scaffold, _sharding
from primforge.ops.csr import api as _api
from primforge.ops.csr import structure as _common
from primforge.ops.packed import PackedEvents

__all__ = ["binary_csrmv_packed", "binary_csrmv_packed_p"]

_WHO = "binary_csrmv"


def _unpack(words, n):
    return PackedEvents(words, n).unpack()


def _event_aval(n):
    return jax.ShapeDtypeStruct((n,), np.dtype(bool))


def _jax_generator(*, ins, outs, shape, transpose, n, **_):
    ref = _api._jax_generator(True, False)(ins=(*ins[:3], _event_aval(n)), outs=outs,
                                           shape=shape, transpose=transpose)
    return lambda data, indices, indptr, words: ref(data, indices, indptr, _unpack(words, n))


def _delegate_generator(*, shape, transpose, n, **_):
    """On GPU and TPU: the words unpacked, then the product on the unpacked events with
    that kernel's own backend choice (its default, or the one a ``use_backend`` names)."""
    return lambda data, indices, indptr, words: _api.binary_csrmv_p(
        data, indices, indptr, _unpack(words, n), shape=shape, transpose=transpose)


def _numba_generator(*, ins, shape, transpose, n, **_):
    from primforge.ops.csr import numba as _numba_csr

    del shape
    homo = _common.is_homogeneous(ins[0], ins[1])
    wide = np.dtype(ins[1].dtype).itemsize > 4
    return _numba_csr.packed_mv_kernel(bool(transpose), homo, wide, int(n))


def _shape_rule(data, indices, indptr, words, *, shape, transpose, n, **_):
    m, cols = _scaffold.check_shape(shape, _WHO)
    _common.check_csr_args(_WHO, data, indices, indptr, (m, cols))
    want = m if transpose else cols
    n_words = -(-want // 32)
    if int(n) != want or tuple(words.shape) != (n_words,) or words.dtype != np.uint32:
        raise ValueError(f"{_WHO}: packed events for shape {(m, cols)} (transpose="
                         f"{bool(transpose)}) must be {want} events in {n_words} uint32 "
                         f"words, got n = {n} in {words.dtype}{list(words.shape)}")
    return jax.ShapeDtypeStruct((cols if transpose else m,), data.dtype)


def _jvp_rule(primals, tangents, *, outs, backend=None, shape, transpose, n, **_):
    kw = {"shape": shape, "transpose": transpose, "n": n, "backend": backend}
    y = binary_csrmv_packed_p(*primals, **kw)
    if type(tangents[0]) is _compat.Zero:
        return [y], [jnp.zeros_like(y)]
    return [y], [binary_csrmv_packed_p(tangents[0], *primals[1:], **kw)]


def _transpose_rule(cts, data, indices, indptr, words, *, outs, backend=None, shape,
                    transpose, n, **_):
    (ct,) = cts
    none = [None] * 4
    if type(ct) is _compat.Zero or not _compat.is_undefined_primal(data):
        return none
    if any(_compat.is_undefined_primal(a) for a in (indices, indptr, words)):
        raise ValueError(f"{_WHO} is linear in 'data' only")
    ct_w = _api._weight_cotangent(True, False, jnp.asarray(ct), data.aval, (indices, indptr),
                                  _unpack(words, n), shape=shape, transpose=transpose,
                                  backend=backend)
    return [ct_w] + none[1:]


def _batching_rule(args, axes, *, outs, backend=None, shape, transpose, n, **_):
    """``vmap``: the unpacked events of every element in one batched product."""

    def one(data, indices, indptr, words):
        return _api.binary_csrmv_p(data, indices, indptr, _unpack(words, n), shape=shape,
                                   transpose=transpose, backend=backend)

    return [jax.vmap(one, in_axes=tuple(axes))(*args)], [0]


binary_csrmv_packed_p = XLACustomKernel("primforge.ops.binary_csrmv_packed", doc=__doc__,
                                        replace=True)
binary_csrmv_packed_p.def_kernel("jax", "cpu", _jax_generator)
for _platform in ("gpu", "tpu"):
    binary_csrmv_packed_p.def_kernel("unpacked", _platform, _delegate_generator)
binary_csrmv_packed_p.def_numba_kernel(_numba_generator, asdefault=True)
binary_csrmv_packed_p.def_abstract_eval(_shape_rule)
binary_csrmv_packed_p.def_jvp_rule(_jvp_rule)
binary_csrmv_packed_p.def_transpose_rule(_transpose_rule)
binary_csrmv_packed_p.def_batching_rule(_batching_rule)
binary_csrmv_packed_p.def_tags("csr", "sparse", "event", "matvec", "packed")
binary_csrmv_packed_p.def_sharding_rule(_sharding.csr_rule)
binary_csrmv_packed_p.def_benchmark_data(
    _scaffold.lazy_benchmark_data("primforge.ops.csr.bench", "packed"))
del _platform


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
