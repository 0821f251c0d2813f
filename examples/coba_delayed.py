"""The COBA network of primforge.sim.coba with per-synapse delays, uniform in [0.1, 5] ms.

Neurons, parameters, connectivity and initial state are those of :mod:`primforge.sim.coba`
(as ``examples/coba.py`` runs them); every synapse also gets a delay drawn uniformly from
the integer steps 1 to 50 (0.1 to 5 ms at dt = 0.1 ms). The input in transit lives in one
ring buffer per population, ``(51, n)``, carried through ``lax.scan``. One step, in the
order of Brian's schedule: integrate, detect spikes, add the spikes into the buffers
(:func:`primforge.ops.delayed_matvec`, event-driven: only the rows of the neurons that
fired are visited), read the input arriving now (:func:`primforge.ops.delay_read`) into
the conductances, reset.

Run:  python examples/coba_delayed.py [--scale 1|10] [--duration 1.0] [--seed 0] [--json]
"""

from __future__ import annotations

import argparse
import json
import resource
import time

import jax
import jax.numpy as jnp
import numpy as np

import primforge
from primforge.ops import delay_buffer, delay_read, delayed_matvec
from primforge.sim import coba

MIN_DELAY_STEPS, MAX_DELAY_STEPS = 1, 50  # 0.1 ms to 5 ms at dt = 0.1 ms


def build(n: int = coba.N_BASE, prob: float = coba.P_BASE, *, seed: int = 0):
    """``(net, delays_exc, delays_inh)``: coba's network and one delay (steps) per synapse,
    aligned with the stored weights of ``net.w_exc`` and ``net.w_inh``."""
    net = coba.build(n, prob, seed=seed)
    rng = np.random.default_rng((seed, 1))
    delays = tuple(rng.integers(MIN_DELAY_STEPS, MAX_DELAY_STEPS + 1, w.nnz).astype(np.int32)
                   for w in (net.w_exc, net.w_inh))
    return net, *delays


def delayed_step(w_exc, w_inh, d_exc, d_inh):
    """``step((v, ge, gi, ref, buf_e, buf_i), t) -> (state, spikes)``."""
    ne = w_exc.shape[0]

    def step(state, t):
        v, ge, gi, ref, buf_e, buf_i = state
        v, spike, ref = coba.neuron_update(v, ge, gi, ref)
        buf_e = delayed_matvec(w_exc, spike[:ne], d_exc, buf_e, t)
        buf_i = delayed_matvec(w_inh, spike[ne:], d_inh, buf_i, t)
        now_e, buf_e = delay_read(buf_e, t)
        now_i, buf_i = delay_read(buf_i, t)
        ge = ge * coba.DECAY_E + now_e
        gi = gi * coba.DECAY_I + now_i
        v = jnp.where(spike, coba.F32(coba.VR), v)
        return (v, ge, gi, ref, buf_e, buf_i), spike

    return step


def simulator(n_steps: int, n_exc: int):
    """A jitted ``run(net arrays, delays) -> (counts per step and population, per neuron)``."""

    @jax.jit
    def run(v, ge, gi, w_exc, w_inh, d_exc, d_inh):
        n = v.shape[0]
        step = delayed_step(w_exc, w_inh, d_exc, d_inh)

        def body(carry, t):
            state, per_neuron = carry
            state, spike = step(state, t)
            counts = jnp.stack([jnp.sum(spike[:n_exc], dtype=jnp.int32),
                                jnp.sum(spike[n_exc:], dtype=jnp.int32)])
            return (state, per_neuron + spike.astype(jnp.int32)), counts

        buf = delay_buffer(MAX_DELAY_STEPS, n, jnp.float32)
        state = (v, ge, gi, jnp.zeros(n, jnp.int32), buf, buf)
        (_, per_neuron), counts = jax.lax.scan(body, (state, jnp.zeros(n, jnp.int32)),
                                               jnp.arange(n_steps))
        return counts, per_neuron

    return run


def simulate(net, d_exc, d_inh, duration_s: float) -> dict:
    """Compile, run ``duration_s`` simulated seconds and time both phases."""
    n_steps = round(duration_s * 1000.0 / coba.DT)
    run = simulator(n_steps, net.n_exc)
    args = (net.v0, net.ge0, net.gi0, net.w_exc, net.w_inh, jnp.asarray(d_exc),
            jnp.asarray(d_inh))
    t0 = time.perf_counter()
    compiled = run.lower(*args).compile()
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    counts, per_neuron = jax.block_until_ready(compiled(*args))
    run_s = time.perf_counter() - t0
    counts = np.asarray(counts)
    return {"rate_exc_hz": float(counts[:, 0].sum() / net.n_exc / duration_s),
            "rate_inh_hz": float(counts[:, 1].sum() / net.n_inh / duration_s),
            "compile_s": compile_s, "run_s": run_s, "s_per_sim_s": run_s / duration_s,
            "counts": counts, "per_neuron": np.asarray(per_neuron)}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", type=int, choices=(1, 10), default=1,
                    help="1: 4,000 neurons, p=0.02; 10: 40,000 neurons, p=0.002")
    ap.add_argument("--neurons", type=int, default=None, help="override the network size")
    ap.add_argument("--prob", type=float, default=None, help="override the connection prob.")
    ap.add_argument("--duration", type=float, default=1.0, help="simulated seconds")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--xla-threads", type=int, default=None,
                    help="threads of XLA's CPU thread pool (primforge.set_cpu_threads; "
                    "default: one per core); 1 runs each step's fusions on one thread")
    ap.add_argument("--json", action="store_true", help="print one JSON line of results")
    args = ap.parse_args(argv)
    if args.xla_threads is not None:
        primforge.set_cpu_threads(args.xla_threads)  # before the first computation
    n = args.neurons or coba.N_BASE * args.scale
    prob = args.prob or coba.P_BASE / args.scale
    t0 = time.perf_counter()
    net, d_exc, d_inh = build(n, prob, seed=args.seed)
    build_s = time.perf_counter() - t0
    res = simulate(net, d_exc, d_inh, args.duration)
    summary = {"impl": "primforge delayed", "neurons": net.n,
               "synapses": net.w_exc.nnz + net.w_inh.nnz, "duration_s": args.duration,
               "seed": args.seed, "build_s": build_s,
               **{k: res[k] for k in ("rate_exc_hz", "rate_inh_hz", "compile_s", "run_s",
                                      "s_per_sim_s")},
               "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"COBA with delays of {MIN_DELAY_STEPS * coba.DT:g}-{MAX_DELAY_STEPS * coba.DT:g}"
              f" ms: {net.n} neurons, {summary['synapses']} synapses, {args.duration:g} s "
              f"simulated, seed {args.seed}")
        print(f"  rates: E {res['rate_exc_hz']:.2f} Hz, I {res['rate_inh_hz']:.2f} Hz")
        print(f"  wall time: {res['s_per_sim_s']:.3f} s per simulated second "
              f"(compile {res['compile_s']:.2f} s, build {build_s:.2f} s, excluded)")
    return summary


if __name__ == "__main__":
    main()
