"""The benchmark step: contenders timed side by side in one process, interleaved.

Elementwise ``y = 2 x + 1``, the CSR event products and the COBA network of
:mod:`primforge.sim.coba`; rounds rotate through the contenders and report the median sample.
"""

from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import primforge
from primforge import ops
from primforge.backends import KNOWN_BACKENDS, get_backend
from tools.gpu_acceptance import _affine

#: Seconds per simulated second of brainevent's COBA example on an RTX A6000, per scale.
BRAINEVENT_A6000 = {1: 0.27, 10: 0.32, 100: 1.17}

SIZES = {
    "gpu": {"elementwise": 1 << 26, "csr_n": (10_000, 100_000), "csr_per_row": 100,
            "coba": ((1, 1.0), (10, 0.5), (100, 0.1))},
    "cpu": {"elementwise": 1 << 16, "csr_n": (1_000, 2_000), "csr_per_row": 20,
            "coba": ((1, 0.02),)},
}


def _usable(backend: str, platform: str) -> bool:
    return backend not in KNOWN_BACKENDS or get_backend(backend).is_available(platform)


def interleaved(fns: dict, *, rounds: int = 7, sample_s: float = 0.02) -> dict:
    """Median seconds per call of each compiled function, timed in rotating turns."""
    reps = {}
    for name, fn in fns.items():
        jax.block_until_ready(fn())
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        once = max(time.perf_counter() - t0, 1e-6)
        reps[name] = max(1, min(1000, int(sample_s / once)))
    samples: dict = {name: [] for name in fns}
    names = list(fns)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            fn, n = fns[name], reps[name]
            t0 = time.perf_counter()
            outs = [fn() for _ in range(n)]
            jax.block_until_ready(outs)
            samples[name].append((time.perf_counter() - t0) / n)
    return {name: statistics.median(s) for name, s in samples.items()}


def _compiled(fn, *args):
    exe = jax.jit(fn).trace(*args).lower().compile()
    return lambda: exe(*args)


def elementwise(emit, platform: str, backends: list[str] | None) -> None:
    n = SIZES[platform]["elementwise"]
    x = jnp.asarray(np.random.default_rng(0).standard_normal(n, dtype=np.float32))
    fns, errors = {"device copy": _compiled(jnp.copy, x),
                   "jnp 2x+1": _compiled(lambda v: 2 * v + 1, x)}, {}
    for b in _affine.BACKENDS[platform]:
        if (backends is not None and b not in backends) or not _usable(b, platform):
            continue
        try:
            fn = _compiled(lambda v, b=b: _affine.run_affine(platform, b, v), x)
            jax.block_until_ready(fn())
            fns[b] = fn
        except Exception as e:  # noqa: BLE001 - recorded, the others are timed
            errors[b] = f"{type(e).__name__}: {e}"[:800]
    times = interleaved(fns)
    for name, t in times.items():
        emit({"kind": "bench", "group": "elementwise", "case": f"n={n}", "contender": name,
              "time_s": t, "gbps": 8 * n / t / 1e9})
    for name, err in errors.items():
        emit({"kind": "bench", "group": "elementwise", "case": f"n={n}", "contender": name,
              "error": err})


def _bcoo(w, n):
    from jax.experimental import sparse

    indptr = np.asarray(w.indptr)
    rows = np.repeat(np.arange(n, dtype=np.int32), np.diff(indptr))
    idx = np.stack([rows, np.asarray(w.indices, np.int32)], axis=1)
    return sparse.BCOO((jnp.asarray(w.data), jnp.asarray(idx)), shape=(n, n))


def csr_products(emit, platform: str, backends: list[str] | None) -> None:
    sizes = SIZES[platform]
    contenders = [b for b in ops.binary_csrmv_p.available_backends(platform)
                  if _usable(b, platform) and (backends is None or b in backends or b == "jax")]
    for n in sizes["csr_n"]:
        per_row = sizes["csr_per_row"]
        w = ops.fixed_prob(n, n, per_row / n, weight=lambda rng, k: rng.standard_normal(
            k).astype(np.float32), seed=1)
        bcoo = _bcoo(w, n)
        for rate in (0.01, 0.1):
            events = jnp.asarray(np.random.default_rng(2).random(n) < rate)
            for transpose in (False, True):
                case = (f"n={n},nnz/row={per_row},events={rate:.0%},"
                        f"{'e @ W' if transpose else 'W @ e'}")
                fns, errors = {}, {}
                for b in contenders:
                    def prod(d, i, p, e, b=b, transpose=transpose, n=n):
                        return ops.binary_csrmv(d, i, p, e, shape=(n, n), transpose=transpose,
                                                backend=b)
                    try:
                        with primforge.use_backend(platform, b):
                            fns[b] = _compiled(prod, w.data, w.indices, w.indptr, events)
                            jax.block_until_ready(fns[b]())
                    except Exception as e:  # noqa: BLE001
                        fns.pop(b, None)
                        errors[b] = f"{type(e).__name__}: {e}"[:800]
                ef = events.astype(jnp.float32)
                fns["BCOO"] = _compiled((lambda m, v: v @ m) if transpose else
                                        (lambda m, v: m @ v), bcoo, ef)
                times = interleaved(fns)
                for name, t in times.items():
                    emit({"kind": "bench", "group": "csr", "case": case, "contender": name,
                          "time_s": t})
                for name, err in errors.items():
                    emit({"kind": "bench", "group": "csr", "case": case, "contender": name,
                          "error": err})


def coba(emit, platform: str, backends: list[str] | None) -> None:
    try:
        from primforge.sim import coba as coba_mod
    except Exception as e:  # noqa: BLE001
        emit({"kind": "bench", "group": "coba", "case": "-", "contender": "-",
              "error": f"{type(e).__name__}: {e}"})
        return
    for scale, duration in SIZES[platform]["coba"]:
        conn = "jitc" if scale >= 100 else "csr"
        kernel = ops.binary_jitc_matvec_p if conn == "jitc" else ops.binary_csrmv_p
        names = [b for b in kernel.available_backends(platform) if _usable(b, platform)
                 and (backends is None or b in backends or b == "jax")]
        net = coba_mod.scaled(scale, seed=0, conn=conn)
        for b in names:
            case = f"{scale}x ({coba_mod.N_BASE * scale} neurons, {conn}), {duration} s"
            record = {"kind": "bench", "group": "coba", "case": case, "contender": b,
                      "scale": scale, "anchor_s_per_sim_s": BRAINEVENT_A6000.get(scale)}
            try:
                with primforge.use_backend(platform, b):
                    r = coba_mod.simulate(net, duration)
                record.update(s_per_sim_s=r["s_per_sim_s"], compile_s=r["compile_s"],
                              rate_exc_hz=r["rate_exc_hz"], rate_inh_hz=r["rate_inh_hz"])
            except Exception as e:  # noqa: BLE001
                record["error"] = f"{type(e).__name__}: {e}"[:800]
            emit(record)


def run_all(emit, *, platform: str, backends: list[str] | None) -> None:
    """Each group in turn; a group that fails is recorded and the next one runs."""
    for group in (elementwise, csr_products, coba):
        try:
            group(emit, platform, backends)
        except Exception as e:  # noqa: BLE001
            emit({"kind": "bench", "group": group.__name__.split("_")[0], "case": "-",
                  "contender": "-",
                  "error": f"{type(e).__name__}: {e}"[:1500]})
