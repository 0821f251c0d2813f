"""What the Pallas (Triton) kernels of every operator family share.

The generator around each family's programs (:func:`generator`: the weight dtypes the GPU
kernels accept, degenerate sizes, bool inputs), compiler parameters, masked row ranges and
column blocks, the summand of one stored entry, and the scatter-add that is exact when
interpreted on the CPU.
"""

from __future__ import annotations

from collections.abc import Callable

import jax.numpy as jnp
import numpy as np

__all__ = [
    "NUM_WARPS",
    "check_float_weights",
    "chunks",
    "column_block",
    "compiler_params",
    "flat_offsets",
    "generator",
    "row_inputs",
    "row_range",
    "scatter_add",
    "term",
    "values",
]

NUM_WARPS = 4  # warps per Triton program


def compiler_params(platform: str):
    """Triton's compiler parameters on 'gpu'; None when interpreted on 'cpu'."""
    if platform == "cpu":
        return None
    from jax.experimental.pallas import triton as plgpu

    return plgpu.CompilerParams(num_warps=NUM_WARPS, num_stages=1)


def row_range(p_ref, i, nnz):
    """Row ``i``'s stored-entry range, clamped to ``[0, nnz]`` and never decreasing."""
    start = jnp.clip(p_ref[i], 0, nnz)
    end = jnp.clip(p_ref[i + 1], start, nnz)
    return start, end


def chunks(start, end, block):
    """How many chunks of ``block`` entries cover ``[start, end)``."""
    return (end - start + block - 1) // block


def term(w, xv, binary):
    """One gathered summand: the weight of an active binary event (a select, so that an
    inactive event's weight, even NaN or inf, never enters), else weight times input."""
    return jnp.where(xv != 0, w, 0) if binary else w * xv


def values(v, *, binary, dtype):
    """Input entries as summands: 1/0 for binary events, else the value in ``dtype``."""
    return (v != 0).astype(dtype) if binary else v.astype(dtype)


def scatter_add(y_ref, offs, vals, mask, platform):
    """``y[offs] += vals`` where ``mask``: atomics on the GPU, an exact sum when interpreted.

    Pallas' interpreter has no masked atomics and keeps only one of several updates to the
    same offset, so on 'cpu' (programs run one after another) the whole buffer is updated
    with a scatter-add instead. The GPU path is what ``atomic_add`` means on hardware.
    """
    if platform == "cpu":
        y_ref[...] = y_ref[...].at[offs].add(jnp.where(mask, vals, 0))
        return
    from jax.experimental.pallas import triton as plgpu

    plgpu.atomic_add(y_ref, offs, vals, mask=mask)


def generator(who: str, fallback: Callable, plan: Callable, *,
              weights: str = "weights ('data')") -> Callable:
    """The 'pallas' generator of one product: what every family's Pallas products share
    around their programs.

    Args:
        who: the product's name, for errors.
        fallback: the product's ``jax`` generator, used for degenerate sizes.
        plan: ``plan(*, ins, outs, dtype, platform, **params) -> run``: the product
            ``run(*operands)`` for the sizes of ``ins`` (any shape of the output's size), or
            None for degenerate sizes.
        weights: how the error for weights other than float32 or float64 names them.

    Returns:
        A generator whose kernel hands ``run`` a bool input as int8 and gives its result
        in the output's shape and dtype.
    """

    def generate(*, ins, outs, platform, **params):
        dtype = np.dtype(outs[0].dtype)
        check_float_weights(who, "pallas", dtype, weights)
        run = plan(ins=ins, outs=outs, dtype=dtype, platform=platform, **params)
        if run is None:
            return fallback(ins=ins, outs=outs, platform=platform, **params)
        shape = tuple(outs[0].shape)

        def kernel(*operands):
            *rest, x = operands
            x = x.astype(jnp.int8) if x.dtype == jnp.bool_ else x
            return run(*rest, x).reshape(shape).astype(dtype)

        return kernel

    return generate


def column_block(width: int, cols: int):
    """This program's block of ``width`` input columns (grid axis 1), and which exist."""
    from jax.experimental import pallas as pl

    cvec = pl.program_id(1) * width + jnp.arange(width, dtype=jnp.int32)
    return cvec, cvec < cols


def flat_offsets(rows, cvec, cols: int, wide: bool):
    """Offsets of ``(rows, cvec)`` pairs in a row-major ``(*, cols)`` array, flattened; in
    int64 when ``wide`` (past the int32 range)."""
    if wide:
        rows, cvec = rows.astype(jnp.int64), cvec.astype(jnp.int64)
    return rows * cols + cvec


def row_inputs(x_ref, i, width: int, cols: int, wide: bool, value: Callable):
    """Row ``i`` of a ``(*, cols)`` input in this program's block of ``width`` columns: the
    columns, which of them are active (non-zero), their summands (``value``), and whether
    any is active (a row with none does no work)."""
    from jax.experimental.pallas import triton as plgpu

    cvec, cmask = column_block(width, cols)
    xi = plgpu.load(x_ref.at[jnp.where(cmask, flat_offsets(i, cvec, cols, wide), 0)],
                    mask=cmask, other=0)
    act = cmask & (xi != 0)
    return cvec, act, value(xi), jnp.sum(act.astype(jnp.int32), dtype=jnp.int32) > 0


def check_float_weights(kind: str, backend: str, dtype, weights: str = "weights ('data')"
                        ) -> None:
    """Raise a clear error unless ``dtype`` is float32 or float64 (the GPU kernels' types).

    Example:
        >>> check_float_weights('csrmv', 'pallas', np.float16)
        Traceback (most recent call last):
        ...
        TypeError: csrmv: backend 'pallas' supports float32 or float64 weights ('data'),
        got float16; cast the weights or use backend='jax'
    """
    dtype = np.dtype(dtype)
    if dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise TypeError(
            f"{kind}: backend {backend!r} supports float32 or float64 {weights}, got "
            f"{dtype.name}; cast the weights or use backend='jax'"
        )
