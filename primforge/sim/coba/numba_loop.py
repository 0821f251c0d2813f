"""The fused COBA loop on one thread, and the Numba pieces every fused kernel shares.

A fused kernel runs whole steps in one Numba loop: per step, one pass over the neurons
(finish the previous step's conductances, integrate, detect, reset: :func:`_neuron_pass`),
then the propagation of the spikes into accumulators that the next pass reads. The
neuron pass is branch-free and compiled with ``fastmath={"contract"}``, so that LLVM
vectorizes it and fuses ``a * b + c`` into an FMA as XLA's CPU compiler does for the plain
step: the float32 results are then bit-identical to the plain step's. The propagation
visits only the neurons that fired, found 64 at a time in the spike row read as 8-byte
words (:func:`_next_fired`: 1-2% of the neurons fire in a step), over stored CSR
(:func:`_csr_propagate`) or over just-in-time connectivity (:func:`_jitc_propagate`,
whose rows are generated into a buffer and then scattered). Every piece is built on
first use (Numba imported then) and cached.
"""

from __future__ import annotations

import functools

import numpy as np

from primforge.ops import jitc_numba_columns
from primforge.sim.coba.network import DECAY_E, DECAY_I, EE, EI, EL, F32, K_M, REF_STEPS, VR, VT


def _copy_in(src, dst) -> None:
    """``dst[:] = src``, unless both are the same memory (a kernel's input and the output
    aliased to it: the state updated in place)."""
    if src.ctypes.data != dst.ctypes.data:
        dst[:] = src


@functools.cache
def _neuron_pass():
    """``update(lo, hi, pending, v, ge, gi, ref, acc_e, acc_i, spk, cnt)``: one step of
    neurons ``lo .. hi - 1`` in place: finish the previous step's conductances (decay +
    input, the plain step's arithmetic) when ``pending``, integrate, detect, reset, zero the
    inputs, add each neuron's spike to its count ``cnt``."""
    import numba

    el, ee, ei, vt, vr = F32(EL), F32(EE), F32(EI), F32(VT), F32(VR)
    k_m, de, di, ref_steps = K_M, DECAY_E, DECAY_I, np.int32(REF_STEPS)

    # 'contract' lets LLVM fuse a*b+c into an FMA, as XLA's CPU compiler does for the plain
    # step: the float32 results are then bit-identical. Branch-free (selects), so LLVM can
    # vectorize the loop.
    @numba.njit(inline="always", nogil=True, fastmath={"contract"})
    def update(lo, hi, pending, v, ge, gi, ref, acc_e, acc_i, spk, cnt):
        for i in range(lo, hi):
            g_e = ge[i] * de + acc_e[i] if pending else ge[i]
            g_i = gi[i] * di + acc_i[i] if pending else gi[i]
            ge[i] = g_e
            gi[i] = g_i
            acc_e[i] = 0
            acc_i[i] = 0
            vi = v[i]
            r = ref[i]
            active = r == 0
            dv = (el - vi) + g_e * (ee - vi) + g_i * (ei - vi)
            vn = vi + k_m * dv
            vn = vn if active else vi
            s = active & (vn > vt)
            spk[i] = s
            cnt[i] += s
            v[i] = vr if s else vn
            ref[i] = ref_steps if s else (0 if active else r - 1)

    @numba.njit(inline="always", nogil=True, fastmath={"contract"})
    def finish(lo, hi, ge, gi, acc_e, acc_i):  # the last step's conductances
        for i in range(lo, hi):
            ge[i] = ge[i] * de + acc_e[i]
            gi[i] = gi[i] * di + acc_i[i]

    return update, finish


@functools.cache
def _next_fired():
    """``next_fired(spk, words, i, hi) -> j``: the first neuron ``j`` in ``i .. hi - 1``
    that fired (``spk[j]``), else ``hi``. ``words`` is ``spk`` read as 8-byte words: eight
    words of zeros (64 neurons, one cache line) are passed in one test, then one word (8
    neurons), then one neuron (1-2% of the neurons fire in a step, so most lines are
    zeros)."""
    import numba

    @numba.njit(inline="always", nogil=True)
    def next_fired(spk, words, i, hi):
        while i < hi:
            if i & 63 == 0 and i + 64 <= hi:
                w = i >> 3
                if (words[w] | words[w + 1] | words[w + 2] | words[w + 3] | words[w + 4]
                        | words[w + 5] | words[w + 6] | words[w + 7]) == 0:
                    i += 64
                    continue
            if i & 7 == 0 and i + 8 <= hi and words[i >> 3] == 0:
                i += 8
            elif spk[i]:
                return i
            else:
                i += 1
        return hi

    return next_fired


def _words(spk):
    """``spk`` (a contiguous bool row) as its whole 8-byte words (njit only)."""
    return spk[:spk.shape[0] // 8 * 8].view(np.uint64)


@functools.cache
def _numba_loop(propagate):
    """The fused loop for as many steps as ``spike_out`` has rows: integrate, detect,
    propagate, reset (one compiled loop serves every number of steps).

    ``propagate(conn, spikes, acc_e, acc_i, fired) -> ok`` adds the outgoing synapses of
    the neurons that fired to the accumulators, rows in increasing order (the event-driven
    products' summation order), and writes how many excitatory and inhibitory neurons
    fired into ``fired``; ``conn`` is the connectivity as a tuple.
    """
    import numba

    update, finish = _neuron_pass()
    copy_in = numba.njit(inline="always")(_copy_in)

    @numba.njit(nogil=True, fastmath={"contract"})
    def loop(v, ge, gi, ref, count, conn, v_out, ge_out, gi_out, ref_out, count_out, spike_out,
             fired_out):
        n = v.shape[0]
        acc_e = np.zeros(n, np.float32)
        acc_i = np.zeros(n, np.float32)
        copy_in(v, v_out)  # nothing to copy where the state comes aliased (in place)
        copy_in(ge, ge_out)
        copy_in(gi, gi_out)
        copy_in(ref, ref_out)
        copy_in(count, count_out)
        ok = True
        for t in range(spike_out.shape[0]):
            # The first step apart, so that each inlined neuron pass has its own constant
            # 'pending' (the pass then vectorizes as with a constant number of steps).
            if t == 0:
                update(0, n, False, v_out, ge_out, gi_out, ref_out, acc_e, acc_i, spike_out[t],
                       count_out)
            else:
                update(0, n, True, v_out, ge_out, gi_out, ref_out, acc_e, acc_i, spike_out[t],
                       count_out)
            # into the zeroed accumulators
            ok &= propagate(conn, spike_out[t], acc_e, acc_i, fired_out[t])
        finish(0, n, ge_out, gi_out, acc_e, acc_i)
        return ok

    return loop


@functools.cache
def _csr_propagate():
    """``propagate(conn, spk, acc_e, acc_i, fired) -> ok`` over stored CSR (``conn``: the
    two matrices' data, indices and indptr): the rows of the neurons that fired, in
    increasing order; ``ok`` is false where a column index is out of range (that synapse
    skipped)."""
    import numba

    next_fired, words = _next_fired(), numba.njit(inline="always")(_words)

    @numba.njit(inline="always", nogil=True)
    def propagate(conn, spk, acc_e, acc_i, fired):
        we, e_idx, e_ptr, wi, i_idx, i_ptr = conn
        n, ne = acc_e.shape[0], e_ptr.shape[0] - 1
        wds = words(spk)
        ok = True
        n_e = n_i = 0
        i = next_fired(spk, wds, 0, n)
        while i < n:
            if i < ne:
                n_e += 1
            else:
                n_i += 1
            acc, w, idx, ptr, row = (acc_e, we[0], e_idx, e_ptr, i) if i < ne else \
                (acc_i, wi[0], i_idx, i_ptr, i - ne)
            for k in range(ptr[row], ptr[row + 1]):
                j = idx[k]
                if j < 0 or j >= n:
                    ok = False
                else:
                    acc[j] += w
            i = next_fired(spk, wds, i + 1, n)
        fired[0], fired[1] = n_e, n_i
        return ok

    return propagate


# Targets generated ahead of their scatter: a block at least this long (plus one row).
_BLOCK = 1 << 15


@functools.cache
def _jitc_propagate(prob: float):
    """Propagation over just-in-time connectivity, in two phases per block of rows.

    The rows of the neurons that fired are generated into a buffer of target indices
    (compute-bound: the generator's hashes and table look-ups), then the buffer is
    scattered (memory-bound: independent read-modify-writes that the CPU overlaps). Done in
    one loop, each random access to the accumulators would wait behind a row's generation.
    The additions keep the event-driven product's order (rows, then columns, increasing).
    """
    import numba

    columns = jitc_numba_columns(prob)  # the generator of binary_jitc_matvec, as Numba code

    @numba.njit(inline="always", nogil=True)
    def scatter(acc, w, buf, count):
        for k in range(count):
            acc[buf[k]] += w

    next_fired, words = _next_fired(), numba.njit(inline="always")(_words)

    @numba.njit(inline="always", nogil=True)
    def propagate(conn, spk, acc_e, acc_i, fired):
        w_e, w_i, seed_e, seed_i, ne, buf = conn
        n = acc_e.shape[0]
        wds = words(spk)
        for pop in range(2):
            acc, w, seed, lo, hi = (acc_e, w_e, seed_e, 0, ne) if pop == 0 else \
                (acc_i, w_i, seed_i, ne, n)
            fill = count = 0
            i = next_fired(spk, wds, lo, hi)
            while i < hi:
                fill += columns(seed, i - lo, n, buf[fill:])
                count += 1
                if fill >= _BLOCK:
                    scatter(acc, w, buf, fill)
                    fill = 0
                i = next_fired(spk, wds, i + 1, hi)
            scatter(acc, w, buf, fill)
            fired[pop] = count
        return True

    return propagate

