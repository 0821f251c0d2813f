"""The just-in-time ``events @ W`` Numba kernel of this checkout beside the one of a revision.

The binary, homogeneous ``W.T @ x`` kernel of ``primforge.ops.jitconn`` (the product a
COBA network's plain step calls for each population) is built from this checkout's
``primforge/ops/jitconn/numba.py`` and from the same file at the git revision ``--against``,
and both are called directly (no XLA around them) on the same pool of event vectors, the
two interleaved within every repeat (rotating which goes first). Each scale is the
excitatory population of :mod:`primforge.sim.coba`'s network: ``4000 * scale`` neurons, 80%
of them sources, connection probability ``0.02 / scale``, events firing with probability
``--fire`` (about 1.9 spikes per 1,000 neurons a step in COBA). The outputs must agree
bit for bit at every repeat. Prints a table and writes JSON::

    python benchmarks/jitc_event_kernel.py --against HEAD~1
    python benchmarks/jitc_event_kernel.py --against b4f74d4 --scales 1,10,100 --reps 21
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np

RESULTS = ROOT / "benchmarks" / "results"
MODULE = "primforge/ops/jitconn/numba.py"


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def measure(kernels: dict, scale: int, fire: float, reps: int, pool: int = 20) -> dict:
    """Median seconds per call of each kernel over ``pool`` event vectors, interleaved."""
    from primforge.ops.jitconn.api import cached_table

    n = 4000 * scale
    sources, prob = n * 4 // 5, 0.02 / scale
    rng = np.random.default_rng(scale)
    table = np.asarray(cached_table(prob))
    theta, seed = np.array([0.3], np.float32), np.array([7], np.uint32)
    events = rng.random((pool, sources)) < fire
    built = {name: make(True, False, True, "homo", prob) for name, make in kernels.items()}
    outs = {name: np.empty(n, np.float32) for name in built}
    for name, fn in built.items():  # compile
        fn(theta, seed, table, events[0], outs[name])
    times = {name: [] for name in built}
    names = list(built)
    for r in range(reps):
        for name in names[r % len(names):] + names[:r % len(names)]:
            t = time.perf_counter()
            for x in events:
                built[name](theta, seed, table, x, outs[name])
            times[name].append((time.perf_counter() - t) / pool)
        first = outs[names[0]]
        for name in names[1:]:
            if not np.array_equal(outs[name], first):
                raise AssertionError(f"{scale}x: {name!r} differs from {names[0]!r}")
    return {"scale": scale, "neurons": n, "events_per_call": float(events.sum(1).mean()),
            **{name: statistics.median(ts) for name, ts in times.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--against", required=True, metavar="REV")
    ap.add_argument("--scales", default="10,100")
    ap.add_argument("--fire", type=float, default=0.0019)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--out", default=str(RESULTS / "jitc_event_kernel.json"))
    args = ap.parse_args()
    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", args.against],
                         capture_output=True, text=True, check=True).stdout.strip()
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{MODULE}"],
                            capture_output=True, text=True, check=True).stdout
    with tempfile.TemporaryDirectory() as folder:
        old_path = Path(folder) / "jitconn_numba_at_rev.py"
        old_path.write_text(source, encoding="utf-8")
        kernels = {"this checkout": _load(ROOT / MODULE, "jitc_numba_now").kernel,
                   f"at {rev[:7]}": _load(old_path, "jitc_numba_at_rev").kernel}
        rows = [measure(kernels, int(s), args.fire, args.reps) for s in args.scales.split(",")]
    now, then = list(kernels)
    print(f"| scale | neurons | events a call | {then}, us | {now}, us | ratio |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['scale']}x | {row['neurons']:,} | {row['events_per_call']:.0f} | "
              f"{row[then] * 1e6:.1f} | {row[now] * 1e6:.1f} | {row[now] / row[then]:.2f} |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump({"against": rev, "argv": sys.argv[1:], "rows": rows}, f, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
