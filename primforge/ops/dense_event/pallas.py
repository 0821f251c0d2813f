"""Pallas (Triton) kernels for the dense event products, on the GPU and, interpreted, on the CPU.

Both directions are gathers (each program writes its own outputs) that read weights only
where the input is non-zero.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from primforge.ops import _pallas_common
from primforge.ops._pallas_common import column_block, compiler_params, flat_offsets, values
from primforge.ops.dense_event import api as _api

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
    col_vector = functools.partial(column_block, bcols, cols)
    x_offsets = functools.partial(flat_offsets, cols=cols, wide=wide)
    w_offsets = functools.partial(flat_offsets, cols=n, wide=wide)

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


def _plan(binary: bool, matrix: bool):
    def plan(*, ins, dtype, platform, transpose, **_):
        weights, x = ins
        m, n = (int(s) for s in weights.shape)
        cols = int(x.shape[1]) if matrix else 1
        if min(m, n, cols) == 0:
            return None
        return _program(binary, bool(transpose), m=m, n=n, cols=cols, dtype=dtype,
                        platform=platform, wide=max(m * n, max(m, n) * cols) >= 2**31 - 1)

    return plan


def generator(binary: bool, matrix: bool, fallback):
    """The 'pallas' kernel generator of one dense event product (see
    :func:`~primforge.ops._pallas_common.generator`), ``(weights, x) -> y``.

    Example:
        >>> import jax.numpy as jnp
        >>> from primforge.ops import binary_densemv
        >>> # interpreted on the CPU: the rows of the active events, summed
        >>> binary_densemv(jnp.array([[1., 2.], [3., 4.]]), jnp.array([False, True]),
        ...                transpose=True, backend='pallas')
        Array([3., 4.], dtype=float32)
    """
    return _pallas_common.generator(_api.FAMILY.name(binary, matrix), fallback,
                                    _plan(binary, matrix), weights="'weights'")
