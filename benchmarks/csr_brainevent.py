"""primforge's CSR products against brainevent's, side by side, serial and multi-threaded.

For an ``N x N`` matrix with connection probability ``p`` and a fraction ``rate`` of active
inputs, times (jitted, median wall time, contenders interleaved in a rotating order, every
call with the next input of a pool of distinct inputs, so none times a cache-hot repeat):

* ``W @ v`` (gather over rows) and ``v @ W`` (event-driven scatter), with bool events and
  float inputs, one shared weight and one weight per synapse;
* ``grad``: ``jax.grad`` of ``sum(c * (s @ W))`` and ``sum(c * (W @ s))`` w.r.t. the
  per-synapse weights, bool events;
* ``vmap``: a batch of 8 bool event vectors, both directions, shared weight.

Contenders: ``pf`` (primforge, backend 'numba'), ``pf_par`` (primforge, backend
'numba_parallel': rows over Numba's threads for ``W @ v`` and its weight gradient, batch
columns over threads for the vmapped ``v @ W``; serial elsewhere), ``be`` (brainevent, Numba
serial) and ``be_par`` (brainevent with ``set_numba_parallel(True)``). Every result is
checked against ``pf``. Prints a Markdown table of time ratios (below 1: primforge faster)
and writes JSON + Markdown to benchmarks/results/csr_brainevent.*.

How the comparison is kept fair:

* Serial and threaded contenders run in separate processes (the threaded round is a
  subprocess of the serial one, ``--mode threaded``): brainevent reads its parallel flag
  when it builds a kernel and then reuses the kernel for identical source text for the
  life of the process, so one process cannot time both of its modes, and idle OpenMP
  workers of one round would otherwise slow the other. ``pf``/``be`` and
  ``pf_par``/``be_par`` are interleaved call by call; ``pf_par/pf`` compares two processes.
  The threaded round runs with primforge's default ``OMP_WAIT_POLICY=PASSIVE`` (set by its
  threaded backend unless the environment sets it), which applies to both contenders'
  OpenMP threads alike.
* The gradients take the weights and the output weighting ``c`` of the loss as jit
  arguments (as a training step does): a closed-over ``c`` would let XLA fold ``c[row]``
  into a constant for brainevent, whose gradient is jax.numpy code.
* brainevent builds its matrix from concrete index arrays, so the structure is closed over
  (a compile-time constant) for both contenders. From N = 20k up (``--fold-below``), XLA's
  constant folding is switched off for every compiled contender
  (``xla_disable_hlo_passes=constant_folding``): otherwise XLA spends minutes folding
  brainevent's row-index computation over the 25 million stored entries at N = 50k. The
  index computations then run at call time, as they do when a matrix is a jit argument;
  this costs brainevent's gradients most (primforge's kernels read ``indptr`` directly and
  keep their structure opaque to XLA in any case). Below 20k both run with XLA's defaults.

    python benchmarks/csr_brainevent.py           # N = 10k, 50k; p = 0.01; 1% events
    python benchmarks/csr_brainevent.py --quick   # N = 5k (seconds)
    python benchmarks/csr_brainevent.py --rate 0.1 --n 10000
    python benchmarks/csr_brainevent.py --n 10000 --only grad vmap   # a subset of cases
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numba
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from primforge import ops

try:
    import brainevent
except ImportError:  # pragma: no cover - depends on the environment
    brainevent = None

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
BATCH = 8
# At and above this N, XLA's constant folding is switched off for every contender.
FOLD_BELOW = 20_000


def time_interleaved(fns, pools, *, min_time=0.2, max_reps=40, min_reps=5):
    """Median seconds per call of ``fns[name](*pools[name][r])``, contenders interleaved."""
    names = list(fns)
    for name in names:  # warm up
        jax.block_until_ready(fns[name](*pools[name][0]))
    times = {n: [] for n in names}
    start, r = time.perf_counter(), 0
    while r < min_reps or (r < max_reps and time.perf_counter() - start < min_time * len(names)):
        for name in names[r % len(names):] + names[: r % len(names)]:
            x = pools[name][r % len(pools[name])]
            t0 = time.perf_counter()
            jax.block_until_ready(fns[name](*x))
            times[name].append(time.perf_counter() - t0)
        r += 1
    return ({n: statistics.median(t) for n, t in times.items()},
            {n: min(t) for n, t in times.items()})


def make_matrix(n, p, seed):
    W = ops.fixed_prob(n, n, p, weight=0.1, seed=seed)
    w = jnp.asarray(np.random.default_rng(seed).uniform(0.05, 0.15, W.nnz), jnp.float32)
    return W, W.with_data(w)


def cases(W, Wh):
    """name -> (primforge fn(backend) -> fn(x), brainevent fn(x) | None, input kind)."""
    n = W.shape[0]
    c = jnp.asarray(np.random.default_rng(1).standard_normal(n), jnp.float32)
    # brainevent caches a workspace on its matrix object when first traced: each traced
    # function builds its own (from the concrete arrays), so no tracer outlives its trace.
    arrays = {"shared": W, "hetero": Wh}
    fresh = lambda m: brainevent.CSR((arrays[m].data, arrays[m].indices, arrays[m].indptr),
                                     shape=arrays[m].shape)
    bw = {m: (lambda m=m: fresh(m)) for m in arrays} if brainevent else {}
    ev = lambda s: (getattr(brainevent, 'BinaryArray', None) or brainevent.EventArray)(s)
    out = {}
    for wname, M in (("shared", W), ("hetero", Wh)):
        B = bw.get(wname)
        for kind in ("bool", "float"):
            be_in = ev if kind == "bool" else (lambda x: x)
            out[f"W@v {kind} {wname}"] = (
                lambda b, M=M: (lambda x: M.matmul(x, backend=b)),
                (lambda x, B=B, f=be_in: B() @ f(x)) if B is not None else None, kind)
            out[f"v@W {kind} {wname}"] = (
                lambda b, M=M: (lambda x: M.rmatmul(x, backend=b)),
                (lambda x, B=B, f=be_in: f(x) @ B()) if B is not None else None, kind)
    Bh = bw.get("hetero")
    # The weights and the output weighting ``c`` are arguments of the jitted gradient (as
    # in a training step): closed over, XLA would fold ``c[row]`` into a constant for the
    # contender whose gradient is written in jax.numpy.
    for direction in ("v@W", "W@v"):
        def pf_loss(b, d=direction):
            def f(x, w, c):
                def loss(w):
                    Mw = Wh.with_data(w)
                    y = Mw.rmatmul(x, backend=b) if d == "v@W" else Mw.matmul(x, backend=b)
                    return jnp.sum(c * y)
                return jax.grad(loss)(w)
            return f

        def be_loss(x, w, c, d=direction):
            def loss(w):
                Bw = Bh().with_data(w)
                y = ev(x) @ Bw if d == "v@W" else Bw @ ev(x)
                return jnp.sum(c * y)
            return jax.grad(loss)(w)

        out[f"grad {direction} bool hetero"] = (pf_loss, be_loss if Bh is not None else None,
                                                ("grad", Wh.data, c))
    Bs = bw.get("shared")
    out["vmap v@W bool shared"] = (
        lambda b: jax.vmap(lambda x: W.rmatmul(x, backend=b)),
        (lambda xs: jax.vmap(lambda x: ev(x) @ Bs())(xs)) if Bs is not None else None, "batch")
    out["vmap W@v bool shared"] = (
        lambda b: jax.vmap(lambda x: W.matmul(x, backend=b)),
        (lambda xs: jax.vmap(lambda x: Bs() @ ev(x))(xs)) if Bs is not None else None, "batch")
    return out


def input_pool(n, rate, kind, size, seed):
    """Distinct inputs (each a tuple of jit arguments)."""
    if isinstance(kind, tuple):  # a gradient: (events, weights, c)
        _, w, c = kind
        return [(x[0], w, c) for x in input_pool(n, rate, "bool", size, seed)]
    rng = np.random.default_rng(seed)
    if kind == "batch":
        return [(jnp.asarray(rng.random((BATCH, n)) < rate),) for _ in range(size)]
    pool = [rng.random(n) < rate for _ in range(size)]
    if kind == "float":
        pool = [np.where(s, rng.uniform(0.5, 1.5, n), 0.0).astype(np.float32) for s in pool]
    return [(jnp.asarray(s),) for s in pool]


def compile_fn(fn, args, fold):
    """``fn`` jitted and compiled for ``args``; ``fold=False``: without XLA constant folding."""
    opts = None if fold else {"xla_disable_hlo_passes": "constant_folding"}
    return jax.jit(fn).lower(*args).compile(compiler_options=opts)


def run_case(n, p, rate, pool, *, threaded, fold, seed=0, only=None):
    """Rows of one size; ``threaded``: the contenders pf_par and be_par, else pf and be."""
    W, Wh = make_matrix(n, p, seed)
    if brainevent is not None:
        # Read by brainevent when it builds a kernel, and its kernels are cached by their
        # source text for the life of the process: one mode per process.
        brainevent.config.set_numba_parallel(threaded)
    rows = []
    for name, (pf, be, kind) in cases(W, Wh).items():
        if only and not any(o in name for o in only):
            continue
        inputs = input_pool(n, rate, kind, pool, seed + 1)
        pf_name, be_name = ("pf_par", "be_par") if threaded else ("pf", "be")
        fns = {pf_name: compile_fn(pf("numba_parallel" if threaded else "numba"), inputs[0],
                                   fold)}
        if be is not None:
            fns[be_name] = compile_fn(be, inputs[0], fold)
        ref = [np.asarray(compile_fn(pf("numba"), inputs[0], fold)(*inputs[k]), np.float64)
               for k in (0, pool - 1)]
        err = {}
        for m, f in fns.items():
            got = [np.asarray(f(*inputs[k]), np.float64) for k in (0, pool - 1)]
            err[m] = max(float(np.max(np.abs(g - r), initial=0.0)) for g, r in zip(got, ref))
        times, best = time_interleaved(fns, {m: inputs for m in fns})
        scale = 1e-3 * max(1.0, max(float(np.abs(r).max(initial=0.0)) for r in ref))
        rows.append({"n": n, "p": p, "rate": rate, "nnz": W.nnz, "op": name, "fold": fold,
                     "times": times, "min_times": best, "max_abs_err_vs_pf": err,
                     "wrong": sorted(m for m, e in err.items() if e > scale)})
        print(f"  N={n} {name}: " + ", ".join(f"{m} {t * 1e3:.3f} ms" for m, t in times.items()),
              file=sys.stderr)
    return rows


def merge(serial, threaded):
    """One row per (N, op) with the four contenders' times."""
    by_key = {(r["n"], r["op"]): r for r in serial}
    for r in threaded:
        row = by_key.setdefault((r["n"], r["op"]), dict(r, times={}, min_times={},
                                                         max_abs_err_vs_pf={}, wrong=[]))
        for key in ("times", "min_times", "max_abs_err_vs_pf"):
            row[key].update(r[key])
        row["wrong"] = sorted(set(row["wrong"]) | set(r["wrong"]))
    return list(by_key.values())


def ratio(row, a, b, key="times"):
    t = row[key]
    return t[a] / t[b] if a in t and b in t else None


# (header, a, b, key): medians, and the fastest call for the threaded pairs (on a shared,
# oversubscribed machine a parallel region waits for its slowest thread to be scheduled).
COLUMNS = (("pf/be", "pf", "be", "times"), ("pf_par/be_par", "pf_par", "be_par", "times"),
           ("pf_par/pf", "pf_par", "pf", "times"), ("be_par/be", "be_par", "be", "times"),
           ("pf_par/be_par min", "pf_par", "be_par", "min_times"),
           ("pf_par/pf min", "pf_par", "pf", "min_times"))


def table(rows):
    lines = ["| N | op | pf ms | " + " | ".join(c[0] for c in COLUMNS) + " | wrong |",
             "|---|---|---|" + "---|" * len(COLUMNS) + "---|"]
    fmt = lambda r: "-" if r is None else f"{r:.2f}"
    for r in rows:
        cells = " | ".join(fmt(ratio(r, a, b, key)) for _, a, b, key in COLUMNS)
        pf_ms = f"{r['times']['pf'] * 1e3:.3f}" if "pf" in r["times"] else "-"
        lines.append(f"| {r['n']} | {r['op']} | {pf_ms} | {cells} | "
                     f"{','.join(r['wrong']) or '-'} |")
    lines.append("")
    for head, a, b, key in COLUMNS:
        rs = [x for x in (ratio(r, a, b, key) for r in rows) if x is not None]
        if rs:
            geo = float(np.exp(np.mean(np.log(rs))))
            lines.append(f"{head}: geometric mean {geo:.2f}, worst {max(rs):.2f}, "
                         f"best {min(rs):.2f} over {len(rs)} cases")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="N = 5k only")
    ap.add_argument("--n", type=int, nargs="*", default=None, help="sizes (default 10k 50k)")
    ap.add_argument("--p", type=float, default=0.01, help="connection probability")
    ap.add_argument("--rate", type=float, default=0.01, help="fraction of active inputs")
    ap.add_argument("--pool", type=int, default=8, help="distinct inputs per case")
    ap.add_argument("--only", nargs="*", default=None,
                    help="run only the cases whose name contains one of these strings")
    ap.add_argument("--fold-below", type=int, default=FOLD_BELOW,
                    help="XLA constant folding stays on for N below this (both contenders)")
    ap.add_argument("--mode", choices=("both", "serial", "threaded"), default="both",
                    help="'both': the serial round here, the threaded one in a subprocess")
    ap.add_argument("--rows-json", default=None, help=argparse.SUPPRESS)  # subprocess output
    ap.add_argument("--out", default=RESULTS, help="results folder")
    args = ap.parse_args(argv)
    sizes = args.n or ([5_000] if args.quick else [10_000, 50_000])
    run = lambda threaded: [row for n in sizes for row in run_case(
        n, args.p, args.rate, args.pool, threaded=threaded, fold=n < args.fold_below,
        only=args.only)]
    if args.mode != "both":
        rows = run(args.mode == "threaded")
        if args.rows_json:
            with open(args.rows_json, "w") as f:
                json.dump(rows, f)
            return
    else:
        rows = run(False)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "rows.json")
            sub = [a for a in (argv if argv is not None else sys.argv[1:])]
            env = dict(os.environ)
            env.setdefault("NUMBA_THREADING_LAYER", "omp")
            subprocess.run([sys.executable, os.path.abspath(__file__), *sub,
                            "--mode", "threaded", "--rows-json", path], check=True, env=env)
            with open(path) as f:
                rows = merge(rows, json.load(f))
    text = table(rows)
    print(text)
    meta = {"jax": jax.__version__, "numba": numba.__version__,
            "brainevent": getattr(brainevent, "__version__", None),
            "numba_threads": numba.get_num_threads(), "platform": platform.platform(),
            "cpu_count": os.cpu_count(), "p": args.p, "rate": args.rate, "sizes": sizes,
            "fold_below": args.fold_below, "argv": sys.argv[1:] if argv is None else argv,
            "env": {k: os.environ.get(k) for k in ("OMP_WAIT_POLICY", "NUMBA_NUM_THREADS",
                                                   "NUMBA_THREADING_LAYER")}}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "csr_brainevent.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    with open(os.path.join(args.out, "csr_brainevent.md"), "w") as f:
        f.write(text + "\n")
    print(f"results in {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
