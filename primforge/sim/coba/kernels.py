"""The fused COBA step: two kernels that advance the network whole steps per call.

One :class:`~primforge.XLACustomKernel` per kind of connectivity: ``coba_step_p`` over
stored CSR and ``coba_jitc_step_p`` over just-in-time connectivity. A call integrates the
neurons, detects their spikes, propagates them and resets, for ``steps`` steps, and counts
each population's spikes per step and each neuron's spikes as it goes. The ``numba``
backend (the default) is one Numba loop (:mod:`~primforge.sim.coba.numba_loop`; over
just-in-time connectivity, on several threads when the network is large enough,
:mod:`~primforge.sim.coba.numba_threaded`) that performs the plain step's float32
operations in the same order, so that both give the same spike trains; the ``jax``
backend is a reference written with ``jax.numpy``. The Numba kernels update the state in
place: its five arrays are aliased to the matching outputs, so that inside a
``lax.scan`` XLA hands the kernel the carry itself. :func:`fused_step` wraps both kernels
as a step function.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from primforge.backends.numba import numba_kernel
from primforge.kernel.kernel import XLACustomKernel
from primforge.ops import CSR, binary_jitc_matvec
from primforge.sim.coba.network import DECAY_E, DECAY_I, F32, VR, JitConn
from primforge.sim.coba.numba_loop import _BLOCK, _csr_propagate, _jitc_propagate, _numba_loop
from primforge.sim.coba.numba_threaded import _THREAD_BLOCK, _numba_jitc_loop_threaded
from primforge.sim.coba.plain import _integrate, fired_per_population

__all__ = ["coba_jitc_step_p", "coba_step_p", "fused_step", "threads_used"]

_STEP_DOC = """The fused COBA step over stored CSR: ``steps`` steps in one call.

Called as ``coba_step_p(v, ge, gi, ref, count, we, e_idx, e_ptr, wi, i_idx, i_ptr,
steps=K)``: the state (``v``, ``ge``, ``gi`` float32, ``ref`` and ``count``, each neuron's
spikes so far, int32, all of shape ``(n,)``) and each population's CSR matrix (one shared
weight of shape ``(1,)``, indices, indptr; excitatory rows first). Returns the state after
``K`` steps, the spikes ``(K, n)`` and each population's spikes per step ``(K, 2)``.
``in_place=False`` has the Numba kernel copy the state into fresh outputs instead of
updating it where it lies. A column index out of range gives NaN conductances.

>>> import jax.numpy as jnp
>>> from primforge.sim.coba import build, coba_step_p
>>> net = build(200, 0.1)
>>> state = (net.v0, net.ge0, net.gi0, jnp.zeros(200, jnp.int32), jnp.zeros(200, jnp.int32))
>>> w, u = net.w_exc, net.w_inh
>>> out = coba_step_p(*state, w.data, w.indices, w.indptr, u.data, u.indices, u.indptr,
...                   steps=5, backend="jax")
>>> out[5].shape, out[6].shape
((5, 200), (5, 2))
"""

_JITC_STEP_DOC = """The fused COBA step over just-in-time connectivity: ``steps`` steps in one call.

Called as ``coba_jitc_step_p(v, ge, gi, ref, count, we, wi, seeds, steps=K, prob=p,
n_exc=ne)``: the state as for ``coba_step_p``, each population's weight (float32, shape
``(1,)``) and their seeds (uint32, shape ``(2,)``). The rows of the neurons that fire are
regenerated as the kernel runs (:func:`~primforge.ops.jitc_numba_columns`). With
``threads=T`` the Numba kernel runs on ``T`` threads when each gets ``min_neurons``
neurons or more (:func:`threads_used`), with the same results bit for bit.

>>> import jax.numpy as jnp, numpy as np
>>> from primforge.sim.coba import build, coba_jitc_step_p
>>> net = build(200, 0.1, conn="jitc")
>>> state = (net.v0, net.ge0, net.gi0, jnp.zeros(200, jnp.int32), jnp.zeros(200, jnp.int32))
>>> w, u = net.w_exc, net.w_inh
>>> out = coba_jitc_step_p(*state, jnp.full(1, w.weight, jnp.float32),
...                        jnp.full(1, u.weight, jnp.float32),
...                        jnp.asarray(np.array([w.seed, u.seed], np.uint32)),
...                        steps=5, prob=w.prob, n_exc=net.n_exc, backend="jax")
>>> out[5].shape, out[6].shape
((5, 200), (5, 2))
"""


def _kernel(name: str, doc: str) -> XLACustomKernel:
    kernel = XLACustomKernel(name, doc=doc.split("\n")[0], replace=True)
    kernel.__doc__ = doc  # help() and the API pages read the instance's docstring
    return kernel


# One kernel per kind of connectivity; both share the Numba loop and have a ``jax``
# reference backend.
coba_step_p = _kernel("primforge.sim.coba_step", _STEP_DOC)
coba_jitc_step_p = _kernel("primforge.sim.coba_jitc_step", _JITC_STEP_DOC)
# doctest finds docstrings on functions and classes, not on instances
__test__ = {"coba_step_p": _STEP_DOC, "coba_jitc_step_p": _JITC_STEP_DOC}


def _in_place(step, outs, in_place: bool = True):
    """``step`` (inputs, then outputs) as a kernel whose five state outputs are written
    into the state inputs' buffers: inside a ``lax.scan`` XLA then hands the kernel the
    carry itself, and the kernel copies nothing in (``_copy_in``). ``step`` itself (the
    state copied into fresh outputs) unless ``in_place``."""
    if not in_place:
        return step
    return numba_kernel(step, outs=list(outs), input_output_aliases={i: i for i in range(5)})


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
    """``step(state) -> (state, spikes, fired)``: one fused kernel call for ``steps`` steps.

    ``state`` is ``(v, ge, gi, ref, count)``, ``count`` each neuron's spikes so far, which
    the kernel adds to as it goes; ``spikes`` has shape ``(steps, n)``; ``fired``, ``(steps,
    2)``, the excitatory and inhibitory neurons that fired at each step.

    Args:
      we: the excitatory connectivity, stored CSR with one shared weight
        (``coba_step_p``) or a :class:`~primforge.sim.coba.JitConn` (``coba_jitc_step_p``).
      wi: the inhibitory connectivity, of the same kind as ``we`` (and, just in time, the
        same connection probability).
      backend: the kernel's backend (``None``: the default, ``numba``).
      steps: steps a call advances.
      threads: over just-in-time connectivity, the Numba kernel runs on this many threads
        when each gets ``min_neurons`` neurons or more (the same results).
      min_neurons: the fewest neurons a thread is given.
      in_place: the Numba kernels update the state where it lies (its buffers aliased to
        the outputs: inside a ``lax.scan``, the carry's own); ``False`` copies it into
        fresh outputs first.

    Raises:
      TypeError: the connectivity is of neither kind, or of both.
      ValueError: several weights per population, two probabilities, or ``threads`` over
        stored CSR.

    >>> import jax.numpy as jnp
    >>> from primforge.sim.coba import build, fused_step
    >>> net = build(200, 0.1)
    >>> step = fused_step(net.w_exc, net.w_inh, steps=10)
    >>> zeros = jnp.zeros(200, jnp.int32)
    >>> state, spikes, fired = step((net.v0, net.ge0, net.gi0, zeros, zeros))
    >>> spikes.shape, fired.shape, bool((state[4] == spikes.sum(0)).all())
    ((10, 200), (10, 2), True)
    """
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


