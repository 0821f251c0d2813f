"""Benchmark: fixed-number connectivity and dense event products on the CPU.

Times ``binary_fixed_num_mv`` (both directions, shared and per-synapse weights) and
``binary_densemv`` (both directions) under ``jit`` for primforge's numba backend, its jax
reference, a dense ``jax.numpy`` matvec and, when ``import brainevent`` works, brainevent's
``binary_fcnmv`` / ``binary_densemv``. Contenders are interleaved (one call each, in a
rotating order, per repetition) and every call gets a different spike vector from a pool
(so no contender sees a cache-hot input); medians are reported. Results are checked for
agreement before timing. Prints a Markdown table and writes JSON to benchmarks/results/.

    python benchmarks/ops_extra.py            # default cases
    python benchmarks/ops_extra.py --quick    # seconds
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp

from primforge import ops

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
POOL = 8  # distinct spike vectors per case

try:  # optional contender
    import brainevent
except ImportError:  # pragma: no cover - depends on the environment
    brainevent = None


def _time_interleaved(fns: dict, inputs: list, reps: int) -> dict:
    """Median seconds per call of each function, interleaved and on rotating inputs."""
    names = list(fns)
    for name in names:  # compile and warm up
        for x in inputs[:2]:
            jax.block_until_ready(fns[name](x))
    times = {n: [] for n in names}
    for r in range(reps):
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            x = inputs[(r + names.index(name)) % len(inputs)]
            t0 = time.perf_counter()
            jax.block_until_ready(fns[name](x))
            times[name].append(time.perf_counter() - t0)
    return {n: statistics.median(t) for n, t in times.items()}


def _check(fns: dict, x, ref: str) -> list[str]:
    want = np.asarray(fns[ref](x), np.float64)
    bad = []
    for name, f in fns.items():
        got = np.asarray(f(x), np.float64)
        if got.shape != want.shape or not np.allclose(got, want, rtol=1e-3, atol=1e-3):
            bad.append(name)
    return bad


def fixed_num_case(n, k, rate, transpose, shared, reps, dense_limit):
    rng = np.random.default_rng(0)
    ind = jnp.asarray(rng.integers(0, n, size=(n, k)).astype(np.int32))
    w = (jnp.full((1,), 0.1, jnp.float32) if shared
         else jnp.asarray(rng.normal(size=(n, k)).astype(np.float32)))
    spikes = [jnp.asarray(rng.random(n) < rate) for _ in range(POOL)]
    kw = {"shape": (n, n), "transpose": transpose}
    fns = {
        "numba": jax.jit(lambda s: ops.binary_fixed_num_mv(w, ind, s, backend="numba", **kw)),
        "jax ref": jax.jit(lambda s: ops.binary_fixed_num_mv(w, ind, s, backend="jax", **kw)),
    }
    if n * n * 4 <= dense_limit:
        W = ops.FixedNum(w, ind, shape=(n, n)).todense()
        W = W.T if transpose else W
        fns["dense jnp"] = jax.jit(lambda s: W @ s.astype(jnp.float32))
    if brainevent is not None:
        fns["brainevent"] = jax.jit(lambda s: brainevent.binary_fcnmv(w, ind, s, **kw))
    bad = _check(fns, spikes[0], "numba")
    for b in bad:
        print(f"WARNING: {b} disagrees with numba at n={n} k={k} rate={rate}", file=sys.stderr)
        fns.pop(b)
    return _time_interleaved(fns, spikes, reps)


def dense_case(n, rate, transpose, reps):
    rng = np.random.default_rng(1)
    W = jnp.asarray(rng.normal(size=(n, n)).astype(np.float32))
    spikes = [jnp.asarray(rng.random(n) < rate) for _ in range(POOL)]
    fns = {
        "numba": jax.jit(lambda s: ops.binary_densemv(W, s, transpose=transpose, backend="numba")),
        "jax ref": jax.jit(lambda s: ops.binary_densemv(W, s, transpose=transpose, backend="jax")),
    }
    if brainevent is not None:
        fns["brainevent"] = jax.jit(lambda s: brainevent.binary_densemv(W, s, transpose=transpose))
    bad = _check(fns, spikes[0], "numba")
    for b in bad:
        print(f"WARNING: {b} disagrees with numba at n={n} rate={rate}", file=sys.stderr)
        fns.pop(b)
    return _time_interleaved(fns, spikes, reps)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small cases, few repetitions")
    ap.add_argument("--reps", type=int, default=None, help="timed calls per contender")
    ap.add_argument("--dense-limit-gb", type=float, default=0.5)
    ap.add_argument("--out", default=RESULTS, help="results folder")
    args = ap.parse_args(argv)
    reps = args.reps or (10 if args.quick else 40)
    if args.quick:
        fixed = [(2000, 20, 0.01), (2000, 20, 0.1)]
        dense = [(1000, 0.01), (1000, 0.1)]
    else:
        fixed = [(10_000, 100, 0.01), (10_000, 100, 0.1), (50_000, 500, 0.01),
                 (50_000, 500, 0.001)]
        dense = [(2000, 0.01), (2000, 0.1), (8000, 0.01), (8000, 0.1)]
    rows = []
    for n, k, rate in fixed:
        for transpose in (True, False):
            for shared in (True, False):
                t = fixed_num_case(n, k, rate, transpose, shared, reps,
                                   args.dense_limit_gb * 2**30)
                rows.append({"op": "binary_fixed_num_mv", "n": n, "k": k, "rate": rate,
                             "direction": "s @ W (scatter)" if transpose else "W @ s (gather)",
                             "weight": "shared" if shared else "per-synapse",
                             "ms": {c: v * 1e3 for c, v in t.items()}})
                print(rows[-1], file=sys.stderr)
    for n, rate in dense:
        for transpose in (True, False):
            t = dense_case(n, rate, transpose, reps)
            rows.append({"op": "binary_densemv", "n": n, "k": n, "rate": rate,
                         "direction": "s @ W" if transpose else "W @ s", "weight": "dense",
                         "ms": {c: v * 1e3 for c, v in t.items()}})
            print(rows[-1], file=sys.stderr)
    contenders = ["numba", "jax ref", "dense jnp", "brainevent"]
    head = ("| op | n | k | rate | direction | weight | " + " | ".join(contenders)
            + " | numba / brainevent |")
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for r in rows:
        ms = r["ms"]
        cells = [f"{ms[c]:.4g}" if c in ms else "-" for c in contenders]
        ratio = (f"{ms['numba'] / ms['brainevent']:.2f}" if "brainevent" in ms else "-")
        print(f"| {r['op']} | {r['n']} | {r['k']} | {r['rate']:g} | {r['direction']} | "
              f"{r['weight']} | " + " | ".join(cells) + f" | {ratio} |")
    ratios = [r["ms"]["numba"] / r["ms"]["brainevent"] for r in rows if "brainevent" in r["ms"]]
    if ratios:
        print(f"\ngeomean numba / brainevent: {float(np.exp(np.mean(np.log(ratios)))):.3f} "
              f"over {len(ratios)} cases (ms per call, medians of {reps} interleaved calls)")
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "ops_extra" + ("_quick" if args.quick else "") + ".json")
    with open(path, "w") as f:
        json.dump({"reps": reps, "brainevent": getattr(brainevent, "__version__", None),
                   "jax": jax.__version__, "rows": rows}, f, indent=1)
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
