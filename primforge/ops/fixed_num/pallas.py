"""Pallas (Triton) kernels for the fixed-number products, on the GPU and, interpreted, on CPU.

The grid is ``(m, column blocks)``; ``A @ x`` gathers, ``A.T @ x`` scatters with
``atomic_add``; out-of-range indices are masked.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from primforge.ops import _pallas_common
from primforge.ops._pallas_common import (
    column_block,
    compiler_params,
    flat_offsets,
    row_inputs,
    scatter_add,
    term,
    values,
)
from primforge.ops.fixed_num import api as _api

__all__ = ["BLOCK_COLS", "BLOCK_K", "generator"]

BLOCK_K = 32  # entries of a row per chunk
BLOCK_COLS = 32  # most input columns per program


def _program(binary, transpose, homo, *, m, n, k, cols, dtype, platform, wide):
    # Long by design: one Pallas program (its body closes over the block sizes and the
    # variant's flags, which Triton specialises on) plus its grid and call.
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu

    block = min(BLOCK_K, pl.next_power_of_2(k))
    bcols = min(BLOCK_COLS, pl.next_power_of_2(cols))
    col_blocks = -(-cols // bcols)
    chunks = -(-k // block)
    rows_out = n if transpose else m
    value = functools.partial(values, binary=binary, dtype=dtype)
    col_vector = functools.partial(column_block, bcols, cols)
    flat = functools.partial(flat_offsets, cols=cols, wide=wide)

    def entries(w_ref, i_ref, i, c, w0):
        """Targets, mask and weights of chunk ``c`` of row ``i`` (masked, never out of range)."""
        pos = c * block + jnp.arange(block, dtype=jnp.int32)
        live = pos < k
        offs = jnp.where(live, i * k + pos, 0)
        tgt = plgpu.load(i_ref.at[offs], mask=live, other=0)
        ok = live & (tgt >= 0) & (tgt < n)  # masked, like every backend
        w = jnp.full((block,), w0) if homo else plgpu.load(w_ref.at[offs], mask=live, other=0)
        return jnp.where(ok, tgt, 0), ok, w.astype(dtype)

    if not transpose:

        def gather(w_ref, i_ref, x_ref, y_ref):
            i = pl.program_id(0)
            cvec, cmask = col_vector()
            one = jnp.ones((), dtype)  # a shared weight multiplies the row's sums once

            def step(c, acc):
                tgt, ok, w = entries(w_ref, i_ref, i, c, one)
                both = ok[:, None] & cmask[None, :]
                offs = jnp.where(both, flat(tgt[:, None], cvec[None, :]), 0)
                xv = value(plgpu.load(x_ref.at[offs], mask=both, other=0))
                return acc + jnp.sum(jnp.where(both, term(w[:, None], xv, binary), 0), axis=0)

            acc = jax.lax.fori_loop(0, chunks, step, jnp.zeros((bcols,), dtype))
            acc = acc * w_ref[0].astype(dtype) if homo else acc
            y_ref[i, pl.ds(pl.program_id(1) * bcols, bcols)] = acc

        def call(weights, indices, x):
            out = jax.ShapeDtypeStruct((m, col_blocks * bcols), dtype)
            y = pl.pallas_call(gather, out_shape=out, grid=(m, col_blocks),
                               interpret=platform == "cpu",
                               compiler_params=compiler_params(platform),
                               name="pf_fixed_num_gather")(weights.reshape(-1),
                                                           indices.reshape(-1), x.reshape(-1))
            return y[:, :cols]

        return call

    def scatter(w_ref, i_ref, x_ref, _zeros_ref, y_ref):
        i = pl.program_id(0)
        cvec, act, xv, busy = row_inputs(x_ref, i, bcols, cols, wide, value)
        w0 = w_ref[0] if homo else None
        # No active column in this row: no work. (Both loop bounds int32: Triton's scf.for
        # needs lower and upper bound of one type.)
        trips = jnp.where(busy, jnp.int32(chunks), jnp.int32(0))

        def step(c, carry):
            tgt, ok, w = entries(w_ref, i_ref, i, c, w0)
            both = ok[:, None] & act[None, :]
            offs = jnp.where(both, flat(tgt[:, None], cvec[None, :]), 0)
            scatter_add(y_ref, offs, w[:, None] * xv[None, :], both, platform)
            return carry

        jax.lax.fori_loop(jnp.int32(0), trips, step, jnp.int32(0))

    def call(weights, indices, x):
        out = jax.ShapeDtypeStruct((rows_out * cols,), dtype)
        zeros = jnp.zeros((rows_out * cols,), dtype)
        return pl.pallas_call(scatter, out_shape=out, grid=(m, col_blocks),
                              input_output_aliases={3: 0}, interpret=platform == "cpu",
                              compiler_params=compiler_params(platform),
                              name="pf_fixed_num_scatter")(weights.reshape(-1),
                                                           indices.reshape(-1), x.reshape(-1),
                                                           zeros)

    return call


def _plan(binary: bool, matrix: bool):
    def plan(*, ins, outs, dtype, platform, transpose, **_):
        weights, indices, x = ins
        # The arrays' own sizes, not ``shape``: a sharded call hands a slice of the rows.
        m, k = (int(s) for s in indices.shape)
        n = int(outs[0].shape[0] if transpose else x.shape[0])
        cols = int(x.shape[1]) if matrix else 1
        if min(m, n, k, cols) == 0:
            return None
        return _program(binary, bool(transpose), len(weights.shape) == 1, m=m, n=n, k=k,
                        cols=cols, dtype=dtype, platform=platform,
                        wide=max(m, n) * cols >= 2**31 - 1)

    return plan


def generator(binary: bool, matrix: bool, fallback):
    """The 'pallas' kernel generator of one fixed-number product (see
    :func:`~primforge.ops._pallas_common.generator`), ``(weights, indices, x) -> y``.

    Example:
        >>> import jax.numpy as jnp
        >>> from primforge.ops import fixed_num_mv
        >>> # A = [[1, 0, 2], [0, 3, 4]], interpreted on the CPU
        >>> fixed_num_mv(jnp.array([[1., 2.], [3., 4.]]), jnp.array([[0, 2], [1, 2]]),
        ...              jnp.array([1., 1., 1.]), shape=(2, 3), backend='pallas')
        Array([3., 7.], dtype=float32)
    """
    return _pallas_common.generator(_api.FAMILY.name(binary, matrix), fallback,
                                    _plan(binary, matrix))
