"""The gradient of a CSR product w.r.t. its per-synapse weights, as one kernel.

``d<ct, W x>/d w_k = ct[row_k] . ev[col_k]`` (``ev[row_k] . ct[col_k]`` for ``W.T @ x``),
``ev`` being ``x`` or ``x != 0``; a malformed structure gives NaN everywhere.
:func:`build_weight_grad` makes such a kernel; the fixed-number gradient is one too.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from primforge import _compat
from primforge.kernel.kernel import XLACustomKernel
from primforge.ops import _scaffold, _sharding
from primforge.ops.csr import structure as _common

__all__ = ["build_weight_grad", "weight_grad"]

GRAD_BACKENDS = (None, "jax", "numba", "numba_parallel")  # the weight gradients' backends


def build_weight_grad(name: str, reference: Callable, *, numba: Callable, parallel: Callable,
                      sharding: Callable, bench: str, doc: str) -> XLACustomKernel:
    """The kernel of a product's gradient w.r.t. its per-entry weights (this module's, the
    fixed-number one's): operands ``(*structure, ct, x)``, the static params ``binary``,
    ``transpose``, ``matrix`` and ``dtype``, and an output shaped like the structure's
    first operand (the indices).

    ``reference(binary, transpose, matrix, dtype)`` makes the ``jax`` kernel, which also
    gives the JVP (the gradient is linear in ``ct``, and in a float ``x``); ``numba`` and
    ``parallel`` are the generators of the default CPU backend and of the opt-in
    ``numba_parallel``; ``bench`` names the module whose ``weight_grad`` gives the
    benchmark cases. The call function (``kernel.call``) takes the operands, the flags,
    ``dtype`` (default: that of ``ct``) and ``backend`` (one the kernel lacks: the default).
    """
    kernel = XLACustomKernel(name, doc=doc, replace=True)

    def jax_generator(*, outs, binary, transpose, matrix, **_):
        return reference(binary, transpose, matrix, outs[0].dtype)

    def shape_rule(*operands, dtype, **_):
        return jax.ShapeDtypeStruct(tuple(operands[0].shape), np.dtype(dtype))

    def jvp(primals, tangents, *, outs, backend=None, binary, transpose, matrix, dtype, **_):
        *structure, ct, x = primals
        y = kernel(*primals, binary=binary, transpose=transpose, matrix=matrix, dtype=dtype,
                   backend=backend)
        ref = reference(binary, transpose, matrix, np.dtype(dtype))
        zero = lambda p, t: jnp.zeros_like(p) if type(t) is _compat.Zero else t
        d_ct, d_x = zero(ct, tangents[-2]), zero(x, tangents[-1])
        if binary:
            _, t = jax.jvp(lambda c: ref(*structure, c, x), (ct,), (d_ct,))
        else:
            _, t = jax.jvp(lambda c, v: ref(*structure, c, v), (ct, x), (d_ct, d_x))
        return [y], [t]

    def call(*operands, binary, transpose, matrix, dtype=None, backend=None):
        if dtype is None:
            ct = operands[-2]
            dtype = ct.dtype if hasattr(ct, "dtype") else np.asarray(ct).dtype
        return kernel(*(jnp.asarray(a) for a in operands), binary=bool(binary),
                      transpose=bool(transpose), matrix=bool(matrix), dtype=np.dtype(dtype).name,
                      backend=backend if backend in GRAD_BACKENDS else None)

    for platform in ("cpu", "gpu", "tpu"):
        kernel.def_kernel("jax", platform, jax_generator)
    kernel.def_numba_kernel(numba, asdefault=True)
    kernel.def_kernel("numba_parallel", "cpu", parallel)
    kernel.def_abstract_eval(shape_rule)
    kernel.def_jvp_rule(jvp)
    kernel.def_tags("sparse", "gradient")
    kernel.def_sharding_rule(sharding)
    kernel.def_call(call)
    kernel.def_benchmark_data(_scaffold.lazy_benchmark_data(bench, "weight_grad"))
    return kernel


def _reference(binary, transpose, matrix, dtype):
    def kernel(indices, indptr, ct, x):
        nnz = indices.shape[0]
        ev = (x != 0).astype(dtype) if binary else x.astype(dtype)
        by_row, by_col = (ev, ct.astype(dtype)) if transpose else (ct.astype(dtype), ev)
        rows = _common.row_ids(indptr, nnz)
        a = _scaffold.take_fill(by_row, rows)
        b = _scaffold.take_fill(by_col, indices, jnp.nan)
        g = jnp.sum(a * b, axis=-1) if matrix else a * b
        g = jnp.where(_common.live_entries(indptr, nnz), g, 0)  # the padding has no weight
        ok = _common.structure_ok(indices, indptr, by_col.shape[0])
        return jnp.where(ok, g, jnp.nan).astype(dtype)

    return kernel


def _numba_generator(*, ins, binary, transpose, matrix, **_):
    from primforge.ops.csr import numba_grad as _numba_csr

    wide = np.dtype(ins[0].dtype).itemsize > 4
    return _numba_csr.weight_grad_kernel(binary, transpose, matrix, wide)


def _parallel_generator(**kw):
    from primforge.ops.csr import numba_grad as _numba_csr

    return _numba_csr.parallel_weight_grad_generator(**kw)


weight_grad_p = build_weight_grad(
    "primforge.ops.csr_weight_grad", _reference, numba=_numba_generator,
    parallel=_parallel_generator, sharding=_sharding.csr_weight_grad_rule,
    bench="primforge.ops.csr.bench", doc=__doc__)


def weight_grad(binary, matrix, ct, x, indices, indptr, *, transpose, dtype, backend=None):
    """``d<ct, W x>/d data`` for per-synapse weights, shape ``(nnz,)`` (NaN if malformed).

    Example:
        >>> import jax.numpy as jnp
        >>> # W = [[w0, 0, w1], [0, w2, 0]]; y = W @ x
        >>> weight_grad(False, False, jnp.array([1., 2.]), jnp.array([3., 4., 5.]),
        ...             jnp.array([0, 2, 1]), jnp.array([0, 2, 3]), transpose=False,
        ...             dtype='float32')
        Array([3., 5., 8.], dtype=float32)
    """
    return weight_grad_p.call(indices, indptr, ct, x, binary=binary, transpose=transpose,
                              matrix=matrix, dtype=dtype, backend=backend)
