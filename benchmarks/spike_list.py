"""The CSR and just-in-time products on a spike list against the same on a bool vector.

A random ``N x N`` matrix, each entry present with probability ``p``, stored as CSR and
generated just in time from a seed; ``W.T @ e`` with ``e`` given three ways, each jitted
and timed interleaved call by call (rotating which goes first), medians reported: the
product on the bool vector (``binary_csrmv``, ``binary_jitc_matvec``), on a ready-made
spike list (``binary_csrmv_spikes``, ``binary_jitc_mv_spikes``; capacity twice the
expected count), and ``spike_list`` followed by the list product in one jitted call.

    python benchmarks/spike_list.py                     # N = 10000, p = 0.01, 1% and 10%
    python benchmarks/spike_list.py --n 4000 --reps 50
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("JAX_PLATFORMS", "cpu")
from primforge import ops


def median_times(fns, reps):
    times = {name: [] for name in fns}
    names = list(fns)
    for r in range(reps):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            t0 = time.perf_counter()
            jax.block_until_ready(fns[name]())
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(t) for name, t in times.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--p", type=float, default=0.01)
    ap.add_argument("--reps", type=int, default=200)
    args = ap.parse_args()
    n, rng = args.n, np.random.default_rng(0)
    counts = rng.binomial(n, args.p, n)
    indptr = jnp.asarray(np.concatenate([[0], np.cumsum(counts)]).astype(np.int32))
    indices = jnp.asarray(np.concatenate(
        [np.sort(rng.choice(n, c, replace=False)) for c in counts]).astype(np.int32))
    data = jnp.asarray(rng.uniform(0.5, 1.5, indices.shape[0]).astype(np.float32))
    shape = (n, n)
    print(f"N = {n}, p = {args.p}, nnz = {indices.shape[0]}, {args.reps} reps, "
          f"{jax.devices()[0].platform}")
    print("| matrix | activity | bool vector (us) | spike list (us) | "
          "spike_list + product (us) |")
    print("|---|---|---|---|---|")
    for rate in (0.01, 0.10):
        events = jnp.asarray(rng.random(n) < rate)
        cap = max(1, int(2 * rate * n))
        for name, fns in (("csr", csr_fns(data, indices, indptr, shape, cap)),
                          ("jitc", jitc_fns(shape, args.p, cap))):
            t = one_rate(*fns, events, cap, args.reps)
            print(f"| {name} | {rate:.0%} | {t['dense'] * 1e6:.1f} | {t['listed'] * 1e6:.1f} | "
                  f"{t['built'] * 1e6:.1f} |")


def csr_fns(data, indices, indptr, shape, cap):
    """The CSR product on a bool vector, on a list, and after ``spike_list``."""
    dense = jax.jit(lambda e: ops.binary_csrmv(data, indices, indptr, e, shape=shape,
                                               transpose=True))
    listed = jax.jit(lambda s, c: ops.binary_csrmv_spikes(
        data, indices, indptr, s, c, shape=shape, transpose=True))
    built = jax.jit(lambda e: ops.binary_csrmv_spikes(
        data, indices, indptr, *ops.spike_list(e, cap), shape=shape, transpose=True))
    return dense, listed, built


def jitc_fns(shape, prob, cap, seed=7):
    """The just-in-time product (a uniform weight per synapse) the same three ways."""
    kw = {"shape": shape, "prob": prob, "weight_kind": "uniform"}
    w = (0.5, 1.5)
    dense = jax.jit(lambda e: ops.binary_jitc_matvec(w, seed, e, transpose=True, **kw))
    listed = jax.jit(lambda s, c: ops.binary_jitc_mv_spikes(w, seed, s, c, **kw))
    built = jax.jit(lambda e: ops.binary_jitc_mv_spikes(w, seed, *ops.spike_list(e, cap), **kw))
    return dense, listed, built


def one_rate(dense, listed, built, events, cap, reps):
    idx, cnt = ops.spike_list(events, cap)
    np.testing.assert_allclose(listed(idx, cnt), dense(events), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(built(events), dense(events), rtol=1e-4, atol=1e-4)
    return median_times({"dense": lambda: dense(events), "listed": lambda: listed(idx, cnt),
                         "built": lambda: built(events)}, reps)


if __name__ == "__main__":
    main()
