"""Sharded kernels with a sharding rule vs without one (XLA then gathers), 4 CPU devices.

Run: python benchmarks/sharding.py [--devices 4] [--repeats 30]

Simulates the devices with XLA_FLAGS (set before JAX starts), runs each kernel under
``jax.jit`` on row-sharded inputs, and reports the median wall time per call and whether
the compiled HLO contains an all-gather. Prints a Markdown table and writes
benchmarks/results/sharding.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "")
        + f" --xla_force_host_platform_device_count={args.devices}"
    )
    sys.path.insert(0, str(ROOT / "tests" / "sharding_scripts"))
    import _hooks  # installs the kernel.py sharding hooks if kernel.py lacks them
    import jax
    import kernels
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    _hooks.install()
    n_dev = jax.device_count()
    mesh = jax.make_mesh((n_dev,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))
    rows = NamedSharding(mesh, P("x"))
    rng = np.random.default_rng(0)

    def timeit(f, *xs):
        jax.block_until_ready(f(*xs))
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            jax.block_until_ready(f(*xs))
            times.append(time.perf_counter() - t0)
        return statistics.median(times) * 1e6

    def gathers(f, *xs):
        return "all-gather" in f.lower(*xs).compile().as_text()

    records = []

    ew_rule = kernels.affine("bench_ew_rule", "numba", rule="elementwise")
    ew_none = kernels.affine("bench_ew_none", "numba", rule=None)
    for n in (2**16, 2**20, 2**22):
        x_np = rng.standard_normal((n_dev * 8, n // (n_dev * 8))).astype(np.float32)
        x = jax.device_put(x_np, rows)
        for label, k in (("rule", ew_rule), ("no rule", ew_none)):
            f = jax.jit(lambda x, k=k: k(x, outs=jax.ShapeDtypeStruct(x.shape, x.dtype)))
            np.testing.assert_allclose(np.asarray(f(x)), 2 * x_np + 1, rtol=1e-6)
            records.append({"kernel": "elementwise 2x+1 (numba)", "size": n, "variant": label,
                            "median_us": timeit(f, x), "all_gather": gathers(f, x)})

    csr = kernels.blocked_csr_matvec("bench_csr_rule")
    csr_none = kernels.blocked_csr_matvec("bench_csr_none")
    csr_none.def_sharding_rule(None)
    for rows_per_block, n_cols in ((256, 4096), (2048, 16384)):
        ip, ix, d = kernels.random_blocked_csr(rng, n_blocks=n_dev, rows=rows_per_block,
                                               n_cols=n_cols, density=0.01)
        v_np = rng.standard_normal(n_cols).astype(np.float32)
        dense_ref = kernels.blocked_to_dense(ip, ix, d, n_cols=n_cols) @ v_np
        xs = (jax.device_put(ip, rows), jax.device_put(ix, rows), jax.device_put(d, rows),
              jax.device_put(v_np, NamedSharding(mesh, P())))
        for label, k in (("rule", csr), ("no rule", csr_none)):
            def mv(ip, ix, d, v, k=k):
                out = jax.ShapeDtypeStruct((ip.shape[0], ip.shape[1] - 1), d.dtype)
                return k(ip, ix, d, v, outs=[out])[0]

            f = jax.jit(mv)
            np.testing.assert_allclose(np.asarray(f(*xs)).reshape(-1), dense_ref,
                                       rtol=1e-4, atol=1e-4)
            records.append({"kernel": "blocked CSR matvec (jax)",
                            "size": int(n_dev * rows_per_block), "variant": label,
                            "median_us": timeit(f, *xs), "all_gather": gathers(f, *xs)})

    lines = ["| kernel | size | rule (µs) | no rule (µs) | speedup | all-gather rule / no rule |",
             "| --- | --- | --- | --- | --- | --- |"]
    keyed = {(r["kernel"], r["size"], r["variant"]): r for r in records}
    for kern, size in dict.fromkeys((r["kernel"], r["size"]) for r in records):
        a, b = keyed[(kern, size, "rule")], keyed[(kern, size, "no rule")]
        lines.append(f"| {kern} | {size} | {a['median_us']:.1f} | {b['median_us']:.1f} | "
                     f"{b['median_us'] / a['median_us']:.2f}x | "
                     f"{a['all_gather']} / {b['all_gather']} |")
    table = "\n".join(lines)
    print(f"{n_dev} simulated CPU devices, jax {jax.__version__}, median of {args.repeats}")
    print(table)
    out = ROOT / "benchmarks" / "results" / "sharding.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "devices": n_dev, "jax": jax.__version__, "machine": platform.platform(),
        "cpu_count": os.cpu_count(), "repeats": args.repeats, "records": records,
        "table": table,
    }, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
