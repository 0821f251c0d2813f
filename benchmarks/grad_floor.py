"""Weight gradients that are bound by the write of their result, against that write alone.

* Dense: ``jax.grad`` of ``sum(c * binary_densemv(W, s))`` with respect to a dense
  ``(N, N)`` ``W`` is an outer product of the events and ``c``: ``N * N`` numbers that must
  be written whatever computes them. The floor is a bare ``jnp.outer`` of the same vectors
  (one fused write of the result).
* CSR: the per-synapse gradient of ``sum(c * (W @ s))`` is ``c[row_k] * s[col_k]`` for
  every stored entry ``k``: every column index is read and ``nnz`` numbers are written. The
  floor is a bare XLA gather ``s[indices]`` of the same events (the same reads and writes,
  without the row factor). ``W`` has ``p = 0.01``; ``c``, the weights and the events are
  jit arguments, as in a training step.

Contenders: primforge (numba backend; for the CSR gradient also its threaded
``numba_parallel`` backend, since XLA spreads the floor's and brainevent's gathers over the
cores), brainevent 0.2.1 and the floor, interleaved call by
call over a pool of distinct event vectors; medians.

    python benchmarks/grad_floor.py            # N = 5000 dense, 10000 CSR; 1% events
    python benchmarks/grad_floor.py --rate 0.1

Prints a Markdown table (milliseconds and ratios to the floor) and writes
benchmarks/results/grad_floor.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from primforge import ops

try:
    import brainevent
except ImportError:  # pragma: no cover - depends on the environment
    brainevent = None

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def csr_contenders(n, p):
    W = ops.fixed_prob(n, n, p, weight=0.1, seed=0)
    w = jnp.asarray(np.random.default_rng(0).uniform(0.05, 0.15, W.nnz), jnp.float32)
    c = jnp.asarray(np.random.default_rng(1).standard_normal(n), jnp.float32)
    fns = {"primforge": jax.jit(lambda x, w, c: jax.grad(
        lambda w: jnp.sum(c * W.with_data(w).matmul(x)))(w)),
           "primforge threaded": jax.jit(lambda x, w, c: jax.grad(
               lambda w: jnp.sum(c * W.with_data(w).matmul(x, backend="numba_parallel")))(w))}
    if brainevent is not None:
        def be(x, w, c):
            B = brainevent.CSR((w, W.indices, W.indptr), shape=W.shape)
            event = (getattr(brainevent, "BinaryArray", None) or brainevent.EventArray)(x)
            return jax.grad(lambda w: jnp.sum(c * (B.with_data(w) @ event)))(w)
        fns["brainevent"] = jax.jit(be)
    fns["floor"] = jax.jit(lambda x, w, c: x.astype(jnp.float32)[W.indices])
    return fns, (w, c), lambda x: np.asarray(c)[np.repeat(np.arange(n), np.diff(
        np.asarray(W.indptr)))] * np.asarray(x, np.float32)[np.asarray(W.indices)]


def contenders(W, c, transpose):
    def grad_of(product):
        return jax.jit(lambda x: jax.grad(lambda w: jnp.sum(c * product(w, x)))(W))

    fns = {"primforge": grad_of(lambda w, x: ops.binary_densemv(w, x, transpose=transpose))}
    if brainevent is not None:
        fns["brainevent"] = grad_of(
            lambda w, x: brainevent.binary_densemv(w, x, transpose=transpose))
    ev = lambda x: x.astype(W.dtype)
    fns["floor"] = jax.jit(
        (lambda x: jnp.outer(ev(x), c)) if transpose else (lambda x: jnp.outer(c, ev(x))))
    return fns


def timed(fns, pool, extra, reps):
    times = {k: [] for k in fns}
    names = list(fns)
    for r in range(reps):
        for k in names[r % len(names):] + names[:r % len(names)]:
            t0 = time.perf_counter()
            jax.block_until_ready(fns[k](pool[(r + names.index(k)) % len(pool)], *extra))
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) * 1e3 for k, v in times.items()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=5000, help="dense size")
    ap.add_argument("--n-csr", type=int, default=10000, help="CSR size")
    ap.add_argument("--rate", type=float, default=0.01)
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(1)
    W = jnp.asarray(rng.standard_normal((args.n, args.n)).astype(np.float32))
    c = jnp.asarray(rng.standard_normal(args.n).astype(np.float32))
    pool = [jnp.asarray(rng.random(args.n) < args.rate) for _ in range(8)]
    rows = []
    for transpose, name in ((True, "s@W"), (False, "W@s")):
        fns = contenders(W, c, transpose)
        ref = np.asarray(fns["floor"](pool[0]))
        for who, f in fns.items():  # every contender computes the same gradient
            np.testing.assert_allclose(np.asarray(f(pool[0])), ref, rtol=1e-6, err_msg=who)
        rows.append({"op": f"dense {name} grad-w bool", "n": args.n, "rate": args.rate,
                     "ms": timed(fns, pool, (), args.reps)})
    pool = [jnp.asarray(rng.random(args.n_csr) < args.rate) for _ in range(8)]
    fns, extra, want = csr_contenders(args.n_csr, 0.01)
    for who, f in fns.items():
        if who != "floor":
            np.testing.assert_allclose(np.asarray(f(pool[0], *extra)), want(pool[0]),
                                       rtol=1e-6, err_msg=who)
    rows.append({"op": "csr W@s grad-w bool hetero", "n": args.n_csr, "rate": args.rate,
                 "ms": timed(fns, pool, extra, args.reps)})
    heads = ["primforge", "primforge threaded", "brainevent", "floor"]
    heads = [h for h in heads if any(h in r["ms"] for r in rows)]
    print("| op | N | " + " | ".join(f"{h} ms" for h in heads) + " | "
          + " | ".join(f"{h} / floor" for h in heads if h != "floor") + " |")
    print("|---|---|" + "---|" * (2 * len(heads) - 1))
    for r in rows:
        ms = r["ms"]
        cell = lambda h, v, ms=ms: "-" if h not in ms else v
        print(f"| {r['op']} | {r['n']} | "
              + " | ".join(cell(h, f"{ms.get(h, 0):.2f}") for h in heads) + " | "
              + " | ".join(cell(h, f"{ms.get(h, 0) / ms['floor']:.2f}")
                           for h in heads if h != "floor") + " |")
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "grad_floor.json"), "w") as f:
        json.dump({"jax": jax.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
