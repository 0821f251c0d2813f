"""The binary sparse products on bit-packed events: read in the kernel against unpacked first.

A random ``N x N`` matrix with the COBA network's connectivity, one shared weight: a CSR
matrix with 80 inputs per neuron on average, and a fixed-number matrix with 80 targets
per presynaptic neuron (``per='pre'``); a random event vector at 1% and 2% activity,
packed 32 events a word. Three contenders, each jitted, timed interleaved call by call
(rotating which goes first), best of ``--reps`` reported: the kernel reading the packed
words, the packed words unpacked by an XLA operation and then the product (what a packed
input cost before), and the product on a ready bool vector. The results are checked bit
for bit first. The 1-minute load average is printed: the timings are only comparable on
an otherwise idle machine.

    python benchmarks/packed_events.py                  # N = 4000 and 40000
    python benchmarks/packed_events.py --n 4000 --reps 500 --matrix fixed_num
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("JAX_PLATFORMS", "cpu")
from primforge import ops


def best_times(fns, reps):
    times = {name: [] for name in fns}
    names = list(fns)
    for r in range(reps):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            t0 = time.perf_counter()
            jax.block_until_ready(fns[name]())
            times[name].append(time.perf_counter() - t0)
    return {name: min(t) for name, t in times.items()}


def product(matrix, n, transpose, rng):
    """The binary vector product of a random ``n x n`` matrix of the kind ``matrix``."""
    seed = int(rng.integers(1 << 30))
    if matrix == "csr":
        w = ops.fixed_prob(n, n, 80 / n, weight=0.6, seed=seed)
        return lambda x: ops.binary_csrmv(w.data, w.indices, w.indptr, x, shape=w.shape,
                                          transpose=transpose)
    w = ops.fixed_num(n, n, 80, weight=0.6, seed=seed)
    return lambda x: ops.binary_fixed_num_mv(w.weights, w.indices, x, shape=w.shape,
                                             transpose=transpose)


def one(matrix, n, rate, transpose, reps, rng):
    call = product(matrix, n, transpose, rng)
    events = rng.random(n) < rate
    packed = ops.pack_events(events)
    words = packed.words
    native = jax.jit(lambda words: call(ops.PackedEvents(words, n)))
    unpacked = jax.jit(lambda words: call(ops.PackedEvents(words, n).unpack()))
    plain = jax.jit(call)
    want = np.asarray(plain(events))
    for f, x in ((native, words), (unpacked, words)):
        np.testing.assert_array_equal(np.asarray(f(x)), want)
    return best_times({"native": lambda: native(words), "unpack": lambda: unpacked(words),
                       "bool": lambda: plain(events)}, reps)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, nargs="*", default=[4000, 40_000])
    ap.add_argument("--reps", type=int, default=300)
    ap.add_argument("--matrix", nargs="*", choices=("csr", "fixed_num"),
                    default=["csr", "fixed_num"])
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    print(f"{jax.devices()[0].platform}, best of {args.reps}, 1-minute load "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print("| matrix | N | activity | product | packed, in the kernel (us) | "
          "unpack + product (us) | bool vector (us) |")
    print("|---|---|---|---|---|---|---|")
    for matrix in args.matrix:
        for n in args.n:
            for rate in (0.01, 0.02):
                for transpose in (True, False):
                    t = one(matrix, n, rate, transpose, args.reps, rng)
                    what = "e @ W" if transpose else "W @ e"
                    print(f"| {matrix} | {n} | {rate:.0%} | {what} | "
                          f"{t['native'] * 1e6:.1f} | {t['unpack'] * 1e6:.1f} | "
                          f"{t['bool'] * 1e6:.1f} |", flush=True)
    print(f"1-minute load at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
