"""The four fixed-number product kernels and their public calls.

Each kernel takes ``(weights, indices, x)`` and the static params ``shape`` and
``transpose``: ``A @ x`` gathers ``k`` inputs per row, ``A.T @ x`` scatters the entries of
each row whose input is non-zero.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from primforge.ops import _scaffold, _sharding
from primforge.ops.fixed_num import grad as _fixed_num_grad

__all__ = [
    "binary_fixed_num_mm",
    "binary_fixed_num_mm_p",
    "binary_fixed_num_mv",
    "binary_fixed_num_mv_p",
    "fixed_num_mm",
    "fixed_num_mm_p",
    "fixed_num_mv",
    "fixed_num_mv_p",
]

FAMILY = _scaffold.Family(
    "fixed_num", ("fixed_num_mv", "fixed_num_mm"), params=("shape", "transpose"),
    what="fixed-number products", structure="'indices'", letter="A", cols="cols",
    ops=("A @ x", "A.T @ x"), dims=("m", "n"), doc=__doc__)
KERNELS = FAMILY.kernels  # (binary, matrix) -> kernel


def safe_indices(indices, n: int):
    """``indices`` with every entry outside ``[0, n)`` replaced by ``n`` (dropped/filled)."""
    ok = (indices >= 0) & (indices < n)
    return jnp.where(ok, indices, n), ok


# ----------------------------------------------------------------------------- backends
def _jax_generator(binary: bool, matrix: bool):
    def generate(*, ins, outs, shape, transpose, **_):
        _m, n = shape
        dtype = outs[0].dtype
        shared = len(ins[0].shape) == 1

        def kernel(weights, indices, x):
            ev = (x != 0).astype(dtype) if binary else x.astype(dtype)
            w = weights.astype(dtype)
            w = w[0] if shared else (w[..., None] if matrix else w)
            # A.T @ x adds w_ij x_i for the active sources only, binary A @ e sums the
            # weights of active events only (a weight, even NaN or inf, of an inactive
            # input never enters); float A @ x multiplies every stored weight by its input,
            # and a shared weight multiplies each row's summed input once.
            if transpose:  # out[indices[i, j]] += w_ij x[i]
                safe, _ = safe_indices(indices, outs[0].shape[0])
                src = ev[:, None, :] if matrix else ev[:, None]
                contrib = jnp.where(src != 0, w * src, 0)
                contrib = jnp.broadcast_to(contrib, indices.shape + tuple(ev.shape[1:]))
                return jnp.zeros(outs[0].shape, dtype).at[safe].add(contrib, mode="drop")
            safe, _ = safe_indices(indices, n)  # out[i] = sum_j w_ij x[indices[i, j]]
            got = _scaffold.take_fill(ev, safe)
            if shared:
                return (jnp.sum(got, axis=1) * w).astype(dtype)
            return jnp.sum(jnp.where(got != 0, w, 0) if binary else w * got, axis=1).astype(dtype)

        return kernel

    return generate


def _numba_generator(binary: bool, matrix: bool):
    def generate(*, ins, transpose, **_):
        from primforge.ops.fixed_num import numba as _numba_fixed_num

        make = _numba_fixed_num.mm_kernel if matrix else _numba_fixed_num.mv_kernel
        return make(binary, bool(transpose), len(ins[0].shape) == 1)

    return generate


def _parallel_generator(binary: bool, matrix: bool):
    """The opt-in ``numba_parallel`` CPU backend: ``A @ x`` (vector) with its rows over
    Numba's threads; the other variants (scatters, matrices) are the serial kernels."""

    def generate(*, ins, outs, transpose, **_):
        from primforge.backends.numba import numba_kernel
        from primforge.ops.csr import numba as _numba_csr
        from primforge.ops.fixed_num import numba as _numba_fixed_num

        homo = len(ins[0].shape) == 1
        if matrix or transpose:
            fn = (_numba_fixed_num.mm_kernel if matrix else _numba_fixed_num.mv_kernel)(
                binary, bool(transpose), homo)
            return numba_kernel(fn, outs=list(outs))
        _numba_csr.parallel_threading_layer()
        fn = _numba_fixed_num.mv_kernel(binary, False, homo, parallel=True)
        return numba_kernel(fn, outs=list(outs), name=f"{fn.__name__}_parallel")

    return generate


# ----------------------------------------------------------------------------- shape rule
def check_structure_args(who, weights, indices, shape):
    m, _n = shape
    ishape = tuple(jnp.shape(indices))
    if len(ishape) != 2:
        raise ValueError(f"{who}: 'indices' must be 2-D (rows, k), got shape {ishape}")
    if not jnp.issubdtype(jnp.result_type(indices), jnp.integer):
        raise TypeError(
            f"{who}: 'indices' must be an integer array, got {jnp.result_type(indices)}")
    if ishape[0] != m:
        raise ValueError(
            f"{who}: 'indices' must have {m} rows (shape ({m}, k)) for the stored shape "
            f"{tuple(shape)}, got {ishape}"
        )
    if not jnp.issubdtype(jnp.result_type(weights), jnp.floating):
        raise TypeError(f"{who}: 'weights' must be floating point, got {jnp.result_type(weights)}")
    wshape = tuple(jnp.shape(weights))
    if wshape != (1,) and wshape != ishape:
        raise ValueError(
            f"{who}: 'weights' must have shape {ishape} (one per entry, like 'indices': the "
            f"same k) or (1,) (one shared weight), got {wshape}"
        )


def _shape_rule(binary: bool, matrix: bool):
    who = FAMILY.name(binary, matrix)

    def rule(weights, indices, x, *, shape, transpose, **_):
        m, n = _scaffold.check_shape(shape, who)
        check_structure_args(who, weights, indices, (m, n))
        return FAMILY.output(who, x, (m, n), weights.dtype, binary=binary, matrix=matrix,
                             transpose=transpose)

    return rule


# ----------------------------------------------------------------------------- rules
def _weight_cotangent(binary, matrix, ct, w_aval, structure, x, *, shape, transpose, backend):
    """d<ct, A x>/d weights for a shared or a per-entry weight."""
    (indices,) = structure
    if len(w_aval.shape) == 1:  # <ct, (w P) x> = w <ct, P x>: one more event-driven call
        return _scaffold.unit_weight_cotangent(
            lambda e: FAMILY.call(binary, matrix, e, indices, x, shape=shape,
                                  transpose=transpose, backend=backend), ct, w_aval.dtype, 1)
    if backend in (None, "numba", "numba_parallel", "jax"):  # one kernel: one pass on the CPU
        return _fixed_num_grad.weight_grad(binary, matrix, ct, x, indices, transpose=transpose,
                                           dtype=w_aval.dtype, backend=backend)
    ev = (x != 0).astype(ct.dtype) if binary else x.astype(ct.dtype)
    if transpose:  # y[indices[i, j]] += w_ij x[i]
        safe, _ = safe_indices(indices, ct.shape[0])
        a = ev[:, None, :] if matrix else ev[:, None]
        b = _scaffold.take_fill(ct, safe)
    else:  # y[i] += w_ij x[indices[i, j]]
        safe, _ = safe_indices(indices, shape[1])
        a = ct[:, None, :] if matrix else ct[:, None]
        b = _scaffold.take_fill(ev, safe)
    g = jnp.sum(a * b, axis=-1) if matrix else a * b
    return g.astype(w_aval.dtype)


FAMILY.build(jax_gen=_jax_generator, numba_gen=_numba_generator,
             pallas_module="primforge.ops.fixed_num.pallas", shape_rule=_shape_rule,
             weight_cotangent=_weight_cotangent, tags=("fixed_num", "sparse"))
_sharding.install(FAMILY.kernels.values(), _sharding.fixed_num_rule)
for (_binary, _matrix), _kernel in FAMILY.kernels.items():
    _kernel.def_kernel("numba_parallel", "cpu", _parallel_generator(_binary, _matrix))
del _binary, _matrix, _kernel
fixed_num_mv_p = KERNELS[(False, False)]
binary_fixed_num_mv_p = KERNELS[(True, False)]
fixed_num_mm_p = KERNELS[(False, True)]
binary_fixed_num_mm_p = KERNELS[(True, True)]


# ----------------------------------------------------------------------------- public calls
def _signature(weights: Any, indices: Any, x: Any, *, shape: tuple[int, int],
               transpose: bool = False, backend: str | None = None) -> jax.Array:
    """The products' signature, ``x`` their input."""


def _operands(who: str, args: dict) -> tuple:
    """The checked weights, structure and static params of a call."""
    shape = _scaffold.check_shape(args["shape"], who)
    weights = _scaffold.float_weights(args["weights"], who=who)
    indices = _scaffold.index_array(args["indices"], who, "indices")
    return weights, (indices,), {"shape": shape, "transpose": bool(args["transpose"])}


FAMILY.def_public(_signature, _operands, {
    "weights": "one weight per entry, shape ``(m, k)`` like ``indices``, or a scalar / "
               "``(1,)`` shared by every entry.",
    "indices": "``(m, k)`` integers: row ``i`` of ``A`` has entries in columns "
               "``indices[i, :]`` (repeats add up). An index outside ``[0, n)`` is masked "
               "(the entry is skipped, never read or written); validate once with "
               ":meth:`~primforge.ops.FixedNum.from_indices`.",
    "shape": "``(m, n)`` of the stored matrix ``A``.",
    "transpose": "compute ``A.T @ x`` (scatter; only rows with a non-zero input cost work).",
    "backend": "'numba' (CPU default), 'jax' (reference; GPU/TPU default) or 'pallas' "
               "(Triton on the GPU, interpreted on the CPU; opt-in).",
    "returns": "The product, dtype of ``weights``.",
})

fixed_num_mv = FAMILY.public(False, False, __name__, """
    ``A @ v`` (or ``A.T @ v``) for a fixed-number matrix ``A`` and a float vector.

    {args}

    Example:
        >>> import jax.numpy as jnp
        >>> # A = [[1, 0, 2], [0, 3, 4]]: k = 2 entries per row
        >>> fixed_num_mv(jnp.array([[1., 2.], [3., 4.]]), jnp.array([[0, 2], [1, 2]]),
        ...              jnp.array([1., 1., 1.]), shape=(2, 3))
        Array([3., 7.], dtype=float32)
    """)

binary_fixed_num_mv = FAMILY.public(True, False, __name__, """
    ``A @ (e != 0)`` (or ``A.T @ (e != 0)``) for binary events (bool, int or float).

    {args}

    Example:
        >>> import jax.numpy as jnp
        >>> # row 1 fires: its k = 2 targets get the shared weight 0.5
        >>> binary_fixed_num_mv(0.5, jnp.array([[0, 2], [1, 2]]), jnp.array([False, True]),
        ...                     shape=(2, 3), transpose=True)
        Array([0. , 0.5, 0.5], dtype=float32)
    """)

fixed_num_mm = FAMILY.public(False, True, __name__, """
    ``A @ B`` (or ``A.T @ B``) for a fixed-number matrix ``A`` and a float matrix ``B``.

    {args}

    Example:
        >>> import jax.numpy as jnp
        >>> fixed_num_mm(1.0, jnp.array([[0, 2], [1, 2]]), jnp.ones((3, 2)), shape=(2, 3))
        Array([[2., 2.],
               [2., 2.]], dtype=float32)
    """)

binary_fixed_num_mm = FAMILY.public(True, True, __name__, """
    ``A @ E`` (or ``A.T @ E``) for a matrix of binary events (one event vector per column).

    {args}

    Example:
        >>> import jax.numpy as jnp
        >>> binary_fixed_num_mm(1.0, jnp.array([[0, 2], [1, 2]]),
        ...                     jnp.array([[True, False], [True, True]]), shape=(2, 3),
        ...                     transpose=True)
        Array([[1., 0.],
               [1., 1.],
               [2., 1.]], dtype=float32)
    """)


# ----------------------------------------------------------------------------- benchmark hooks
FAMILY.install("primforge.ops.fixed_num.bench")
