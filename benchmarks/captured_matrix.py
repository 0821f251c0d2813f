"""Compile time of ``jit(grad)`` through a CSR product: matrix captured vs passed as argument.

A matrix captured from the enclosing scope makes its arrays compile-time constants; XLA
then constant-folds every index computation of the product and of its weight gradient
while compiling (measured before the library kept the index arrays opaque: 37 s at
5000x5000, p=0.04, against 1.9 s with the matrix as an argument). This measures the first
call (trace + compile + run) of

    jax.jit(jax.grad(lambda w: (s @ W.with_data(w)).sum()))(W.data)          # captured
    jax.jit(jax.grad(lambda w, W: (s @ W.with_data(w)).sum()))(W.data, W)    # argument

each in a fresh subprocess (so no cache is shared), for a few sizes. Prints a table and
writes ``benchmarks/results/captured_matrix.json``.

Usage: ``python benchmarks/captured_matrix.py [--sizes 1000 2000] [--p 0.04]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import jax

CHILD = """
import sys, time, jax, jax.numpy as jnp
from primforge.ops import fixed_prob
n, p, mode = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
W = fixed_prob(n, n, p, weight=lambda rng, k: rng.normal(size=k), seed=0)
s = jnp.ones(n)
t = time.perf_counter()
if mode == "captured":
    out = jax.jit(jax.grad(lambda w: (s @ W.with_data(w)).sum()))(W.data)
else:
    out = jax.jit(jax.grad(lambda w, W: (s @ W.with_data(w)).sum()))(W.data, W)
jax.block_until_ready(out)
print(time.perf_counter() - t)
"""


def first_call(n: int, p: float, mode: str) -> float:
    root = Path(__file__).resolve().parents[1]
    path = os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path}
    proc = subprocess.run([sys.executable, "-c", CHILD, str(n), str(p), mode], env=env,
                          capture_output=True, text=True, check=True)
    return float(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 2000])
    parser.add_argument("--p", type=float, default=0.04)
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).parent / "results" / "captured_matrix.json")
    args = parser.parse_args()
    rows = []
    print(f"{'n':>6} {'nnz~':>9} {'captured s':>11} {'argument s':>11} {'ratio':>6}")
    for n in args.sizes:
        cap, arg = first_call(n, args.p, "captured"), first_call(n, args.p, "argument")
        rows.append({"n": n, "p": args.p, "captured_s": cap, "argument_s": arg})
        print(f"{n:>6} {int(n * n * args.p):>9} {cap:>11.2f} {arg:>11.2f} {cap / arg:>6.2f}")
    meta = {"jax": jax.__version__, "python": sys.version.split()[0],
            "machine": platform.machine(), "devices": [str(d) for d in jax.devices()]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "results": rows}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
