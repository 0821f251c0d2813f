"""Pallas (Triton) kernels for the dense event products, on the GPU and, interpreted, on the CPU.

Both directions are gathers (each program writes its own outputs) that read weights only
where the input is non-zero.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from primforge.ops._pallas_common import compiler_params, values

__all__ = ["BLOCK_COLS", "BLOCK_M", "BLOCK_N", "generator"]

BLOCK_N = 128  # entries of a row (W @ x) or output columns (W.T @ x) per chunk
BLOCK_M = 32  # rows of W per chunk for W.T @ x with a vector input
BLOCK_COLS = 32  # most input columns per program


def _program(binary, transpose, *, m, n, cols, dtype, platform, wide):
    # Long by design: one Pallas program per direction (its body closes over the block
    # sizes and the variant's flags, which Triton specialises on) plus its grid and call.
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu

    bcols = min(BLOCK_COLS, pl.next_power_of_2(cols))
    col_blocks = -(-cols // bcols)
    itype = jnp.int64 if wide else jnp.int32

    def col_vector():
        cvec = pl.program_id(1) * bcols + jnp.arange(bcols, dtype=jnp.int32)
        return cvec, cvec < cols

    def x_offsets(rows, cvec):
        return rows.astype(itype) * cols + cvec.astype(itype)

    def w_offsets(rows, jvec):
        return rows.astype(itype) * n + jvec.astype(itype)

    if not transpose:
        block = min(BLOCK_N, pl.next_power_of_2(n))
        chunks = -(-n // block)

        def gather(w_ref, x_ref, y_ref):
            i = pl.program_id(0)
            cvec, cmask = col_vector()

            def step(c, acc):
                j = c * block + jnp.arange(block, dtype=jnp.int32)
                both = (j < n)[:, None] & cmask[None, :]
                xv = plgpu.load(x_ref.at[jnp.where(both, x_offsets(j[:, None], cvec[None, :]), 0)],
                                mask=both, other=0)
                act = both & (xv != 0)
                need = jnp.sum(act.astype(jnp.int32), axis=1) > 0  # rows of x with an event
                w = plgpu.load(w_ref.at[jnp.where(need, w_offsets(i, j), 0)], mask=need, other=0)
                terms = w.astype(dtype)[:, None] * values(xv, binary=binary, dtype=dtype)
                return acc + jnp.sum(jnp.where(act, terms, 0), axis=0)

            acc = jax.lax.fori_loop(0, chunks, step, jnp.zeros((bcols,), dtype))
            y_ref[i, pl.ds(pl.program_id(1) * bcols, bcols)] = acc

        def call(weights, x):
            out = jax.ShapeDtypeStruct((m, col_blocks * bcols), dtype)
            y = pl.pallas_call(gather, out_shape=out, grid=(m, col_blocks),
                               interpret=platform == "cpu",
                               compiler_params=compiler_params(platform),
                               name="pf_dense_gather")(weights.reshape(-1), x.reshape(-1))
            return y[:, :cols]

        return call

    block = min(BLOCK_N, pl.next_power_of_2(n))
    out_blocks = -(-n // block)

    if cols == 1:
        rblock = min(BLOCK_M, pl.next_power_of_2(m))
        rchunks = -(-m // rblock)

        def columns(w_ref, x_ref, y_ref):
            jvec = pl.program_id(0) * block + jnp.arange(block, dtype=jnp.int32)
            jmask = jvec < n

            def step(c, acc):
                r = c * rblock + jnp.arange(rblock, dtype=jnp.int32)
                live = r < m
                xv = plgpu.load(x_ref.at[jnp.where(live, r, 0)], mask=live, other=0)
                act = live & (xv != 0)
                tile = act[:, None] & jmask[None, :]
                w = plgpu.load(w_ref.at[jnp.where(tile, w_offsets(r[:, None], jvec[None, :]), 0)],
                               mask=tile, other=0)
                terms = w.astype(dtype) * values(xv, binary=binary, dtype=dtype)[:, None]
                return acc + jnp.sum(jnp.where(tile, terms, 0), axis=0)

            acc = jax.lax.fori_loop(0, rchunks, step, jnp.zeros((block,), dtype))
            y_ref[pl.ds(pl.program_id(0) * block, block), 0] = acc

    else:

        def columns(w_ref, x_ref, y_ref):
            jvec = pl.program_id(0) * block + jnp.arange(block, dtype=jnp.int32)
            jmask = jvec < n
            cvec, cmask = col_vector()

            def step(i, acc):
                xv = plgpu.load(x_ref.at[jnp.where(cmask, x_offsets(i, cvec), 0)], mask=cmask,
                                other=0)
                act = cmask & (xv != 0)
                busy = jnp.sum(act.astype(jnp.int32)) > 0  # no active column: W's row unread
                need = jmask & busy
                w = plgpu.load(w_ref.at[jnp.where(need, w_offsets(i, jvec), 0)], mask=need,
                               other=0)
                terms = w.astype(dtype)[:, None] * values(xv, binary=binary, dtype=dtype)[None, :]
                return acc + jnp.where(need[:, None] & act[None, :], terms, 0)

            acc = jax.lax.fori_loop(0, m, step, jnp.zeros((block, bcols), dtype))
            y_ref[pl.ds(pl.program_id(0) * block, block),
                  pl.ds(pl.program_id(1) * bcols, bcols)] = acc

    def call(weights, x):
        out = jax.ShapeDtypeStruct((out_blocks * block, col_blocks * bcols), dtype)
        y = pl.pallas_call(columns, out_shape=out, grid=(out_blocks, col_blocks),
                           interpret=platform == "cpu",
                           compiler_params=compiler_params(platform),
                           name="pf_dense_columns")(weights.reshape(-1), x.reshape(-1))
        return y[:n, :cols]

    return call


def generator(binary: bool, matrix: bool, fallback):
    """The 'pallas' kernel generator for one dense event product.

    Args:
        binary: the input holds events (non-zero = active).
        matrix: the input is a ``(rows, cols)`` matrix rather than a vector.
        fallback: the pure-JAX generator, used for degenerate sizes.

    Example:
        >>> import jax.numpy as jnp
        >>> from primforge.ops import binary_densemv
        >>> # interpreted on the CPU: the rows of the active events, summed
        >>> binary_densemv(jnp.array([[1., 2.], [3., 4.]]), jnp.array([False, True]),
        ...                transpose=True, backend='pallas')
        Array([3., 4.], dtype=float32)
    """

    def generate(*, ins, outs, transpose, platform, **params):
        weights, x = ins
        m, n = (int(s) for s in weights.shape)
        dtype = np.dtype(outs[0].dtype)
        cols = int(x.shape[1]) if matrix else 1
        if dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
            kind = ("binary_" if binary else "") + ("densemm" if matrix else "densemv")
            raise TypeError(f"{kind}: backend 'pallas' supports float32 or float64 "
                            f"'weights', got {dtype.name}; cast the weights or use "
                            f"backend='jax'")
        if min(m, n, cols) == 0:
            return fallback(ins=ins, outs=outs, transpose=transpose, platform=platform,
                            **params)
        wide = max(m * n, max(m, n) * cols) >= 2**31 - 1
        run = _program(binary, bool(transpose), m=m, n=n, cols=cols, dtype=dtype,
                       platform=platform, wide=wide)
        out_shape = tuple(outs[0].shape)

        def kernel(weights, x):
            if x.dtype == jnp.bool_:
                x = x.astype(jnp.int8)
            return run(weights.astype(dtype), x).reshape(out_shape).astype(dtype)

        return kernel

    return generate
