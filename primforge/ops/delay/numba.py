"""Numba CPU kernels for the delayed products (imported only when one is generated).

``kernel(data, indices, indptr, delays, x, buffer, slot, out)``: ``out`` is ``buffer``
(aliased), each visited synapse ``k`` adds its weight (times the input) into
``out[(slot + delays[k]) % D, target]``. A malformed structure, a visited delay outside
``[0, D)`` or a slot outside ``[0, D)`` fill the buffer with NaN.

The buffer is larger than the caches and each addition lands somewhere else in it, so the
kernels compute a chunk of additions (flat offset and value) first, prefetching each
target, then do them in order (:mod:`primforge.ops._prefetch`, :func:`ring_adder`): the
sums, and their order, are those of one addition after another.
"""

from __future__ import annotations

import functools

import numpy as np

from primforge.ops._prefetch import CHUNK, chunked_adder, event_words, prefetcher


@functools.cache
def ring_adder():
    """``(chunk, queue, flush)``: the njit additions into a ring buffer ``out``, by chunks.

    ``flat, offsets, values = chunk(out)`` gives the buffer as one row and an empty chunk;
    ``fill = queue(flat, offsets, values, fill, o, value)`` (``fill`` the additions pending,
    0 at first) prefetches ``flat[o]`` and puts ``value`` on the chunk, ``o`` taken modulo
    the buffer's size (an offset ``(s + d) * width + target`` with ``s`` and ``d`` in
    ``[0, D)`` is that of row ``(s + d) % D``); ``fill = flush(flat, offsets, values,
    fill)`` does the chunk's additions (once ``fill == CHUNK``, and at the end). The values
    are kept in float64, exact for every float dtype's product.

    The test of a full chunk stays in the kernels: inlined into the loop through ``queue``,
    the branch made the delayed jitc kernel several times slower.
    """
    import numba

    prefetch, add = prefetcher(), chunked_adder()

    @numba.njit(inline="always", nogil=True)
    def chunk(out):
        flat = out.reshape(out.shape[0] * out.shape[1])
        return flat, np.empty(CHUNK, np.int64), np.empty(CHUNK, np.float64)

    @numba.njit(inline="always", nogil=True)
    def queue(flat, offsets, values, fill, o, value):
        if o >= flat.shape[0]:
            o -= flat.shape[0]
        prefetch(flat, o)
        offsets[fill] = o
        values[fill] = value
        return fill + 1

    @numba.njit(inline="always", nogil=True)
    def flush(flat, offsets, values, fill):
        add(flat, offsets, values, fill)
        return 0

    return chunk, queue, flush


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
    chunk, queue, flush = ring_adder()
    words = event_words()
    BINARY, HOMO, TRANSPOSE = binary, homo, transpose

    @numba.njit(nogil=True)
    def delayed_csr(data, indices, indptr, delays, x, buffer, slot, out):
        depth, n_dst = out.shape
        m = indptr.shape[0] - 1
        n = n_dst if TRANSPOSE else x.shape[0]  # the stored columns
        s = slot[0]
        if s < 0 or s >= depth or not indptr_ok(indptr, m, indices.shape[0]):
            out[:, :] = np.nan
            return
        w0 = data[0] if HOMO else data.dtype.type(1)  # a per-synapse data may be empty
        flat, offsets, values = chunk(out)
        fill = 0
        # Rows: with TRANSPOSE those of the active inputs, found a word of 8 bytes at a time
        # (8 bool events skipped by one test of a zero word); else every row, in one block.
        # Written out here and in the jitc kernel: as an inlined helper, measured slower.
        x_words, n_words = words(x)
        size = x.itemsize
        for b in range(n_words + 1 if TRANSPOSE else 1):
            if TRANSPOSE and b < n_words and x_words[b] == 0:
                continue
            lo, hi = (8 * b // size, min(8 * (b + 1) // size, m)) if TRANSPOSE else (0, m)
            for i in range(lo, hi):
                if TRANSPOSE:
                    xi = x[i]
                    if xi == 0:
                        continue
                for k in range(indptr[i], indptr[i + 1]):
                    j = indices[k]
                    if j < 0 or j >= n:
                        out[:, :] = np.nan
                        return
                    if TRANSPOSE:
                        xk, dst = xi, j
                    else:
                        xk, dst = x[j], i
                        if xk == 0:
                            continue
                    d = delays[k]
                    if d < 0 or d >= depth:
                        out[:, :] = np.nan
                        return
                    wk = w0 if HOMO else data[k]
                    o = np.int64(s + d) * n_dst + dst
                    fill = queue(flat, offsets, values, fill, o, wk if BINARY else wk * xk)
                    if fill == CHUNK:
                        fill = flush(flat, offsets, values, fill)
        flush(flat, offsets, values, fill)

    return delayed_csr


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
    regenerates the rows of ``W`` exactly as the jitc products do (the same walk along
    their columns, the same weights) and adds each active synapse's weight into
    ``out[(slot + d) % D, target]``, ``d = dmin + floor(mix(dstart + j * gamma) * span /
    2**32)`` (see :func:`primforge.ops.jitconn.generator.delay_draws`). A slot outside
    ``[0, D)`` fills the buffer with NaN. ``transpose``: the rows of ``W`` are the sources
    (only the rows of active events are generated); else the rows are the targets and the
    columns the sources.
    """

    import numba

    from primforge.ops.jitconn.generator import DELAY_SALT, MASK, ROW_SALT
    from primforge.ops.jitconn.numba import column_walk, helpers, weight_helpers

    row_cursor, next_column = column_walk(prob)
    mix, seed_keys = helpers()[:2]
    weight, params = weight_helpers(kind)  # the jitc kernels' synapse weights
    DMIN, SPAN = dmin, span
    TRANSPOSE = transpose
    chunk, queue, flush = ring_adder()
    words = event_words()

    @numba.njit(nogil=True)
    def delayed_jitc(theta, seed, table, events, buffer, slot, out):
        depth, n_dst = out.shape
        s = slot[0]
        if s < 0 or s >= depth:
            out[:, :] = np.nan
            return
        flat, offsets, values = chunk(out)
        fill = 0
        m, n = (events.shape[0], n_dst) if TRANSPOSE else (n_dst, events.shape[0])
        keys = seed_keys(seed[0])
        dkey = mix((seed[0] & MASK) ^ DELAY_SALT)
        th = params(theta)
        # Rows: as in the CSR kernel.
        e_words, n_words = words(events)
        size = events.itemsize
        for b in range(n_words + 1 if TRANSPOSE else 1):
            if TRANSPOSE and b < n_words and e_words[b] == 0:
                continue
            lo, hi = (8 * b // size, min(8 * (b + 1) // size, m)) if TRANSPOSE else (0, m)
            for i in range(lo, hi):
                if TRANSPOSE and events[i] == 0:
                    continue
                j, ctr, gamma, step = row_cursor(keys, i)
                dstart = mix((mix(i ^ ROW_SALT) + dkey) & MASK)
                while True:
                    j, ctr = next_column(j, ctr, step, table)
                    if j >= n:
                        break
                    if TRANSPOSE or events[j] != 0:
                        u = mix((dstart + j * gamma) & MASK)
                        r = s + DMIN + ((u * SPAN) >> 32)
                        o = np.int64(r) * n_dst + (j if TRANSPOSE else i)
                        fill = queue(flat, offsets, values, fill, o, weight(th, ctr, gamma))
                        if fill == CHUNK:
                            fill = flush(flat, offsets, values, fill)
        flush(flat, offsets, values, fill)

    return delayed_jitc
