"""Numba CPU kernels for the delayed products (imported only when one is generated).

``kernel(data, indices, indptr, delays, x, buffer, slot, out)``: ``out`` is ``buffer``
(aliased), each visited synapse ``k`` adds its weight (times the input) into
``out[(slot + delays[k]) % D, target]``. A malformed structure, a visited delay outside
``[0, D)`` or a slot outside ``[0, D)`` fill the buffer with NaN.

The buffer is larger than the caches and each addition lands somewhere else in it, so the
kernels compute a chunk of additions (flat offset and value) first, prefetching each
target, then do them in order (:mod:`primforge.ops._prefetch`): the sums, and their order,
are those of one addition after another.
"""

from __future__ import annotations

import functools

import numpy as np

from primforge.ops._prefetch import CHUNK, chunked_adder, event_words, prefetcher


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
    prefetch, add, words = prefetcher(), chunked_adder(), event_words()
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
            flat = out.reshape(depth * n)
            offsets = np.empty(CHUNK, np.int64)
            values = np.empty(CHUNK, np.float64)  # exact for every float dtype's product
            fill = 0
            x_words, n_words = words(x)
            size = x.itemsize
            for w in range(n_words + 1):  # the events a word at a time, then the rest
                if w < n_words and x_words[w] == 0:
                    continue
                hi = 8 * (w + 1) // size if w < n_words else m
                for i in range(8 * w // size, hi):
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
                        wk = w0 if HOMO else data[k]
                        o = np.int64(r) * n + j
                        prefetch(flat, o)
                        offsets[fill] = o
                        values[fill] = wk if BINARY else wk * xi
                        fill += 1
                        if fill == CHUNK:
                            add(flat, offsets, values, fill)
                            fill = 0
            add(flat, offsets, values, fill)

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
        flat = out.reshape(depth * m)
        offsets = np.empty(CHUNK, np.int64)
        values = np.empty(CHUNK, np.float64)
        fill = 0
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
                o = np.int64(r) * m + i
                prefetch(flat, o)
                offsets[fill] = o
                values[fill] = w if BINARY else w * xj
                fill += 1
                if fill == CHUNK:
                    add(flat, offsets, values, fill)
                    fill = 0
        add(flat, offsets, values, fill)

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
    prefetch, add, words = prefetcher(), chunked_adder(), event_words()

    @numba.njit(nogil=True)
    def delayed_jitc(theta, seed, table, events, buffer, slot, out):
        depth, n_dst = out.shape
        s = slot[0]
        if s < 0 or s >= depth:
            out[:, :] = np.nan
            return
        flat = out.reshape(depth * n_dst)
        offsets = np.empty(CHUNK, np.int64)
        values = np.empty(CHUNK, np.float64)
        fill = 0
        m, n = (events.shape[0], n_dst) if TRANSPOSE else (n_dst, events.shape[0])
        keys = seed_keys(seed[0])
        dkey = mix((seed[0] & MASK) ^ DELAY_SALT)
        th = params(theta)
        # Rows: with TRANSPOSE those of the events that fired, found a word at a time; else
        # every row (one block).
        e_words, n_words = words(events)
        size = events.itemsize
        for b in range(n_words + 1 if TRANSPOSE else 1):
            if TRANSPOSE and b < n_words and e_words[b] == 0:
                continue
            lo = 8 * b // size if TRANSPOSE else 0
            hi = 8 * (b + 1) // size if TRANSPOSE and b < n_words else m
            for i in range(lo, hi):
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
                        o = np.int64(r) * n_dst + (j if TRANSPOSE else i)
                        prefetch(flat, o)
                        offsets[fill] = o
                        values[fill] = w
                        fill += 1
                        if fill == CHUNK:
                            add(flat, offsets, values, fill)
                            fill = 0
                    ctr = (ctr + step) & MASK
        add(flat, offsets, values, fill)

    return delayed_jitc
