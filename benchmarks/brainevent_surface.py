"""primforge's index conversions, row slices, diagonal updates and SDDMM against brainevent's.

A random ``N x N`` CSR matrix with ``k`` entries per row. Each operation is timed for both
libraries interleaved call by call (alternating which goes first), and the medians are
reported: NumPy-input conversions run eagerly; ``csr_slice_rows`` (64 rows), the values of
``diag_add`` (a plan made once) and the SDDMM (inner size 16) run jitted, after a warm-up
call. Prints a Markdown table (ratio below 1: primforge faster) and writes JSON to
benchmarks/results/brainevent_surface.json.

    python benchmarks/brainevent_surface.py              # N = 4000, k = 100
    python benchmarks/brainevent_surface.py --n 1000 --k 20
"""

from __future__ import annotations

import argparse
import json
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

try:
    import brainevent
except ImportError:  # pragma: no cover - depends on the environment
    brainevent = None

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def median_times(fns, reps):
    times = {name: [] for name in fns}
    names = list(fns)
    for r in range(reps):
        for name in names[r % 2:] + names[: r % 2]:
            t0 = time.perf_counter()
            jax.block_until_ready(fns[name]())
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(t) for name, t in times.items()}


def cases(n, k, seed=0):
    rng = np.random.default_rng(seed)
    indices = np.sort(rng.integers(0, n, (n, k)), axis=1).ravel().astype(np.int32)
    indptr = np.arange(0, n * k + 1, k, dtype=np.int32)
    rows = np.repeat(np.arange(n, dtype=np.int32), k)
    shuffle = rng.permutation(n * k)
    coo_r, coo_c = rows[shuffle], indices[shuffle]
    data = jnp.asarray(rng.uniform(0.5, 1.5, n * k).astype(np.float32))
    jind, jptr = jnp.asarray(indices), jnp.asarray(indptr)
    sel = jnp.asarray(rng.integers(0, n, 64).astype(np.int32))
    diag = jnp.ones(n, jnp.float32)
    a = jnp.asarray(rng.standard_normal((n, 16)).astype(np.float32))
    b = jnp.asarray(rng.standard_normal((16, n)).astype(np.float32))
    shape = (n, n)
    be = brainevent
    out = {
        "coo2csr (NumPy)": (lambda: ops.coo2csr(coo_r, coo_c, shape=shape),
                            lambda: be.coo2csr(coo_r, coo_c, shape=shape)),
        "csr_to_csc_index (NumPy)": (
            lambda: ops.csr_to_csc_index(indptr, indices, shape=shape),
            lambda: be.csr_to_csc_index(indptr, indices, shape=shape)),
        "csc_to_csr_index (NumPy)": (
            lambda: ops.csc_to_csr_index(indptr, indices, shape=shape),
            lambda: be.csc_to_csr_index(indptr, indices, shape=shape)),
    }
    pf_slice = jax.jit(lambda d, r: ops.csr_slice_rows(d, jind, jptr, r, shape=shape))
    be_slice = jax.jit(lambda d, r: be.csr_slice_rows(d, jind, jptr, r, shape=shape))
    out["csr_slice_rows (64 rows, jit)"] = (lambda: pf_slice(data, sel),
                                            lambda: be_slice(data, sel))
    pf_plan = ops.csr_diag_position(indptr, indices, shape=shape)
    pf_diag = jax.jit(lambda d, g: ops.csr_diag_add(d, pf_plan, g))
    out["diag_add values (jit)"] = (lambda: pf_diag(data, diag), None)
    if be is not None:
        from brainevent._csr.diag_add import csr_diag_add, csr_diag_position

        be_plan = csr_diag_position(indptr, indices, shape=shape)
        be_diag = jax.jit(lambda d, g: csr_diag_add(d, be_plan, g))
        out["diag_add values (jit)"] = (out["diag_add values (jit)"][0],
                                        lambda: be_diag(data, diag))
        from brainevent._sddmm import sddmm_coo_indices

        be_sddmm = jax.jit(lambda x, y: sddmm_coo_indices(x, y, jnp.asarray(rows), jind).data)
    pf_sddmm = jax.jit(lambda x, y: ops.csr_sddmm(x, y, jind, jptr, shape=shape))
    out["csr_sddmm (inner 16, jit)"] = (lambda: pf_sddmm(a, b),
                                        (lambda: be_sddmm(a, b)) if be is not None else None)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=4000)
    parser.add_argument("--k", type=int, default=100)
    parser.add_argument("--reps", type=int, default=15)
    args = parser.parse_args()
    rows = []
    print(f"N = {args.n}, k = {args.k}, brainevent "
          f"{getattr(brainevent, '__version__', 'not installed')}, jax {jax.__version__}\n")
    print("| operation | primforge (ms) | brainevent (ms) | ratio |")
    print("| --- | --- | --- | --- |")
    for name, (pf, be) in cases(args.n, args.k).items():
        fns = {"pf": pf} if be is None or brainevent is None else {"pf": pf, "be": be}
        for f in fns.values():  # warm-up (compiles)
            jax.block_until_ready(f())
        t = median_times(fns, args.reps)
        be_ms = t["be"] * 1e3 if "be" in t else float("nan")
        rows.append({"op": name, "pf_ms": t["pf"] * 1e3, "be_ms": be_ms})
        print(f"| {name} | {t['pf'] * 1e3:.3f} | {be_ms:.3f} | {t['pf'] * 1e3 / be_ms:.2f} |")
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "brainevent_surface.json"), "w") as f:
        json.dump({"n": args.n, "k": args.k, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
