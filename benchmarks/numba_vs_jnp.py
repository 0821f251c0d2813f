"""When a Numba CPU kernel pays off against plain ``jax.numpy``.

Three kinds of work, each timed as a jitted function on the CPU, median of ``--runs`` runs
after warm-up (compilation excluded), result ready included; the two contenders of a case
alternate run by run:

* softmax over the last axis: a naive two-pass Numba kernel (registered on an
  ``XLACustomKernel``) against ``jax.nn.softmax``. Dense, regular, vectorisable work that
  XLA fuses well;
* segment sum (``out[s] += x[i]`` for sorted segment ids): a Numba loop against
  ``jax.ops.segment_sum``. Scatter-shaped work;
* an event-driven product ``events @ W`` with a sparse ``W`` (CSR) and 1% of the events
  active: ``primforge.ops.binary_csrmv(..., transpose=True)`` on its ``numba`` backend
  (visits only the rows of active events) against the same operator on its ``jax``
  backend (every stored entry, masked).

Usage::

    python benchmarks/numba_vs_jnp.py --runs 20 --out numba_vs_jnp.json

Prints one table row per case (times in microseconds, ``speedup`` = jnp time / Numba
time: above 1 the Numba kernel is faster) and writes the rows, the machine and the
versions as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import jax
import jax.numpy as jnp
import numba
import numpy as np

import primforge
from primforge import ops


@numba.njit
def _softmax_rows(x, out):
    for i in range(x.shape[0]):
        m = x[i, 0]
        for j in range(1, x.shape[1]):
            m = max(m, x[i, j])
        s = 0.0
        for j in range(x.shape[1]):
            e = np.exp(x[i, j] - m)
            out[i, j] = e
            s += e
        for j in range(x.shape[1]):
            out[i, j] /= s


@numba.njit
def _segment_sum(x, seg, out):
    out[:] = 0  # output buffers arrive uninitialised
    for i in range(x.size):
        out[seg[i]] += x[i]


def _kernels():
    softmax = primforge.XLACustomKernel("bench_numba_softmax", replace=True)
    softmax.def_kernel("numba", "cpu", lambda **kw: _softmax_rows)
    segsum = primforge.XLACustomKernel("bench_numba_segment_sum", replace=True)
    segsum.def_kernel("numba", "cpu", lambda **kw: _segment_sum)
    return softmax, segsum


def _time_pair(fns, args, runs: int) -> list[float]:
    """Median seconds of each ``fn(*args)`` over ``runs`` runs, after two warm-up calls.

    The functions alternate run by run, so a busy machine slows both alike.
    """
    for fn in fns:
        for _ in range(2):
            jax.block_until_ready(fn(*args))
    times: list[list[float]] = [[] for _ in fns]
    for r in range(runs):
        order = range(len(fns)) if r % 2 == 0 else reversed(range(len(fns)))
        for k in order:
            t0 = time.perf_counter()
            jax.block_until_ready(fns[k](*args))
            times[k].append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times]


def _cases(rng):
    softmax, segsum = _kernels()
    for rows, cols in [(256, 64), (4096, 256), (16384, 512)]:
        x = jnp.asarray(rng.normal(size=(rows, cols)).astype(np.float32))
        spec = jax.ShapeDtypeStruct(x.shape, x.dtype)
        yield (f"softmax {rows}x{cols}", jax.jit(lambda x, spec=spec: softmax(x, outs=spec)),
               jax.jit(lambda x: jax.nn.softmax(x, axis=-1)), (x,))
    for n, segments in [(10_000, 100), (1_000_000, 1_000), (1_000_000, 100_000)]:
        x = jnp.asarray(rng.normal(size=n).astype(np.float32))
        seg = jnp.asarray(np.sort(rng.integers(0, segments, n)).astype(np.int32))
        spec = jax.ShapeDtypeStruct((segments,), jnp.float32)
        yield (f"segment sum n={n} segments={segments}",
               jax.jit(lambda x, s, spec=spec: segsum(x, s, outs=spec)),
               jax.jit(lambda x, s, k=segments: jax.ops.segment_sum(
                   x, s, k, indices_are_sorted=True)),
               (x, seg))
    for n, per_row in [(1_000, 100), (10_000, 100)]:
        indptr = np.arange(n + 1, dtype=np.int32) * per_row
        indices = rng.integers(0, n, n * per_row).astype(np.int32)
        data = rng.normal(size=n * per_row).astype(np.float32)
        events = rng.random(n) < 0.01
        csr = (jnp.asarray(data), jnp.asarray(indices), jnp.asarray(indptr))

        def product(backend, n=n):  # the arrays are arguments, not constants to fold
            return jax.jit(lambda d, i, p, e: ops.binary_csrmv(
                d, i, p, e, shape=(n, n), transpose=True, backend=backend))

        yield (f"events @ W n={n} {per_row}/row 1% active", product("numba"), product("jax"),
               (*csr, jnp.asarray(events)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20, help="timed runs per case (20)")
    parser.add_argument("--out", default="numba_vs_jnp.json", help="JSON file to write")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    rows = []
    print(f"{'case':44} {'numba us':>10} {'jnp us':>10} {'speedup':>8}")
    for name, numba_fn, jnp_fn, inputs in _cases(rng):
        np.testing.assert_allclose(np.asarray(numba_fn(*inputs)), np.asarray(jnp_fn(*inputs)),
                                   rtol=1e-3, atol=1e-3, err_msg=name)
        t_numba, t_jnp = _time_pair((numba_fn, jnp_fn), inputs, args.runs)
        rows.append({"case": name, "numba_s": t_numba, "jnp_s": t_jnp,
                     "speedup": t_jnp / t_numba})
        print(f"{name:44} {t_numba * 1e6:10.1f} {t_jnp * 1e6:10.1f} {t_jnp / t_numba:8.2f}")
    meta = {"machine": platform.machine(), "processor": platform.processor(),
            "cpus": os.cpu_count(), "load_average": os.getloadavg(),
            "python": platform.python_version(),
            "jax": jax.__version__, "numba": numba.__version__,
            "primforge": primforge.__version__, "runs": args.runs}
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
