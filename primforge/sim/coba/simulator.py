"""Simulators of the COBA network: a whole run under ``lax.scan``, timed or chosen.

:func:`simulator` compiles ``n_steps`` steps of the plain or the fused step into one
``jax.jit`` call that records each population's spikes per step, each neuron's spike
count and the spikes of a few neurons for a raster. :func:`thread_choosing_simulator` runs
the fused step over just-in-time connectivity in chunks, each a compiled call on one
thread or on several, whichever an :class:`~primforge.sim.OnlineChoice` finds faster at
the time (both ways give the same spike trains): two threads pay only while both cores
are free. :func:`simulate` compiles, runs and times a number of simulated seconds.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from primforge.sim.coba.kernels import THREAD_MIN_NEURONS, fused_step, threads_used
from primforge.sim.coba.network import DT, EXC_FRACTION, JitConn, Network
from primforge.sim.coba.plain import fired_per_population, plain_step
from primforge.sim.online import OnlineChoice

__all__ = ["chunk_steps_for", "simulate", "simulator", "thread_choosing_simulator"]

RASTER_NEURONS = 200  # neurons whose spikes are recorded for the raster plot


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
    80% of them excitatory, the rest inhibitory), and the voltage at the end (``v``).
    ``once`` is :func:`~primforge.sim.coba.plain_step`'s. With ``fused``, each scan
    iteration is one kernel call (:func:`~primforge.sim.coba.fused_step`, its ``backend``,
    ``threads`` and ``min_neurons``) that advances ``steps_per_call`` steps (it must divide
    ``n_steps``).

    >>> from primforge.sim.coba import build
    >>> net = build(400, 0.2)
    >>> run = simulator(net, 100, raster=10)
    >>> out = run(net.v0, net.ge0, net.gi0, net.w_exc, net.w_inh)
    >>> out["counts"].shape, out["raster"].shape, int(out["per_neuron"].sum()) > 0
    ((100, 2), (100, 10), True)
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

    >>> from primforge.sim.coba import scaled
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
                              choice: OnlineChoice | None = None):
    """``run(v, ge, gi, w_exc, w_inh) -> dict``: the fused simulator's run (the same
    result; the counts and raster of the chunks gathered into NumPy arrays), in chunks of
    ``chunk_steps`` steps (default :func:`chunk_steps_for`), each on one thread or on
    ``threads``, whichever :class:`OnlineChoice` finds faster at the time (both
    give the same spike trains, bit for bit). Way 0 is one thread, way 1 ``threads``;
    ``run.choice`` holds the choice, kept from call to call, ``run.threads`` the thread
    counts of the ways and ``run.chunk_steps`` the chunk. A network too small for the
    threads (:func:`threads_used`) runs on one thread only, in one call (one chunk).

    Needs just-in-time connectivity (the threaded kernel's). Both ways are compiled on the
    first call, or ahead by ``run.compile(*args)``; the chunks are run from Python: the
    state stays on the device, and the counts and raster of each chunk are gathered at the
    end.

    >>> from primforge.sim.coba import build
    >>> net = build(400, 0.2, conn="jitc")  # too small for two threads: one way
    >>> run = thread_choosing_simulator(net, 100, backend="jax")
    >>> run.threads, run.chunk_steps
    ((1,), 100)
    >>> out = run(net.v0, net.ge0, net.gi0, net.w_exc, net.w_inh)
    >>> out["counts"].shape, run.choice.chunks
    ((100, 2), [1])
    """
    if not isinstance(net.w_exc, JitConn):
        raise TypeError("thread_choosing_simulator: the threaded kernel needs just-in-time "
                        "connectivity (scaled(..., conn='jitc'))")
    c = chunk_steps_for(net, n_steps, steps_per_call) if chunk_steps is None else int(chunk_steps)
    _check_calls(n_steps, c, "chunk_steps")
    _check_calls(c, int(steps_per_call))
    options = [1] + ([int(threads)] if threads_used(net.n, int(threads), min_neurons) > 1 else [])
    if choice is None:
        choice = OnlineChoice(len(options))
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
    """Compile, run ``duration_s`` simulated seconds of ``net`` and time both phases.

    The run is :func:`simulator`'s (its ``fused``, ``backend``, ``steps_per_call``,
    ``threads`` and ``min_neurons``). The fused step on several ``threads`` over
    just-in-time connectivity runs in chunks, each on one thread or on the threads,
    whichever is faster at the time (:func:`thread_choosing_simulator`), unless
    ``choose_threads`` is false.

    Returns:
      A dict: each population's mean rate (``rate_exc_hz``, ``rate_inh_hz``), the
      seconds spent compiling (``compile_s``) and running (``run_s``, and per simulated
      second ``s_per_sim_s``), the spikes of each population per step (``counts``), of
      each neuron (``per_neuron``), the recorded neurons' spikes per step (``raster``) and
      how many of those are excitatory (``raster_exc``).

    >>> from primforge.sim.coba import build
    >>> result = simulate(build(400, 0.2), 0.01, fused=True)
    >>> result["counts"].shape, result["rate_exc_hz"] >= 0, result["s_per_sim_s"] > 0
    ((100, 2), True, True)
    """
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
