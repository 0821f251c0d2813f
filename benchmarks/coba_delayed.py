"""The COBA network with per-synapse delays (0.1-5 ms): primforge beside Brian2's C++ standalone.

Contenders, each run in its own subprocess:

* ``primforge delayed``: ``examples/coba_delayed.py`` (ring buffers, event-driven delayed
  products, the numba kernels).
* ``primforge plain (no delays)``: ``examples/coba.py``, the same network without delays,
  for the cost of the delays.
* ``brian2 cpp_standalone``: the network written in Brian2 with ``delay`` per synapse
  drawn from the same integer steps 1 to 50 (its own random connectivity and initial
  state, drawn from the same distributions), run by the interpreter given with
  ``--brian-python`` or ``$BRIAN_PYTHON``.

``--xla-threads 1`` runs primforge's contenders with XLA's CPU thread pool at one thread.

Timing: wall time of the simulation only, in seconds per simulated second (JAX compile and
Brian2's code generation and C++ compilation excluded; the standalone binary reports its
own run time). Contenders are interleaved (the order rotates with the seed), each seed draws
a new network, and the 1-minute load average is recorded before every run: the machine
this runs on may be shared, so compare runs made at similar load.

Run:  BRIAN_PYTHON=/work/venv-brian/bin/python python benchmarks/coba_delayed.py \\
          --scales 1,10 --seeds 3 --duration 1.0 \\
          --out benchmarks/reference/coba_delayed_cpu_run1.json
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
PF_DELAYED, PF_PLAIN, BRIAN = ("primforge delayed", "primforge plain (no delays)",
                               "brian2 cpp_standalone")

_BRIAN = r"""
import json, os, subprocess, sys
scale, seed_, duration, workdir = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), \
    sys.argv[4]
import brian2 as b2
from brian2 import ms, mV
b2.set_device("cpp_standalone", directory=workdir, build_on_run=False)
b2.seed(seed_)
b2.defaultclock.dt = 0.1 * ms
n = 4000 * scale; ne = int(0.8 * n); p = 0.02 / scale
taum, taue, taui = 20 * ms, 5 * ms, 10 * ms
El, Ee, Ei, Vt, Vr = -60 * mV, 0 * mV, -80 * mV, -50 * mV, -60 * mV
we, wi = 0.6, 6.7
eqs = '''
dv/dt = (El - v + ge * (Ee - v) + gi * (Ei - v)) / taum : volt (unless refractory)
dge/dt = -ge / taue : 1
dgi/dt = -gi / taui : 1
'''
P = b2.NeuronGroup(n, eqs, threshold="v > Vt", reset="v = Vr", refractory=5 * ms, method="euler")
P.v = "(randn() * 5 - 65) * mV"
P.ge = "randn() * 1.5 + 4"
P.gi = "randn() * 12 + 20"
Ce = b2.Synapses(P[:ne], P, on_pre="ge += we"); Ce.connect(p=p)
Ci = b2.Synapses(P[ne:], P, on_pre="gi += wi"); Ci.connect(p=p)
Ce.delay = "(1 + floor(rand() * 50)) * 0.1 * ms"  # integer steps 1 .. 50
Ci.delay = "(1 + floor(rand() * 50)) * 0.1 * ms"
M = b2.SpikeMonitor(P, record=False)
net = b2.Network(P, Ce, Ci, M)
net.run(duration * b2.second)
dev = b2.get_device()
dev.build(directory=workdir, compile=True, run=False)
subprocess.run([os.path.join(workdir, "main")], cwd=workdir, stdout=subprocess.DEVNULL,
               check=True)
dev.has_been_run = True
with open(os.path.join(workdir, "results", "last_run_info.txt")) as f:
    run_s = float(f.read().split()[0])
import numpy as np
count = np.asarray(M.count)
print(json.dumps(dict(neurons=n, rate_exc_hz=float(count[:ne].sum() / ne / duration),
    rate_inh_hz=float(count[ne:].sum() / (n - ne) / duration), run_s=run_s,
    s_per_sim_s=run_s / duration, version=b2.__version__)))
"""


def _child(cmd, env=None, timeout=3600) -> dict:
    out = subprocess.run(cmd, check=False, capture_output=True, text=True, cwd=ROOT, env=env,
                         timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"{cmd[:3]} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_one(contender: str, scale: int, seed: int, duration: float, brian: str,
            tmp: str, xla_threads: int | None = None) -> dict:
    if contender == BRIAN:
        workdir = tempfile.mkdtemp(dir=tmp, prefix="brian-delayed-")
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        return _child([brian, "-c", _BRIAN, str(scale), str(seed), str(duration), workdir], env)
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    example = "coba_delayed.py" if contender == PF_DELAYED else "coba.py"
    threads = [] if xla_threads is None else ["--xla-threads", str(xla_threads)]
    return _child([sys.executable, str(ROOT / "examples" / example), "--scale", str(scale),
                   "--seed", str(seed), "--duration", str(duration), "--json", *threads], env)


def summarize(rows: list[dict]) -> list[dict]:
    table = []
    for scale in sorted({r["scale"] for r in rows}):
        for name in dict.fromkeys(r["contender"] for r in rows if r["scale"] == scale):
            mine = [r for r in rows if r["scale"] == scale and r["contender"] == name]
            speed = [r["s_per_sim_s"] for r in mine]
            table.append({
                "scale": scale, "contender": name, "runs": len(mine),
                "s_per_sim_s_median": statistics.median(speed),
                "s_per_sim_s_min": min(speed), "s_per_sim_s_max": max(speed),
                "rate_exc_hz_mean": statistics.fmean(r["rate_exc_hz"] for r in mine),
                "rate_inh_hz_mean": statistics.fmean(r["rate_inh_hz"] for r in mine),
                "load_1min_mean": statistics.fmean(r["load_1min"] for r in mine)})
    return table


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scales", default="1", help="comma-separated: 1 and/or 10")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=1.0, help="simulated seconds")
    ap.add_argument("--brian-python", default=os.environ.get("BRIAN_PYTHON"))
    ap.add_argument("--no-plain", action="store_true", help="skip the run without delays")
    ap.add_argument("--xla-threads", type=int, default=None,
                    help="threads of XLA's CPU pool in primforge's runs "
                    "(primforge.set_cpu_threads; default: one per core)")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args(argv)
    contenders = [PF_DELAYED] + ([] if args.no_plain else [PF_PLAIN])
    if args.brian_python:
        contenders.append(BRIAN)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for scale in (int(s) for s in args.scales.split(",")):
            for seed in range(args.seeds):
                order = contenders[seed % len(contenders):] + contenders[:seed % len(contenders)]
                for name in order:
                    load = os.getloadavg()[0]
                    t0 = time.perf_counter()
                    res = run_one(name, scale, seed, args.duration, args.brian_python, tmp,
                                  args.xla_threads)
                    row = {"contender": name, "scale": scale, "seed": seed, "load_1min": load,
                           "process_s": time.perf_counter() - t0, **res}
                    rows.append(row)
                    print(f"x{scale} seed {seed} {name:28s} {row['s_per_sim_s']:8.3f} s/sim s "
                          f"E {row['rate_exc_hz']:6.2f} Hz  load {load:5.1f}", flush=True)
    result = {"benchmark": "coba_delayed", "duration_s": args.duration,
              "xla_threads": args.xla_threads,
              "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                          "python": platform.python_version()},
              "note": "shared, noisy machine: compare runs at similar 1-minute load",
              "summary": summarize(rows), "runs": rows}
    for line in result["summary"]:
        print(f"x{line['scale']} {line['contender']:28s} median {line['s_per_sim_s_median']:.3f}"
              f" s/sim s (min {line['s_per_sim_s_min']:.3f}, max {line['s_per_sim_s_max']:.3f}),"
              f" E {line['rate_exc_hz_mean']:.2f} Hz, load {line['load_1min_mean']:.1f}")
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
