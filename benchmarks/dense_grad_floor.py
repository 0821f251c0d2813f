"""The weight gradient of a dense event product against the cost of writing it.

``jax.grad`` of ``sum(c * binary_densemv(W, s))`` with respect to a dense ``(N, N)`` ``W`` is
an outer product of the events and ``c``: ``N * N`` numbers that must be written whatever
computes them. This script times primforge's gradient, brainevent's and a bare
``jnp.outer`` of the same vectors (the floor: one fused write of the result), in both
directions, interleaved call by call over a pool of distinct event vectors; medians.

    python benchmarks/dense_grad_floor.py            # N = 5000, 1% events
    python benchmarks/dense_grad_floor.py --n 2000 --rate 0.1

Prints a Markdown table (milliseconds and ratios to the floor) and writes
benchmarks/results/dense_grad_floor.json.
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


def contenders(W, c, transpose):
    def grad_of(product):
        return jax.jit(lambda x: jax.grad(lambda w: jnp.sum(c * product(w, x)))(W))

    fns = {"primforge": grad_of(lambda w, x: ops.binary_densemv(w, x, transpose=transpose))}
    if brainevent is not None:
        fns["brainevent"] = grad_of(
            lambda w, x: brainevent.binary_densemv(w, x, transpose=transpose))
    ev = lambda x: x.astype(W.dtype)
    fns["jnp.outer"] = jax.jit(
        (lambda x: jnp.outer(ev(x), c)) if transpose else (lambda x: jnp.outer(c, ev(x))))
    return fns


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=5000)
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
        ref = np.asarray(fns["jnp.outer"](pool[0]))
        for who, f in fns.items():  # every contender computes the same gradient
            np.testing.assert_allclose(np.asarray(f(pool[0])), ref, rtol=1e-6, err_msg=who)
        times = {k: [] for k in fns}
        names = list(fns)
        for r in range(args.reps):
            for k in names[r % len(names):] + names[:r % len(names)]:
                t0 = time.perf_counter()
                jax.block_until_ready(fns[k](pool[(r + names.index(k)) % len(pool)]))
                times[k].append(time.perf_counter() - t0)
        med = {k: statistics.median(v) for k, v in times.items()}
        rows.append({"op": f"dense {name} grad-w bool", "n": args.n, "rate": args.rate,
                     "ms": {k: v * 1e3 for k, v in med.items()}})
    heads = list(rows[0]["ms"])
    print("| op | " + " | ".join(f"{h} ms" for h in heads) + " | "
          + " | ".join(f"{h} / floor" for h in heads if h != "jnp.outer") + " |")
    print("|---|" + "---|" * (2 * len(heads) - 1))
    for r in rows:
        ms = r["ms"]
        print(f"| {r['op']} | " + " | ".join(f"{ms[h]:.2f}" for h in heads) + " | "
              + " | ".join(f"{ms[h] / ms['jnp.outer']:.2f}" for h in heads if h != "jnp.outer")
              + " |")
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "dense_grad_floor.json"), "w") as f:
        json.dump({"jax": jax.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
