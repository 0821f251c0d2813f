"""Dispatch cost of a Numba kernel run by XLA through the typed FFI.

Measures, side by side in one process (this machine is noisy: compare ratios, not times):
  1. per-call latency under jax.jit of y = 2x + 1 (float32) for a Numba kernel through
     XLACustomKernel, plain jax.numpy, and jax.pure_callback calling the same @njit
     function, at n = 8, 1e3, 1e5, 1e7 (plus a parallel=True Numba kernel at 1e7);
  2. vmap over a 64 x 1000 batch: native batching, the general (scan) rule, jax.numpy;
  3. first-call time (compile + run) in a fresh process, with a cold and a warm disk cache.

Usage:  python benchmarks/dispatch.py [--quick] [--json PATH]
Prints a table and writes JSON (default benchmarks/results/dispatch.json).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

import jax
import jax.numpy as jnp
import numba
import numpy as np

import primforge

RESULTS = pathlib.Path(__file__).resolve().parent / "results"


@numba.njit
def affine(x, out):
    for i in range(x.size):
        out[i] = 2.0 * x[i] + 1.0


@numba.njit(parallel=True)
def affine_parallel(x, out):
    for i in numba.prange(x.size):
        out[i] = 2.0 * x[i] + 1.0


def make_kernel(name, fn, general=False):
    k = primforge.XLACustomKernel(name)
    k.def_numba_kernel(lambda **kw: fn)
    if general:
        k.register_general_batching()
    return k


def timeit(fn, x, *, min_time=0.2, max_reps=20000, repeats=7):
    """Median per-call seconds of fn(x) (each call blocked until ready)."""
    jax.block_until_ready(fn(x))  # compile + warm
    t0 = time.perf_counter()
    jax.block_until_ready(fn(x))
    one = max(time.perf_counter() - t0, 1e-7)
    reps = int(min(max_reps, max(3, min_time / one / repeats)))
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(reps):
            out = fn(x)
        jax.block_until_ready(out)
        samples.append((time.perf_counter() - t0) / reps)
    return statistics.median(samples)


def latency_table(sizes):
    k = make_kernel("bench_dispatch_affine", affine)
    kp = make_kernel("bench_dispatch_affine_par", affine_parallel)

    def host(x):
        x = np.asarray(x)  # the callback gets a read-only buffer
        out = np.empty_like(x)
        affine(x, out)
        return out

    routes = {
        "numba (primforge FFI)": jax.jit(
            lambda x: k(x, outs=jax.ShapeDtypeStruct(x.shape, x.dtype))),
        "jax.numpy": jax.jit(lambda x: 2.0 * x + 1.0),
        "pure_callback + njit": jax.jit(
            lambda x: jax.pure_callback(host, jax.ShapeDtypeStruct(x.shape, x.dtype), x)
        ),
        "numba parallel=True": jax.jit(
            lambda x: kp(x, outs=jax.ShapeDtypeStruct(x.shape, x.dtype))),
    }
    rows = []
    for n in sizes:
        x = jnp.linspace(-1, 1, n, dtype=jnp.float32)
        row = {"n": n}
        for name, fn in routes.items():
            row[name] = timeit(fn, x, min_time=0.3 if n < 10**6 else 1.0)
        rows.append(row)
    return rows


def vmap_table(batch=64, n=1000):
    native = make_kernel("bench_dispatch_vmap_native", affine)
    general = make_kernel("bench_dispatch_vmap_general", affine, general=True)
    o = jax.ShapeDtypeStruct((n,), jnp.float32)
    fns = {
        "numba, native vmap": jax.jit(jax.vmap(lambda x: native(x, outs=o))),
        "numba, general (scan) vmap": jax.jit(jax.vmap(lambda x: general(x, outs=o))),
        "jax.numpy vmap": jax.jit(jax.vmap(lambda x: 2.0 * x + 1.0)),
    }
    xs = jnp.ones((batch, n), jnp.float32)
    return {name: timeit(fn, xs) for name, fn in fns.items()}


_FIRST_CALL = textwrap.dedent(
    """
    import time
    t0 = time.perf_counter()
    import jax, jax.numpy as jnp, numba, primforge
    @numba.njit(cache=True)
    def affine_cached(x, out):
        for i in range(x.size):
            out[i] = 2.0 * x[i] + 1.0
    k = primforge.XLACustomKernel("first_call")
    k.def_numba_kernel(lambda **kw: affine_cached)
    x = jnp.ones(1000, jnp.float32)
    t1 = time.perf_counter()
    jax.block_until_ready(k(x, outs=jax.ShapeDtypeStruct(x.shape, x.dtype)))
    print(time.perf_counter() - t1)
    """
)


def first_call_times():
    with tempfile.TemporaryDirectory() as cache:
        script = pathlib.Path(cache) / "first_call.py"  # a real file, so numba can cache it
        script.write_text(_FIRST_CALL)
        env = {**os.environ, "PRIMFORGE_CACHE_DIR": cache, "NUMBA_CACHE_DIR": cache}
        times = []
        for _ in range(2):
            out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                                 text=True, check=True)
            times.append(float(out.stdout.strip().splitlines()[-1]))
    return {"cold cache": times[0], "warm cache": times[1]}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="skip n = 1e7")
    ap.add_argument("--json", default=str(RESULTS / "dispatch.json"))
    args = ap.parse_args(argv)
    sizes = [8, 1000, 100_000] + ([] if args.quick else [10_000_000])

    lat = latency_table(sizes)
    cols = [c for c in lat[0] if c != "n"]
    print("\nPer-call latency under jax.jit, y = 2x + 1 float32 (median, microseconds)")
    print(f"{'n':>10} | " + " | ".join(f"{c:>22}" for c in cols) + " | numba/jnp")
    for row in lat:
        ratio = row["numba (primforge FFI)"] / row["jax.numpy"]
        print(f"{row['n']:>10} | " + " | ".join(f"{row[c] * 1e6:>22.2f}" for c in cols)
              + f" | {ratio:>8.2f}x")

    vm = vmap_table()
    base = vm["jax.numpy vmap"]
    print("\nvmap over a 64 x 1000 batch (median, microseconds; ratio vs jax.numpy)")
    for name, t in vm.items():
        print(f"{name:>28} | {t * 1e6:>10.2f} | {t / base:>6.2f}x")

    first = first_call_times()
    print("\nFirst call in a fresh process (compile + run, seconds)")
    for name, t in first.items():
        print(f"{name:>28} | {t:>8.3f}")

    payload = {
        "jax": jax.__version__, "numba": numba.__version__, "device": str(jax.devices()[0]),
        "latency_seconds": lat, "vmap_64x1000_seconds": vm, "first_call_seconds": first,
    }
    path = pathlib.Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2))
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
