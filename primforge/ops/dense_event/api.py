"""Dense-matrix event products: ``W @ x`` and ``x @ W`` that skip inactive inputs.

``densemv`` / ``densemm`` (float input) and ``binary_densemv`` / ``binary_densemm`` take a
dense ``(m, n)`` ``W`` and ``x``; ``transpose=True`` computes ``W.T @ x`` (``x @ W``).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from primforge.ops import _scaffold, _sharding

__all__ = [
    "binary_densemm",
    "binary_densemm_p",
    "binary_densemv",
    "binary_densemv_p",
    "densemm",
    "densemm_p",
    "densemv",
    "densemv_p",
]

FAMILY = _scaffold.Family(
    "dense", ("densemv", "densemm"), params=("transpose",), what="dense event products",
    cols="cols", ops=("W @ x", "x @ W"), dims=("m", "n"), doc=__doc__)
KERNELS = FAMILY.kernels  # (binary, matrix) -> kernel


def _jax_generator(binary: bool, matrix: bool):
    def generate(*, outs, transpose, **_):
        dtype = outs[0].dtype

        def kernel(weights, x):
            ev = (x != 0).astype(dtype) if binary else x.astype(dtype)
            w = weights.astype(dtype)
            w = w.T if transpose else w
            y = w @ ev
            # A finite product is the event product; otherwise recompute it so that a
            # non-finite weight at an inactive input is skipped (no 0 * inf = NaN).
            return jax.lax.cond(jnp.all(jnp.isfinite(y)), lambda: y,
                                lambda: _event_product(w, ev)).astype(dtype)

        return kernel

    return generate


def _event_product(w, ev):
    """``w @ ev`` summing only over ``ev != 0``: the finite part as one matmul, and each
    kind of non-finite weight (NaN, +inf, -inf) met by an active input added as a flag."""
    active = (ev != 0).astype(w.dtype)
    finite = jnp.isfinite(w)
    y = jnp.where(finite, w, 0) @ ev
    hits = lambda mask, side: (mask.astype(w.dtype) @ side) > 0
    pos, neg = (ev > 0).astype(w.dtype), (ev < 0).astype(w.dtype)
    up = hits(w == jnp.inf, pos) | hits(w == -jnp.inf, neg)
    down = hits(w == -jnp.inf, pos) | hits(w == jnp.inf, neg)
    nan = hits(jnp.isnan(w), active)
    inf = jnp.asarray(jnp.inf, w.dtype)
    return y + jnp.where(up, inf, 0) - jnp.where(down, inf, 0) + jnp.where(nan, jnp.nan, 0)


def _numba_generator(binary: bool, matrix: bool):
    def generate(*, transpose, **_):
        from primforge.ops.dense_event import numba as _numba_dense_event

        make = _numba_dense_event.mm_kernel if matrix else _numba_dense_event.mv_kernel
        return make(binary, bool(transpose))

    return generate


def _shape_rule(binary: bool, matrix: bool):
    who = FAMILY.name(binary, matrix)

    def rule(weights, x, *, transpose, **_):
        if len(weights.shape) != 2:
            raise ValueError(f"{who}: 'weights' must be a 2-D (m, n) matrix, got shape "
                             f"{tuple(weights.shape)}")
        if not jnp.issubdtype(weights.dtype, jnp.floating):
            raise TypeError(f"{who}: 'weights' must be floating point, got {weights.dtype}")
        return FAMILY.output(who, x, weights.shape, weights.dtype, binary=binary, matrix=matrix,
                             transpose=transpose)

    return rule


def _weight_cotangent(binary, matrix, ct, w_aval, structure, x, *, transpose, backend):
    """d<ct, W x>/dW: an outer product (a dense matmul for matrix inputs)."""
    ev = (x != 0).astype(ct.dtype) if binary else x.astype(ct.dtype)
    a, b = (ev, ct) if transpose else (ct, ev)  # dW = a b^T
    g = a @ b.T if matrix else jnp.outer(a, b)
    return g.astype(w_aval.dtype)


FAMILY.build(jax_gen=_jax_generator, numba_gen=_numba_generator, shape_rule=_shape_rule,
             weight_cotangent=_weight_cotangent, tags=("dense",),
             pallas_module="primforge.ops.dense_event.pallas")
_sharding.install(FAMILY.kernels.values(), _sharding.dense_rule)
densemv_p = KERNELS[(False, False)]
binary_densemv_p = KERNELS[(True, False)]
densemm_p = KERNELS[(False, True)]
binary_densemm_p = KERNELS[(True, True)]


# ----------------------------------------------------------------------------- public calls
def _signature(weights: Any, x: Any, *, transpose: bool = False,
               backend: str | None = None) -> jax.Array:
    """The products' signature, ``x`` their input."""


def _operands(who: str, args: dict) -> tuple:
    """The checked weights and static params of a call (no structure)."""
    weights = _scaffold.float_weights(args["weights"], scalar_as_vector=False, who=who)
    return weights, (), {"transpose": bool(args["transpose"])}


FAMILY.def_public(_signature, _operands, {
    "weights": "dense ``(m, n)`` float matrix ``W``.",
    "transpose": "compute ``W.T @ x`` (= ``x @ W``) for the input ``x``, the event-driven "
                 "direction for ``W`` of shape ``(n_pre, n_post)``: only the rows of ``W`` "
                 "whose input is non-zero are read.",
    "backend": "'numba' (CPU default), 'jax' (reference; GPU/TPU default) or 'pallas' "
               "(opt-in GPU kernel; interpreted on the CPU).",
    "returns": "The product, dtype of ``weights``.",
})

densemv = FAMILY.public(False, False, __name__, """
    ``W @ v`` (or ``v @ W`` with ``transpose``) skipping the zero entries of ``v``.

    Only non-zero entries of ``v`` contribute, so a NaN or inf weight that meets a zero
    input never enters (unlike a dense ``W @ v``, where ``inf * 0`` is NaN); a NaN entry
    of ``v`` is non-zero and propagates.

    {args}

    Example:
        >>> import jax.numpy as jnp
        >>> densemv(jnp.array([[1., 2.], [3., 4.]]), jnp.array([0., 2.]), transpose=True)
        Array([6., 8.], dtype=float32)
    """)

binary_densemv = FAMILY.public(True, False, __name__, """
    ``W @ (e != 0)`` (or ``(e != 0) @ W``): the summed columns (rows) of active events.

    {args}

    Example:
        >>> import jax.numpy as jnp
        >>> binary_densemv(jnp.array([[1., 2.], [3., 4.]]), jnp.array([True, False]))
        Array([1., 3.], dtype=float32)
    """)

densemm = FAMILY.public(False, True, __name__, """
    ``W @ B`` (or ``W.T @ B``) skipping the zero entries of the float matrix ``B``.

    As :func:`densemv`, column by column: a weight meeting a zero entry never enters.

    {args}

    Example:
        >>> import jax.numpy as jnp
        >>> densemm(jnp.array([[1., 2.], [3., 4.]]), jnp.array([[1., 0.], [0., 0.]]))
        Array([[1., 0.],
               [3., 0.]], dtype=float32)
    """)

binary_densemm = FAMILY.public(True, True, __name__, """
    ``W @ E`` (or ``W.T @ E``) for a matrix of binary events (one event vector per column).

    {args}

    Example:
        >>> import jax.numpy as jnp
        >>> binary_densemm(jnp.array([[1., 2.], [3., 4.]]), jnp.array([[True], [True]]),
        ...                transpose=True)
        Array([[4.],
               [6.]], dtype=float32)
    """)


# ----------------------------------------------------------------------------- benchmark hooks
FAMILY.install("primforge.ops.dense_event.bench")
