"""Event-driven sparse connectivity: ``spikes @ W`` for N neurons connected with probability p.

Compares, for binary spike vectors at a given event rate, on the default JAX device:

* primforge.ops binary_csrmv (transpose=True) with one shared weight, per backend of the
  platform: ``numba`` on a CPU; ``pallas`` and ``cuda_raw`` on a GPU (plus ``numba_host``,
  the numba kernel on the GPU machine's CPU); and ``<backend>_hetero``, the same with one
  weight per synapse
* ``jax_ref``      the same kernel with backend='jax' (the pure-jax.numpy reference)
* ``dense``        ``spikes.astype(f32) @ W_dense`` with jax.numpy (skipped when W does not fit)
* ``bcoo``         ``spikes.astype(f32) @ W`` with jax.experimental.sparse.BCOO
* ``brainevent``   ``EventArray(spikes) @ brainevent.CSR`` (shared weight), when
  ``import brainevent`` works in this environment

All are jitted; the time is the median wall time of repeated calls (block_until_ready).
Contenders are interleaved: each repetition calls every contender once, in a rotating
order, so a slow phase of this shared machine hits all of them alike. Every call gets a
spike vector from a pool of distinct vectors at the same rate (``--pool``, default 16), so
no contender times a cache-hot repeat of one input. Every result is checked against the
first primforge backend, on two vectors of the pool; a backend that fails to build
or run is reported in the JSON ("failed") and the table, and the others still run. Writes a
Markdown table to stdout and JSON + PNG to benchmarks/results/ (file names carry the
platform: event_csr.json on a CPU, event_csr_gpu.json on a GPU).

    python benchmarks/event_csr.py            # default grid (a few minutes)
    python benchmarks/event_csr.py --quick    # small grid (seconds)
    python benchmarks/event_csr.py --full     # N = 10k..100k, p = 0.01..0.1, rates 0.1%..10%
    python benchmarks/event_csr.py --target   # N = 100k, p = 0.01, 1% events only
    python benchmarks/event_csr.py --target --compare results/event_csr.json
                                              # ratio against another run (e.g. a CPU's numba)
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

try:  # optional contender
    import brainevent
except ImportError:  # pragma: no cover - depends on the environment
    brainevent = None

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
BASELINES = ["jax_ref", "dense", "bcoo", "brainevent"]

GRIDS = {
    "quick": {"n": [2_000, 5_000], "p": [0.02, 0.05], "rate": [0.01, 0.1]},
    "default": {"n": [10_000, 20_000], "p": [0.01, 0.05], "rate": [0.001, 0.01, 0.1]},
    "full": {"n": [10_000, 20_000, 50_000, 100_000], "p": [0.01, 0.02, 0.05, 0.1],
                 "rate": [0.001, 0.01, 0.1]},
    "target": {"n": [100_000], "p": [0.01], "rate": [0.01]},
}


def platform_backends() -> list[str]:
    """The primforge backends to time on the default device's platform."""
    if jax.default_backend() == "cpu":
        return ["numba"]
    return ["pallas", "cuda_raw"]


def time_interleaved(fns, pools, *, min_time=0.3, max_reps=50, min_reps=5):
    """Median seconds per call of each ``fns[name](*args, spikes)``, interleaved.

    ``fns`` maps a name to ``(fn, args)``; ``pools[name]`` is that contender's list of spike
    vectors (the same values, placed on its device). Repetition ``r`` calls the contenders in
    an order rotated by ``r`` and gives each the next vector of its pool.
    """
    names = list(fns)
    for name in names:  # compile and warm up
        fn, args = fns[name]
        jax.block_until_ready(fn(*args, pools[name][0]))
    times = {n: [] for n in names}
    start, r = time.perf_counter(), 0
    while r < min_reps or (r < max_reps and time.perf_counter() - start < min_time * len(names)):
        for name in names[r % len(names):] + names[: r % len(names)]:
            fn, args = fns[name]
            x = pools[name][r % len(pools[name])]
            t0 = time.perf_counter()
            jax.block_until_ready(fn(*args, x))
            times[name].append(time.perf_counter() - t0)
        r += 1
    return {n: statistics.median(t) for n, t in times.items()}, r


def run_config(n, p, rate, *, dense_limit_gb, nnz_limit_xla, host_numba, pool=16, seed=0):
    W = ops.fixed_prob(n, n, p, weight=0.1, seed=seed)
    nnz = W.nnz
    rng = np.random.default_rng(seed + 1)
    pool_np = [rng.random(n) < rate for _ in range(pool)]
    spike_pool = [jnp.asarray(s) for s in pool_np]
    row = {"n": n, "p": p, "rate": rate, "nnz": nnz,
           "n_events": round(np.mean([s.sum() for s in pool_np])), "pool": pool, "times": {},
           "skipped": {}, "failed": {}}
    hetero = W.with_data(jnp.full((nnz,), 0.1, jnp.float32))

    def product(backend):
        return jax.jit(lambda W, s: W.rmatmul(s, backend=backend))

    fns = {}
    for backend in platform_backends():
        fns[backend] = (product(backend), (W,))
        fns[backend + "_hetero"] = (product(backend), (hetero,))
    if host_numba and jax.default_backend() != "cpu":
        cpu = jax.devices("cpu")[0]
        fns["numba_host"] = (product("numba"), (jax.device_put(W, cpu),))
    fns["jax_ref"] = (product("jax"), (W,))
    dense_gb = n * n * 4 / 1e9
    if dense_gb <= dense_limit_gb:
        dense = np.zeros((n, n), np.float32)
        rows = np.repeat(np.arange(n), np.diff(np.asarray(W.indptr)))
        dense[rows, np.asarray(W.indices)] = 0.1
        fns["dense"] = (jax.jit(lambda D, s: s.astype(jnp.float32) @ D), (jnp.asarray(dense),))
        del dense
    else:
        row["skipped"]["dense"] = f"W is {dense_gb:.0f} GB > {dense_limit_gb} GB limit"
    if nnz <= nnz_limit_xla:
        rows = np.repeat(np.arange(n, dtype=np.int32), np.diff(np.asarray(W.indptr)))
        idx = np.stack([rows, np.asarray(W.indices)], axis=1)
        bcoo = jsparse.BCOO((jnp.full((nnz,), 0.1, jnp.float32), jnp.asarray(idx)), shape=(n, n),
                            indices_sorted=True, unique_indices=True)
        fns["bcoo"] = (jax.jit(lambda B, s: s.astype(jnp.float32) @ B), (bcoo,))
    else:
        row["skipped"]["bcoo"] = f"nnz {nnz:.2g} > {nnz_limit_xla:.2g} limit"
        row["skipped"]["jax_ref"] = f"nnz {nnz:.2g} > {nnz_limit_xla:.2g} limit"
        fns.pop("jax_ref")
    if brainevent is not None:
        # brainevent sizes its workspace from a concrete indptr: build the matrix outside jit.
        be_w = brainevent.CSR((W.data, W.indices, W.indptr), shape=W.shape)
        events = getattr(brainevent, "BinaryArray", None) or brainevent.EventArray
        fns["brainevent"] = (jax.jit(lambda s: events(s) @ be_w), ())
    else:
        row["skipped"]["brainevent"] = "brainevent is not installed"
    pools = {name: (jax.device_put(spike_pool, jax.devices("cpu")[0]) if name == "numba_host"
                    else spike_pool) for name in fns}
    errors, reference, ref_name = {}, None, None
    for name, (fn, args) in list(fns.items()):
        try:  # two vectors of the pool: agreement, and that the input is not ignored
            out = np.stack([np.asarray(fn(*args, pools[name][k])) for k in (0, pool - 1)])
        except Exception as e:  # noqa: BLE001 - report it and time the others
            row["failed"][name] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            print(f"FAILED {name} at n={n} p={p} rate={rate}: {row['failed'][name]}",
                  file=sys.stderr)
            fns.pop(name)
            continue
        if reference is None:
            reference, ref_name = out, name
        errors[name] = float(np.max(np.abs(out - reference))) if out.size else 0.0
    if fns:
        row["times"], row["reps"] = time_interleaved(fns, pools)
    row["reference"] = ref_name
    row["max_abs_err_vs_reference"] = errors
    scale = 1e-3 * max(1.0, float(np.abs(reference).max())) if reference is not None else 0.0
    bad = {k: v for k, v in errors.items() if v > scale}
    if bad:
        print(f"WARNING: results differ from {ref_name} at n={n} p={p} rate={rate}: {bad}",
              file=sys.stderr)
        row["wrong"] = sorted(bad)
    return row


def best_primforge(row):
    """(name, seconds) of the fastest correct primforge method of a row (shared weight)."""
    wrong = set(row.get("wrong", ()))
    cands = [(t, m) for m, t in row["times"].items()
             if m not in BASELINES and not m.endswith("_hetero") and m != "numba_host"
             and m not in wrong]
    if not cands:
        return None, None
    t, m = min(cands)
    return m, t


def fmt_ms(t):
    return "-" if t is None else (f"{t * 1e3:.3f}" if t < 0.01 else f"{t * 1e3:.1f}")


def methods_of(rows):
    seen = []
    for r in rows:
        for m in list(r["times"]) + list(r["failed"]):
            if m not in seen:
                seen.append(m)
    return [m for m in seen if m not in BASELINES] + [m for m in BASELINES if m in seen]


def table(rows):
    methods = methods_of(rows)
    head = ("| N | p | rate | nnz | events | " + " | ".join(f"{m} ms" for m in methods)
            + " | best | x dense | x BCOO | x brainevent |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        t = r["times"]
        cells = []
        for m in methods:
            cells.append(fmt_ms(t[m]) if m in t else "FAIL" if m in r["failed"] else "skip")
        best, tb = best_primforge(r)
        vs_dense = f"{t['dense'] / tb:.0f}" if "dense" in t and tb else "skip"
        vs_bcoo = f"{t['bcoo'] / tb:.0f}" if "bcoo" in t and tb else "skip"
        vs_be = f"{t['brainevent'] / tb:.1f}" if "brainevent" in t and tb else "skip"
        head = f"| {r['n']} | {r['p']} | {r['rate']:.1%} | {r['nnz']:.3g} | {r['n_events']} | "
        tail = f" | {best or '-'} | {vs_dense} | {vs_bcoo} | {vs_be} |"
        lines.append(head + " | ".join(cells) + tail)
    notes = sorted({f"{m}: {why}" for r in rows for m, why in r["skipped"].items()})
    if notes:
        lines.append("")
        lines += [f"skip = {n}" for n in notes]
    fails = sorted({f"{m}: {why}" for r in rows for m, why in r["failed"].items()})
    if fails:
        lines.append("")
        lines += [f"FAIL = {f}" for f in fails]
    wrong = sorted({m for r in rows for m in r.get("wrong", ())})
    if wrong:
        lines.append("")
        lines.append("WRONG RESULTS (excluded from 'best'): " + ", ".join(wrong))
    return "\n".join(lines)


def compare(rows, other_path):
    """Lines comparing this run's best primforge time with another run's, per config."""
    with open(other_path) as f:
        other = json.load(f)
    by_key = {(r["n"], r["p"], r["rate"]): r for r in other["rows"]}
    where = other.get("meta", {}).get("device", other_path)
    lines = [f"| N | p | rate | best here | ms | best in {where} | ms | speed-up |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        o = by_key.get((r["n"], r["p"], r["rate"]))
        if o is None:
            continue
        m1, t1 = best_primforge(r)
        m2, t2 = best_primforge(o)
        if t1 and t2:
            lines.append(f"| {r['n']} | {r['p']} | {r['rate']:.1%} | {m1} | {fmt_ms(t1)} | {m2} | "
                         f"{fmt_ms(t2)} | {t2 / t1:.1f}x |")
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
        for m in methods_of(rows):
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
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="small grid (seconds)")
    mode.add_argument("--full", action="store_true", help="the whole grid (long; needs ~16 GB)")
    mode.add_argument("--target", action="store_true", help="N=100k, p=0.01, 1%% events only")
    ap.add_argument("--compare", metavar="JSON",
                    help="another run's JSON: print the speed-up of this run's best backend")
    ap.add_argument("--no-host-numba", action="store_true",
                    help="on a GPU, do not also time numba on the host CPU")
    ap.add_argument("--dense-limit-gb", type=float, default=4.0,
                    help="skip the dense matvec when W would exceed this (default 4 GB)")
    ap.add_argument("--nnz-limit-xla", type=float, default=1.5e8,
                    help="skip BCOO and the jax reference above this many synapses")
    ap.add_argument("--pool", type=int, default=16,
                    help="distinct spike vectors per case, used in turn (default 16)")
    ap.add_argument("--out", default=RESULTS, help="results folder")
    args = ap.parse_args(argv)
    grid = GRIDS["quick" if args.quick else "full" if args.full else
                 "target" if args.target else "default"]
    suffix = "" if jax.default_backend() == "cpu" else "_" + jax.default_backend()
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for n, p in itertools.product(grid["n"], grid["p"]):
        for rate in grid["rate"]:
            t0 = time.perf_counter()
            rows.append(run_config(n, p, rate, dense_limit_gb=args.dense_limit_gb,
                                   nnz_limit_xla=args.nnz_limit_xla,
                                   host_numba=not args.no_host_numba, pool=args.pool))
            print(f"  N={n} p={p} rate={rate}: {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    text = table(rows)
    if args.compare:
        text += "\n\n" + compare(rows, args.compare)
    print(text)
    meta = {"jax": jax.__version__, "platform": platform.platform(), "cpu_count": os.cpu_count(),
                "device": str(jax.devices()[0]), "grid": grid}
    with open(os.path.join(args.out, f"event_csr{suffix}.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    with open(os.path.join(args.out, f"event_csr{suffix}.md"), "w") as f:
        f.write(text + "\n")
    try:
        plot(rows, os.path.join(args.out, f"event_csr{suffix}.png"))
    except ImportError:
        print("matplotlib not installed: no plot", file=sys.stderr)
    print(f"results in {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
