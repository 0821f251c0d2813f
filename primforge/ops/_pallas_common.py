"""What the Pallas (Triton) kernels of every operator family share.

Compiler parameters, masked row ranges, the summand of one stored entry, the scatter-add
that is exact when interpreted on the CPU, and the weight dtypes the GPU kernels accept.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

__all__ = [
    "NUM_WARPS",
    "check_float_weights",
    "chunks",
    "compiler_params",
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


def check_float_weights(kind: str, backend: str, dtype) -> None:
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
            f"{kind}: backend {backend!r} supports float32 or float64 weights ('data'), got "
            f"{dtype.name}; cast the weights or use backend='jax'"
        )
