"""Pallas (Triton) kernels for the CSR products, on the GPU and, interpreted, on the CPU.

``W @ x`` is one program per row (a gather); ``W.T @ x`` is one program per source row
that scatters with ``atomic_add`` and skips rows whose input is zero.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from primforge.ops import _pallas_common
from primforge.ops._pallas_common import (
    NUM_WARPS,
    chunks,
    column_block,
    compiler_params,
    flat_offsets,
    row_inputs,
    row_range,
    scatter_add,
    term,
    values,
)
from primforge.ops.csr import api as _api
from primforge.ops.csr import structure as _common

__all__ = ["BLOCK_COLS", "BLOCK_NNZ", "NUM_WARPS", "generator"]

BLOCK_NNZ = 128  # stored entries per chunk for the matvec kernels
BLOCK_NNZ_MM = 32  # stored entries per chunk for the matmat kernels
BLOCK_COLS = 32  # most input columns per program for the matmat kernels


def _entry_chunk(i_ref, d_ref, start, end, c, *, block, n, homo, w0):
    """Columns, in-range mask, weights and bad-index count of one chunk of a row."""
    from jax.experimental.pallas import triton as plgpu

    offs = start + c * block + jnp.arange(block, dtype=start.dtype)
    live = offs < end
    cols = plgpu.load(i_ref.at[offs], mask=live, other=0)
    inside = (cols >= 0) & (cols < n)
    ok = live & inside
    if homo:
        w = jnp.full((block,), w0)
    else:
        w = plgpu.load(d_ref.at[offs], mask=live, other=0)
    bad = jnp.sum((live & ~inside).astype(jnp.int32), dtype=jnp.int32)
    return jnp.where(ok, cols, 0), ok, w, bad


def _matvec(binary, transpose, homo, *, m, n, nnz, dtype, platform):
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu

    block = BLOCK_NNZ
    value = functools.partial(values, binary=binary, dtype=dtype)

    if not transpose:

        def gather(d_ref, i_ref, p_ref, x_ref, y_ref, bad_ref):
            i = pl.program_id(0)
            start, end = row_range(p_ref, i, nnz)
            one = jnp.ones((), dtype)  # a shared weight multiplies the row's sum once

            def step(c, carry):
                acc, bad = carry
                cols, ok, w, b = _entry_chunk(i_ref, d_ref, start, end, c, block=block, n=n,
                                              homo=homo, w0=one)
                xv = value(plgpu.load(x_ref.at[cols], mask=ok, other=0))
                return acc + jnp.where(ok, term(w, xv, binary), 0), bad + b

            init = (jnp.zeros((block,), dtype), jnp.int32(0))
            acc, bad = jax.lax.fori_loop(0, chunks(start, end, block), step, init)
            y_ref[i] = jnp.sum(acc) * d_ref[0] if homo else jnp.sum(acc)
            bad_ref[i] = bad

        def call(data, indices, indptr, x):
            outs = (jax.ShapeDtypeStruct((m,), dtype), jax.ShapeDtypeStruct((m,), jnp.int32))
            return pl.pallas_call(gather, out_shape=outs, grid=(m,),
                                  interpret=platform == "cpu",
                                  compiler_params=compiler_params(platform),
                                  name="pf_csr_gather_mv")(data, indices, indptr, x)

        return call

    def scatter(d_ref, i_ref, p_ref, x_ref, _zeros_ref, y_ref, bad_ref):
        i = pl.program_id(0)
        start, end = row_range(p_ref, i, nnz)
        xi = x_ref[i]
        xv = value(xi)
        w0 = d_ref[0] if homo else None
        trips = jnp.where(xi != 0, chunks(start, end, block), 0)  # inactive rows: no work

        def step(c, bad):
            cols, ok, w, b = _entry_chunk(i_ref, d_ref, start, end, c, block=block, n=n,
                                          homo=homo, w0=w0)
            scatter_add(y_ref, cols, w * xv, ok, platform)
            return bad + b

        bad_ref[i] = jax.lax.fori_loop(0, trips, step, jnp.int32(0))

    def call(data, indices, indptr, x):
        outs = (jax.ShapeDtypeStruct((n,), dtype), jax.ShapeDtypeStruct((m,), jnp.int32))
        zeros = jnp.zeros((n,), dtype)
        return pl.pallas_call(scatter, out_shape=outs, grid=(m,), input_output_aliases={4: 0},
                              interpret=platform == "cpu",
                              compiler_params=compiler_params(platform),
                              name="pf_csr_scatter_mv")(data, indices, indptr, x, zeros)

    return call


def _matmat(binary, transpose, homo, *, m, n, nnz, k, dtype, platform, wide):
    # Long by design: one Pallas program (its body closes over the block sizes and the
    # variant's flags, which Triton specialises on) plus its grid and call.
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu

    block = BLOCK_NNZ_MM
    bcols = min(BLOCK_COLS, pl.next_power_of_2(k))
    col_blocks = -(-k // bcols)
    rows_out = n if transpose else m
    value = functools.partial(values, binary=binary, dtype=dtype)
    col_vector = functools.partial(column_block, bcols, k)
    flat = functools.partial(flat_offsets, cols=k, wide=wide)

    if not transpose:

        def gather(d_ref, i_ref, p_ref, x_ref, y_ref, bad_ref):
            i = pl.program_id(0)
            start, end = row_range(p_ref, i, nnz)
            cvec, cmask = col_vector()
            one = jnp.ones((), dtype)  # a shared weight multiplies the row's sums once

            def step(c, carry):
                acc, bad = carry
                cols, ok, w, b = _entry_chunk(i_ref, d_ref, start, end, c, block=block, n=n,
                                              homo=homo, w0=one)
                both = ok[:, None] & cmask[None, :]
                offs = jnp.where(both, flat(cols[:, None], cvec[None, :]), 0)
                xv = value(plgpu.load(x_ref.at[offs], mask=both, other=0))
                acc = acc + jnp.sum(jnp.where(both, term(w[:, None], xv, binary), 0), axis=0)
                return acc, bad + b

            init = (jnp.zeros((bcols,), dtype), jnp.int32(0))
            acc, bad = jax.lax.fori_loop(0, chunks(start, end, block), step, init)
            acc = acc * d_ref[0] if homo else acc
            # Rows of the output are padded to whole column blocks, so this store needs no mask.
            y_ref[i, pl.ds(pl.program_id(1) * bcols, bcols)] = acc
            bad_ref[i, pl.program_id(1)] = bad

        def call(data, indices, indptr, x):
            outs = (jax.ShapeDtypeStruct((m, col_blocks * bcols), dtype),
                    jax.ShapeDtypeStruct((m, col_blocks), jnp.int32))
            y, bad = pl.pallas_call(gather, out_shape=outs, grid=(m, col_blocks),
                                    interpret=platform == "cpu",
                                    compiler_params=compiler_params(platform),
                                    name="pf_csr_gather_mm")(data, indices, indptr, x.reshape(-1))
            return y[:, :k], bad

        return call

    def scatter(d_ref, i_ref, p_ref, x_ref, _zeros_ref, y_ref, bad_ref):
        i = pl.program_id(0)
        start, end = row_range(p_ref, i, nnz)
        cvec, act, xv, busy = row_inputs(x_ref, i, bcols, k, wide, value)
        w0 = d_ref[0] if homo else None
        trips = jnp.where(busy, chunks(start, end, block), 0)  # no active column: no work

        def step(c, bad):
            cols, ok, w, b = _entry_chunk(i_ref, d_ref, start, end, c, block=block, n=n,
                                          homo=homo, w0=w0)
            both = ok[:, None] & act[None, :]
            offs = jnp.where(both, flat(cols[:, None], cvec[None, :]), 0)
            scatter_add(y_ref, offs, w[:, None] * xv[None, :], both, platform)
            return bad + b

        bad_ref[i, pl.program_id(1)] = jax.lax.fori_loop(0, trips, step, jnp.int32(0))

    def call(data, indices, indptr, x):
        outs = (jax.ShapeDtypeStruct((rows_out * k,), dtype),
                jax.ShapeDtypeStruct((m, col_blocks), jnp.int32))
        zeros = jnp.zeros((rows_out * k,), dtype)
        return pl.pallas_call(scatter, out_shape=outs, grid=(m, col_blocks),
                              input_output_aliases={4: 0}, interpret=platform == "cpu",
                              compiler_params=compiler_params(platform),
                              name="pf_csr_scatter_mm")(data, indices, indptr, x.reshape(-1),
                                                        zeros)

    return call


def _plan(binary: bool, matrix: bool):
    def plan(*, ins, dtype, platform, shape, transpose, **_):
        m, n = (int(s) for s in shape)
        data, indices, _indptr, x = ins
        nnz = int(indices.shape[0])
        k = int(x.shape[1]) if matrix else 1
        if min(m, n, nnz, k) == 0:
            return None
        homo = _common.is_homogeneous(data, indices)
        if matrix:
            wide = max(m, n) * k >= 2**31 - 1
            run = _matmat(binary, bool(transpose), homo, m=m, n=n, nnz=nnz, k=k, dtype=dtype,
                          platform=platform, wide=wide)
        else:
            run = _matvec(binary, bool(transpose), homo, m=m, n=n, nnz=nnz, dtype=dtype,
                          platform=platform)

        def product(data, indices, indptr, x):
            y, bad = run(data, indices, indptr, x)
            ok = _common.indptr_ok(indptr, nnz) & (jnp.sum(bad) == 0)
            return jnp.where(ok, y, jnp.nan)

        return product

    return plan


def generator(binary: bool, matrix: bool, fallback):
    """The 'pallas' kernel generator of one CSR product (see
    :func:`~primforge.ops._pallas_common.generator`), ``(data, indices, indptr, x) -> y``.

    Example:
        >>> import jax.numpy as jnp, primforge
        >>> from primforge.ops import csrmv
        >>> # W = [[1, 0, 2], [0, 3, 0]]; the Pallas kernel, interpreted on the CPU
        >>> csrmv(jnp.array([1., 2., 3.]), jnp.array([0, 2, 1]), jnp.array([0, 2, 3]),
        ...       jnp.array([1., 1., 1.]), shape=(2, 3), backend='pallas')
        Array([3., 3.], dtype=float32)
    """
    return _pallas_common.generator(_api.FAMILY.name(binary, matrix), fallback,
                                    _plan(binary, matrix))
