"""The COBA network (primforge.sim.coba) on every simulator at hand, in one run.

Contenders, each run in its own subprocess (so peak memory is that run's alone):

* ``primforge plain``: :mod:`primforge.sim.coba`'s plain step (jax.numpy neurons + CSR event
  products).
* ``primforge fused``: its fused step (one kernel call per step).
* ``primforge fused x10``: one kernel call per 10 steps; ``primforge fused x100``, per 100
  steps (``primforge fused x100 2t`` and ``x100 auto``: on two threads and choosing, as
  ``x10 2t`` and ``x10 auto``).
* ``primforge fused x10 jitc``: the same over just-in-time connectivity (at 1x and 10x; at
  100x ``primforge fused x10`` is that).
* ``primforge fused x10 2t``: the same on two threads over just-in-time connectivity
  (the same spike trains as one thread; the kernel uses the threads only where each gets
  enough neurons, :mod:`primforge.sim.coba`'s ``THREAD_MIN_NEURONS``).
* ``primforge fused x10 auto``: the same network chunk by chunk, each chunk on one thread
  or two, whichever ran faster lately (:func:`primforge.sim.coba.thread_choosing_simulator`,
  :class:`primforge.OnlineChoice`; the same spike trains); the JSON line gives the chunks
  each way ran and their total time (first call included).
* ``primforge fused x10 stored``: the fused step over stored CSR connectivity (at 100x,
  where primforge's other rows use just-in-time connectivity).
* ``brainevent``: the same jax.numpy step with brainevent's CSR event products
  (``EventArray(spikes) @ brainevent.CSR``), same connectivity and initial state (stored,
  at every scale), run by the interpreter of ``--brainevent-python`` (default: this one).
* ``brian2 numpy`` / ``brian2 cython`` / ``brian2 cpp_standalone``: the network written in
  Brian2 (its own random connectivity and initial state, drawn from the same
  distributions), run by the interpreter given with ``--brian-python`` or
  ``$BRIAN_PYTHON`` (Brian2 wants its own environment: ``numpy<2.4``);
  ``brian2 cpp_standalone 2t``: the standalone binary built with OpenMP on 2 threads
  (``prefs.devices.cpp_standalone.openmp_threads``).
* ``... pinned``: a JAX contender under ``taskset -c 0``. XLA's runtime keeps threads of
  its own next to the one that runs the loop, so an unpinned "one-thread" JAX process uses
  more than one core of CPU time; pinned, it gets one core, as Brian2 does.
* ``... xla1``: a JAX contender whose XLA CPU thread pool has one thread
  (:func:`primforge.set_cpu_threads`, ``PJRT_NPROC=1``): XLA runs every fusion on the
  thread that runs the loop instead of splitting the large ones over its pool; not pinned.

Recording: primforge's contenders count the spikes of each neuron, as Brian2's
``SpikeMonitor(record=False)`` does; brainevent's count the spikes of each population.

Timing, the same for every contender: wall clock (``time.perf_counter``) around the
simulation only, measured inside the process that simulates, plus that process's CPU
time (user + system, all its threads) over the same interval. JAX contenders compile, run
once (one-time costs of a first call: Numba's and brainevent's kernels, buffers) and then
time later, identical calls (the median; as many as take ``--min-time`` seconds, since
``/proc/stat`` counts in 10 ms ticks). Brian2's runtime targets run 1 ms first (code
generation and compilation), then the timed run, continued until ``--min-time`` has
passed (rates from the first run). Its standalone binary gets a wall and CPU clock inserted
around the network runs in the generated ``main`` (Brian2's own run time is CPU time), so
network construction inside the binary is excluded; it runs about ``--min-time`` seconds
(a fixed number of continued runs, rates from the first). Memory: peak resident set of
the process that simulates (``ru_maxrss``; for cpp_standalone that of the binary).

Disturbance: each run records the 1-minute load average before it starts and the CPU time
that other processes took during its timed interval (``/proc/stat`` busy time minus the
run's own CPU time, in cores). A run in which other processes took more than
``--max-other`` cores (default 0.3) is marked disturbed and rerun, up to ``--retries``
times; the table's medians are over the undisturbed runs when a contender has any, over
all runs otherwise, and the table says how many runs were disturbed.

Contenders are interleaved (the order rotates with the seed) and each seed draws a new
network; rates agree when the mean rates over seeds differ by less than three combined
standard errors plus 1 Hz.

Run:  BRIAN_PYTHON=/work/venv-brian/bin/python python benchmarks/coba.py \
          --scales 1,10,100 --seeds 3,2,1 --duration 1.0,0.5,0.1
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
RESULTS = ROOT / "benchmarks" / "results"
PF = ("primforge plain", "primforge fused", "primforge fused x10", "primforge fused x10 jitc",
      "primforge fused x10 2t", "primforge fused x10 auto", "primforge fused x10 stored",
      "primforge fused x100", "primforge fused x100 2t", "primforge fused x100 auto")
# At 100x primforge's steps use just-in-time connectivity (never stored; the fused one
# regenerates the rows of the neurons that fired inside the kernel); "primforge fused x10
# stored", brainevent and Brian2 store the 32M synapses. (brainevent's own just-in-time
# matrices are not event-driven in the x @ W direction: one product of that size takes
# seconds, so a run would take hours.) "... stored" runs at 100x only, "... jitc" (one
# thread over just-in-time connectivity, the one-thread counterpart of "... 2t") below.
BRIAN = ("brian2 numpy", "brian2 cython", "brian2 cpp_standalone",
         "brian2 cpp_standalone 2t")
PINNED = tuple(f"{name} pinned" for name in (*PF[:3], "primforge fused x10 stored",
                                             "primforge fused x100", "brainevent"))
XLA1 = tuple(f"{name} xla1" for name in (*PF[:6], *PF[7:], "brainevent"))
ALL = (*PF, "brainevent", *BRIAN, *PINNED, *XLA1)


def base_name(contender: str) -> str:
    """The contender without its ``pinned`` / ``xla1`` suffix."""
    return contender.removesuffix(" pinned").removesuffix(" xla1")

# ----------------------------------------------------------------------------- probes
# Shared by the Python children: wall clock, busy CPU time of the whole machine (/proc/stat:
# user, nice, system, irq, softirq, steal) and this process's CPU time.
_PROBE = r"""
import os, resource, time
_TCK = os.sysconf("SC_CLK_TCK")
def _probe():
    with open("/proc/stat") as f:
        u, n, s, idle, iow, irq, sirq, st = (int(x) for x in f.readline().split()[1:9])
    r = resource.getrusage(resource.RUSAGE_SELF)
    return time.perf_counter(), (u + n + s + irq + sirq + st) / _TCK, r.ru_utime + r.ru_stime
def _interval(p0, p1, reps=1):
    wall, cpu = p1[0] - p0[0], p1[2] - p0[2]
    return dict(run_s=wall / reps, cpu_s=cpu / reps, reps=reps,
                other_cpu_cores=max(0.0, (p1[1] - p0[1]) - cpu) / wall)
"""

# ----------------------------------------------------------------------------- JAX child
_JAX = _PROBE + r"""
import json, statistics, sys
sys.path.insert(0, {root!r})
import jax, jax.numpy as jnp, numpy as np
from primforge.sim import coba
scale, seed, duration, kind = {scale}, {seed}, {duration}, {kind!r}
fused, k, threads, conn, choosing = {fused}, {k}, {threads}, {conn!r}, {choosing}
n_steps = int(round(duration * 1000 / coba.DT))
net = coba.scaled(scale, seed, conn)
if kind == "brainevent":
    import brainevent
    version = brainevent.__version__
    # brainevent sizes its workspace from a concrete indptr: the matrices are built outside
    # jit and closed over (its intended use).
    we = brainevent.CSR((net.w_exc.data, net.w_exc.indices, net.w_exc.indptr),
                        shape=net.w_exc.shape)
    wi = brainevent.CSR((net.w_inh.data, net.w_inh.indices, net.w_inh.indptr),
                        shape=net.w_inh.shape)
    ne = net.n_exc
    @jax.jit
    def run(v, ge, gi):
        def body(carry, _):
            (v, ge, gi, ref), count = carry
            v, spike, ref = coba.neuron_update(v, ge, gi, ref)
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
    counts = lambda out: np.asarray(out)
else:
    import primforge
    version = getattr(primforge, "__version__", None)
    # Records the spikes of each neuron, as Brian2's SpikeMonitor(record=False) does.
    if choosing:  # chunk by chunk, on one thread or two
        run = coba.thread_choosing_simulator(net, n_steps, threads=threads, steps_per_call=k,
                                             raster=0, counts=False)
    else:
        run = coba.simulator(net, n_steps, fused=fused, steps_per_call=k, threads=threads,
                             raster=0, counts=False)
    args = (net.v0, net.ge0, net.gi0, net.w_exc, net.w_inh)
    def counts(out):
        per_neuron = np.asarray(out["per_neuron"])
        return np.array([per_neuron[:net.n_exc].sum(), per_neuron[net.n_exc:].sum()])
t0 = time.perf_counter()
# the choosing run compiles both of its ways ahead
compiled = run.compile(*args) if choosing else run.lower(*args).compile()
compile_s = time.perf_counter() - t0
jax.block_until_ready(compiled(*args))  # the first call, with its one-time costs, untimed
# Later calls, identical, until {min_time} s have passed: /proc/stat counts in clock ticks.
walls, p0 = [], _probe()
while not walls or sum(walls) < {min_time}:
    t0 = time.perf_counter(); out = jax.block_until_ready(compiled(*args))
    walls.append(time.perf_counter() - t0)
p1 = _probe()
count = counts(out)
timing = _interval(p0, p1, len(walls))
timing["mean_run_s"] = timing["run_s"]  # the mean over the timed calls
timing["run_s"] = statistics.median(walls)
if choosing:
    timing["chunks_per_way"] = dict(zip(map(str, run.threads), run.choice.chunks))
    timing["seconds_per_way"] = dict(zip(map(str, run.threads), run.choice.seconds))
print(json.dumps(dict(neurons=net.n, rate_exc_hz=float(count[0] / net.n_exc / duration),
    rate_inh_hz=float(count[1] / net.n_inh / duration), compile_s=compile_s, **timing,
    s_per_sim_s=timing["run_s"] / duration, cpu_s_per_sim_s=timing["cpu_s"] / duration,
    peak_rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    version=version)))
"""

# ----------------------------------------------------------------------------- brian2 child
# Inserted around the network run of the standalone binary: wall clock, the process's CPU
# clock and the machine's busy time, written to results/bench_clock.txt.
_CPP_CLOCK = r"""
auto _bench_busy = []() {
    std::ifstream f("/proc/stat"); std::string cpu;
    unsigned long long u, n, s, idle, iow, irq, sirq, st;
    f >> cpu >> u >> n >> s >> idle >> iow >> irq >> sirq >> st;
    return u + n + s + irq + sirq + st;
};
struct timespec _bench_w0, _bench_c0, _bench_w1, _bench_c1;
unsigned long long _bench_b0 = _bench_busy();
clock_gettime(CLOCK_MONOTONIC, &_bench_w0); clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &_bench_c0);
"""
_CPP_CLOCK_END = r"""
clock_gettime(CLOCK_MONOTONIC, &_bench_w1); clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &_bench_c1);
unsigned long long _bench_b1 = _bench_busy();
{
    std::ofstream f(brian::results_dir + "bench_clock.txt");
    f << (_bench_w1.tv_sec - _bench_w0.tv_sec) + 1e-9 * (_bench_w1.tv_nsec - _bench_w0.tv_nsec)
      << " " << (_bench_c1.tv_sec - _bench_c0.tv_sec)
                 + 1e-9 * (_bench_c1.tv_nsec - _bench_c0.tv_nsec)
      << " " << (_bench_b1 - _bench_b0) << std::endl;
}
"""

_BRIAN = _PROBE + r"""
import json, math, subprocess, sys
target, workdir = sys.argv[1], sys.argv[5]
scale, seed_, duration = int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
cpp_clock, cpp_clock_end, min_time = sys.argv[6], sys.argv[7], float(sys.argv[8])
threads = int(sys.argv[9])
# The standalone binary runs a fixed number of times: at least 0.1 s per simulated second
# per 4,000 neurons, about min_time in all.
reps = 1 if target != "cpp_standalone" else max(1, math.ceil(min_time / (0.1 * scale * duration)))
import numpy as np
import brian2 as b2
from brian2 import ms, mV
if target == "cpp_standalone":
    b2.set_device("cpp_standalone", directory=workdir, build_on_run=False)
    if threads > 1:  # OpenMP in the generated code
        b2.prefs.devices.cpp_standalone.openmp_threads = threads
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
    dev = b2.get_device()
    dev.insert_code("main", cpp_clock)
    net.run(duration * b2.second)
    M.active = False  # rates from the first run; the others continue it, for the clock
    for _ in range(reps - 1):
        net.run(duration * b2.second)
    dev.insert_code("main", cpp_clock_end)
    dev.build(directory=workdir, compile=True, run=False)
    proc = subprocess.Popen([os.path.join(workdir, "main")], cwd=workdir, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    assert status == 0, status
    dev.has_been_run = True
    with open(os.path.join(workdir, "results", "bench_clock.txt")) as f:
        wall, cpu, busy = (float(x) for x in f.read().split())
    timing = dict(run_s=wall / reps, cpu_s=cpu / reps, reps=reps,
                  other_cpu_cores=max(0.0, busy / _TCK - cpu) / wall)
    rss = usage.ru_maxrss / 1024
    sim_s = duration
else:
    net.run(1 * ms)  # code generation and compilation
    p0 = _probe(); net.run(duration * b2.second); reps = 1
    count = np.array(M.count)
    while time.perf_counter() - p0[0] < min_time:  # continue the run, for the clock
        net.run(duration * b2.second); reps += 1
    p1 = _probe()
    timing = _interval(p0, p1, reps)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    sim_s = duration + 1e-3
if target == "cpp_standalone":
    count = np.asarray(M.count)
print(json.dumps(dict(neurons=n, rate_exc_hz=float(count[:ne].sum() / ne / sim_s),
    rate_inh_hz=float(count[ne:].sum() / (n - ne) / sim_s), **timing,
    s_per_sim_s=timing["run_s"] / duration, cpu_s_per_sim_s=timing["cpu_s"] / duration,
    peak_rss_mib=rss, version=b2.__version__)))
"""


def _child(cmd, env=None, timeout=1800) -> dict:
    out = subprocess.run(cmd, check=False, capture_output=True, text=True, cwd=ROOT, env=env,
                         timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"{cmd[:3]} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _jax_options(contender: str, scale: int) -> dict:
    name = base_name(contender)
    stored = name == "brainevent" or name.endswith("stored") or scale != 100
    return {"kind": "brainevent" if name == "brainevent" else "primforge",
            "fused": "fused" in name,
            "k": 100 if "x100" in name else 10 if "x10" in name else 1,
            "threads": 2 if name.endswith(("2t", "auto")) else 1,
            "conn": "jitc" if name.endswith(("2t", "auto", "jitc")) or not stored else "csr",
            "choosing": name.endswith("auto")}


def _brian_target(contender: str) -> tuple[str, int]:
    """Brian2's code-generation target and OpenMP threads of a ``brian2 ...`` contender."""
    words = contender.split()
    return words[1], int(words[2].removesuffix("t")) if len(words) > 2 else 1


def run_one(contender: str, scale: int, seed: int, duration: float, brian: str | None,
            brainevent_python: str, tmp: str, min_time: float = 1.0) -> dict:
    """Run one contender in a child process; returns its JSON line."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    if contender in BRIAN:
        target, threads = _brian_target(contender)
        workdir = tempfile.mkdtemp(dir=tmp, prefix=f"brian-{target}-")
        benv = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
        return _child([brian, "-c", _BRIAN, target, str(scale), str(seed), str(duration),
                       workdir, _CPP_CLOCK, _CPP_CLOCK_END, str(min_time), str(threads)],
                      benv)
    opts = _jax_options(contender, scale)
    code = _JAX.format(root=str(ROOT), scale=scale, seed=seed, duration=duration,
                       min_time=min_time, **opts)
    python = brainevent_python if opts["kind"] == "brainevent" else sys.executable
    prefix = ["taskset", "-c", "0"] if contender.endswith(" pinned") else []
    if contender.endswith(" xla1"):
        env["PJRT_NPROC"] = "1"  # what primforge.set_cpu_threads(1) sets
    else:
        env.pop("PJRT_NPROC", None)
    return _child([*prefix, python, "-c", code], env)


def _cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` where there is one), for the run's record."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _loadavg() -> float:
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def _mean_se(xs):
    m = statistics.fmean(xs)
    se = statistics.stdev(xs) / len(xs) ** 0.5 if len(xs) > 1 else 0.0
    return m, se


def summarize(rows: list[dict]) -> list[dict]:
    """One entry per (scale, contender): rates over seeds, medians of the kept runs.

    Of the retries of one (scale, contender, seed), the last one counts (the earlier ones
    were disturbed); timing medians are over the undisturbed runs when there are any.
    """
    last = {}
    for r in rows:
        last[(r["scale"], r["contender"], r["seed"])] = r
    rows = list(last.values())
    table = []
    for scale in sorted({r["scale"] for r in rows}):
        at = [r for r in rows if r["scale"] == scale]
        names = list(dict.fromkeys(r["contender"] for r in at))
        for name in names:
            # Rates are compared with primforge's plain step (with the one-thread fused step
            # over just-in-time connectivity for the others over it), or the first one run.
            jitc = name.endswith(("2t", "auto", "jitc")) and scale != 100
            ref_name = "primforge fused x10 jitc" if jitc else "primforge plain"
            ref_name = ref_name if ref_name in names else names[0]
            base = [r for r in at if r["contender"] == ref_name]
            mine = [r for r in at if r["contender"] == name]
            quiet = [r for r in mine if not r["disturbed"]] or mine
            entry = {"scale": scale, "contender": name, "runs": len(mine),
                     "disturbed_runs": sum(r["disturbed"] for r in mine)}
            for key in ("rate_exc_hz", "rate_inh_hz"):
                m, se = _mean_se([r[key] for r in mine])
                entry[key], entry[key + "_se"] = m, se
                if name != ref_name:
                    bm, bse = _mean_se([r[key] for r in base])
                    entry.setdefault("rates_agree", True)
                    entry["rates_agree"] &= abs(m - bm) <= 3 * (se**2 + bse**2) ** 0.5 + 1.0
            for key in ("s_per_sim_s", "cpu_s_per_sim_s", "other_cpu_cores", "load_avg_1m"):
                entry[key] = statistics.median(r[key] for r in quiet)
            entry["peak_rss_mib"] = max(r["peak_rss_mib"] for r in mine)
            table.append(entry)
    return table


def markdown(table: list[dict]) -> str:
    """The table as Markdown."""
    lines = [("| scale | contender | E rate (Hz) | I rate (Hz) | rates agree | wall s per sim. s "
              "| CPU s per sim. s | others' CPU (cores) | load (1 min) | disturbed "
              "| peak memory (MiB) |"),
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for e in table:
        lines.append(
            f"| {e['scale']}x | {e['contender']} | {e['rate_exc_hz']:.1f} ± "
            f"{e['rate_exc_hz_se']:.1f} | {e['rate_inh_hz']:.1f} ± {e['rate_inh_hz_se']:.1f} | "
            f"{ {True: 'yes', False: 'NO'}.get(e.get('rates_agree'), 'reference')} | "
            f"{e['s_per_sim_s']:.3f} | {e['cpu_s_per_sim_s']:.3f} | "
            f"{e['other_cpu_cores']:.2f} | {e['load_avg_1m']:.1f} | "
            f"{e['disturbed_runs']}/{e['runs']} | {e['peak_rss_mib']:.0f} |")
    return "\n".join(lines)


def _per_scale(text: str, scales: list[int], kind):
    values = [kind(x) for x in text.split(",")]
    if len(values) == 1:
        values = values * len(scales)
    if len(values) != len(scales):
        raise SystemExit(f"coba.py: give one value or one per scale, got {text!r}")
    return dict(zip(scales, values, strict=True))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scales", default="1,10")
    ap.add_argument("--seeds", default="3", help="seeds per scale (one, or one per scale)")
    ap.add_argument("--duration", default="1.0",
                    help="simulated seconds per run (one, or one per scale)")
    ap.add_argument("--contenders", default=",".join(ALL))
    ap.add_argument("--brian-python", default=os.environ.get("BRIAN_PYTHON"),
                    help="python of an environment with brian2 (default $BRIAN_PYTHON)")
    ap.add_argument("--brainevent-python", default=os.environ.get("BRAINEVENT_PYTHON",
                                                                   sys.executable),
                    help="python of an environment with brainevent, jax and primforge's "
                    "dependencies (default $BRAINEVENT_PYTHON, else this one)")
    ap.add_argument("--skip", default="", help="scale:contender pairs to leave out, e.g. "
                    "'10:brian2 numpy'")
    ap.add_argument("--max-other", type=float, default=0.3,
                    help="a run is disturbed when other processes took more CPU (cores)")
    ap.add_argument("--min-time", type=float, default=1.0,
                    help="seconds of simulation timed per run at least (runs repeated)")
    ap.add_argument("--retries", type=int, default=2, help="reruns of a disturbed run")
    ap.add_argument("--out", default=str(RESULTS / "coba.json"))
    ap.add_argument("--markdown", default=None, help="also write the table to this file")
    args = ap.parse_args(argv)

    contenders = [c.strip() for c in args.contenders.split(",") if c.strip()]
    unknown = sorted(set(contenders) - set(ALL))
    if unknown:
        raise SystemExit(f"coba.py: unknown contenders {unknown}; known: {list(ALL)}")
    if not args.brian_python:
        print("no --brian-python / $BRIAN_PYTHON: Brian2 left out", file=sys.stderr)
        contenders = [c for c in contenders if c not in BRIAN]
    skip = {tuple(s.split(":", 1)) for s in args.skip.split(",") if ":" in s}
    scales = [int(s) for s in args.scales.split(",")]
    seeds = _per_scale(args.seeds, scales, int)
    durations = _per_scale(args.duration, scales, float)
    meta = {"durations_s": durations, "seeds": seeds, "cpus": os.cpu_count(),
            "cpu_model": _cpu_model(),
            "python": sys.version.split()[0], "max_other_cores": args.max_other,
            "retries": args.retries, "min_time_s": args.min_time,
            "argv": sys.argv[1:] if argv is None else list(argv)}
    rows = []
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="coba-bench-") as tmp:
        for seed in range(max(seeds.values())):
            order = contenders[seed % len(contenders):] + contenders[:seed % len(contenders)]
            for scale in scales:
                if seed >= seeds[scale]:
                    continue
                for name in order:
                    base = base_name(name)
                    if ((str(scale), name) in skip or (scale != 100 and base.endswith("stored"))
                            or (scale == 100 and base.endswith("jitc"))):
                        continue
                    for attempt in range(args.retries + 1):
                        load = _loadavg()
                        t0 = time.perf_counter()
                        res = run_one(name, scale, seed, durations[scale], args.brian_python,
                                      args.brainevent_python, tmp, args.min_time)
                        res.update(contender=name, scale=scale, seed=seed, attempt=attempt,
                                   duration_s=durations[scale], load_avg_1m=load,
                                   disturbed=res["other_cpu_cores"] > args.max_other,
                                   wall_total_s=time.perf_counter() - t0)
                        rows.append(res)
                        print(f"{scale:>3}x seed {seed} {name:<29} E {res['rate_exc_hz']:6.2f} "
                              f"I {res['rate_inh_hz']:6.2f} Hz {res['s_per_sim_s']:7.3f} s/s "
                              f"cpu {res['cpu_s_per_sim_s']:7.3f} others "
                              f"{res['other_cpu_cores']:4.2f} load {load:4.1f} "
                              f"{res['peak_rss_mib']:5.0f} MiB"
                              + (" DISTURBED" if res["disturbed"] else ""), flush=True)
                        with open(args.out, "w") as f:  # every run so far, kept on a crash
                            json.dump({"meta": meta, "runs": rows}, f, indent=1)
                        if not res["disturbed"]:
                            break
    table = summarize(rows)
    text = markdown(table)
    print()
    print(text)
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "runs": rows, "table": table}, f, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")
    return table


if __name__ == "__main__":
    main(sys.argv[1:])
