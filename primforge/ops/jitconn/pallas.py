"""Pallas (Triton) kernels for just-in-time connectivity, on the GPU and interpreted on the CPU.

One program per block of rows, advancing together one synapse per step with the same
generator code as the ``jax`` reference.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from primforge.ops import _pallas_common
from primforge.ops._pallas_common import (
    NUM_WARPS,
    column_block,
    compiler_params,
    scatter_add,
    term,
)
from primforge.ops.jitconn import api as _jc

__all__ = ["BLOCK_COLS", "BLOCK_ROWS", "NUM_WARPS", "generator"]

BLOCK_ROWS = 64  # rows of W per program
BLOCK_ROWS_MM = 32  # rows per program for the matmat kernels
BLOCK_COLS = 16  # most input columns per program for the matmat kernels


def _any(mask):
    return jnp.max(mask.astype(jnp.int32)) > 0


def _build(binary, matrix, transpose, kind, *, m, n, k, k_max, dtype, platform):
    # Long by design: the Pallas body (the generator's loop over synapses, inlined so that
    # Triton specialises on the variant's flags and block sizes) plus its grid and call.
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu

    br = BLOCK_ROWS_MM if matrix else BLOCK_ROWS
    bc = min(BLOCK_COLS, pl.next_power_of_2(k)) if matrix else 1
    row_blocks = -(-m // br)
    col_blocks = -(-k // bc)
    rows_out = n if transpose else m
    n_theta = _jc.WEIGHT_KINDS[kind]

    def value(v):
        return (v != 0).astype(dtype) if binary else v.astype(dtype)

    def body(t_ref, s_ref, tab_ref, x_ref, y_ref):
        rows = pl.program_id(0) * br + jnp.arange(br, dtype=jnp.int32)
        valid = rows < m
        stream = _jc.row_streams(s_ref[0], rows)
        theta = tuple(t_ref[i] for i in range(n_theta))

        def load(idx):
            return plgpu.load(tab_ref.at[idx])

        if matrix:
            cvec, cmask = column_block(bc, k)
        if transpose:
            if matrix:
                both = valid[:, None] & cmask[None, :]
                xi = plgpu.load(x_ref.at[jnp.where(both, rows[:, None] * k + cvec[None, :], 0)],
                                mask=both, other=0)
                act = both & (xi != 0)
                alive0 = jnp.max(act.astype(jnp.int32), axis=1) > 0
            else:
                xi = plgpu.load(x_ref.at[jnp.where(valid, rows, 0)], mask=valid, other=0)
                alive0 = valid & (xi != 0)
            xv = value(xi)
            acc0 = jnp.int32(0)  # unused carry
        else:
            alive0 = valid
            acc0 = jnp.zeros((br, bc) if matrix else (br,), dtype)

        def cond(state):
            return _any(state[2])

        def step(state):
            s, j, alive, acc = state
            j, alive = _jc.next_column(j, alive, _jc.draw(stream, jnp.uint32(3) * s), load,
                                       k_max, n)
            w = _jc.weights(theta, stream, s, kind, dtype)
            if kind == "homo" and not transpose:
                w = jnp.ones_like(w)  # a shared weight multiplies the row's sum once
            jc = jnp.where(alive, j, 0)
            if transpose:
                if matrix:
                    live = alive[:, None] & act
                    offs = jnp.where(live, jc[:, None] * k + cvec[None, :], 0)
                    scatter_add(y_ref, offs, w[:, None] * xv, live, platform)
                else:
                    scatter_add(y_ref, jc, w * xv, alive, platform)
            elif matrix:
                live = alive[:, None] & cmask[None, :]
                offs = jnp.where(live, jc[:, None] * k + cvec[None, :], 0)
                got = value(plgpu.load(x_ref.at[offs], mask=live, other=0))
                acc = acc + jnp.where(live, term(w[:, None], got, binary), 0)
            else:
                got = value(plgpu.load(x_ref.at[jc], mask=alive, other=0))
                acc = acc + jnp.where(alive, term(w, got, binary), 0)
            return s + jnp.uint32(1), j, alive, acc

        init = (jnp.uint32(0), jnp.full((br,), -1, jnp.int32), alive0, acc0)
        acc = jax.lax.while_loop(cond, step, init)[3]
        if kind == "homo" and not transpose:
            acc = acc * theta[0].astype(dtype)
        if not transpose:
            # The output is padded to whole blocks, so every program owns its own lanes and
            # the store needs no mask (masked lanes sharing an offset would race).
            if matrix:
                y_ref[pl.ds(pl.program_id(0) * br, br), pl.ds(pl.program_id(1) * bc, bc)] = acc
            else:
                y_ref[pl.ds(pl.program_id(0) * br, br)] = acc

    grid = (row_blocks, col_blocks) if matrix else (row_blocks,)
    if transpose:
        out = jax.ShapeDtypeStruct((rows_out * k,), dtype)
    elif matrix:
        out = jax.ShapeDtypeStruct((row_blocks * br, col_blocks * bc), dtype)
    else:
        out = jax.ShapeDtypeStruct((row_blocks * br,), dtype)
    name = "pf_jitc_" + ("scatter" if transpose else "gather") + ("_mm" if matrix else "_mv")
    common = {"out_shape": out, "grid": grid, "interpret": platform == "cpu",
              "compiler_params": compiler_params(platform), "name": name}

    if transpose:
        def scatter(t_ref, s_ref, tab_ref, x_ref, _zeros_ref, y_ref):
            body(t_ref, s_ref, tab_ref, x_ref, y_ref)

        def call(theta, seed, table, x):
            zeros = jnp.zeros((rows_out * k,), dtype)
            return pl.pallas_call(scatter, input_output_aliases={4: 0}, **common)(
                theta, seed, table, x.reshape(-1), zeros)

        return call

    def call(theta, seed, table, x):
        y = pl.pallas_call(body, **common)(theta, seed, table, x.reshape(-1))
        return y[:m, :k] if matrix else y[:m]

    return call


def _plan(binary: bool, matrix: bool):
    who = _jc.FAMILY.name(binary, matrix)

    def plan(*, ins, dtype, platform, shape, transpose, weight_kind, block=None, **_):
        if block is not None:
            raise ValueError(f"{who}: backend 'pallas' does not take 'rows' or 'cols' (a block "
                             f"of W); use backend 'jax' or 'numba'")
        m, n = (int(s) for s in shape)
        k = int(ins[3].shape[1]) if matrix else 1
        if min(m, n, k) == 0:
            return None
        if max(m, n) * k >= 2**31 - 1:
            raise ValueError(f"{who}: backend 'pallas' needs rows * k and cols * k below 2**31, "
                             f"got shape {(m, n)} with k={k}")
        return _build(binary, matrix, bool(transpose), weight_kind, m=m, n=n, k=k,
                      k_max=int(ins[2].shape[0]) - 1, dtype=dtype, platform=platform)

    return plan


def generator(binary: bool, matrix: bool, fallback):
    """The 'pallas' kernel generator of one jitc product (see
    :func:`~primforge.ops._pallas_common.generator`), ``(theta, seed, table, x) -> y``.

    Example:
        >>> import numpy as np
        >>> from primforge.ops import jitc_matvec, jitc_todense
        >>> x = np.ones(6, np.float32)  # the Pallas kernel, interpreted on the CPU
        >>> y = jitc_matvec(0.5, 7, x, shape=(4, 6), prob=0.5, backend='pallas')
        >>> np.allclose(y, jitc_todense(7, (4, 6), 0.5, 0.5) @ x)
        True
    """
    return _pallas_common.generator(_jc.FAMILY.name(binary, matrix), fallback,
                                    _plan(binary, matrix))
