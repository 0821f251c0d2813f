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
'numba_parallel': rows over Numba's threads for ``W @ v``; serial elsewhere), ``be``
(brainevent, Numba serial) and ``be_par`` (brainevent with ``set_numba_parallel(True)``).
Every result is checked against ``pf``. Serial and threaded contenders are timed in
separate interleaved rounds (spinning idle worker threads would slow the serial ones). Prints a Markdown table of time ratios (below 1:
primforge faster) and writes JSON + Markdown to benchmarks/results/csr_brainevent.*.

    python benchmarks/csr_brainevent.py           # N = 10k, 50k; p = 0.01; 1% events
    python benchmarks/csr_brainevent.py --quick   # N = 5k (seconds)
    python benchmarks/csr_brainevent.py --rate 0.1 --n 10000
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
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


def time_interleaved(fns, pools, *, min_time=0.2, max_reps=40, min_reps=5):
    """Median seconds per call of ``fns[name](pools[name][r])``, contenders interleaved."""
    names = list(fns)
    for name in names:  # compile and warm up
        jax.block_until_ready(fns[name](pools[name][0]))
    times = {n: [] for n in names}
    start, r = time.perf_counter(), 0
    while r < min_reps or (r < max_reps and time.perf_counter() - start < min_time * len(names)):
        for name in names[r % len(names):] + names[: r % len(names)]:
            x = pools[name][r % len(pools[name])]
            t0 = time.perf_counter()
            jax.block_until_ready(fns[name](x))
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
    ev = lambda s: getattr(brainevent, 'BinaryArray', brainevent.EventArray)(s)
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
    for direction in ("v@W", "W@v"):
        def pf_loss(b, d=direction):
            def f(x):
                def loss(w):
                    Mw = Wh.with_data(w)
                    y = Mw.rmatmul(x, backend=b) if d == "v@W" else Mw.matmul(x, backend=b)
                    return jnp.sum(c * y)
                return jax.grad(loss)(Wh.data)
            return f

        def be_loss(x, d=direction):
            def loss(w):
                Bw = Bh().with_data(w)
                y = ev(x) @ Bw if d == "v@W" else Bw @ ev(x)
                return jnp.sum(c * y)
            return jax.grad(loss)(Wh.data)

        out[f"grad {direction} bool hetero"] = (pf_loss, be_loss if Bh is not None else None,
                                                "bool")
    Bs = bw.get("shared")
    out["vmap v@W bool shared"] = (
        lambda b: jax.vmap(lambda x: W.rmatmul(x, backend=b)),
        (lambda xs: jax.vmap(lambda x: ev(x) @ Bs())(xs)) if Bs is not None else None, "batch")
    out["vmap W@v bool shared"] = (
        lambda b: jax.vmap(lambda x: W.matmul(x, backend=b)),
        (lambda xs: jax.vmap(lambda x: Bs() @ ev(x))(xs)) if Bs is not None else None, "batch")
    return out


def input_pool(n, rate, kind, size, seed):
    rng = np.random.default_rng(seed)
    if kind == "batch":
        return [jnp.asarray(rng.random((BATCH, n)) < rate) for _ in range(size)]
    pool = [rng.random(n) < rate for _ in range(size)]
    if kind == "float":
        pool = [np.where(s, rng.uniform(0.5, 1.5, n), 0.0).astype(np.float32) for s in pool]
    return [jnp.asarray(s) for s in pool]


def build_brainevent(fn, parallel, x0):
    """A jitted brainevent call, compiled (its Numba kernels built) in the given mode."""
    brainevent.config.set_numba_parallel(parallel)
    f = jax.jit(fn)
    jax.block_until_ready(f(x0))  # brainevent reads the mode when it builds its kernels
    return f


def run_case(n, p, rate, pool, seed=0, only=None):
    W, Wh = make_matrix(n, p, seed)
    rows = []
    for name, (pf, be, kind) in cases(W, Wh).items():
        if only and not any(o in name for o in only):
            continue
        inputs = input_pool(n, rate, kind, pool, seed + 1)
        fns = {"pf": jax.jit(pf("numba")), "pf_par": jax.jit(pf("numba_parallel"))}
        if be is not None:
            fns["be"] = build_brainevent(be, False, inputs[0])
            fns["be_par"] = build_brainevent(be, True, inputs[0])
            brainevent.config.set_numba_parallel(False)
        ref = [np.asarray(fns["pf"](inputs[k]), np.float64) for k in (0, pool - 1)]
        err = {}
        for m, f in fns.items():
            got = [np.asarray(f(inputs[k]), np.float64) for k in (0, pool - 1)]
            err[m] = max(float(np.max(np.abs(g - r), initial=0.0)) for g, r in zip(got, ref))
        # Serial and threaded contenders are timed in separate rounds: the idle workers of a
        # parallel region spin for a while after it, which would slow whichever serial call
        # follows on a machine with few cores.
        times, best = {}, {}
        for group in (("pf", "be"), ("pf_par", "be_par")):
            sub = {m: fns[m] for m in group if m in fns}
            t, b = time_interleaved(sub, {m: inputs for m in sub})
            times.update(t)
            best.update(b)
        scale = 1e-3 * max(1.0, max(float(np.abs(r).max(initial=0.0)) for r in ref))
        row = {"n": n, "p": p, "rate": rate, "nnz": W.nnz, "op": name, "times": times, "min_times": best,
               "max_abs_err_vs_pf": err, "wrong": sorted(m for m, e in err.items() if e > scale)}
        rows.append(row)
        print(f"  N={n} {name}: " + ", ".join(f"{m} {t * 1e3:.3f} ms" for m, t in times.items()),
              file=sys.stderr)
    return rows


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
        lines.append(f"| {r['n']} | {r['op']} | {r['times']['pf'] * 1e3:.3f} | {cells} | "
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
    ap.add_argument("--out", default=RESULTS, help="results folder")
    args = ap.parse_args(argv)
    sizes = args.n or ([5_000] if args.quick else [10_000, 50_000])
    rows = []
    for n in sizes:
        rows += run_case(n, args.p, args.rate, args.pool, only=args.only)
    text = table(rows)
    print(text)
    meta = {"jax": jax.__version__, "numba": numba.__version__,
            "brainevent": getattr(brainevent, "__version__", None),
            "numba_threads": numba.get_num_threads(), "platform": platform.platform(),
            "cpu_count": os.cpu_count(), "p": args.p, "rate": args.rate, "sizes": sizes}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "csr_brainevent.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    with open(os.path.join(args.out, "csr_brainevent.md"), "w") as f:
        f.write(text + "\n")
    print(f"results in {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
