"""Event-driven sparse connectivity: ``spikes @ W`` for N neurons connected with probability p.

Compares, for binary spike vectors at a given event rate:

* ``numba``        primforge.ops binary_csrmv (transpose=True), one shared weight (CPU default)
* ``numba_hetero`` the same with one weight per synapse
* ``jax_ref``      the same kernel with backend='jax' (the pure-jax.numpy reference)
* ``dense``        ``spikes.astype(f32) @ W_dense`` with jax.numpy (skipped when W does not fit)
* ``bcoo``         ``spikes.astype(f32) @ W`` with jax.experimental.sparse.BCOO

All are jitted; the time is the median wall time of repeated calls (block_until_ready).
Writes a Markdown table to stdout and JSON + PNG to benchmarks/results/.

    python benchmarks/event_csr.py            # default grid (a few minutes)
    python benchmarks/event_csr.py --quick    # small grid (seconds)
    python benchmarks/event_csr.py --full     # N = 10k..100k, p = 0.01..0.1, rates 0.1%..10%
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import sparse as jsparse

from primforge import ops

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
METHODS = ["numba", "numba_hetero", "jax_ref", "dense", "bcoo"]

GRIDS = {
    "quick": {"n": [2_000, 5_000], "p": [0.02, 0.05], "rate": [0.01, 0.1]},
    "default": {"n": [10_000, 20_000], "p": [0.01, 0.05], "rate": [0.001, 0.01, 0.1]},
    "full": {"n": [10_000, 20_000, 50_000, 100_000], "p": [0.01, 0.02, 0.05, 0.1],
                 "rate": [0.001, 0.01, 0.1]},
}


def timeit(fn, *args, min_time=0.3, max_reps=50, min_reps=3):
    jax.block_until_ready(fn(*args))  # compile + warm up
    times, start = [], time.perf_counter()
    while len(times) < min_reps or (len(times) < max_reps and time.perf_counter() - start < min_time):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return statistics.median(times), len(times)


def run_config(n, p, rate, *, dense_limit_gb, nnz_limit_xla, seed=0):
    W = ops.fixed_prob(n, n, p, weight=0.1, seed=seed)
    nnz = W.nnz
    rng = np.random.default_rng(seed + 1)
    spikes = jnp.asarray(rng.random(n) < rate)
    row = {"n": n, "p": p, "rate": rate, "nnz": nnz, "n_events": int(spikes.sum()), "times": {}, "skipped": {}}
    hetero = W.with_data(jnp.full((nnz,), 0.1, jnp.float32))

    fns = {
        "numba": (jax.jit(lambda W, s: s @ W), (W, spikes)),
        "numba_hetero": (jax.jit(lambda W, s: s @ W), (hetero, spikes)),
        "jax_ref": (jax.jit(lambda W, s: W.rmatmul(s, backend="jax")), (W, spikes)),
    }
    reference = np.asarray(fns["numba"][0](*fns["numba"][1]))
    dense_gb = n * n * 4 / 1e9
    if dense_gb <= dense_limit_gb:
        dense = np.zeros((n, n), np.float32)
        rows = np.repeat(np.arange(n), np.diff(np.asarray(W.indptr)))
        dense[rows, np.asarray(W.indices)] = 0.1
        fns["dense"] = (jax.jit(lambda D, s: s.astype(jnp.float32) @ D), (jnp.asarray(dense), spikes))
        del dense
    else:
        row["skipped"]["dense"] = f"W is {dense_gb:.0f} GB > {dense_limit_gb} GB limit"
    if nnz <= nnz_limit_xla:
        rows = np.repeat(np.arange(n, dtype=np.int32), np.diff(np.asarray(W.indptr)))
        idx = np.stack([rows, np.asarray(W.indices)], axis=1)
        bcoo = jsparse.BCOO((jnp.full((nnz,), 0.1, jnp.float32), jnp.asarray(idx)), shape=(n, n),
                            indices_sorted=True, unique_indices=True)
        fns["bcoo"] = (jax.jit(lambda B, s: s.astype(jnp.float32) @ B), (bcoo, spikes))
    else:
        row["skipped"]["bcoo"] = f"nnz {nnz:.2g} > {nnz_limit_xla:.2g} limit"
        row["skipped"]["jax_ref"] = f"nnz {nnz:.2g} > {nnz_limit_xla:.2g} limit"
        fns.pop("jax_ref")
    errors = {}
    for name, (fn, args) in fns.items():
        out = np.asarray(fn(*args))
        errors[name] = float(np.max(np.abs(out - reference))) if out.size else 0.0
        row["times"][name], _ = timeit(fn, *args)
    row["max_abs_err_vs_numba"] = errors
    bad = {k: v for k, v in errors.items() if v > 1e-3 * max(1.0, float(np.abs(reference).max()))}
    if bad:
        print(f"WARNING: results differ from numba at n={n} p={p} rate={rate}: {bad}", file=sys.stderr)
    return row


def fmt_ms(t):
    return "-" if t is None else (f"{t * 1e3:.3f}" if t < 0.01 else f"{t * 1e3:.1f}")


def table(rows):
    head = ("| N | p | rate | nnz | events | " + " | ".join(f"{m} ms" for m in METHODS)
            + " | x dense | x BCOO |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        t = r["times"]
        cells = []
        for m in METHODS:
            cells.append(fmt_ms(t.get(m)) if m in t else "skip")
        vs_dense = f"{t['dense'] / t['numba']:.0f}" if "dense" in t else "skip"
        vs_bcoo = f"{t['bcoo'] / t['numba']:.0f}" if "bcoo" in t else "skip"
        lines.append(f"| {r['n']} | {r['p']} | {r['rate']:.1%} | {r['nnz']:.3g} | {r['n_events']} | "
                     + " | ".join(cells) + f" | {vs_dense} | {vs_bcoo} |")
    notes = sorted({f"{m}: {why}" for r in rows for m, why in r["skipped"].items()})
    if notes:
        lines.append("")
        lines += [f"skip = {n}" for n in notes]
    return "\n".join(lines)


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({(r["n"], r["p"]) for r in rows})
    cols = min(4, len(groups))
    nrows = (len(groups) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(4 * cols, 3.2 * nrows), squeeze=False)
    for ax, (n, p) in zip(axes.flat, groups):
        sel = sorted((r for r in rows if r["n"] == n and r["p"] == p), key=lambda r: r["rate"])
        for m in METHODS:
            pts = [(r["rate"], r["times"][m] * 1e3) for r in sel if m in r["times"]]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=m)
        ax.set(xscale="log", yscale="log", title=f"N={n}, p={p}", xlabel="event rate",
               ylabel="ms per spikes @ W")
        ax.grid(True, which="both", alpha=0.3)
    for ax in list(axes.flat)[len(groups):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="small grid (seconds)")
    mode.add_argument("--full", action="store_true", help="the whole grid (long; needs ~16 GB)")
    ap.add_argument("--dense-limit-gb", type=float, default=4.0,
                    help="skip the dense matvec when W would exceed this (default 4 GB)")
    ap.add_argument("--nnz-limit-xla", type=float, default=1.5e8,
                    help="skip BCOO and the jax reference above this many synapses")
    ap.add_argument("--out", default=RESULTS, help="results folder")
    args = ap.parse_args(argv)
    grid = GRIDS["quick" if args.quick else "full" if args.full else "default"]
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for n, p in itertools.product(grid["n"], grid["p"]):
        for rate in grid["rate"]:
            t0 = time.perf_counter()
            rows.append(run_config(n, p, rate, dense_limit_gb=args.dense_limit_gb,
                                   nnz_limit_xla=args.nnz_limit_xla))
            print(f"  N={n} p={p} rate={rate}: {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    text = table(rows)
    print(text)
    meta = {"jax": jax.__version__, "platform": platform.platform(), "cpu_count": os.cpu_count(),
                "device": str(jax.devices()[0]), "grid": grid}
    with open(os.path.join(args.out, "event_csr.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    with open(os.path.join(args.out, "event_csr.md"), "w") as f:
        f.write(text + "\n")
    try:
        plot(rows, os.path.join(args.out, "event_csr.png"))
    except ImportError:
        print("matplotlib not installed: no plot", file=sys.stderr)
    print(f"results in {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
