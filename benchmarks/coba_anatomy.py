"""Where a plain COBA step's time goes: the loop, the neurons, the products, the recording.

The plain step of :mod:`primforge.sim.coba` (``jax.numpy`` neurons and one event-driven product
per population over stored CSR, or with ``--conn jitc`` over just-in-time connectivity) is
timed whole and in parts, each part a jitted
``lax.scan`` over the same number of steps, on the same network:

* ``loop``: a scan whose body carries the four state arrays through and counts the steps:
  what one iteration of XLA's CPU loop costs;
* ``neurons``: the Euler step, spike detection, reset and the conductances' decay, no
  input (the arithmetic of every step, whatever fires);
* ``silent step``: the plain step with its products' events masked off at run time (an
  all-false mask XLA cannot fold): the same computation, no row visited. Minus
  ``neurons``, what the products cost whatever fires (the output vector, finding the
  spiking rows, the sum); ``step`` minus it, what the spikes' rows cost;
* ``step``: the whole plain step, no recording;
* ``simulate``: :func:`primforge.sim.coba.simulator` recording what ``benchmarks/coba.py``
  records: the step plus the spike count of each neuron;
* ``step, recomputed`` and ``simulate, recomputed``: the same two without
  :func:`primforge.evaluate_once` around the neuron update, so that XLA's CPU compiler
  computes the update again inside the fusion of each of its readers.

Every variant but the two ``recomputed`` computes the neuron update once
(:func:`primforge.sim.coba.neuron_update`).

With ``--fused K`` the same is done for the fused step of ``K`` steps a kernel call, over
just-in-time connectivity (one thread), to see what recording and copying cost beside
the kernel:

* ``kernel``: the scan of kernel calls, each neuron's spike count kept by the kernel as
  it goes, the state updated in place (the simulator's way);
* ``copying``: the same with a kernel that copies the state into fresh outputs at each
  call (``fused_step(..., in_place=False)``);
* ``rows``: the same, with each neuron's spike count also summed by XLA beside the kernel,
  adding the rows of each call's ``(K, n)`` spikes one at a time (an elementwise loop over
  contiguous rows);
* ``columns``: the same, summed by XLA's reduction over the steps' axis instead;
* ``simulate``: the simulator as ``benchmarks/coba.py`` runs it.

The variants run interleaved (rotating which goes first), ``--reps`` times each; the table
gives the median wall time per step, the CPU time per wall time of the process during that
variant (XLA's runtime threads show as more than 1), and each part's share of ``step``
(of ``kernel`` with ``--fused``).
``--xla-threads 1`` runs everything with XLA's CPU thread pool at one thread
(:func:`primforge.set_cpu_threads`).

    python benchmarks/coba_anatomy.py                         # scales 1 and 10, 0.2 s each
    python benchmarks/coba_anatomy.py --scales 1,10,100 --duration 0.1 --reps 5
    python benchmarks/coba_anatomy.py --xla-threads 1
    python benchmarks/coba_anatomy.py --scales 100 --duration 0.1 --reps 5 --conn jitc
    python benchmarks/coba_anatomy.py --fused 100 --xla-threads 1 --duration 0.4
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp
import numpy as np

RESULTS = ROOT / "benchmarks" / "results"


def _example():
    """:mod:`primforge.sim.coba`, imported once XLA's thread pool is set (``--xla-threads``)."""
    from primforge.sim import coba

    return coba


def variants(coba, net, n_steps: int):
    """``{name: (jitted function, args)}`` for the variants on ``net``."""
    ne, f32 = net.n_exc, np.float32
    state0 = (net.v0, net.ge0, net.gi0, jnp.zeros(net.n, jnp.int32))

    def scan(body, carry, xs=None):
        return jax.lax.scan(lambda c, x: (body(c, x), None), carry, xs, length=n_steps)[0]

    @jax.jit
    def loop(state):  # the state passes through; a step counter keeps the loop a loop
        return scan(lambda c, _: (c[0], c[1] + 1), (state, jnp.int32(0)))

    @jax.jit
    def neurons(state):
        def body(s, _):
            v, ge, gi, ref = s
            v, spike, ref = coba.neuron_update(v, ge, gi, ref)
            return (jnp.where(spike, f32(coba.VR), v), ge * coba.DECAY_E, gi * coba.DECAY_I,
                    ref)
        return scan(body, state)

    @jax.jit
    def silent_step(state, w_exc, w_inh, mask):
        # The plain step whose products get its spikes masked off by an all-false vector
        # known only at run time: the same computation, except that no row is visited.
        def body(s, _):
            v, ge, gi, ref = s
            v, spike, ref = coba.neuron_update(v, ge, gi, ref)
            quiet = spike & mask
            ge = ge * coba.DECAY_E + quiet[:ne] @ w_exc
            gi = gi * coba.DECAY_I + quiet[ne:] @ w_inh
            return jnp.where(spike, f32(coba.VR), v), ge, gi, ref
        return scan(body, state)

    def step_of(once):
        @jax.jit
        def step(state, w_exc, w_inh):
            one = coba.plain_step(w_exc, w_inh, once=once)
            return scan(lambda s, _: one(s)[0], state)
        return step

    step, step_recomputed = step_of(True), step_of(False)
    # As benchmarks/coba.py records:
    simulate = coba.simulator(net, n_steps, raster=0, counts=False)
    recomputed = coba.simulator(net, n_steps, raster=0, counts=False, once=False)
    w = (net.w_exc, net.w_inh)
    record = simulate(net.v0, net.ge0, net.gi0, *w)
    return {
        "loop": (loop, (state0,)),
        "neurons": (neurons, (state0,)),
        "silent step": (silent_step, (state0, *w, jnp.zeros(net.n, bool))),
        "step": (step, (state0, *w)),
        "simulate": (simulate, (net.v0, net.ge0, net.gi0, *w)),
        "step, recomputed": (step_recomputed, (state0, *w)),
        "simulate, recomputed": (recomputed, (net.v0, net.ge0, net.gi0, *w)),
    }, float(np.asarray(record["per_neuron"]).sum() / (n_steps * net.n))


def fused_variants(coba, net, n_steps: int, k: int):
    """``{name: (jitted function, args)}`` for the fused step of ``k`` steps a call."""
    def run(record):
        @jax.jit
        def fn(v, ge, gi, w_exc, w_inh):
            # "copying": the kernel copies the state into fresh outputs (not in place)
            step = coba.fused_step(w_exc, w_inh, steps=k, in_place=record != "copying")

            def body(carry, _):
                state, count = carry
                state, spike, _ = step(state)  # the kernel counts in state[4]
                if record == "columns":  # XLA's reduction over the steps' axis
                    count = count + jnp.sum(spike, axis=0, dtype=jnp.int32)
                elif record == "rows":  # XLA's elementwise sum, a row at a time
                    for r in range(k):
                        count = count + spike[r].astype(jnp.int32)
                else:
                    count = state[4]
                return (state, count), None

            zero = jnp.zeros(v.shape, jnp.int32)
            (state, count), _ = jax.lax.scan(body, ((v, ge, gi, zero, zero), zero), None,
                                             length=n_steps // k)
            return {"v": state[0], "per_neuron": count}
        return fn

    args = (net.v0, net.ge0, net.gi0, net.w_exc, net.w_inh)
    simulate = coba.simulator(net, n_steps, fused=True, steps_per_call=k, raster=0,
                              counts=False)
    record = simulate(*args)
    return {"kernel": (run("kernel"), args), "copying": (run("copying"), args),
            "rows": (run("rows"), args), "columns": (run("columns"), args),
            "simulate": (simulate, args)}, float(
        np.asarray(record["per_neuron"]).sum() / (n_steps * net.n))


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def measure(fns: dict, reps: int) -> dict:
    """Median wall seconds and CPU/wall of each variant, run interleaved."""
    for fn, args in fns.values():  # compile and warm up
        jax.block_until_ready(fn(*args))
    wall = {k: [] for k in fns}
    cpu = {k: [] for k in fns}
    names = list(fns)
    for r in range(reps):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            fn, args = fns[name]
            c0, t0 = _cpu(), time.perf_counter()
            jax.block_until_ready(fn(*args))
            wall[name].append(time.perf_counter() - t0)
            cpu[name].append(_cpu() - c0)
    return {k: {"wall_s": statistics.median(wall[k]),
                "cpu_per_wall": sum(cpu[k]) / sum(wall[k])} for k in fns}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scales", default="1,10")
    ap.add_argument("--duration", type=float, default=0.2, help="simulated seconds a run")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--xla-threads", type=int, default=None,
                    help="threads of XLA's CPU pool (default: one per core)")
    ap.add_argument("--conn", choices=("csr", "jitc"), default="csr",
                    help="the plain step's connectivity: stored CSR or just-in-time")
    ap.add_argument("--fused", type=int, default=0, metavar="K",
                    help="time the fused step of K steps a call instead (jitc, one thread)")
    ap.add_argument("--out", default=None,
                    help="JSON file (default: results/coba_anatomy[_fused].json)")
    args = ap.parse_args()
    if args.xla_threads is not None:
        import primforge

        primforge.set_cpu_threads(args.xla_threads)
    coba = _example()
    n_steps = round(args.duration * 1000.0 / coba.DT)
    k = args.fused
    if k and n_steps % k:
        ap.error(f"--fused {k} must divide the {n_steps} steps of --duration")
    out = args.out or str(RESULTS / f"coba_anatomy{'_fused' if k else ''}.json")
    base = "kernel" if k else "step"
    rows = []
    print(f"{n_steps} steps a run, {args.reps} runs a variant, medians; "
          f"{jax.devices()[0].platform}, XLA CPU threads {args.xla_threads or 'default'}, "
          f"1-minute load {os.getloadavg()[0]:.1f}")
    print(f"| scale | neurons | spikes/step | variant | us/step | share of {base} | CPU/wall |")
    print("|---|---|---|---|---|---|---|")
    for scale in (int(s) for s in args.scales.split(",")):
        if k:
            net = coba.scaled(scale, seed=0, conn="jitc")
            fns, rate = fused_variants(coba, net, n_steps, k)
        else:
            net = coba.scaled(scale, seed=0, conn=args.conn)
            fns, rate = variants(coba, net, n_steps)
        got = measure(fns, args.reps)
        step = got[base]["wall_s"]
        for name, m in got.items():
            us = 1e6 * m["wall_s"] / n_steps
            share = m["wall_s"] / step
            print(f"| {scale}x | {net.n:,} | {rate * net.n:.1f} | {name} | {us:.1f} | "
                  f"{share:.2f} | {m['cpu_per_wall']:.2f} |")
            rows.append({"scale": scale, "neurons": net.n, "spikes_per_step": rate * net.n,
                         "variant": name, "us_per_step": us, "share_of_step": share,
                         "cpu_per_wall": m["cpu_per_wall"], "steps": n_steps,
                         "reps": args.reps, "xla_threads": args.xla_threads,
                         "conn": "jitc" if k else args.conn,
                         "steps_per_call": k or None})
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps({"rows": rows, "load": os.getloadavg()[0]}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
