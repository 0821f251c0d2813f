"""Just-in-time connectivity: products with a random N x N matrix regenerated from a seed.

Contenders, per case (all jitted, CPU numba kernels unless named otherwise):

* ``jitc``         primforge.ops jitc product (matrix never stored)
* ``csr``          primforge.ops CSR product of the very same matrix, stored (its memory is
                   reported); the results are checked to agree
* ``be_jitc``      brainevent's jitc product with its default ``corder=True`` (if installed)
* ``be_jitc_fast`` brainevent with ``corder=False`` (its faster generation order, whose
                   ``W`` and ``W.T`` are different matrices)

brainevent draws a different random matrix (same N, p and weights), so its results are
compared statistically (the ratio of total inputs is recorded; for ``x@W``, whose sums are
positive, outside 0.7-1.3 is a failure), not entry by entry.

Directions: ``x@W`` is binary spikes times ``W`` (rows are sources: event-driven) and
``W@x`` a float vector with 10% non-zeros (every row generated). Timing: all contenders
are interleaved call by call over a pool of different inputs (no contender runs cache-hot on
a repeated input), the median of the repeats is reported. Writes a Markdown table to stdout
and JSON to benchmarks/results/jitconn.json.

    python benchmarks/jitconn.py           # default grid (a few minutes)
    python benchmarks/jitconn.py --quick   # small grid
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
import warnings
import zlib

import jax
import jax.numpy as jnp
import numpy as np

from primforge import ops
from primforge.ops.jitconn import api as jitconn

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
GRIDS = {
    "quick": {"n": [2_000, 5_000], "p": [0.02], "rate": [0.01, 0.1], "kind": ["homo"]},
    "default": {"n": [10_000, 20_000], "p": [0.01, 0.05], "rate": [0.01, 0.1],
                "kind": ["homo", "uniform"]},
}
POOL = 8  # different inputs cycled through


def jitc_csr(seed: int, shape, prob: float):
    """The CSR arrays (data = 1) of the matrix ``seed`` describes, row by row with the
    products' own generator (:func:`primforge.ops.jitc_numba_columns`)."""
    import numba

    m, n = shape
    columns = ops.jitc_numba_columns(prob)

    @numba.njit
    def fill(seed, m, n, counts, cols):
        buf = np.empty(n, np.int64)
        pos = 0
        for i in range(m):
            c = columns(seed, i, n, buf)
            if pos + c > cols.size:
                return -1
            cols[pos:pos + c] = buf[:c]
            counts[i] = c
            pos += c
        return pos

    counts = np.zeros(m, np.int64)
    size = int(m * n * prob * 1.1) + 10 * n
    while True:
        cols = np.empty(size, np.int32)
        total = fill(seed % 2**32, m, n, counts, cols)
        if total >= 0:
            break
        size *= 2
    indptr = np.zeros(m + 1, np.int32)
    np.cumsum(counts, out=indptr[1:])
    return cols[:total], indptr


def make_inputs(rs, n, rate, direction):
    if direction == "x@W":
        return [jnp.asarray(rs.random_sample(n) < rate) for _ in range(POOL)]
    return [jnp.asarray(np.where(rs.random_sample(n) < 0.1, rs.standard_normal(n), 0.0)
                        .astype(np.float32)) for _ in range(POOL)]


def contenders(n, p, kind, direction, seed, indices, indptr):
    transpose = direction == "x@W"
    binary = transpose
    weight = 0.5 if kind == "homo" else (0.25, 0.75)
    fn = ops.binary_jitc_matvec if binary else ops.jitc_matvec
    out = {"jitc": jax.jit(lambda x: fn(weight, seed, x, shape=(n, n), prob=p,
                                        transpose=transpose, weight_kind=kind))}
    if kind == "homo":
        csr = ops.binary_csrmv if binary else ops.csrmv
        data = jnp.asarray([0.5], jnp.float32)
        ind, ptr = jnp.asarray(indices), jnp.asarray(indptr)
        out["csr"] = jax.jit(lambda x: csr(data, ind, ptr, x, shape=(n, n), transpose=transpose))
    try:
        import brainevent as be
    except ImportError:
        return out
    for name, corder in (("be_jitc", True), ("be_jitc_fast", False)):
        if kind == "homo":
            f = be.binary_jitsmv if binary else be.jitsmv
            out[name] = jax.jit(lambda x, f=f, c=corder: f(0.5, p, x, seed, shape=(n, n),
                                                           transpose=transpose, corder=c))
        else:
            f = be.binary_jitumv if binary else be.jitumv
            out[name] = jax.jit(lambda x, f=f, c=corder: f(0.25, 0.75, p, x, seed, shape=(n, n),
                                                           transpose=transpose, corder=c))
    return out


def run_case(n, p, rate, kind, direction, reps, seed=7):
    rs = np.random.RandomState(zlib.crc32(repr((n, p, rate, kind, direction)).encode()))
    xs = make_inputs(rs, n, rate, direction)
    indices, indptr = jitc_csr(seed, (n, n), p) if kind == "homo" else (None, None)
    fns = contenders(n, p, kind, direction, seed, indices, indptr)
    row = {"n": n, "p": p, "rate": rate, "kind": kind, "direction": direction,
           "nnz": int(indices.size) if indices is not None else None, "ms": {}, "failed": {}}
    if indices is not None:
        row["csr_bytes"] = int(indices.nbytes + indptr.nbytes)
    row["jitc_table_bytes"] = int(jitconn.threshold_table(p).nbytes)
    ref = None
    for name in list(fns):  # compile, check
        try:
            y = np.asarray(fns[name](xs[0]))
        except Exception as e:  # noqa: BLE001 - reported, the others still run
            row["failed"][name] = f"{type(e).__name__}: {e}"[:300]
            del fns[name]
            continue
        if ref is None:
            ref = y
        elif name == "csr":
            if not np.allclose(y, ref, rtol=1e-4, atol=1e-4):
                row["failed"][name] = "disagrees with jitc"
        else:  # another random matrix: record how its total input compares
            row.setdefault("total_vs_jitc", {})[name] = float(y.sum() / ref.sum())
            if direction == "x@W" and not 0.7 < y.sum() / ref.sum() < 1.3:  # positive sums
                row["failed"][name] = f"total {y.sum():.4g} vs jitc {ref.sum():.4g}"
    times = {name: [] for name in fns}
    for r in range(reps):
        for name, f in fns.items():  # interleaved
            x = xs[r % POOL]
            t = time.perf_counter()
            f(x).block_until_ready()
            times[name].append(time.perf_counter() - t)
    row["ms"] = {name: statistics.median(t) * 1e3 for name, t in times.items()}
    return row


def table(rows):
    names = ["jitc", "csr", "be_jitc", "be_jitc_fast"]
    head = ("| dir | kind | N | p | rate | " + " | ".join(f"{n} ms" for n in names)
            + " | jitc / be_fast | jitc / csr |")
    lines = [head, "|" + " --- |" * (head.count("|") - 1)]
    for r in rows:
        ms = r["ms"]
        cells = [f"{ms[n]:.3f}" if n in ms else "-" for n in names]
        rb = f"{ms['jitc'] / ms['be_jitc_fast']:.2f}" if "be_jitc_fast" in ms else "-"
        rc = f"{ms['jitc'] / ms['csr']:.2f}" if "csr" in ms else "-"
        lines.append(f"| {r['direction']} | {r['kind']} | {r['n']} | {r['p']} | {r['rate']} | "
                     + " | ".join(cells) + f" | {rb} | {rc} |")
    return "\n".join(lines)


def geomean(values):
    values = [v for v in values if v > 0]
    return float(np.exp(np.mean(np.log(values)))) if values else float("nan")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small grid")
    ap.add_argument("--reps", type=int, default=15, help="interleaved repeats per case")
    ap.add_argument("--out", default=RESULTS, help="results folder")
    args = ap.parse_args(argv)
    grid = GRIDS["quick" if args.quick else "default"]
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    rows = []
    for direction, n, p, rate, kind in itertools.product(["x@W", "W@x"], grid["n"], grid["p"],
                                                          grid["rate"], grid["kind"]):
        if direction == "W@x" and rate != grid["rate"][0]:
            continue  # the float input's density is fixed (10%): one rate is enough
        row = run_case(n, p, rate, kind, direction, args.reps)
        rows.append(row)
        print(f"{direction} {kind} N={n} p={p} rate={rate}: "
              + ", ".join(f"{k} {v:.3f} ms" for k, v in row["ms"].items())
              + (f"  failed: {row['failed']}" if row["failed"] else ""), file=sys.stderr)
    print(table(rows))
    summary = {}
    for other in ("be_jitc", "be_jitc_fast", "csr"):
        for d in ("x@W", "W@x"):
            ratios = [r["ms"]["jitc"] / r["ms"][other] for r in rows
                      if other in r["ms"] and r["direction"] == d]
            if ratios:
                summary[f"jitc/{other} {d}"] = geomean(ratios)
    print("\ngeomean time ratios: " + ", ".join(f"{k} {v:.3f}" for k, v in summary.items()))
    meta = {"python": sys.version.split()[0], "jax": jax.__version__,
            "machine": platform.machine(), "cpus": os.cpu_count(), "reps": args.reps,
            "grid": grid}
    try:
        import brainevent

        meta["brainevent"] = brainevent.__version__
    except ImportError:
        meta["brainevent"] = None
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "jitconn" + ("_quick" if args.quick else "") + ".json")
    with open(path, "w") as f:
        json.dump({"meta": meta, "summary": summary, "rows": rows}, f, indent=1)
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
