"""First-call latency of Numba CPU kernels, each measured in a fresh process.

Contenders: primforge (the ``primforge`` package importable from the current directory)
and brainevent (when installed; else a hand-written ``numba.cfunc`` + ``jax.ffi`` baseline
of the same kernels). Cases: a tiny elementwise kernel (``y = 2x + 1``) and an
event-driven CSR product (``events @ W``) from each library's operators.

* cold: empty cache folders (``PRIMFORGE_CACHE_DIR``, ``NUMBA_CACHE_DIR``, ``HOME`` and
  ``XDG_CACHE_HOME`` all point into a fresh temporary folder);
* warm: a second process with the same folders, after the cold one.

Each measurement is the wall time of the first call in a new interpreter (input
construction excluded, result ready included), after a trivial Numba compile and JAX
computation that both contenders would pay alike (Numba loads its registries on the first
compiles of a process; a library may trigger that at import); ``+import`` rows add the
time to import the library. Contenders are interleaved within
every repeat; the table gives medians. Usage::

    python benchmarks/first_call.py --repeats 5 --label after
    cd /path/to/other/checkout && python /path/to/benchmarks/first_call.py --label before
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

_CHILD = textwrap.dedent("""
    import json, sys, time
    import numpy as np
    import jax, jax.numpy as jnp
    import numba

    contender, case = sys.argv[1], sys.argv[2]

    # Numba loads most of its typing and lowering registries (and SciPy's BLAS) on the
    # first compiles in a process, whoever asks (a library may do it at import): do it
    # here, for both, outside the measurements, with an unrelated array loop.
    @numba.njit
    def _warm(a, b):
        for i in range(a.size):
            b[i] = a[i] + 1 if a[i] > 0 else 0
    _warm(np.ones(3, np.float64), np.ones(3, np.float64))
    jax.block_until_ready(jnp.ones(3) + 1)
    t_import = time.perf_counter()

    @numba.njit
    def affine(x, out):
        for i in range(x.size):
            out[i] = 2.0 * x[i] + 1.0

    def csr_arrays():
        rng = np.random.default_rng(0)
        n = 2000
        dense = rng.random((n, n)) < 0.02
        indptr = np.concatenate([[0], np.cumsum(dense.sum(1))]).astype(np.int32)
        indices = np.nonzero(dense)[1].astype(np.int32)
        data = np.full(indices.shape, 0.5, np.float32)
        events = rng.random(n) < 0.05
        return data, indices, indptr, events, (n, n)

    x = jnp.arange(1000, dtype=jnp.float32)
    spec = jax.ShapeDtypeStruct(x.shape, x.dtype)
    if contender == "primforge":
        import primforge
        if case == "tiny":
            from primforge.backends import numba as nb
            call = lambda: nb.numba_kernel(affine, spec)(x)
        else:
            from primforge.ops import CSR
            data, indices, indptr, events, shape = csr_arrays()
            W = CSR(jnp.asarray(data), jnp.asarray(indices), jnp.asarray(indptr), shape=shape)
            ev = jnp.asarray(events)
            call = lambda: ev @ W
    elif contender == "brainevent":
        import brainevent
        if case == "tiny":
            call = lambda: brainevent.numba_kernel(affine, spec)(x)
        else:
            data, indices, indptr, events, shape = csr_arrays()
            W = brainevent.CSR((jnp.asarray(data), jnp.asarray(indices), jnp.asarray(indptr)),
                               shape=shape)
            ev = jnp.asarray(events)
            call = lambda: ev @ W
    else:
        raise SystemExit(f"unknown contender {contender}")
    t0 = time.perf_counter()
    y = jax.block_until_ready(call())
    t1 = time.perf_counter()
    print(json.dumps({"ms": (t1 - t0) * 1e3, "import_ms": (t0 - t_import) * 1e3,
                      "checksum": float(np.asarray(y, np.float64).sum())}))
""")


def _available(module: str) -> bool:
    out = subprocess.run(
        [sys.executable, "-c", f"import {module}"], capture_output=True, check=False
    )
    return out.returncode == 0


def _run_child(script: str, contender: str, case: str, folder: str) -> dict:
    env = dict(os.environ)
    env.update(
        JAX_PLATFORMS="cpu",
        PRIMFORGE_CACHE_DIR=os.path.join(folder, "primforge"),
        NUMBA_CACHE_DIR=os.path.join(folder, "numba"),
        HOME=os.path.join(folder, "home"),
        XDG_CACHE_HOME=os.path.join(folder, "xdg"),
        PYTHONPATH=os.pathsep.join(p for p in (os.getcwd(), env.get("PYTHONPATH")) if p),
    )
    for sub in ("home", "xdg"):
        os.makedirs(os.path.join(folder, sub), exist_ok=True)
    out = subprocess.run(
        [sys.executable, script, contender, case],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=300,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{contender}/{case} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark; print a table; write JSON. Returns the result dictionary."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--cases", default="tiny,csr")
    p.add_argument("--label", default="current", help="name of this run in the JSON")
    p.add_argument("--json", default=None, help="output path (default benchmarks/results/)")
    args = p.parse_args(argv)

    contenders = ["primforge"]
    if _available("brainevent"):
        contenders.append("brainevent")
    else:
        print("brainevent is not installed: comparing primforge only", file=sys.stderr)
    cases = [c for c in args.cases.split(",") if c]
    samples: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="first-call-") as tmp:
        script = os.path.join(tmp, "child.py")
        with open(script, "w") as f:
            f.write(_CHILD)
        for rep in range(args.repeats):
            order = contenders if rep % 2 == 0 else contenders[::-1]
            for case in cases:
                for contender in order:
                    folder = tempfile.mkdtemp(dir=tmp)
                    for state in ("cold", "warm"):
                        res = _run_child(script, contender, case, folder)
                        key = f"{case}/{state}/{contender}"
                        samples.setdefault(key, []).append(res["ms"])
                        total = res["ms"] + res["import_ms"]
                        samples.setdefault(f"{case}/{state}+import/{contender}", []).append(total)
            print(f"repeat {rep + 1}/{args.repeats} done", file=sys.stderr)

    medians = {k: statistics.median(v) for k, v in samples.items()}
    print(f"\nfirst call, median of {args.repeats} fresh processes (ms), label {args.label!r}")
    header = f"{'case':<6} {'state':<11} " + " ".join(f"{c:>11}" for c in contenders)
    if len(contenders) > 1:
        header += "   ratio"
    print(header)
    for case in cases:
        for state in ("cold", "warm", "cold+import", "warm+import"):
            row = [medians[f"{case}/{state}/{c}"] for c in contenders]
            line = f"{case:<6} {state:<11} " + " ".join(f"{v:11.1f}" for v in row)
            if len(row) > 1:
                line += f"   {row[0] / row[1]:5.2f}x"
            print(line)
    result = {
        "label": args.label,
        "cwd": os.getcwd(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "repeats": args.repeats,
        "contenders": contenders,
        "medians_ms": medians,
        "samples_ms": samples,
    }
    path = args.json or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "results", f"first_call_{args.label}.json"
    )
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(result, f, indent=2)
    print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
