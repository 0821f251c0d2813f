"""The COBA benchmark network (Brette et al. 2007, Benchmark 1), with primforge.sim.

Conductance-based leaky integrate-and-fire neurons after Vogels & Abbott (2005), with the
parameters of Brian 1's script for the benchmark: 4,000 neurons (80% excitatory), every pair
connected with probability 0.02, no external input (the activity is self-sustained from the
initial state). The network, its steps and simulators are :mod:`primforge.sim.coba`; this
script runs one simulation and reports its rates, speed and memory:

* plain: ``jax.numpy`` for the neurons and two event-driven products of
  :mod:`primforge.ops` (:func:`primforge.sim.coba.plain_step`);
* fused (``--fused``): one kernel call per step, or per ``--steps-per-call`` steps, that
  integrates, detects, propagates and counts in a single Numba loop
  (:func:`primforge.sim.coba.fused_step`); the same spike trains.

``--scale 10`` has 40,000 neurons with p = 0.002 (the same 80 inputs per neuron) and
``--scale 100`` 400,000 neurons with p = 0.0002, whose connectivity is never stored: with
``--conn jitc`` (the default at 100x) each product regenerates the rows of the spiking
neurons from a seed, so memory stays flat.

With ``--fused --threads 2`` over just-in-time connectivity the run goes in chunks, each
on one thread or on two, whichever is faster at the time
(:func:`primforge.sim.coba.thread_choosing_simulator`, the same spike trains);
``--fixed-threads`` runs every step on the threads.

Run:  python examples/coba.py [--scale 1|10|100] [--conn csr|jitc] [--duration 1.0]
      [--seed 0] [--fused] [--plot coba.png] [--json]
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time

import numpy as np

import primforge
from primforge.sim import coba


def plot(result: dict, net: coba.Network, duration_s: float, path: str) -> None:
    """Raster of the first recorded neurons and a histogram of single-neuron rates."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.2), gridspec_kw={"width_ratios": [2, 1]})
    steps, neurons = np.nonzero(result["raster"])
    exc = neurons < result["raster_exc"]
    ax1.scatter(steps[exc] * coba.DT, neurons[exc], s=0.6, c="tab:blue", lw=0, label="E")
    ax1.scatter(steps[~exc] * coba.DT, neurons[~exc], s=0.6, c="tab:red", lw=0, label="I")
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
    ap.add_argument("--thread-min-neurons", type=int, default=coba.THREAD_MIN_NEURONS,
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
        net = coba.build(args.neurons or coba.N_BASE * args.scale,
                         args.prob or coba.P_BASE / args.scale, seed=args.seed, conn=conn)
    else:
        net = coba.scaled(args.scale, args.seed, conn)
    build_s = time.perf_counter() - t0
    res = coba.simulate(net, args.duration, fused=args.fused, backend=args.backend,
                        steps_per_call=args.steps_per_call, threads=args.threads,
                        min_neurons=args.thread_min_neurons,
                        choose_threads=not args.fixed_threads)
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
