"""Whole processes of the fused COBA simulator on one thread and on two, timed call by call.

``benchmarks/coba.py`` times a whole process once; ``benchmarks/coba_threads.py`` times the
kernels side by side in one process. This script sits between them: it starts
``--processes`` rounds of two processes each (one thread, then two threads; each process
alone on the machine), and each process builds the simulator of :mod:`primforge.sim.coba`
(fused kernel, ``--steps-per-call`` steps a kernel call, just-in-time connectivity, XLA's
CPU pool at one thread) for ``--call-steps`` steps, then runs it ``--calls`` times from the
same initial state and records the wall time of every call. A process whose calls change
speed while it runs shows it here, call by call, where a whole-process figure only shows
the mean. Every call of every process must give the same spike counts (checked).

The table gives, per process, the median, quartiles and maximum of the call times, and how
many calls took more than 1.5 times the median of the one-thread processes; the JSON holds
every call's time.

    python benchmarks/coba_thread_calls.py                        # 10x, 3 rounds, 150 calls
    python benchmarks/coba_thread_calls.py --scale 100 --call-steps 200 --calls 60
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
SLOW = 1.5  # a call is slow above this many times the one-thread processes' median


def _example():
    """:mod:`primforge.sim.coba`, imported once XLA's thread pool is set."""
    from primforge.sim import coba

    return coba


def time_calls(coba, net, threads: int, call_steps: int, steps_per_call: int,
               calls: int) -> dict:
    """Run the fused simulator ``calls`` times (after one warm-up call) and return each
    call's wall time in milliseconds and the spike count of each neuron, which every call
    must reproduce (checked)."""
    import jax
    import numpy as np

    run = coba.simulator(net, call_steps, fused=True, steps_per_call=steps_per_call,
                         threads=threads, raster=0, counts=False)
    args = (net.v0, net.ge0, net.gi0, net.w_exc, net.w_inh)
    first = np.asarray(jax.block_until_ready(run(*args))["per_neuron"])
    ms = []
    for _ in range(calls):
        t0 = time.perf_counter()
        out = jax.block_until_ready(run(*args))
        ms.append((time.perf_counter() - t0) * 1e3)
        if not np.array_equal(np.asarray(out["per_neuron"]), first):
            raise RuntimeError(f"threads={threads}: a call gave other spike counts")
    return {"ms": ms, "per_neuron": first.tolist()}


def summarize(ms: list[float], reference_ms: float) -> dict:
    """Median, quartiles and maximum of one process's call times, and how many calls took
    more than ``SLOW`` times ``reference_ms``."""
    q1, median, q3 = statistics.quantiles(ms, n=4, method="inclusive")
    return {"median_ms": median, "q1_ms": q1, "q3_ms": q3, "max_ms": max(ms),
            "slow_calls": sum(1 for x in ms if x > SLOW * reference_ms), "calls": len(ms)}


def _child(a) -> None:
    import primforge

    primforge.set_cpu_threads(1)
    coba = _example()
    net = coba.scaled(a.scale, seed=a.seed, conn="jitc")
    got = time_calls(coba, net, a.child, a.call_steps, a.steps_per_call, a.calls)
    print(json.dumps({"ms": got["ms"], "spikes": int(sum(got["per_neuron"]))}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--call-steps", type=int, default=1000, help="steps a simulator call")
    ap.add_argument("--steps-per-call", type=int, default=10, help="steps a kernel call")
    ap.add_argument("--calls", type=int, default=150)
    ap.add_argument("--processes", type=int, default=3, help="rounds of one and two threads")
    ap.add_argument("--out", default=str(RESULTS / "coba_thread_calls.json"))
    ap.add_argument("--child", type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        _child(a)
        return
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    runs = []
    for r in range(a.processes):
        for threads in (1, 2):
            cmd = [sys.executable, __file__, "--child", str(threads), "--scale", str(a.scale),
                   "--seed", str(a.seed), "--call-steps", str(a.call_steps),
                   "--steps-per-call", str(a.steps_per_call), "--calls", str(a.calls)]
            out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
            if out.returncode:
                raise SystemExit(f"threads={threads}: {out.stderr[-2000:]}")
            got = json.loads(out.stdout.strip().splitlines()[-1])
            runs.append({"round": r, "threads": threads, **got})
    if len({run["spikes"] for run in runs}) != 1:
        raise SystemExit(f"the processes disagree on the spike count: "
                         f"{[run['spikes'] for run in runs]}")
    reference = statistics.median(x for run in runs if run["threads"] == 1 for x in run["ms"])
    print(f"{a.scale}x, {a.call_steps} steps a call ({a.steps_per_call} a kernel call), "
          f"{a.calls} calls a process; one-thread median {reference:.1f} ms")
    print("| round | threads | median ms | q1-q3 ms | max ms | calls over "
          f"{SLOW}x the one-thread median |")
    print("|---|---|---|---|---|---|")
    for run in runs:
        run.update(summarize(run["ms"], reference))
        print(f"| {run['round']} | {run['threads']} | {run['median_ms']:.1f} | "
              f"{run['q1_ms']:.1f}-{run['q3_ms']:.1f} | {run['max_ms']:.1f} | "
              f"{run['slow_calls']} of {run['calls']} |")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"argv": sys.argv[1:], "cpus": os.cpu_count(),
                                       "one_thread_median_ms": reference, "runs": runs},
                                      indent=1))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
