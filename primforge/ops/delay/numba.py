"""Numba CPU kernels for the delayed products (imported only when one is generated).

``kernel(data, indices, indptr, delays, x, buffer, slot, out)``: ``out`` is ``buffer``
(aliased), each visited synapse ``k`` adds its weight (times the input) into
``out[(slot + delays[k]) % D, target]``. A malformed structure, a visited delay outside
``[0, D)`` or a slot outside ``[0, D)`` fill the buffer with NaN.
"""

from __future__ import annotations

import functools

import numpy as np


@functools.cache
def kernel(binary: bool, transpose: bool, homo: bool):
    """The njit kernel of one variant (compiled lazily per dtype).

    ``transpose``: the stored rows are the sources (a CSR of presynaptic rows: only the rows
    of active inputs are visited); else the stored rows are the targets (every entry is
    visited, an inactive source's entry skipped).
    """
    import numba

    from primforge.ops.csr.numba import _indptr_checker

    indptr_ok = _indptr_checker()
    BINARY, HOMO = binary, homo

    if transpose:

        @numba.njit(nogil=True)
        def delayed_rows(data, indices, indptr, delays, x, buffer, slot, out):
            depth, n = out.shape
            m = indptr.shape[0] - 1
            s = slot[0]
            if s < 0 or s >= depth or not indptr_ok(indptr, m, indices.shape[0]):
                out[:, :] = np.nan
                return
            w0 = data[0] if HOMO else data.dtype.type(1)  # a per-synapse data may be empty
            for i in range(m):
                xi = x[i]
                if xi == 0:
                    continue
                for k in range(indptr[i], indptr[i + 1]):
                    j = indices[k]
                    d = delays[k]
                    if j < 0 or j >= n or d < 0 or d >= depth:
                        out[:, :] = np.nan
                        return
                    r = s + d
                    if r >= depth:
                        r -= depth
                    w = w0 if HOMO else data[k]
                    if BINARY:
                        out[r, j] += w
                    else:
                        out[r, j] += w * xi

        return delayed_rows

    @numba.njit(nogil=True)
    def delayed_cols(data, indices, indptr, delays, x, buffer, slot, out):
        depth, m = out.shape
        n = x.shape[0]
        s = slot[0]
        if s < 0 or s >= depth or not indptr_ok(indptr, m, indices.shape[0]):
            out[:, :] = np.nan
            return
        w0 = data[0] if HOMO else data.dtype.type(1)
        for i in range(m):
            for k in range(indptr[i], indptr[i + 1]):
                j = indices[k]
                if j < 0 or j >= n:
                    out[:, :] = np.nan
                    return
                xj = x[j]
                if xj == 0:
                    continue
                d = delays[k]
                if d < 0 or d >= depth:
                    out[:, :] = np.nan
                    return
                r = s + d
                if r >= depth:
                    r -= depth
                w = w0 if HOMO else data[k]
                if BINARY:
                    out[r, i] += w
                else:
                    out[r, i] += w * xj

    return delayed_cols


@functools.cache
def read_kernel():
    """``read(buffer, slot, now, out)`` (``out`` is ``buffer``): ``now`` gets row ``slot``,
    which is then zeroed in place; a slot outside ``[0, D)`` gives NaN in both outputs."""
    import numba

    @numba.njit(nogil=True)
    def delay_read(buffer, slot, now, out):
        depth, n = out.shape
        s = slot[0]
        if s < 0 or s >= depth:
            now[:] = np.nan
            out[:, :] = np.nan
            return
        for j in range(n):
            now[j] = out[s, j]
            out[s, j] = 0

    return delay_read


@functools.cache
def jitc_kernel(transpose: bool, kind: str, prob: float, dmin: int, span: int):
    """The njit kernel of the delayed just-in-time product (binary events).

    ``kernel(theta, seed, table, events, buffer, slot, out)`` (``out`` is ``buffer``):
    regenerates the rows of ``W`` exactly as the jitc products do (the same synapses and
    weights) and adds each active synapse's weight into ``out[(slot + d) % D, target]``,
    ``d = dmin + floor(mix(dstart + j * gamma) * span / 2**32)`` (see
    :func:`primforge.ops.jitconn.generator.delay_draws`). A slot outside ``[0, D)`` fills
    the buffer with NaN. ``transpose``: the rows of ``W`` are the sources (only the rows of
    active events are generated); else the rows are the targets and the columns the sources.
    """

    import numba

    from primforge.ops.jitconn.generator import DELAY_SALT, MASK, ROW_SALT, threshold_table
    from primforge.ops.jitconn.numba import guide_table, helpers, weight_helpers

    GUIDE, SHIFT = guide_table(threshold_table(prob))
    mix, seed_keys, row_stream, _, skip = helpers()
    weight, params = weight_helpers(kind)  # the jitc kernels' synapse weights
    DMIN, SPAN = dmin, span
    TRANSPOSE = transpose

    @numba.njit(nogil=True)
    def delayed_jitc(theta, seed, table, events, buffer, slot, out):
        depth, n_dst = out.shape
        s = slot[0]
        if s < 0 or s >= depth:
            out[:, :] = np.nan
            return
        m, n = (events.shape[0], n_dst) if TRANSPOSE else (n_dst, events.shape[0])
        keys = seed_keys(seed[0])
        dkey = mix((seed[0] & MASK) ^ DELAY_SALT)
        th = params(theta)
        for i in range(m):
            if TRANSPOSE and events[i] == 0:
                continue
            ctr, gamma, step = row_stream(keys, i)
            dstart = mix((mix(i ^ ROW_SALT) + dkey) & MASK)
            j = -1
            while True:
                g = skip(mix(ctr), table, GUIDE, SHIFT)
                if g >= n - 1 - j:
                    break
                j += 1 + g
                if TRANSPOSE or events[j] != 0:
                    w = weight(th, ctr, gamma)
                    u = mix((dstart + j * gamma) & MASK)
                    r = s + DMIN + ((u * SPAN) >> 32)
                    if r >= depth:
                        r -= depth
                    if TRANSPOSE:
                        out[r, j] += w
                    else:
                        out[r, i] += w
                ctr = (ctr + step) & MASK

    return delayed_jitc
