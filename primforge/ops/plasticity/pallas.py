"""Pallas (Triton) kernels for the compressed plasticity update (GPU; interpreted on CPU).

One program per stored row; the output aliases the weights, so a synapse no event touches
is never read or written.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from primforge.ops._pallas_common import chunks, compiler_params, row_range
from primforge.ops.csr import structure as _common

__all__ = ["BLOCK_NNZ", "generator"]

BLOCK_NNZ = 128  # stored entries per chunk


def _store(y_ref, offs, vals, mask, *, nnz, platform):
    if platform == "cpu":
        y_ref[...] = y_ref[...].at[jnp.where(mask, offs, nnz)].set(vals, mode="drop")
        return
    from jax.experimental.pallas import triton as plgpu

    plgpu.store(y_ref.at[jnp.where(mask, offs, 0)], vals, mask=mask)


def _chunk(i_ref, start, end, c, *, n):
    """Offsets, column indices (0 where unusable), usable mask and bad count of one chunk."""
    from jax.experimental.pallas import triton as plgpu

    offs = start + c * BLOCK_NNZ + jnp.arange(BLOCK_NNZ, dtype=start.dtype)
    live = offs < end
    cols = plgpu.load(i_ref.at[offs], mask=live, other=0)
    inside = (cols >= 0) & (cols < n)
    ok = live & inside
    bad = jnp.sum((live & ~inside).astype(jnp.int32), dtype=jnp.int32)
    return offs, jnp.where(ok, cols, 0), ok, bad


def _program(on_rows, *, m, n, nnz, lo, hi, platform):
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu

    def body(i_ref, p_ref, s_ref, t_ref, any_ref, _w_ref, y_ref, bad_ref):
        i = pl.program_id(0)
        start, end = row_range(p_ref, i, nnz)
        fires = (s_ref[i] != 0) if on_rows else (any_ref[0] != 0)
        trips = jnp.where(fires, chunks(start, end, BLOCK_NNZ), 0)
        t_row = None if on_rows else t_ref[i]

        def step(c, bad):
            offs, cols, ok, b = _chunk(i_ref, start, end, c, n=n)
            w = plgpu.load(y_ref.at[jnp.where(ok, offs, 0)], mask=ok, other=0)
            if on_rows:
                add, hit = plgpu.load(t_ref.at[cols], mask=ok, other=0), ok
            else:
                hit = ok & (plgpu.load(s_ref.at[cols], mask=ok, other=0) != 0)
                add = jnp.full((BLOCK_NNZ,), t_row)
            _store(y_ref, offs, _common.clip_to(w + add.astype(w.dtype), lo, hi), hit, nnz=nnz,
                   platform=platform)
            return bad + b

        bad_ref[i] = jax.lax.fori_loop(0, trips, step, jnp.int32(0))

    def call(data, indices, indptr, spikes, trace):
        outs = (jax.ShapeDtypeStruct((nnz,), data.dtype), jax.ShapeDtypeStruct((m,), jnp.int32))
        any_fired = jnp.any(spikes != 0).astype(jnp.int32).reshape(1)
        name = "pf_plasticity_rows" if on_rows else "pf_plasticity_cols"
        return pl.pallas_call(body, out_shape=outs, grid=(m,), input_output_aliases={5: 0},
                              interpret=platform == "cpu",
                              compiler_params=compiler_params(platform),
                              name=name)(indices, indptr, spikes, trace, any_fired, data)

    return call


def generator(fallback):
    """The 'pallas' kernel generator of the compressed plasticity update.

    Args:
        fallback: the pure-JAX generator, used for degenerate sizes (no rows or entries).

    Returns:
        ``generate(*, ins, outs, shape, on_rows, masked, w_min, w_max, platform)`` whose
        kernel is ``(data, indices, indptr, spikes, trace, *index) -> new data`` (a column
        index, when given, is not used).

    Example:
        >>> import jax.numpy as jnp
        >>> from primforge import ops
        >>> W = ops.CSR.from_dense(jnp.array([[1., 0., 2.], [0., 3., 0.]]))
        >>> ops.update_on_pre(W, jnp.array([True, False]), jnp.ones(3),
        ...                   backend='pallas').data    # interpreted on the CPU
        Array([2., 3., 3.], dtype=float32)
    """

    def generate(*, ins, outs, shape, on_rows, masked, w_min, w_max, platform, **params):
        m, n = (int(s) for s in shape)
        nnz = int(ins[1].shape[0])
        if min(m, nnz) == 0:
            return fallback(ins=ins, outs=outs, shape=shape, on_rows=on_rows, masked=masked,
                            w_min=w_min, w_max=w_max, platform=platform, **params)
        run = _program(bool(on_rows), m=m, n=n, nnz=nnz, lo=w_min, hi=w_max,
                       platform=platform)
        dtype = np.dtype(outs[0].dtype)

        def kernel(data, indices, indptr, spikes, trace, *index):
            del index  # a column index does not change what a program per row reads
            if spikes.dtype == jnp.bool_:
                spikes = spikes.astype(jnp.int8)
            y, bad = run(data, indices, indptr, spikes, trace)
            ok = _common.indptr_ok(indptr, nnz)
            if not masked:
                ok = ok & (jnp.sum(bad) == 0)
            return jnp.where(ok, y, jnp.nan).astype(dtype)

        return kernel

    return generate
