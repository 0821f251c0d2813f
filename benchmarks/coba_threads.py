"""The fused COBA kernel on one thread and on two, side by side in one process.

For the network of :mod:`primforge.sim.coba` over just-in-time connectivity at each scale, from
a settled state (the network run ``--settle`` steps first), the same ``--steps`` steps are
run four ways, interleaved (rotating which goes first), ``--reps`` times each:

* ``one thread``: the one-thread fused kernel;
* ``one part``: the threaded kernel with one part (one range of every neuron) on one
  thread: what its form (the phases, the lists of neurons that fired, the buffered rows)
  costs before any cut;
* ``parts on one thread``: the two-thread kernel with Numba's pool at one thread, which
  then does both parts of every phase in turn: what cutting the work in two costs;
* ``two threads``: the two-thread kernel on two threads;
* ``two threads at REV`` (with ``--against REV``): the two-thread kernel as it is at the
  git revision ``REV`` of this repository (``primforge/sim/coba`` there, or
  ``examples/coba.py`` at a revision before that package), on two threads, to compare two
  forms of the kernel side by side.

A run is one kernel call, or with ``--steps-per-call K`` calls of ``K`` steps, each from
the state the one before ended in (each call of the two-thread kernel opens a parallel
region and wakes Numba's sleeping worker, as in a simulation of ``K`` steps a call).
The ways give the same spike trains, bit for bit (checked at every run). Each way writes
into output arrays of its own, allocated and touched once and then reused, as XLA reuses
its buffers from call to call: a run does not pay for fresh pages. The table gives the
median and quartiles of the wall time per step, and the medians' ratios to one thread.

``--probe S`` first runs one single-thread loop on each core at once for ``S`` seconds
(a process pinned to each, a fixed floating-point loop over 240 KB) and gives each core's
time per pass, second by second: a step on two threads waits for the slower core, so a
core that runs slower for a while slows every step of that while.

    python benchmarks/coba_threads.py                       # 10x, 1,000 steps, 15 reps
    python benchmarks/coba_threads.py --scales 10,100 --steps 2000,200 --probe 30
    python benchmarks/coba_threads.py --against HEAD~1
    python benchmarks/coba_threads.py --steps 2000 --steps-per-call 10
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np

RESULTS = ROOT / "benchmarks" / "results"
WAYS = ("one thread", "one part", "parts on one thread", "two threads")

_PROBE = """
import os, sys, time
import numpy as np
import numba

@numba.njit(fastmath=True)
def passes(a, b, reps):
    for _ in range(reps):
        for i in range(a.shape[0]):
            b[i] = a[i] * 1.0001 + b[i] * 0.5

os.sched_setaffinity(0, {int(sys.argv[1])})
a = np.random.default_rng(0).random(30_000).astype(np.float32)
b = a.copy()
passes(a, b, 1)
start, seconds = float(sys.argv[2]), float(sys.argv[3])
while time.time() < start:
    pass
times = []
while time.time() < start + seconds:
    t0 = time.perf_counter()
    passes(a, b, 200)
    times.append((time.time() - start, (time.perf_counter() - t0) / 200 * 1e6))
per_second = [float(np.median([t for s, t in times if k <= s < k + 1]))
              for k in range(int(seconds))]
print(" ".join(f"{x:.3f}" for x in per_second))
"""


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def probe_cores(seconds: float) -> dict:
    """Each core's time per pass of one loop, second by second, all cores at once."""
    cores = sorted(os.sched_getaffinity(0))
    start = time.time() + 10.0  # after every process has compiled its loop
    procs = [subprocess.Popen([sys.executable, "-c", _PROBE, str(c), str(start), str(seconds)],
                              stdout=subprocess.PIPE, text=True) for c in cores]
    out = {}
    for c, p in zip(cores, procs):
        text, _ = p.communicate()
        if p.returncode != 0:
            raise RuntimeError(f"the probe on core {c} failed")
        out[c] = [float(x) for x in text.split()]
    return out


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                          check=True).stdout


def example_at(rev: str, folder: Path):
    """The threaded kernel's module as it is at the git revision ``rev``: the one with
    ``_numba_jitc_loop_threaded`` and ``_THREAD_BLOCK``.

    Where ``rev`` has ``primforge/sim/coba``, its modules are copied into ``folder`` as a
    package of another name (their imports of one another pointed at the copy; the rest
    of primforge is the present one) and its ``numba_threaded`` is loaded, without the
    package's ``__init__`` (which would register the revision's kernels under the present
    ones' names). At a revision before that package, its ``examples/coba.py``."""
    folder.mkdir(parents=True, exist_ok=True)
    package = "primforge/sim/coba"
    paths = _git("ls-tree", "--name-only", rev, f"{package}/").split()
    names = [p.rsplit("/", 1)[1] for p in paths]
    if not names:
        path = folder / "coba_at_rev.py"
        path.write_text(_git("show", f"{rev}:examples/coba.py"))
        return _load(path, "coba_example_at_rev")
    copy = folder / "coba_at_rev"
    copy.mkdir()
    for name in names:
        if name.endswith(".py"):
            text = _git("show", f"{rev}:{package}/{name}")
            (copy / name).write_text(text.replace("primforge.sim.coba", "coba_at_rev"))
    for name in [m for m in sys.modules if m.split(".")[0] == "coba_at_rev"]:
        del sys.modules[name]  # a copy loaded before
    shell = types.ModuleType("coba_at_rev")  # the package, its __init__ not run
    shell.__path__ = [str(copy)]
    sys.modules["coba_at_rev"] = shell
    return importlib.import_module("coba_at_rev.numba_threaded")


def runners(net, settle: int, other=None):
    """The ways to run steps from a settled state of ``net`` (a network of
    :mod:`primforge.sim.coba` over just-in-time connectivity): the four of ``WAYS``, and
    ``two threads at REV`` with ``other``'s two-thread kernel (:func:`example_at`). The
    state is ``v, ge, gi, ref`` and each neuron's spike count; the outputs, the state, the
    spikes and each population's spikes per step. A way writes only the outputs its
    ``writes`` attribute names, where it has one (a revision's kernel that does not count
    each neuron's or each population's spikes)."""
    import numba

    from primforge.sim.coba import numba_loop, numba_threaded

    n, ne, prob = net.n, net.n_exc, net.w_exc.prob
    w_e, w_i = np.float32(net.w_exc.weight), np.float32(net.w_inh.weight)
    seeds = (np.uint32(net.w_exc.seed), np.uint32(net.w_inh.seed))  # as the simulation passes them
    serial = numba_loop._numba_loop(numba_loop._jitc_propagate(prob))
    threaded = numba_threaded._numba_jitc_loop_threaded(prob)

    def outputs(steps):
        """Output arrays for ``steps`` steps, every page touched."""
        return ([np.ones(n, np.float32) for _ in range(3)]
                + [np.ones(n, np.int32), np.ones(n, np.int32)]
                + [np.ones((steps, n), np.bool_), np.ones((steps, 2), np.int32)])

    def one(state, out):
        buf = np.empty(numba_loop._BLOCK + n, np.int64)
        serial(*state, (w_e, w_i, *seeds, np.int64(ne), buf), *out)

    def parts(threads, ranges=2):
        def run(state, out):
            before = numba.get_num_threads()
            numba.set_num_threads(threads)
            try:
                threaded(*state, w_e, w_i, *seeds, np.int64(ne), np.int64(ranges),
                         np.int64(numba_threaded._THREAD_BLOCK), *out)
            finally:
                numba.set_num_threads(before)
        return run

    start = ([np.array(x) for x in (net.v0, net.ge0, net.gi0)]
             + [np.zeros(n, np.int32), np.zeros(n, np.int32)])
    out = outputs(max(settle, 1))
    one(start, out)
    settled = out[:5]
    ways = dict(zip(WAYS, (one, parts(1, 1), parts(1), parts(2))))
    if other is not None:
        earlier = other._numba_jitc_loop_threaded(prob)
        names = list(inspect.signature(earlier.py_func).parameters)
        # before the kernel counted each neuron's spikes, the state had no count; before
        # it counted each population's, there was no last output
        counting = "count" in names
        state_in = 5 if counting else 4
        writes = ([0, 1, 2, 3] + ([4] if counting else [])
                  + [5, 6][:len(names) - 7 - 2 * state_in])

        def at_rev(state, out):
            earlier(*state[:state_in], w_e, w_i, *seeds, np.int64(ne), np.int64(2),
                    np.int64(other._THREAD_BLOCK), *(out[i] for i in writes))

        at_rev.writes = writes
        ways["two threads at REV"] = at_rev
    return settled, outputs, ways


def measure(scale: int, steps: int, reps: int, settle: int, other=None, per_call: int = 0,
            net=None) -> dict:
    """Each way's runs of ``steps`` steps, in calls of ``per_call`` steps (all in one call
    when 0), each call starting from the state the one before ended in, on the network at
    ``scale`` (or on ``net``, a network over just-in-time connectivity)."""
    per_call = per_call or steps
    if steps % per_call:
        raise ValueError(f"steps ({steps}) must be a multiple of the steps a call ({per_call})")
    calls = steps // per_call
    if net is None:
        from primforge.sim import coba

        net = coba.scaled(scale, conn="jitc")
    settled, outputs, ways = runners(net, settle, other)
    names = tuple(ways)
    times = {way: [] for way in names}
    outs = {way: (outputs(per_call), outputs(per_call)) for way in names}  # alternate
    reference = None
    for rep in range(reps + 1):  # the first round compiles
        order = names[rep % len(names):] + names[:rep % len(names)]
        for way in order:
            state = [x.copy() for x in settled]
            t0 = time.perf_counter()
            for call in range(calls):
                out = outs[way][call % 2]
                ways[way](state, out)
                state = out[:5]
            elapsed = time.perf_counter() - t0
            if reference is None:
                reference = [x.copy() for x in out]
            for i in getattr(ways[way], "writes", range(len(out))):
                if not np.array_equal(out[i], reference[i]):
                    raise AssertionError(f"{way} at {scale}x differs from the first run")
            if rep:
                times[way].append(elapsed / steps * 1e6)
    spikes = float(reference[5].mean())
    row = {"scale": scale, "neurons": int(reference[0].shape[0]), "steps": steps,
           "steps_per_call": per_call, "reps": reps,
           "fired_per_step": spikes * reference[0].shape[0]}
    one = statistics.median(times["one thread"])
    for way in names:
        q1, med, q3 = np.percentile(times[way], [25, 50, 75])
        row[way] = {"us_per_step": float(med), "q1": float(q1), "q3": float(q3),
                    "ratio": float(med / one), "all": times[way]}
    return row


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scales", default="10")
    ap.add_argument("--steps", default="1000", help="steps a run (one, or one per scale)")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--steps-per-call", type=int, default=0,
                    help="steps a kernel call, a run being calls from the state the one "
                         "before ended in (0: a run is one call)")
    ap.add_argument("--settle", type=int, default=2000, help="steps run before timing")
    ap.add_argument("--probe", type=float, default=0.0,
                    help="seconds of the cores' speed probe first (0: none)")
    ap.add_argument("--against", default=None, metavar="REV",
                    help="also time the two-thread kernel of this git revision")
    ap.add_argument("--out", default=str(RESULTS / "coba_threads.json"))
    args = ap.parse_args(argv)
    scales = [int(s) for s in args.scales.split(",")]
    steps = [int(s) for s in args.steps.split(",")]
    steps = steps * len(scales) if len(steps) == 1 else steps
    if len(steps) != len(scales):
        ap.error("--steps: give one number, or one per scale")
    result = {"argv": sys.argv[1:] if argv is None else list(argv), "cpus": os.cpu_count()}
    if args.probe > 0:
        result["probe_us_per_pass"] = probe_cores(args.probe)
        print("core speed probe, microseconds per pass, second by second:")
        for core, series in result["probe_us_per_pass"].items():
            print(f"  core {core}: " + " ".join(f"{x:.1f}" for x in series))
    if args.against:  # the commit, named before the run: a commit made meanwhile moves HEAD
        result["against"] = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", args.against], capture_output=True,
            text=True, check=True).stdout.strip()
    with tempfile.TemporaryDirectory() as folder:
        other = example_at(result["against"], Path(folder)) if args.against else None
        rows = [measure(scale, n, args.reps, args.settle, other, args.steps_per_call)
                for scale, n in zip(scales, steps)]
    result["rows"] = rows
    names = [w for w in rows[0] if isinstance(rows[0][w], dict)]
    print("| scale | fired per step | " + " | ".join(f"{w}, us/step (q1-q3)" for w in names)
          + " | " + " | ".join(f"{w} / one" for w in names[1:]) + " |")
    print("|---" * (2 * len(names) + 1) + "|")
    for row in rows:
        cells = [f"{row[w]['us_per_step']:.1f} ({row[w]['q1']:.1f}-{row[w]['q3']:.1f})"
                 for w in names]
        ratios = [f"{row[w]['ratio']:.2f}" for w in names[1:]]
        print(f"| {row['scale']}x | {row['fired_per_step']:.0f} | " + " | ".join(cells)
              + " | " + " | ".join(ratios) + " |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
