"""The four CSR product kernels and their transformation rules.

``csrmv`` / ``csrmm`` (float input) and ``binary_csrmv`` / ``binary_csrmm`` take
``(data, indices, indptr, x)`` and the static params ``shape`` and ``transpose``; a
``(1,)`` ``data`` is one shared weight.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from primforge.ops import _scaffold, _sharding
from primforge.ops.csr import grad as _csr_grad
from primforge.ops.csr import numba as _numba_csr
from primforge.ops.csr import structure as _common

__all__ = [
    "binary_csrmm",
    "binary_csrmm_p",
    "binary_csrmv",
    "binary_csrmv_p",
    "csrmm",
    "csrmm_p",
    "csrmv",
    "csrmv_p",
]

FAMILY = _scaffold.Family(
    "csr", ("csrmv", "csrmm"), params=("shape", "transpose"), what="CSR products", weights="data",
    structure="'indices' or 'indptr'", doc=__doc__)
KERNELS = FAMILY.kernels  # (binary, matrix) -> kernel


# ----------------------------------------------------------------------------- jax reference
def _jax_generator(binary: bool, matrix: bool):
    def generate(*, ins, outs, shape, transpose, **_):
        m, n = shape
        dtype = outs[0].dtype
        homo = _common.is_homogeneous(ins[0], ins[1])

        def kernel(data, indices, indptr, x):
            nnz = indices.shape[0]
            ev = (x != 0).astype(dtype) if binary else x.astype(dtype)
            rows = _common.row_ids(indptr, nnz)
            w = data[0] if homo else (data[:, None] if matrix else data)
            # x @ W adds w_k x_i for the active sources only, binary W @ e sums the weights
            # of active events only (a weight, even NaN or inf, of an inactive input never
            # enters); float W @ x multiplies every stored weight by its input, and a
            # shared weight multiplies each row's summed input once.
            if transpose:
                # out[indices[k]] += w_k * x[row_k]
                got = _scaffold.take_fill(ev, rows)  # padding: row m, no event
                contrib = jnp.where(got != 0, w * got, 0)
                y = jnp.zeros(outs[0].shape, dtype).at[indices].add(contrib, mode="drop")
            else:
                # out[row_k] += w_k * x[indices[k]]
                got = _scaffold.take_fill(ev, indices)
                contrib = got if homo else (jnp.where(got != 0, w, 0) if binary else w * got)
                y = jax.ops.segment_sum(contrib, rows, num_segments=m)
                y = y * w if homo else y
            ok = _common.structure_ok(indices, indptr, n)
            return jnp.where(ok, y, jnp.nan).astype(dtype)

        return kernel

    return generate


def _numba_generator(binary: bool, matrix: bool):
    def generate(*, ins, outs, transpose, **_):
        from primforge.ops.csr import numba as _numba_csr

        homo = _common.is_homogeneous(ins[0], ins[1])
        make = _numba_csr.mm_kernel if matrix else _numba_csr.mv_kernel
        fn = make(binary, bool(transpose), homo, wide=np.dtype(ins[1].dtype).itemsize > 4)
        if matrix and transpose:  # batch-major: see _numba_csr.scatter_mm_call
            name = ("binary_" if binary else "") + "csrmm_" + fn.__name__
            return _numba_csr.scatter_mm_call(fn, outs[0], name)
        return fn

    return generate


def _cuda_generator(binary: bool, matrix: bool):
    def generate(*, platform, **kw):
        from primforge.ops.csr import cuda as _cuda_csr

        return _cuda_csr.generator(binary, matrix, platform)(**kw)

    return generate


# ----------------------------------------------------------------------------- shape rule
def _shape_rule(binary: bool, matrix: bool):
    kind = FAMILY.name(binary, matrix)

    def rule(data, indices, indptr, x, *, shape, transpose, **_):
        m, n = _scaffold.check_shape(shape, kind)
        _common.check_csr_args(kind, data, indices, indptr, (m, n))
        return FAMILY.output(kind, x, (m, n), data.dtype, binary=binary, matrix=matrix,
                             transpose=transpose)

    return rule


# ----------------------------------------------------------------------------- rules
def _weight_cotangent(binary, matrix, ct, w_aval, structure, x, *, shape, transpose, backend):
    """d<ct, W x>/d data, for the shared-weight and per-synapse layouts."""
    indices, indptr = structure
    if _common.is_homogeneous(w_aval, indices):
        # <ct, (w P) x> = w <ct, P x>: one more event-driven kernel call with unit weight.
        return _scaffold.unit_weight_cotangent(
            lambda e: FAMILY.call(binary, matrix, e, indices, indptr, x, shape=shape,
                                  transpose=transpose, backend=backend), ct, w_aval.dtype, 1)
    # One pass over the stored entries, the structure check folded in (numba on the CPU).
    return _csr_grad.weight_grad(binary, matrix, jnp.asarray(ct), jnp.asarray(x), indices,
                                 indptr, transpose=transpose, dtype=w_aval.dtype,
                                 backend=backend)


FAMILY.build(jax_gen=_jax_generator, numba_gen=_numba_generator, cuda_gen=_cuda_generator,
             pallas_module="primforge.ops.csr.pallas", shape_rule=_shape_rule,
             weight_cotangent=_weight_cotangent, tags=("csr", "sparse"))
for (_binary, _matrix), _kernel in FAMILY.kernels.items():
    # Opt-in: W @ x with rows spread over Numba's threads (tbb/omp layer only).
    _kernel.def_kernel("numba_parallel", "cpu", _numba_csr.parallel_generator(_binary, _matrix))
del _binary, _matrix, _kernel
_sharding.install(FAMILY.kernels.values(), _sharding.csr_rule)
csrmv_p = KERNELS[(False, False)]
binary_csrmv_p = KERNELS[(True, False)]
csrmm_p = KERNELS[(False, True)]
binary_csrmm_p = KERNELS[(True, True)]


# ----------------------------------------------------------------------------- public calls
def _signature(data: Any, indices: Any, indptr: Any, x: Any, *, shape: tuple[int, int],
               transpose: bool = False, backend: str | None = None) -> jax.Array:
    """The products' signature, ``x`` their input."""


def _operands(who: str, args: dict) -> tuple:
    """The checked weights, structure and static params of a call."""
    shape = _scaffold.check_shape(args["shape"], who)
    data = _scaffold.float_weights(args["data"], who=who, name="data")
    structure = tuple(_scaffold.index_array(args[k], who, k) for k in ("indices", "indptr"))
    return data, structure, {"shape": shape, "transpose": bool(args["transpose"])}


FAMILY.def_public(_signature, _operands, {
    "data": "weights, shape ``(nnz,)``, or a scalar / ``(1,)`` shared by every entry.",
    "indices": "column of each stored entry, shape ``(nnz,)``.",
    "indptr": "row offsets, shape ``(rows + 1,)``.",
    "shape": "``(rows, cols)`` of ``W``.",
    "transpose": "compute ``W.T @ x`` (the same as ``x @ W``) for the input ``x``.",
    "backend": "force a backend ('numba', 'jax', 'pallas', 'cuda_raw'); default: numba on "
               "CPU, jax on GPU and TPU.",
    "returns": "The product, dtype of ``data``, ``(rows,)`` or ``(rows, k)`` (``(cols,)`` or "
               "``(cols, k)`` with ``transpose``). NaN everywhere if the structure is "
               "malformed.",
})

csrmv = FAMILY.public(False, False, __name__, """
    Sparse matrix times dense float vector: ``W @ v`` (or ``W.T @ v`` with ``transpose``).

    {args}

    Example:
        >>> import jax.numpy as jnp
        >>> # W = [[1, 0, 2], [0, 3, 0]]
        >>> csrmv(jnp.array([1., 2., 3.]), jnp.array([0, 2, 1]), jnp.array([0, 2, 3]),
        ...       jnp.array([1., 1., 1.]), shape=(2, 3))
        Array([3., 3.], dtype=float32)
    """)

binary_csrmv = FAMILY.public(True, False, __name__, """
    Sparse matrix times binary event vector: ``W @ (e != 0)`` (or ``W.T @ (e != 0)``).

    With ``transpose=True`` (rows of ``W`` are the event sources) the numba kernel only
    visits the rows of active events: work proportional to the number of events.

    {args}

    Example:
        >>> import jax.numpy as jnp
        >>> # W = [[1, 0, 2], [0, 3, 0]]; row 1 is active
        >>> binary_csrmv(jnp.array([1., 2., 3.]), jnp.array([0, 2, 1]), jnp.array([0, 2, 3]),
        ...              jnp.array([False, True]), shape=(2, 3), transpose=True)
        Array([0., 3., 0.], dtype=float32)
    """)

csrmm = FAMILY.public(False, True, __name__, """
    Sparse matrix times dense float matrix: ``W @ B`` (or ``W.T @ B`` with ``transpose``).

    {args}

    Example:
        >>> import jax.numpy as jnp
        >>> csrmm(jnp.array([1., 2., 3.]), jnp.array([0, 2, 1]), jnp.array([0, 2, 3]),
        ...       jnp.ones((3, 2)), shape=(2, 3))
        Array([[3., 3.],
               [3., 3.]], dtype=float32)
    """)

binary_csrmm = FAMILY.public(True, True, __name__, """
    Sparse matrix times a matrix of binary events (one event vector per column).

    {args}

    Example:
        >>> import jax.numpy as jnp
        >>> binary_csrmm(jnp.array([1., 2., 3.]), jnp.array([0, 2, 1]), jnp.array([0, 2, 3]),
        ...              jnp.array([[True, False], [True, True]]), shape=(2, 3), transpose=True)
        Array([[1., 0.],
               [3., 3.],
               [2., 0.]], dtype=float32)
    """)


# ----------------------------------------------------------------------------- benchmark hooks
# Each kernel's call function is its public one above (``kernel.call``, ``kernel.benchmark``);
# its benchmark data the small deterministic cases of ``bench``, loaded only when
# ``primforge bench`` or ``primforge check`` asks for them.
FAMILY.install("primforge.ops.csr.bench")
