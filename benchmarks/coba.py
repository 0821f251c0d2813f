"""The COBA network (examples/coba.py) on every simulator at hand, in one run.

Contenders, each run in its own subprocess (so peak memory is that run's alone):

* ``primforge plain``: ``examples/coba.py`` (jax.numpy neurons + CSR event products).
* ``primforge fused``: ``examples/coba.py --fused`` (one kernel call per step).
* ``primforge fused x10``: ``--fused --steps-per-call 10`` (one kernel call per 10 steps).
* ``primforge fused x10 2t``: the same on two threads (at 100x only: at 1x and 10x a step
  is too short to pay for the threads' synchronisation; the same spike trains as one
  thread).
* ``primforge fused x10 stored``: the same over stored CSR connectivity (at 100x, where the
  others use just-in-time connectivity).
* ``brainevent``: the same jax.numpy step with brainevent's CSR event products
  (``EventArray(spikes) @ brainevent.CSR``), same connectivity and initial state (stored,
  at every scale).
* ``brian2 numpy`` / ``brian2 cython`` / ``brian2 cpp_standalone``: the network written in
  Brian2 (its own random connectivity and initial state, drawn from the same
  distributions), run by the interpreter given with ``--brian-python`` or
  ``$BRIAN_PYTHON`` (Brian2 wants its own environment: ``numpy<2.4``).

Timing: wall time of the simulation only (JAX compile, Brian2 code generation and
compilation excluded: JAX runs a compiled executable; Brian2's runtime targets run 1 ms
first, and its standalone binary reports its own run time). Memory: peak resident set of
the process that simulates (``ru_maxrss``; for cpp_standalone that of the binary).

Contenders are interleaved (the order rotates with the seed) and each seed draws a new
network; rates agree when the mean rates over seeds differ by less than three combined
standard errors plus 1 Hz.

Run:  BRIAN_PYTHON=/work/venv-brian/bin/python python benchmarks/coba.py \
          --scales 1,10 --seeds 3 --duration 1.0
      (add ``--scales 100 --duration 0.05 --seeds 1`` for the 400,000-neuron network)
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PF = ("primforge plain", "primforge fused", "primforge fused x10", "primforge fused x10 2t",
      "primforge fused x10 stored")
# At 100x primforge's steps use just-in-time connectivity (never stored; the fused one
# regenerates the rows of the neurons that fired inside the kernel); "primforge fused x10
# stored", brainevent and Brian2 store the 32M synapses. (brainevent's own just-in-time
# matrices are not event-driven in the x @ W direction: one product of that size takes
# seconds, so a run would take hours.) "... stored" and "... 2t" run at 100x only.
BRIAN = ("brian2 numpy", "brian2 cython", "brian2 cpp_standalone")

# ----------------------------------------------------------------------------- brainevent child
_BRAINEVENT = r"""
import importlib.util, json, resource, sys, time
sys.path.insert(0, {root!r})
import jax, jax.numpy as jnp, numpy as np
import brainevent
spec = importlib.util.spec_from_file_location("coba_example", {example!r})
coba = importlib.util.module_from_spec(spec); sys.modules[spec.name] = coba
spec.loader.exec_module(coba)
scale, seed, duration = {scale}, {seed}, {duration}
net = coba.scaled(scale, seed)
# brainevent sizes its workspace from a concrete indptr: the matrices are built outside jit
# and closed over (its intended use).
we = brainevent.CSR((net.w_exc.data, net.w_exc.indices, net.w_exc.indptr), shape=net.w_exc.shape)
wi = brainevent.CSR((net.w_inh.data, net.w_inh.indices, net.w_inh.indptr), shape=net.w_inh.shape)
ne, n_steps = net.n_exc, int(round(duration * 1000 / coba.DT))
@jax.jit
def run(v, ge, gi):
    def body(carry, _):
        (v, ge, gi, ref), count = carry
        v, spike, ref = coba._integrate(v, ge, gi, ref)
        ge = ge * coba.DECAY_E + brainevent.EventArray(spike[:ne]) @ we
        gi = gi * coba.DECAY_I + brainevent.EventArray(spike[ne:]) @ wi
        v = jnp.where(spike, coba.F32(coba.VR), v)
        count = count + jnp.stack([spike[:ne].sum(dtype=jnp.int32),
                                   spike[ne:].sum(dtype=jnp.int32)])
        return ((v, ge, gi, ref), count), None
    init = ((v, ge, gi, jnp.zeros(v.shape, jnp.int32)), jnp.zeros(2, jnp.int32))
    (_, count), _ = jax.lax.scan(body, init, None, length=n_steps)
    return count
args = (net.v0, net.ge0, net.gi0)
t0 = time.perf_counter()
compiled = run.lower(*args).compile()
compile_s = time.perf_counter() - t0
t0 = time.perf_counter(); count = np.asarray(jax.block_until_ready(compiled(*args)))
run_s = time.perf_counter() - t0
print(json.dumps(dict(neurons=net.n, rate_exc_hz=count[0] / net.n_exc / duration,
    rate_inh_hz=count[1] / net.n_inh / duration, compile_s=compile_s, run_s=run_s,
    s_per_sim_s=run_s / duration,
    peak_rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    version=brainevent.__version__)))
"""

# ----------------------------------------------------------------------------- brian2 child
_BRIAN = r"""
import json, os, resource, subprocess, sys, time
target, workdir = sys.argv[1], sys.argv[5]
scale, seed_, duration = int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
import brian2 as b2
from brian2 import ms, mV
if target == "cpp_standalone":
    b2.set_device("cpp_standalone", directory=workdir, build_on_run=False)
else:
    b2.prefs.codegen.target = target
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
M = b2.SpikeMonitor(P, record=False)
net = b2.Network(P, Ce, Ci, M)
if target == "cpp_standalone":
    net.run(duration * b2.second)
    dev = b2.get_device()
    dev.build(directory=workdir, compile=True, run=False)
    proc = subprocess.Popen([os.path.join(workdir, "main")], cwd=workdir, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    assert status == 0, status
    dev.has_been_run = True
    with open(os.path.join(workdir, "results", "last_run_info.txt")) as f:
        run_s = float(f.read().split()[0])
    rss = usage.ru_maxrss / 1024
    sim_s = duration
else:
    net.run(1 * ms)  # code generation and compilation
    t0 = time.perf_counter(); net.run(duration * b2.second); run_s = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    sim_s = duration + 1e-3
import numpy as np
count = np.asarray(M.count)
print(json.dumps(dict(neurons=n, rate_exc_hz=float(count[:ne].sum() / ne / sim_s),
    rate_inh_hz=float(count[ne:].sum() / (n - ne) / sim_s), run_s=run_s,
    s_per_sim_s=run_s / duration, peak_rss_mib=rss, version=b2.__version__)))
"""


def _child(cmd, env=None, timeout=1800) -> dict:
    out = subprocess.run(cmd, check=False, capture_output=True, text=True, cwd=ROOT, env=env,
                         timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"{cmd[:3]} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_one(contender: str, scale: int, seed: int, duration: float, brian: str | None,
            tmp: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    if contender in PF:
        cmd = [sys.executable, str(ROOT / "examples" / "coba.py"), "--scale", str(scale),
               "--seed", str(seed), "--duration", str(duration), "--json"]
        if "fused" in contender:
            cmd.append("--fused")
        if "x10" in contender:
            cmd += ["--steps-per-call", "10"]
        if contender.endswith("2t"):
            cmd += ["--threads", "2", "--conn", "jitc"]
        if contender.endswith("stored"):
            cmd += ["--conn", "csr"]
        return _child(cmd, env)
    if contender == "brainevent":
        code = _BRAINEVENT.format(root=str(ROOT), example=str(ROOT / "examples" / "coba.py"),
                                  scale=scale, seed=seed, duration=duration)
        return _child([sys.executable, "-c", code], env)
    target = contender.split()[1]
    workdir = tempfile.mkdtemp(dir=tmp, prefix=f"brian-{target}-")
    benv = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    return _child([brian, "-c", _BRIAN, target, str(scale), str(seed), str(duration), workdir],
                  benv)


def _mean_se(xs):
    m = statistics.fmean(xs)
    se = statistics.stdev(xs) / len(xs) ** 0.5 if len(xs) > 1 else 0.0
    return m, se


def summarize(rows: list[dict]) -> list[dict]:
    table = []
    for scale in sorted({r["scale"] for r in rows}):
        at = [r for r in rows if r["scale"] == scale]
        names = list(dict.fromkeys(r["contender"] for r in at))
        # Rates are compared with primforge's plain step, or the first contender run.
        ref_name = "primforge plain" if "primforge plain" in names else names[0]
        base = [r for r in at if r["contender"] == ref_name]
        for name in names:
            mine = [r for r in at if r["contender"] == name]
            entry = {"scale": scale, "contender": name, "runs": len(mine)}
            for key in ("rate_exc_hz", "rate_inh_hz"):
                m, se = _mean_se([r[key] for r in mine])
                entry[key], entry[key + "_se"] = m, se
                if name != ref_name:
                    bm, bse = _mean_se([r[key] for r in base])
                    entry.setdefault("rates_agree", True)
                    entry["rates_agree"] &= abs(m - bm) <= 3 * (se**2 + bse**2) ** 0.5 + 1.0
            entry["s_per_sim_s"] = statistics.median(r["s_per_sim_s"] for r in mine)
            entry["peak_rss_mib"] = max(r["peak_rss_mib"] for r in mine)
            table.append(entry)
    return table


def markdown(table: list[dict]) -> str:
    lines = [("| scale | contender | E rate (Hz) | I rate (Hz) | rates agree | s per simulated s "
              "| peak memory (MiB) |"), "| --- | --- | --- | --- | --- | --- | --- |"]
    for e in table:
        lines.append(
            f"| {e['scale']}x | {e['contender']} | {e['rate_exc_hz']:.1f} ± "
            f"{e['rate_exc_hz_se']:.1f} | {e['rate_inh_hz']:.1f} ± {e['rate_inh_hz_se']:.1f} | "
            f"{ {True: 'yes', False: 'NO'}.get(e.get('rates_agree'), 'reference')} | "
            f"{e['s_per_sim_s']:.3f} | "
            f"{e['peak_rss_mib']:.0f} |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scales", default="1,10")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=1.0, help="simulated seconds per run")
    ap.add_argument("--contenders", default=",".join((*PF, "brainevent", *BRIAN)))
    ap.add_argument("--brian-python", default=os.environ.get("BRIAN_PYTHON"),
                    help="python of an environment with brian2 (default $BRIAN_PYTHON)")
    ap.add_argument("--skip", default="", help="scale:contender pairs to leave out, e.g. "
                    "'10:brian2 numpy'")
    ap.add_argument("--out", default=str(RESULTS / "coba.json"))
    ap.add_argument("--markdown", default=None, help="also write the table to this file")
    args = ap.parse_args(argv)

    contenders = [c.strip() for c in args.contenders.split(",") if c.strip()]
    if not args.brian_python:
        print("no --brian-python / $BRIAN_PYTHON: Brian2 left out", file=sys.stderr)
        contenders = [c for c in contenders if c not in BRIAN]
    skip = {tuple(s.split(":", 1)) for s in args.skip.split(",") if ":" in s}
    scales = [int(s) for s in args.scales.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="coba-bench-") as tmp:
        for seed in range(args.seeds):
            order = contenders[seed % len(contenders):] + contenders[:seed % len(contenders)]
            for scale in scales:
                for name in order:
                    small_only = scale != 100 and name.endswith(("stored", "2t"))
                    if (str(scale), name) in skip or small_only:
                        continue
                    t0 = time.perf_counter()
                    res = run_one(name, scale, seed, args.duration, args.brian_python, tmp)
                    res.update(contender=name, scale=scale, seed=seed,
                               wall_total_s=time.perf_counter() - t0)
                    rows.append(res)
                    print(f"{scale:>3}x seed {seed} {name:<22} E {res['rate_exc_hz']:6.2f} Hz "
                          f"I {res['rate_inh_hz']:6.2f} Hz  {res['s_per_sim_s']:7.3f} s/s  "
                          f"{res['peak_rss_mib']:6.0f} MiB", flush=True)
    table = summarize(rows)
    text = markdown(table)
    print()
    print(text)
    meta = {"duration_s": args.duration, "seeds": args.seeds, "cpus": os.cpu_count(),
            "load_avg": os.getloadavg(), "python": sys.version.split()[0]}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "runs": rows, "table": table}, f, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")
    return table


if __name__ == "__main__":
    main(sys.argv[1:])
