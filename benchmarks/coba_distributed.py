"""The COBA network split by neurons across processes (examples/coba_distributed.py).

For each network size (``--scales``: 100 is 400,000 neurons and 32M synapses, 1000 is 4
million neurons and 320M synapses, both with just-in-time connectivity) and each number of
processes (``--processes``, one CPU device each, started by ``primforge.distributed``), one
run of ``--duration`` simulated seconds reports per step:

* ``step_ms``: wall time of a step (the slowest process; compile excluded; each time is
  the fastest of 2 runs after a warm-up run);
* ``compute_ms``: the local work alone: the same steps again, each reading the spikes the
  simulation gathered (recorded) instead of gathering them (the same spikes, no
  collective);
* ``exchange_ms``: the collective alone: a scan of the same number of ``all_gather``\\ s
  of the same words, each step's input depending on the previous result;
* ``step_ms - compute_ms - exchange_ms``: waiting (a process reaches the collective
  before the other, or waits to be scheduled);
* ``bytes_per_step``: the gathered spike words (N / 8 bytes, on every device);
* the firing rates (every run must give the spike counts of the one-process run) and
  the peak resident memory of each process.

Then, in this process, the excitatory product of one step (as many random spikes as the
runs' mean) is timed for each device's column window: a window's rows are generated up to
its last column, so the last window costs a whole row per spike whatever the split.

The 1-minute load average is recorded before each run: on a machine with fewer cores than
processes (or shared with other work) the times are upper bounds, while spike counts and
bytes are exact.

Run:  python benchmarks/coba_distributed.py [--scales 100,1000] [--processes 1,2,4]
          [--duration 0.02] [--out benchmarks/reference/coba_distributed_cpu.json]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "coba_distributed.py"
sys.path.insert(0, str(ROOT))

from primforge.distributed import launch


def run_one(scale: int, processes: int, duration: float, timeout: float) -> dict:
    """One launch; the per-process JSON lines merged into one row."""
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    env.pop("XLA_FLAGS", None)
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    outputs = launch(EXAMPLE, ["--scale", str(scale), "--duration", str(duration), "--json",
                               "--time-exchange", "--repeats", "2"], num_processes=processes,
                     devices_per_process=1, timeout=timeout, echo=False, env=env)
    wall = time.perf_counter() - t0
    ranks = [json.loads(next(line for line in out.splitlines() if line.startswith("{")))
             for out in outputs]
    first = ranks[0]
    return {
        "scale": scale, "neurons": first["neurons"], "synapses": first["synapses"],
        "processes": processes, "devices": first["devices"], "steps": first["steps"],
        "duration_s": duration, "spikes": first["spikes"],
        "rate_exc_hz": first["rate_exc_hz"], "rate_inh_hz": first["rate_inh_hz"],
        "step_ms": max(r["step_ms"] for r in ranks),
        "exchange_ms": max(r["exchange_ms"] for r in ranks),
        "compute_ms": max(r["compute_ms"] for r in ranks),
        "bytes_per_step": first["bytes_per_step"],
        "peak_rss_mib": [round(r["peak_rss_mib"], 1) for r in ranks],
        "compile_s": max(r["compile_s"] for r in ranks),
        "load_1min": load, "launch_wall_s": wall,
        "same_spikes_all_ranks": all(r["spikes"] == first["spikes"] for r in ranks),
    }


def window_costs(scale: int, spikes_per_step: float, parts=(1, 2, 4), repeats: int = 5) -> dict:
    """Time one excitatory product ``spikes @ W`` of the network at ``scale`` (one process,
    one device) for each device's column window when split in ``parts``: every firing row
    is generated up to the end of the window, so the last window generates whole rows.

    The spikes: ``spikes_per_step`` random excitatory neurons (the run's mean). Returns
    ``{parts: [ms of window 0, ..., ms of the last window]}``.
    """
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    import numpy as np

    from primforge.ops import binary_jitc_matvec
    from primforge.sim import coba

    net = coba.scaled(scale, 0, conn="jitc")
    we, n = net.w_exc, net.n
    rng = np.random.default_rng(1)
    spikes = np.zeros(net.n_exc, bool)
    spikes[rng.choice(net.n_exc, round(spikes_per_step * net.n_exc / n), replace=False)] = True
    out = {}
    for p in parts:
        width = -(-n // (32 * p)) * 32
        f = jax.jit(lambda s, c0, width=width: binary_jitc_matvec(
            we.weight, we.seed, s, shape=we.shape, prob=we.prob, transpose=True,
            cols=(c0, width)))
        times = []
        for k in range(p):
            jax.block_until_ready(f(spikes, k * width))
            best = float("inf")
            for _ in range(repeats):
                t0 = time.perf_counter()
                jax.block_until_ready(f(spikes, k * width))
                best = min(best, time.perf_counter() - t0)
            times.append(round(1e3 * best, 3))
        out[p] = times
    return out


def table(rows: list[dict]) -> str:
    head = ("| neurons | processes | step (ms) | compute (ms) | all_gather (ms) | bytes/step "
            "| rate E / I (Hz) | peak RSS per process (MiB) | load (1 min) |")
    lines = [head, "|" + " --- |" * 9]
    for r in rows:
        lines.append(
            f"| {r['neurons']:,} | {r['processes']} | {r['step_ms']:.2f} | "
            f"{r['compute_ms']:.2f} | {r['exchange_ms']:.2f} | {r['bytes_per_step']:,} | "
            f"{r['rate_exc_hz']:.2f} / {r['rate_inh_hz']:.2f} | "
            f"{', '.join(f'{m:.0f}' for m in r['peak_rss_mib'])} | {r['load_1min']:.1f} |")
    return "\n".join(lines)


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scales", default="100,1000")
    ap.add_argument("--processes", default="1,2,4")
    ap.add_argument("--duration", type=float, default=0.02, help="simulated seconds")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per launch")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "reference"
                                         / "coba_distributed_cpu.json"))
    ap.add_argument("--windows-only", action="store_true",
                    help="read the runs from --out and time only the column windows")
    args = ap.parse_args(argv)
    rows = []
    if args.windows_only:
        previous = json.loads(pathlib.Path(args.out).read_text())
        rows, meta = previous["runs"], previous["meta"]
    for scale in (int(s) for s in args.scales.split(",") if not args.windows_only):
        base = None
        for procs in (int(p) for p in args.processes.split(",")):
            row = run_one(scale, procs, args.duration, args.timeout)
            base = base or row
            row["same_spikes_as_first"] = row["spikes"] == base["spikes"]
            rows.append(row)
            print(json.dumps(row), flush=True)
            if not (row["same_spikes_as_first"] and row["same_spikes_all_ranks"]):
                raise SystemExit(f"spike counts differ: {row['spikes']} vs {base['spikes']}")
    print(table(rows))
    windows, window_load = {}, os.getloadavg()[0]
    for scale in sorted({r["scale"] for r in rows}):
        first = next(r for r in rows if r["scale"] == scale)
        per_step = sum(first["spikes"]) / first["steps"]
        windows[scale] = window_costs(scale, per_step)
        print(f"{scale}x: excitatory product per column window, ms (window 0 .. last): "
              f"{windows[scale]}", flush=True)
    if not args.windows_only:
        meta = {"command": "python benchmarks/coba_distributed.py "
                + " ".join(argv or sys.argv[1:]), "cpu_count": os.cpu_count(),
                "machine": platform.machine(),
                "note": "1 CPU device per process; times are wall times on a machine whose "
                        "load is recorded per run (load_1min)"}
    meta["window_load_1min"] = window_load
    pathlib.Path(args.out).write_text(json.dumps({"meta": meta, "runs": rows,
                                                "window_ms": windows}, indent=1) + "\n")
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
