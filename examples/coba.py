"""The COBA benchmark network (Brette et al. 2007, Benchmark 1), with primforge.ops.

Conductance-based leaky integrate-and-fire neurons after Vogels & Abbott (2005), with the
parameters of Brian 1's script for the benchmark: 4,000 neurons (80% excitatory), every pair
connected with probability 0.02, conductances in units of the leak conductance:

    dv/dt  = (El - v + ge (Ee - v) + gi (Ei - v)) / taum
    dge/dt = -ge / taue          dgi/dt = -gi / taui

taum 20 ms, taue 5 ms, taui 10 ms, El -60 mV, Ee 0 mV, Ei -80 mV, threshold -50 mV, reset
-60 mV, 5 ms refractory (v held at the reset, conductances keep decaying), an excitatory
spike adds 0.6 to ge, an inhibitory one 6.7 to gi. Forward Euler, dt = 0.1 ms, no external
input: the activity is self-sustained from the initial state (as in Brian 1's script: v from
N(-65, 5) mV, ge from N(4, 1.5), gi from N(20, 12)).

One step, in the order of Brian's schedule: integrate (refractory neurons hold v), detect
spikes (v > Vt, not refractory), propagate (ge += We^T spikes_E, gi += Wi^T spikes_I),
reset. Two implementations of that step run under ``jax.lax.scan``:

* plain: ``jax.numpy`` for the neurons and two event-driven CSR products
  (``spikes_E @ We``, ``spikes_I @ Wi``, the numba kernels of :mod:`primforge.ops`).
* fused (``--fused``): one :class:`primforge.XLACustomKernel` per step that integrates the
  neurons, detects spikes, propagates them and counts each population's spikes in a single
  Numba kernel call, with a ``jax`` reference backend. It performs the same float32
  operations in the same order (including the multiply-adds XLA contracts into FMAs), so
  both give the same spike trains.

``--scale 10`` has 40,000 neurons with p = 0.002 (the same 80 inputs per neuron) and
``--scale 100`` 400,000 neurons with p = 0.0002, whose connectivity is never stored: with
``--conn jitc`` (the default at 100x) each product regenerates the rows of the spiking
neurons from a seed (:func:`primforge.ops.binary_jitc_matvec`), so memory stays flat.

With ``--fused --threads 2`` over just-in-time connectivity the run goes in chunks, each
on one thread or on two, whichever is faster at the time (:func:`thread_choosing_simulator`,
the same spike trains); ``--fixed-threads`` runs every step on the threads.

Run:  python examples/coba.py [--scale 1|10|100] [--conn csr|jitc] [--duration 1.0]
      [--seed 0] [--fused] [--plot coba.png] [--json]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import resource
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import primforge
from primforge.ops import CSR, binary_jitc_matvec, fixed_prob, jitc_numba_columns
from primforge.utils import dataclass, field

# ----------------------------------------------------------------------------- parameters
DT = 0.1  # ms
TAUM, TAUE, TAUI = 20.0, 5.0, 10.0  # ms
EL, EE, EI = -60.0, 0.0, -80.0  # mV
VT, VR = -50.0, -60.0  # mV
REFRACTORY = 5.0  # ms
WE, WI = 0.6, 6.7  # conductance increments, units of the leak conductance
N_BASE, P_BASE, EXC_FRACTION = 4000, 0.02, 0.8
RASTER_NEURONS = 200  # neurons whose spikes are recorded for the raster plot

# Step constants as float32, shared by both implementations (identical arithmetic).
F32 = np.float32
K_M = F32(DT / TAUM)  # dt / taum
DECAY_E = F32(1.0 - DT / TAUE)  # Euler: ge + dt * (-ge / taue)
DECAY_I = F32(1.0 - DT / TAUI)
# Brian's rule: refractory while fewer than 5 ms have passed since the spike, i.e. v is held
# for the 49 steps after the spike and integrates again at the 50th.
REF_STEPS = round(REFRACTORY / DT) - 1


@dataclass
class JitConn:
    """Fixed-probability connectivity regenerated from ``seed`` at every use (never stored).

    ``spikes @ W`` is :func:`primforge.ops.binary_jitc_matvec` with ``transpose=True``: only
    the rows of the spiking neurons are generated.
    """

    seed: int = field(static=True)
    weight: float = field(static=True)
    prob: float = field(static=True)
    shape: tuple[int, int] = field(static=True)
    homogeneous = True

    @property
    def nnz(self) -> int:
        """Expected number of synapses."""
        return round(self.shape[0] * self.shape[1] * self.prob)

    def __rmatmul__(self, spikes):
        return binary_jitc_matvec(self.weight, self.seed, spikes, shape=self.shape,
                                  prob=self.prob, transpose=True)


@dataclasses.dataclass(frozen=True)
class Network:
    """Connectivity and initial state of one COBA network."""

    n: int
    n_exc: int
    w_exc: CSR | JitConn  # (n_exc, n): rows are excitatory sources
    w_inh: CSR | JitConn  # (n - n_exc, n)
    v0: jax.Array
    ge0: jax.Array
    gi0: jax.Array

    @property
    def n_inh(self) -> int:
        return self.n - self.n_exc


def build(n: int = N_BASE, prob: float = P_BASE, *, seed: int = 0,
          we: float = WE, wi: float = WI, conn: str = "csr") -> Network:
    """Random connectivity (stored ``'csr'`` or just-in-time ``'jitc'``) and Brian 1's
    initial state for ``n`` neurons."""
    rng = np.random.default_rng(seed)
    n_exc = round(EXC_FRACTION * n)
    if conn == "csr":
        w_exc = fixed_prob(n_exc, n, prob, weight=we, seed=rng)
        w_inh = fixed_prob(n - n_exc, n, prob, weight=wi, seed=rng)
    elif conn == "jitc":
        s_exc, s_inh = (int(x) for x in rng.integers(0, 2**31, 2))
        w_exc = JitConn(s_exc, float(we), float(prob), (n_exc, n))
        w_inh = JitConn(s_inh, float(wi), float(prob), (n - n_exc, n))
    else:
        raise ValueError(f"build: 'conn' must be 'csr' or 'jitc', got {conn!r}")
    v0 = (rng.standard_normal(n) * 5.0 - 65.0).astype(F32)
    ge0 = (rng.standard_normal(n) * 1.5 + 4.0).astype(F32)
    gi0 = (rng.standard_normal(n) * 12.0 + 20.0).astype(F32)
    return Network(n, n_exc, w_exc, w_inh, jnp.asarray(v0), jnp.asarray(ge0), jnp.asarray(gi0))


def scaled(scale: int, seed: int = 0, conn: str = "csr") -> Network:
    """The network at ``scale`` times 4,000 neurons, 80 inputs per neuron."""
    n = N_BASE * scale
    return build(n, P_BASE / scale, seed=seed, conn=conn)


# ----------------------------------------------------------------------------- plain step
def _integrate(v, ge, gi, ref):
    """Euler step of the neurons and spike detection (plain jax.numpy)."""
    active = ref == 0
    dv = (F32(EL) - v) + ge * (F32(EE) - v) + gi * (F32(EI) - v)
    v_new = jnp.where(active, v + K_M * dv, v)
    spike = active & (v_new > F32(VT))
    ref_new = jnp.where(spike, jnp.int32(REF_STEPS), jnp.where(active, 0, ref - 1))
    return v_new, spike, ref_new


def neuron_update(v, ge, gi, ref, *, once: bool = True):
    """:func:`_integrate`, computed once for all its readers (:func:`primforge.evaluate_once`).

    The voltage, spikes and refractory counter are read by the reset, the products, the
    spike counts and the recording; without ``once``, XLA's CPU compiler computes the
    update again inside each of those fusions, each pass reading the whole state.
    """
    if once:
        return primforge.evaluate_once(_integrate, v, ge, gi, ref)
    return _integrate(v, ge, gi, ref)


def plain_step(w_exc, w_inh, *, once: bool = True):
    """``step(state) -> (state, spikes)`` with jax.numpy plus two event products (stored
    CSR or just-in-time connectivity); ``once`` as in :func:`neuron_update`."""
    ne = w_exc.shape[0]

    def step(state):
        v, ge, gi, ref = state
        v, spike, ref = neuron_update(v, ge, gi, ref, once=once)
        ge = ge * DECAY_E + spike[:ne] @ w_exc  # event-driven: visits the spiking rows
        gi = gi * DECAY_I + spike[ne:] @ w_inh
        v = jnp.where(spike, F32(VR), v)
        return (v, ge, gi, ref), spike

    return step


def fired_per_population(spikes, ne):
    """``(steps, 2)`` int32: the excitatory (the first ``ne``) and inhibitory neurons that
    fired at each step of ``spikes``, ``(steps, n)`` bool."""
    return jnp.stack([jnp.sum(spikes[:, :ne], axis=1, dtype=jnp.int32),
                      jnp.sum(spikes[:, ne:], axis=1, dtype=jnp.int32)], axis=1)


# ----------------------------------------------------------------------------- fused step
# Two kernels, one per kind of connectivity, share the Numba loop below; each also has a
# ``jax`` reference backend.
coba_step_p = primforge.XLACustomKernel("examples.coba_step", replace=True)  # stored CSR
coba_jitc_step_p = primforge.XLACustomKernel("examples.coba_jitc_step", replace=True)


def _copy_in(src, dst) -> None:
    """``dst[:] = src``, unless both are the same memory (a kernel's input and the output
    aliased to it: the state updated in place)."""
    if src.ctypes.data != dst.ctypes.data:
        dst[:] = src


def _in_place(step, outs, in_place: bool = True):
    """``step`` (inputs, then outputs) as a kernel whose five state outputs are written
    into the state inputs' buffers: inside a ``lax.scan`` XLA then hands the kernel the
    carry itself, and the kernel copies nothing in (``_copy_in``). ``step`` itself (the
    state copied into fresh outputs) unless ``in_place``."""
    if not in_place:
        return step
    return primforge.numba_kernel(step, outs=list(outs),
                                  input_output_aliases={i: i for i in range(5)})


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
# The same for a part of the threaded kernel, whose targets wait for the next step: a step's
# targets at 100x (about 60,000) fit, and rows past a full block are generated again.
_THREAD_BLOCK = 1 << 18
# Rows a part of the threaded kernel takes at a time from the neurons that fired.
_ROWS_A_CLAIM = 4


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


@functools.cache
def _numba_jitc_loop_threaded(prob: float):
    """The fused loop over just-in-time connectivity on ``T`` parts (an argument, as is the
    number of steps: the rows of ``spike_out``), in one parallel region for every step.

    The neurons are split into ``T`` contiguous ranges, part ``t`` owning range ``t``. Each
    step is two phases of :func:`primforge.ops.numba_team`. In the first, part ``t`` adds
    to the neurons of range ``t`` the targets that the other parts generated for them in
    the step before, updates those neurons and lists the ones that fired. In the second,
    the parts generate the rows of the neurons that fired, taking them from the lists
    ``_ROWS_A_CLAIM`` at a time from a shared counter (a part on a core that runs slower
    takes fewer), into buffers, noting where each row's targets pass from one owner's
    range to the next (a row's targets increase); part ``t`` adds the targets in range
    ``t`` at once. Each part thus scatters only into its own range. The parts are claimed,
    so that each thread keeps its range, and the range's neurons stay in its core's cache,
    from step to step while the threads keep pace. Two sets of buffers and lists alternate
    with the step, so no part writes what another still reads; a phase after the last
    step adds the last targets. A part stops taking rows when its buffer holds ``block``
    targets (an argument); the rows that no part generated are then generated again by
    every owner, each keeping its own range's targets. Each accumulator gets the serial
    kernel's additions in another order; all of them add its population's one weight, so
    each sum is the serial kernel's, bit for bit, whatever the number of parts or threads.
    In the first phase each part also copies its range of the state in (at the first
    step) and counts the excitatory and inhibitory neurons of its range that fired; the
    counts are summed after the region.
    """
    import numba

    update, finish = _neuron_pass()
    copy_in = numba.njit(inline="always")(_copy_in)
    columns = jitc_numba_columns(prob)
    counters, draw, wait, done = primforge.ops.numba_team()
    next_fired, words = _next_fired(), numba.njit(inline="always")(_words)
    per_claim = _ROWS_A_CLAIM

    @numba.njit(inline="always", nogil=True)
    def row_of(i, ne, n, seed_e, seed_i, row):
        """The targets of neuron ``i``'s row into ``row``: their count."""
        if i < ne:
            return columns(seed_e, i, n, row)
        return columns(seed_i, i - ne, n, row)

    @numba.njit(inline="always", nogil=True)
    def first_at_least(row, a, b, edge):
        """The first position in ``row[a:b]`` (increasing) whose target is ``edge`` or more."""
        while a < b:
            mid = (a + b) >> 1
            if row[mid] < edge:
                a = mid + 1
            else:
                b = mid
        return a

    @numba.njit(inline="always", nogil=True)
    def fired_at(fired, counts, j):
        """The neuron at position ``j`` of the ranges' lists of those that fired, in turn."""
        t = 0
        while j >= counts[t]:
            j -= counts[t]
            t += 1
        return fired[t, j]

    @numba.njit(inline="always", nogil=True)
    def list_fired(lo, spk, out):
        """The neurons ``lo + i`` with ``spk[i]`` into ``out``, increasing: their count."""
        wds, m, count = words(spk), spk.shape[0], 0
        i = next_fired(spk, wds, 0, m)
        while i < m:
            out[count] = lo + i
            count += 1
            i = next_fired(spk, wds, i + 1, m)
        return count

    @numba.njit(inline="always", nogil=True)
    def generate(T, chunk, ne, n, block, seed_e, seed_i, fired, counts, first, rows, buf,
                 cuts, ids, meta):
        """A part's rows: claimed ``per_claim`` list positions at a time (ticket ``k``
        of ``rows`` names positions from ``(k - first) * per_claim``) until none is left
        or ``buf`` holds ``block`` targets. Row ``r`` is neuron ``ids[r]``'s; its targets in
        owner ``o``'s range are ``buf[cuts[r, o]:cuts[r, o + 1]]``. ``meta``: rows, the
        positions of a claim left unfinished (none: equal), the last ticket drawn."""
        total = counts.sum()
        fill, r, stop_lo, stop_hi = 0, 0, 0, 0
        while fill < block:
            ticket = draw(rows)
            j0 = (ticket - first) * per_claim
            if j0 >= total:
                break
            j1 = min(j0 + per_claim, total)
            for j in range(j0, j1):
                if fill >= block:
                    stop_lo, stop_hi = j, j1
                    break
                i = fired_at(fired, counts, j)
                count = row_of(i, ne, n, seed_e, seed_i, buf[fill:])
                ids[r] = i
                cuts[r, 0] = fill
                end = fill + count
                for o in range(1, T):
                    cuts[r, o] = first_at_least(buf, cuts[r, o - 1], end, o * chunk)
                cuts[r, T] = end
                fill = end
                r += 1
            if stop_hi > stop_lo:
                break
        meta[0], meta[1], meta[2], meta[3] = r, stop_lo, stop_hi, ticket

    @numba.njit(inline="always", nogil=True)
    def first_ticket(meta, s):
        """The first ticket of step ``s``'s claims: one past the last of the step before
        (every part draws at least one). Read from what the parts wrote, not from the
        counter, whose atomic updates Numba does not see."""
        if s == 0:
            return 0
        last = meta[(s - 1) % 2, 0, 3]
        for b in range(1, meta.shape[1]):
            last = max(last, meta[(s - 1) % 2, b, 3])
        return last + 1

    @numba.njit(inline="always", nogil=True)
    def add_rows(acc_e, acc_i, w_e, w_i, ne, buf, cuts, ids, rows, t):
        """The targets in owner ``t``'s range of a buffer's ``rows`` rows."""
        for r in range(rows):
            acc, w = (acc_e, w_e) if ids[r] < ne else (acc_i, w_i)
            for k in range(cuts[r, t], cuts[r, t + 1]):
                acc[buf[k]] += w

    @numba.njit(inline="always", nogil=True)
    def add_again(lo, hi, ne, n, seed_e, seed_i, w_e, w_i, acc_e, acc_i, fired, counts,
                  j0, j1, row):
        """Rows at list positions ``j0 .. j1 - 1``, generated again: their targets in
        ``lo .. hi - 1``."""
        for j in range(j0, j1):
            i = fired_at(fired, counts, j)
            count = row_of(i, ne, n, seed_e, seed_i, row)
            acc, w = (acc_e, w_e) if i < ne else (acc_i, w_i)
            for c in range(count):
                if lo <= row[c] < hi:
                    acc[row[c]] += w

    @numba.njit(inline="always", nogil=True)
    def scatter_own(t, T, lo, hi, ne, seed_e, seed_i, w_e, w_i, acc_e, acc_i, bufs, cuts,
                    ids, meta, fired, counts, left, row):
        """Part ``t``'s targets of the step before: each other part's rows' targets in
        range ``lo .. hi - 1``, and the rows no part generated (a claim a part left
        unfinished; from list position ``left`` on), generated again."""
        n = acc_e.shape[0]
        for b in range(T):
            if b != t:  # a part's own range got its targets as they were generated
                add_rows(acc_e, acc_i, w_e, w_i, ne, bufs[b], cuts[b], ids[b], meta[b, 0], t)
            add_again(lo, hi, ne, n, seed_e, seed_i, w_e, w_i, acc_e, acc_i, fired, counts,
                      meta[b, 1], meta[b, 2], row)
        add_again(lo, hi, ne, n, seed_e, seed_i, w_e, w_i, acc_e, acc_i, fired, counts,
                  left, counts.sum(), row)

    # One parallel region, the prange's: array expressions and initializations stay serial
    # (each would be a region of its own, and each region wakes the other threads).
    only_prange = {"prange": True, "numpy": False, "setitem": False, "reduction": False,
                   "comprehension": False, "stencil": False, "fusion": False}

    @numba.njit(nogil=True, parallel=only_prange, fastmath={"contract"})
    def loop(v, ge, gi, ref, count, w_e, w_i, seed_e, seed_i, ne, T, block,
             v_out, ge_out, gi_out, ref_out, count_out, spike_out, fired_out):
        n = v.shape[0]
        acc_e = np.empty(n, np.float32)  # each part zeroes its range
        acc_i = np.empty(n, np.float32)
        chunk = (n + T - 1) // T
        # Set p = step % 2: of part s, bufs[p, s], a block of targets plus one row (a row
        # starts only below the block); cuts[p, s] and ids[p, s], the row cuts and neurons
        # of its rows; meta[p, s], its rows, unfinished claim and last ticket (padded so
        # that no two parts' meta share a cache line); of range t, fired[p, t] and
        # counts[p, t], the neurons that fired.
        bufs = np.empty((2, T, block + n), np.int64)
        cuts = np.empty((2, T, n, T + 1), np.int64)
        ids = np.empty((2, T, n), np.int64)
        meta = np.zeros((2, T, 8), np.int64)
        fired = np.empty((2, T, chunk), np.int64)
        counts = np.zeros((2, T), np.int64)
        row = np.empty((T, n), np.int64)  # each part's row generated again
        steps = spike_out.shape[0]
        # of range t at step s, the excitatory and inhibitory neurons that fired
        fired_parts = np.empty((steps, T, 2), np.int64)
        sync, claims = counters(T), counters()
        for _ in numba.prange(T):
            while True:
                k = draw(sync, T)  # claimed: a thread keeps its range while it can
                phase, t = k // T, k % T
                if phase > 2 * steps:
                    break
                wait(sync, phase * T)  # every part of the phases before is done
                s, cur = phase // 2, phase // 2 % 2
                lo, hi = min(n, t * chunk), min(n, (t + 1) * chunk)
                if phase % 2 == 1:  # the rows of the neurons that fired at step s
                    generate(T, chunk, ne, n, block, seed_e, seed_i, fired[cur],
                             counts[cur], first_ticket(meta, s), claims, bufs[cur, t],
                             cuts[cur, t], ids[cur, t], meta[cur, t])
                    # the targets in its own range at once, while they are in the cache
                    add_rows(acc_e, acc_i, w_e, w_i, ne, bufs[cur, t], cuts[cur, t],
                             ids[cur, t], meta[cur, t, 0], t)
                    done(sync)
                    continue
                if s == 0:  # the state comes in range by range, each part's into its core
                    # (array by array: copies that vectorize; one loop over the six arrays
                    # made a call of 10 steps at 10x about 15% slower)
                    # (nothing to copy where the state comes aliased: in place)
                    copy_in(v[lo:hi], v_out[lo:hi])
                    copy_in(ge[lo:hi], ge_out[lo:hi])
                    copy_in(gi[lo:hi], gi_out[lo:hi])
                    copy_in(ref[lo:hi], ref_out[lo:hi])
                    copy_in(count[lo:hi], count_out[lo:hi])
                    acc_e[lo:hi] = 0.0
                    acc_i[lo:hi] = 0.0
                else:  # step s - 1's claims: its first ticket up to this step's first
                    prev = 1 - cur
                    left = (first_ticket(meta, s) - first_ticket(meta, s - 1)) * per_claim
                    scatter_own(t, T, lo, hi, ne, seed_e, seed_i, w_e, w_i, acc_e, acc_i,
                                bufs[prev], cuts[prev], ids[prev], meta[prev], fired[prev],
                                counts[prev], left, row[t])
                if s == steps:
                    finish(0, hi - lo, ge_out[lo:hi], gi_out[lo:hi], acc_e[lo:hi],
                           acc_i[lo:hi])
                else:
                    spk = spike_out[s]
                    # on slices from 0, so that Numba's indexing knows no index is negative,
                    # and a constant 'pending' in each inlined pass: the loop then vectorizes
                    # as the one-thread kernel's does
                    if s > 0:
                        update(0, hi - lo, True, v_out[lo:hi], ge_out[lo:hi], gi_out[lo:hi],
                               ref_out[lo:hi], acc_e[lo:hi], acc_i[lo:hi], spk[lo:hi],
                               count_out[lo:hi])
                    else:
                        update(0, hi - lo, False, v_out[lo:hi], ge_out[lo:hi],
                               gi_out[lo:hi], ref_out[lo:hi], acc_e[lo:hi], acc_i[lo:hi],
                               spk[lo:hi], count_out[lo:hi])
                    c = list_fired(lo, spk[lo:hi], fired[cur, t])
                    counts[cur, t] = c
                    e = 0
                    while e < c and fired[cur, t, e] < ne:  # the list increases
                        e += 1
                    fired_parts[s, t, 0], fired_parts[s, t, 1] = e, c - e
                done(sync)
        for s in range(steps):
            fired_out[s, 0], fired_out[s, 1] = 0, 0
            for t in range(T):
                fired_out[s, 0] += fired_parts[s, t, 0]
                fired_out[s, 1] += fired_parts[s, t, 1]

    return loop


def _numba_step(*, outs, in_place=True, **_):
    """The Numba kernel over stored CSR: bad column indices give NaN conductances."""
    import numba

    loop = _numba_loop(_csr_propagate())

    @numba.njit(nogil=True)
    def step(v, ge, gi, ref, count, we, e_idx, e_ptr, wi, i_idx, i_ptr,
             v_out, ge_out, gi_out, ref_out, count_out, spike_out, fired_out):
        conn = (we, e_idx, e_ptr, wi, i_idx, i_ptr)
        if not loop(v, ge, gi, ref, count, conn, v_out, ge_out, gi_out, ref_out, count_out,
                    spike_out, fired_out):
            ge_out[:] = np.nan
            gi_out[:] = np.nan

    return _in_place(step, outs, in_place)


# Below this many neurons per thread the kernel runs on one thread. With XLA's CPU pool at
# one thread (benchmarks/coba.py, "primforge fused x10 2t xla1" against "... jitc xla1",
# 2 cores, nothing else running), two threads took 0.69-0.87x the one-thread time at 10x
# (20,000 neurons each) and 0.57-0.71x at 100x, process by process, on two machines
# (docs/performance.md has every run); a step of 4,000 neurons (1x) is too short for the
# second thread to pay.
# Threads pay only on cores nothing else runs on: a step waits for its slowest thread.
THREAD_MIN_NEURONS = 10_000


def threads_used(n: int, threads: int, min_neurons: int = THREAD_MIN_NEURONS) -> int:
    """Threads the fused kernel runs ``n`` neurons on when given ``threads``: all of them
    when each gets at least ``min_neurons`` neurons, else one.

    >>> threads_used(4_000, 2), threads_used(40_000, 2), threads_used(4_000, 2, 0)
    (1, 2, 2)
    """
    return threads if threads > 1 and n >= threads * min_neurons else 1


def _numba_jitc_step(*, prob, n_exc, outs, threads=1, min_neurons=THREAD_MIN_NEURONS,
                     in_place=True, **_):
    """The Numba kernel over just-in-time connectivity: rows regenerated as spikes come,
    on ``threads`` threads when the network is large enough (:func:`threads_used`, decided
    here, from the shapes: a network run on one thread gets the one-thread kernel itself)."""
    import numba

    ne = int(n_exc)
    if threads_used(outs[0].shape[0], int(threads), int(min_neurons)) == 1:
        loop = _numba_loop(_jitc_propagate(float(prob)))

        @numba.njit(nogil=True)
        def step(v, ge, gi, ref, count, we, wi, seeds, v_out, ge_out, gi_out, ref_out,
                 count_out, spike_out, fired_out):
            buf = np.empty(_BLOCK + v.shape[0], np.int64)  # a block of targets, plus one row
            conn = (we[0], wi[0], seeds[0], seeds[1], np.int64(ne), buf)
            loop(v, ge, gi, ref, count, conn, v_out, ge_out, gi_out, ref_out, count_out,
                 spike_out, fired_out)

        return _in_place(step, outs, in_place)

    T, threaded = int(threads), _numba_jitc_loop_threaded(float(prob))

    @numba.njit(nogil=True)
    def step(v, ge, gi, ref, count, we, wi, seeds, v_out, ge_out, gi_out, ref_out, count_out,
             spike_out, fired_out):
        # int64, not the constants: one compiled loop for every network and thread count
        threaded(v, ge, gi, ref, count, we[0], wi[0], seeds[0], seeds[1], np.int64(ne),
                 np.int64(T), np.int64(_THREAD_BLOCK), v_out, ge_out, gi_out, ref_out,
                 count_out, spike_out, fired_out)

    return _in_place(step, outs, in_place)


def _jax_steps(steps, ne, v, ge, gi, ref, count, propagate_e, propagate_i):
    spikes = []
    for _ in range(steps):
        v, spike, ref = _integrate(v, ge, gi, ref)
        count = count + spike.astype(jnp.int32)
        ge = ge * DECAY_E + propagate_e(spike)
        gi = gi * DECAY_I + propagate_i(spike)
        v = jnp.where(spike, F32(VR), v)
        spikes.append(spike)
    spikes = jnp.stack(spikes)
    return v, ge, gi, ref, count, spikes, fired_per_population(spikes, ne)


def _jax_step(*, steps, **_):
    """The reference over stored CSR: the same steps in jax.numpy, scatter-add propagation."""

    def step(v, ge, gi, ref, count, we, e_idx, e_ptr, wi, i_idx, i_ptr):
        n = v.shape[0]
        ne = e_ptr.shape[0] - 1

        def prop(spk, idx, ptr, w):
            rows = jnp.repeat(jnp.arange(ptr.shape[0] - 1), jnp.diff(ptr),
                              total_repeat_length=idx.shape[0])
            return jnp.zeros(n, v.dtype).at[idx].add(jnp.where(spk[rows], w[0], 0), mode="drop")

        return _jax_steps(steps, ne, v, ge, gi, ref, count,
                          lambda s: prop(s[:ne], e_idx, e_ptr, we),
                          lambda s: prop(s[ne:], i_idx, i_ptr, wi))

    return step


def _jax_jitc_step(*, steps, prob, n_exc, **_):
    """The reference over just-in-time connectivity: the jitc product's ``jax`` backend."""

    def step(v, ge, gi, ref, count, we, wi, seeds):
        n, ne = v.shape[0], n_exc

        def prop(spk, w, seed, rows):
            return binary_jitc_matvec(w[0], seed, spk, shape=(rows, n), prob=prob,
                                      transpose=True, backend="jax")

        return _jax_steps(steps, ne, v, ge, gi, ref, count,
                          lambda s: prop(s[:ne], we, seeds[0], ne),
                          lambda s: prop(s[ne:], wi, seeds[1], n - ne))

    return step


def _check_state(v, ge, gi, ref, count, steps, who):
    n = v.shape[0]
    for name, x in (("v", v), ("ge", ge), ("gi", gi)):
        if x.shape != (n,) or x.dtype != jnp.float32:
            raise ValueError(f"{who}: '{name}' must be float32 of shape ({n},), got "
                             f"{x.dtype}{list(x.shape)}")
    for name, x in (("ref", ref), ("count", count)):
        if x.shape != (n,) or x.dtype != jnp.int32:
            raise ValueError(f"{who}: '{name}' must be int32 of shape ({n},), got "
                             f"{x.dtype}{list(x.shape)}")
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"{who}: 'steps' must be a positive int, got {steps!r}")
    f, i = jax.ShapeDtypeStruct((n,), jnp.float32), jax.ShapeDtypeStruct((n,), jnp.int32)
    return (f, f, f, i, i,
            jax.ShapeDtypeStruct((steps, n), jnp.bool_),
            jax.ShapeDtypeStruct((steps, 2), jnp.int32))


def _step_shapes(v, ge, gi, ref, count, we, e_idx, e_ptr, wi, i_idx, i_ptr, *, steps, **_):
    if we.shape != (1,) or wi.shape != (1,):
        raise ValueError("coba_step: the fused step needs one shared weight per population")
    if (e_ptr.shape[0] - 1) + (i_ptr.shape[0] - 1) != v.shape[0]:
        raise ValueError("coba_step: excitatory plus inhibitory rows must equal the neurons")
    return _check_state(v, ge, gi, ref, count, steps, "coba_step")


def _jitc_step_shapes(v, ge, gi, ref, count, we, wi, seeds, *, steps, prob, n_exc, threads=1,
                      min_neurons=THREAD_MIN_NEURONS, **_):
    if not isinstance(threads, int) or threads < 1:
        raise ValueError(f"coba_jitc_step: 'threads' must be a positive int, got {threads!r}")
    if not isinstance(min_neurons, int) or min_neurons < 0:
        raise ValueError("coba_jitc_step: 'min_neurons' must be a non-negative int, got "
                         f"{min_neurons!r}")
    if we.shape != (1,) or wi.shape != (1,) or we.dtype != jnp.float32 or wi.dtype != we.dtype:
        raise ValueError("coba_jitc_step: 'we' and 'wi' must be float32 of shape (1,)")
    if seeds.shape != (2,) or seeds.dtype != jnp.uint32:
        raise ValueError(f"coba_jitc_step: 'seeds' must be uint32 of shape (2,), got "
                         f"{seeds.dtype}{list(seeds.shape)}")
    if not 0 <= n_exc <= v.shape[0]:
        raise ValueError(f"coba_jitc_step: 'n_exc' = {n_exc} is not in [0, {v.shape[0]}]")
    return _check_state(v, ge, gi, ref, count, steps, "coba_jitc_step")


coba_step_p.def_numba_kernel(_numba_step, asdefault=True)
coba_step_p.def_kernel("jax", "cpu", _jax_step)
coba_step_p.def_abstract_eval(_step_shapes)
coba_jitc_step_p.def_numba_kernel(_numba_jitc_step, asdefault=True)
coba_jitc_step_p.def_kernel("jax", "cpu", _jax_jitc_step)
coba_jitc_step_p.def_abstract_eval(_jitc_step_shapes)


def fused_step(we: CSR | JitConn, wi: CSR | JitConn, backend: str | None = None,
               steps: int = 1, threads: int = 1, min_neurons: int = THREAD_MIN_NEURONS,
               in_place: bool = True):
    """``step(state) -> (state, spikes, fired)``: one kernel call for ``steps`` steps
    (``state``: ``v, ge, gi, ref`` and ``count``, each neuron's spikes so far, which the
    kernel adds to as it goes; ``spikes`` has shape ``(steps, n)``; ``fired``, ``(steps,
    2)``, the excitatory and inhibitory neurons that fired at each step), over stored CSR
    (``coba_step_p``) or just-in-time connectivity (``coba_jitc_step_p``, whose Numba
    kernel can run on several ``threads`` with the same results, when each thread gets
    ``min_neurons`` neurons or more). The Numba kernels update the state ``in_place`` (its
    buffers aliased to the outputs: inside a ``lax.scan``, the carry's own), or, with
    ``in_place=False``, copy it into fresh outputs first."""
    if isinstance(we, JitConn) and isinstance(wi, JitConn):
        if we.prob != wi.prob:
            raise ValueError("fused_step: both populations need the same connection prob.")
        kernel = coba_jitc_step_p
        params = {"prob": we.prob, "n_exc": we.shape[0], "threads": int(threads),
                  "min_neurons": int(min_neurons), "in_place": bool(in_place)}
        conn = (jnp.full((1,), we.weight, jnp.float32), jnp.full((1,), wi.weight, jnp.float32),
                jnp.asarray(np.array([we.seed, wi.seed], np.uint32)))
    else:
        for w in (we, wi):
            if not isinstance(w, CSR):
                raise TypeError("fused_step: the fused kernel reads stored CSR or just-in-time "
                                f"connectivity (both of one kind), got {type(w).__name__}")
            if not w.homogeneous:
                raise ValueError("fused_step: the fused kernel expects one shared weight per "
                                 "population (fixed_prob(..., weight=<number>))")
        if threads != 1:
            raise ValueError("fused_step: 'threads' > 1 needs just-in-time connectivity")
        kernel, params = coba_step_p, {"in_place": bool(in_place)}
        conn = (we.data, we.indices, we.indptr, wi.data, wi.indices, wi.indptr)

    def step(state):
        *state, spike, fired = kernel(*state, *conn, backend=backend, steps=int(steps),
                                      **params)
        return tuple(state), spike, fired

    return step


# ----------------------------------------------------------------------------- simulation
def _recorded(net: Network, raster: int) -> np.ndarray:
    """The neurons of the raster: the first 80% of them excitatory, the rest inhibitory."""
    ne = net.n_exc
    r_exc = min(ne, round(EXC_FRACTION * raster))
    return np.concatenate([np.arange(r_exc), ne + np.arange(min(net.n_inh, raster - r_exc))])


def _check_calls(n_steps: int, k: int, what: str = "steps_per_call") -> None:
    if k < 1 or n_steps % k:
        raise ValueError(f"simulator: {what}={k} must be a positive divisor of the "
                         f"{n_steps} steps")


def _chunk(net: Network, n_steps: int, *, fused: bool, backend: str | None, raster: int,
           steps_per_call: int, threads: int, min_neurons: int, counts: bool, once: bool):
    """``chunk(state, per_neuron, w_exc, w_inh) -> (state, per_neuron, pop, raster)``:
    ``n_steps`` steps from ``state`` (v, ge, gi, ref) under ``lax.scan``, adding each
    neuron's spikes to ``per_neuron``; ``pop`` holds each population's spikes per step
    (``None`` without ``counts``), ``raster`` the recorded neurons' spikes per step."""
    ne = net.n_exc
    shown = _recorded(net, raster)
    k = int(steps_per_call) if fused else 1
    _check_calls(n_steps, k)

    def chunk(state, per_neuron, w_exc, w_inh):
        if fused:  # the kernel counts each population's and each neuron's spikes as it goes
            step = fused_step(w_exc, w_inh, backend, steps=k, threads=threads,
                              min_neurons=min_neurons)
        else:
            one = plain_step(w_exc, w_inh, once=once)

            def step(state):
                *state, per_neuron = state
                state, spike = one(tuple(state))
                per_neuron = per_neuron + spike.astype(jnp.int32)
                spike = spike[None]
                return ((*state, per_neuron), spike,
                        fired_per_population(spike, ne) if counts else None)

        def body(state, _):
            state, spike, pop = step(state)  # spike: (k, n), pop: (k, 2)
            return state, (pop if counts else None, spike[:, shown])

        (*state, per_neuron), (pop, rast) = jax.lax.scan(
            body, (*state, per_neuron), None, length=n_steps // k)
        return (tuple(state), per_neuron, None if pop is None else pop.reshape(n_steps, 2),
                rast.reshape(n_steps, -1))

    return chunk


def simulator(net: Network, n_steps: int, *, fused: bool = False, backend: str | None = None,
              raster: int = RASTER_NEURONS, steps_per_call: int = 1, threads: int = 1,
              min_neurons: int = THREAD_MIN_NEURONS, counts: bool = True,
              once: bool = True):
    """A jitted ``run(v, ge, gi, w_exc, w_inh) -> dict`` of ``n_steps`` steps under ``lax.scan``.

    The result holds the spike counts of each population per step (``counts``, shape
    ``(n_steps, 2)``; with ``counts=False`` it is left out), spikes per neuron
    (``per_neuron``) and the spikes of ``raster`` neurons per step (``raster``: the first
    80% of them excitatory, the rest inhibitory). ``once`` is :func:`plain_step`'s.
    With ``fused``, each scan iteration is one kernel call that advances ``steps_per_call``
    steps (it must divide ``n_steps``).
    """
    chunk = _chunk(net, n_steps, fused=fused, backend=backend, raster=raster,
                   steps_per_call=steps_per_call, threads=threads, min_neurons=min_neurons,
                   counts=counts, once=once)

    @jax.jit
    def run(v, ge, gi, w_exc, w_inh):
        state = (v, ge, gi, jnp.zeros(v.shape, jnp.int32))
        state, per_neuron, pop, rast = chunk(state, jnp.zeros(v.shape, jnp.int32), w_exc,
                                             w_inh)
        out = {"per_neuron": per_neuron, "raster": rast, "v": state[0]}
        if counts:
            out["counts"] = pop
        return out

    return run


# Steps of a chunk of the thread-choosing simulator: about this many neuron-steps (1,000
# steps at 10x, about 45 ms on one thread; 100 at 100x), long beside the few tens of
# microseconds between two chunks, short beside the seconds a slow spell of two threads
# lasts.
CHUNK_NEURON_STEPS = 40_000_000


def chunk_steps_for(net: Network, n_steps: int, steps_per_call: int) -> int:
    """The default steps a chunk of :func:`thread_choosing_simulator`: the largest multiple
    of ``steps_per_call`` that divides ``n_steps`` and is at most ``CHUNK_NEURON_STEPS /
    net.n`` (``steps_per_call`` if none is).

    >>> net = scaled(1)  # 4,000 neurons
    >>> chunk_steps_for(net, 10_000, 10), chunk_steps_for(net, 2_000, 10)
    (10000, 2000)
    """
    k = int(steps_per_call)
    _check_calls(n_steps, k)
    most = max(k, CHUNK_NEURON_STEPS // net.n)
    for c in range(most - most % k, k - 1, -k):
        if n_steps % c == 0:
            return c
    return k


def thread_choosing_simulator(net: Network, n_steps: int, *, threads: int = 2,
                              steps_per_call: int = 10, chunk_steps: int | None = None,
                              backend: str | None = None, raster: int = RASTER_NEURONS,
                              min_neurons: int = THREAD_MIN_NEURONS, counts: bool = True,
                              choice: primforge.OnlineChoice | None = None):
    """``run(v, ge, gi, w_exc, w_inh) -> dict``: the fused simulator's run (the same
    result; the counts and raster of the chunks gathered into NumPy arrays), in chunks of
    ``chunk_steps`` steps (default :func:`chunk_steps_for`), each on one thread or on
    ``threads``, whichever :class:`primforge.OnlineChoice` finds faster at the time (both
    give the same spike trains, bit for bit). Way 0 is one thread, way 1 ``threads``;
    ``run.choice`` holds the choice, kept from call to call, ``run.threads`` the thread
    counts of the ways and ``run.chunk_steps`` the chunk. A network too small for the
    threads (:func:`threads_used`) runs on one thread only, in one call (one chunk).

    Needs just-in-time connectivity (the threaded kernel's). Both ways are compiled on the
    first call, or ahead by ``run.compile(*args)``; the chunks are run from Python: the
    state stays on the device, and the counts and raster of each chunk are gathered at the
    end.
    """
    if not isinstance(net.w_exc, JitConn):
        raise TypeError("thread_choosing_simulator: the threaded kernel needs just-in-time "
                        "connectivity (scaled(..., conn='jitc'))")
    c = chunk_steps_for(net, n_steps, steps_per_call) if chunk_steps is None else int(chunk_steps)
    _check_calls(n_steps, c, "chunk_steps")
    _check_calls(c, int(steps_per_call))
    options = [1] + ([int(threads)] if threads_used(net.n, int(threads), min_neurons) > 1 else [])
    if choice is None:
        choice = primforge.OnlineChoice(len(options))
    elif choice.ways != len(options):
        raise ValueError(f"thread_choosing_simulator: 'choice' has {choice.ways} ways, the "
                         f"network runs {len(options)} (thread counts {options})")
    compiled = []
    if len(options) == 1:  # nothing to choose: the whole run in one compiled call
        c = n_steps
        whole = simulator(net, n_steps, fused=True, backend=backend, raster=raster,
                          steps_per_call=steps_per_call, min_neurons=min_neurons,
                          counts=counts)

        def start(v, w_exc, w_inh):
            if not compiled:
                compiled.append(whole.lower(*v, w_exc, w_inh).compile())

        def run(v, ge, gi, w_exc, w_inh):
            start((v, ge, gi), w_exc, w_inh)
            return choice.run(compiled, v, ge, gi, w_exc, w_inh)
    else:
        chunks = [jax.jit(_chunk(net, c, fused=True, backend=backend, raster=raster,
                                 steps_per_call=steps_per_call, threads=t,
                                 min_neurons=min_neurons, counts=counts, once=True))
                  for t in options]

        def start(v, w_exc, w_inh):
            state = (*v, jnp.zeros(v[0].shape, jnp.int32))
            per_neuron = jnp.zeros(v[0].shape, jnp.int32)
            if not compiled:
                compiled.extend(f.lower(state, per_neuron, w_exc, w_inh).compile()
                                for f in chunks)
            return state, per_neuron

        def run(v, ge, gi, w_exc, w_inh):
            state, per_neuron = start((v, ge, gi), w_exc, w_inh)
            pops, rasts = [], []
            for _ in range(n_steps // c):
                state, per_neuron, pop, rast = choice.run(compiled, state, per_neuron, w_exc,
                                                          w_inh)
                pops.append(pop)
                rasts.append(rast)
            out = {"per_neuron": per_neuron, "raster": np.concatenate(rasts), "v": state[0]}
            if counts:
                out["counts"] = np.concatenate(pops)
            return out

    def compile_ahead(v, ge, gi, w_exc, w_inh):
        start((v, ge, gi), w_exc, w_inh)
        return run

    run.choice, run.chunk_steps, run.threads = choice, c, tuple(options)
    run.compile = compile_ahead  # run.compile(*args) compiles both ways now; gives run
    return run


def simulate(net: Network, duration_s: float, *, fused: bool = False,
             backend: str | None = None, steps_per_call: int = 1, threads: int = 1,
             min_neurons: int = THREAD_MIN_NEURONS, choose_threads: bool = True) -> dict:
    """Compile, run ``duration_s`` simulated seconds and time both phases. The fused step
    on several ``threads`` over just-in-time connectivity runs in chunks, each on one
    thread or on the threads, whichever is faster at the time
    (:func:`thread_choosing_simulator`), unless ``choose_threads`` is false."""
    n_steps = round(duration_s * 1000.0 / DT)
    args = (net.v0, net.ge0, net.gi0, net.w_exc, net.w_inh)
    t0 = time.perf_counter()
    if choose_threads and fused and threads > 1 and isinstance(net.w_exc, JitConn):
        compiled = thread_choosing_simulator(
            net, n_steps, threads=threads, steps_per_call=steps_per_call, backend=backend,
            min_neurons=min_neurons).compile(*args)
    else:
        run = simulator(net, n_steps, fused=fused, backend=backend,
                        steps_per_call=steps_per_call, threads=threads,
                        min_neurons=min_neurons)
        compiled = run.lower(*args).compile()
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    out = jax.block_until_ready(compiled(*args))
    run_s = time.perf_counter() - t0
    counts = np.asarray(out["counts"])
    return {
        "rate_exc_hz": float(counts[:, 0].sum() / net.n_exc / duration_s),
        "rate_inh_hz": float(counts[:, 1].sum() / net.n_inh / duration_s),
        "compile_s": compile_s,
        "run_s": run_s,
        "s_per_sim_s": run_s / duration_s,
        "counts": counts,
        "per_neuron": np.asarray(out["per_neuron"]),
        "raster": np.asarray(out["raster"]),
        "raster_exc": round(EXC_FRACTION * RASTER_NEURONS),
    }


def plot(result: dict, net: Network, duration_s: float, path: str) -> None:
    """Raster of the first recorded neurons and a histogram of single-neuron rates."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.2), gridspec_kw={"width_ratios": [2, 1]})
    steps, neurons = np.nonzero(result["raster"])
    exc = neurons < result["raster_exc"]
    ax1.scatter(steps[exc] * DT, neurons[exc], s=0.6, c="tab:blue", lw=0, label="E")
    ax1.scatter(steps[~exc] * DT, neurons[~exc], s=0.6, c="tab:red", lw=0, label="I")
    ax1.set(xlabel="time (ms)", ylabel="neuron (E below, I above)",
            title=f"COBA, {net.n} neurons ({result['raster'].shape[1]} shown)")
    rates = result["per_neuron"] / duration_s
    bins = np.linspace(0, max(1.0, float(rates.max())), 40)
    ax2.hist(rates[: net.n_exc], bins=bins, alpha=0.6, color="tab:blue", label="E")
    ax2.hist(rates[net.n_exc:], bins=bins, alpha=0.6, color="tab:red", label="I")
    ax2.set(xlabel="rate (Hz)", ylabel="neurons", title="single-neuron rates")
    ax2.legend(frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def peak_rss_mib() -> float:
    """Peak resident memory of this process (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", type=int, choices=(1, 10, 100), default=1,
                    help="network size: 1 (4,000 neurons, p=0.02), 10 (40,000, p=0.002) or "
                    "100 (400,000, p=0.0002)")
    ap.add_argument("--conn", choices=("csr", "jitc"), default=None,
                    help="stored CSR or just-in-time connectivity (default: jitc at 100x)")
    ap.add_argument("--duration", type=float, default=1.0, help="simulated seconds")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fused", action="store_true", help="one fused kernel per step")
    ap.add_argument("--backend", default=None, help="backend of the fused kernel (numba, jax)")
    ap.add_argument("--steps-per-call", type=int, default=1,
                    help="with --fused: steps advanced by one kernel call (divides the steps)")
    ap.add_argument("--threads", type=int, default=1,
                    help="with --fused and jitc connectivity: threads of the kernel (used "
                    "when each gets --thread-min-neurons neurons or more)")
    ap.add_argument("--thread-min-neurons", type=int, default=THREAD_MIN_NEURONS,
                    help="fewest neurons per thread for which the kernel uses threads")
    ap.add_argument("--fixed-threads", action="store_true",
                    help="with --threads > 1: every step on the threads (by default the run "
                    "goes in chunks, each on one thread or on the threads, whichever is "
                    "faster at the time)")
    ap.add_argument("--neurons", type=int, default=None, help="override the network size")
    ap.add_argument("--prob", type=float, default=None, help="override the connection prob.")
    ap.add_argument("--plot", metavar="PNG", default=None, help="write a raster + histogram")
    ap.add_argument("--xla-threads", type=int, default=None,
                    help="threads of XLA's CPU thread pool (primforge.set_cpu_threads; "
                    "default: one per core); 1 runs each step's fusions on one thread")
    ap.add_argument("--json", action="store_true", help="print one JSON line of results")
    args = ap.parse_args(argv)
    if args.xla_threads is not None:
        primforge.set_cpu_threads(args.xla_threads)  # before the first computation

    conn = args.conn or ("jitc" if args.scale == 100 else "csr")
    t0 = time.perf_counter()
    if args.neurons is not None or args.prob is not None:
        net = build(args.neurons or N_BASE * args.scale, args.prob or P_BASE / args.scale,
                    seed=args.seed, conn=conn)
    else:
        net = scaled(args.scale, args.seed, conn)
    build_s = time.perf_counter() - t0
    res = simulate(net, args.duration, fused=args.fused, backend=args.backend,
                   steps_per_call=args.steps_per_call, threads=args.threads,
                   min_neurons=args.thread_min_neurons, choose_threads=not args.fixed_threads)
    summary = {
        "impl": (("primforge fused" + (f" x{args.steps_per_call}"
                                        if args.steps_per_call > 1 else "")
                                     + (f", {args.threads} threads" if args.threads > 1 else ""))
                 if args.fused else "primforge plain")
        + (" (jitc)" if conn == "jitc" else ""),
        "neurons": net.n, "synapses": net.w_exc.nnz + net.w_inh.nnz,
        "duration_s": args.duration, "seed": args.seed, "build_s": build_s,
        **{k: res[k] for k in ("rate_exc_hz", "rate_inh_hz", "compile_s", "run_s",
                               "s_per_sim_s")},
        "peak_rss_mib": peak_rss_mib(),
    }
    if args.plot:
        plot(res, net, args.duration, args.plot)
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"COBA {summary['impl']}: {net.n} neurons, {summary['synapses']} synapses, "
              f"{args.duration:g} s simulated, seed {args.seed}")
        print(f"  rates: E {res['rate_exc_hz']:.2f} Hz, I {res['rate_inh_hz']:.2f} Hz")
        print(f"  wall time: {res['s_per_sim_s']:.3f} s per simulated second "
              f"(compile {res['compile_s']:.2f} s, build {build_s:.2f} s, excluded)")
        print(f"  peak memory: {summary['peak_rss_mib']:.0f} MiB")
    return summary


if __name__ == "__main__":
    main(sys.argv[1:])
