"""The fast CSR paths on awkward inputs, OpenMP's wait policy, and autotune's threaded pick.

* The gather kernels (``W @ x``, ``W @ X``; serial and threaded) and the weight gradient
  of ``W @ x`` copy the input into a float table with a zero clamp row, and ``W.T @ X``
  scatters column by column (threaded: columns over threads): checked against
  NumPy on empty rows, no events, all events, duplicate and unsorted column indices,
  int8/float32/bool events and int64 indices, and for NaN (never a wrapped-around read)
  on an int64 index that is out of range only above 32 bits.
* ``W.T @ X`` runs batch-major: under ``vmap`` and in ``x @ W`` with a matrix ``x`` the
  compiled program is the kernel's call alone, with no transpose or copy around it.
* The threaded backend sets ``OMP_WAIT_POLICY=PASSIVE`` unless the user set it.
* ``autotune.tune`` chooses between the serial and the threaded backend by the measured
  time (a fake timer decides), and only among the candidates it was given.
"""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from primforge import autotune, ops
from primforge.bench import _run as bench_run
from primforge.ops.csr import grad as _csr_grad

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
M, N, K = 7, 6, 3
FUNCS = {(False, False): ops.csrmv, (True, False): ops.binary_csrmv,
         (False, True): ops.csrmm, (True, True): ops.binary_csrmm}


def awkward_csr(rng, index_dtype=np.int32):
    """Rows 0 and 4 empty, row 3 full; duplicate and unsorted columns elsewhere."""
    cols = [[], [5, 0, 5], [2, 2, 2, 1], list(range(N))[::-1], [], [3, 0], [1, 4, 1]]
    indptr = np.cumsum([0] + [len(c) for c in cols]).astype(index_dtype)
    indices = np.array([j for c in cols for j in c], index_dtype)
    data = rng.normal(size=indices.size).astype(np.float32)
    return data, indices, indptr


def dense_of(data, indices, indptr, shape=(M, N)):
    """Duplicates add up, as in the products (np.add.at, independent of primforge)."""
    d = np.zeros(shape, np.float64)
    rows = np.repeat(np.arange(shape[0]), np.diff(indptr))
    np.add.at(d, (rows, indices), np.broadcast_to(data, indices.shape).astype(np.float64))
    return d


def events(rng, which, shape):
    """No event, every event, or about half of them."""
    if which == "none":
        return np.zeros(shape, bool)
    return np.ones(shape, bool) if which == "all" else rng.random(shape) < 0.5


CASES = list(itertools.product(["numba", "numba_parallel"], [False, True], [False, True],
                               [False, True], [False, True], ["none", "all", "some"]))


@pytest.mark.parametrize("backend,binary,matrix,homo,transpose,which", CASES)
def test_products_on_awkward_structures(backend, binary, matrix, homo, transpose, which):
    rng = np.random.default_rng(hash((backend, binary, matrix, homo, transpose, which)) % 2**32)
    data, indices, indptr = awkward_csr(rng)
    if homo:
        data = np.array([0.5], np.float32)
    want_w = dense_of(data, indices, indptr)
    if transpose:
        want_w = want_w.T
    shape = (want_w.shape[1], K) if matrix else (want_w.shape[1],)
    active = events(rng, which, shape)
    inputs = ([active, active.astype(np.int8), active.astype(np.float32) * 3]
              if binary else [np.where(active, rng.normal(size=shape), 0).astype(np.float32)])
    for x in inputs:
        want = want_w @ ((x != 0) if binary else x).astype(np.float64)
        got = FUNCS[(binary, matrix)](data, indices, indptr, x, shape=(M, N),
                                      transpose=transpose, backend=backend)
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


def _hlo_ops(f, *args):
    """The op names of the optimised HLO of ``jax.jit(f)`` (parameters and constants out)."""
    text = jax.jit(f).lower(*args).compile().as_text()
    entry = text[text.index("ENTRY"):]
    ops_ = re.findall(r"= [a-z0-9]+\[[^\]]*\](?:\{[^}]*\})? ([a-z-]+)\(", entry)
    return [o for o in ops_ if o not in ("parameter", "constant")]


@pytest.mark.parametrize("backend", ["numba", "numba_parallel"])
@pytest.mark.parametrize("binary", [False, True])
def test_scatter_of_a_batch_is_one_call_with_no_transpose(backend, binary):
    rng = np.random.default_rng(5)
    data, indices, indptr = awkward_csr(rng)
    W = ops.CSR(jnp.asarray(data), jnp.asarray(indices), jnp.asarray(indptr), shape=(M, N))
    active = rng.random((K, M)) < 0.5
    xs = jnp.asarray(active if binary else np.where(active, rng.normal(size=(K, M)), 0),
                     None if binary else jnp.float32)
    want = ((np.asarray(xs) != 0) if binary else np.asarray(xs)).astype(np.float64) @ \
        dense_of(data, indices, indptr)
    batched = lambda xs: jax.vmap(lambda x: W.rmatmul(x, backend=backend))(xs)
    matrix = lambda xs: W.rmatmul(xs, backend=backend)
    for f in (batched, matrix):
        np.testing.assert_allclose(np.asarray(jax.jit(f)(xs)), want, rtol=1e-5, atol=1e-5)
        assert _hlo_ops(f, xs) == ["custom-call"]


@pytest.mark.parametrize("backend", ["numba", "numba_parallel"])
@pytest.mark.parametrize("binary,matrix", list(itertools.product([False, True], repeat=2)))
def test_int64_indices_out_of_range_only_above_32_bits_poison(backend, binary, matrix):
    rng = np.random.default_rng(2)
    data, indices, indptr = awkward_csr(rng, np.int64)
    x = np.ones((N, K) if matrix else (N,), bool if binary else np.float32)
    f = FUNCS[(binary, matrix)]
    bad = indices.copy()
    bad[3] = 2**32 + 1  # 1 in its low 32 bits: a 32-bit compare would accept it
    with jax.enable_x64(True):  # keeps the index arrays int64
        good = f(data, indices, indptr, x, shape=(M, N), backend=backend)
        poisoned = f(data, bad, indptr, x, shape=(M, N), backend=backend)
    np.testing.assert_allclose(np.asarray(good), dense_of(data, indices, indptr) @ x.astype(
        np.float64), rtol=1e-5, atol=1e-5)
    assert np.all(np.isnan(np.asarray(poisoned)))


def _numpy_weight_grad(binary, matrix, ct, x, indices, indptr, transpose=False):
    ev = (x != 0).astype(np.float64) if binary else x.astype(np.float64)
    rows = np.repeat(np.arange(indptr.size - 1), np.diff(indptr))
    a, b = (ev[rows], ct[indices]) if transpose else (ct[rows], ev[indices])
    g = a.astype(np.float64) * b
    return g.sum(-1) if matrix else g


@pytest.mark.parametrize("backend,binary,matrix,transpose,which",
                         list(itertools.product(["numba", "numba_parallel"], [False, True],
                                                [False, True], [False, True],
                                                ["none", "all", "some"])))
def test_weight_grad_on_awkward_structures(backend, binary, matrix, transpose, which):
    rng = np.random.default_rng(hash((backend, binary, matrix, transpose, which)) % 2**32)
    _, indices, indptr = awkward_csr(rng)
    rows_in, rows_out = (M, N) if transpose else (N, M)
    shape = (rows_in, K) if matrix else (rows_in,)
    active = events(rng, which, shape)
    ct = rng.normal(size=(rows_out, K) if matrix else (rows_out,)).astype(np.float32)
    xs = ([active, active.astype(np.int8)] if binary
          else [np.where(active, rng.normal(size=shape), 0).astype(np.float32)])
    grad = lambda x, i: _csr_grad.weight_grad(binary, matrix, ct, x, i, indptr,
                                              transpose=transpose, dtype="float32",
                                              backend=backend)
    for x in xs:
        np.testing.assert_allclose(
            np.asarray(grad(x, indices)),
            _numpy_weight_grad(binary, matrix, ct, x, indices, indptr, transpose),
            rtol=1e-5, atol=1e-5)
    if transpose:
        return  # event-driven: checks only visited rows (tested with the products)
    for k, bad in ((0, -1), (5, N), (7, 2**31 - 1)):
        idx = indices.copy()
        idx[k] = bad
        assert np.all(np.isnan(np.asarray(grad(xs[0], idx)))), (k, bad)


@pytest.mark.parametrize("backend", ["numba", "numba_parallel"])
def test_grad_through_matmul_matches_dense(backend):
    rng = np.random.default_rng(9)
    data, indices, indptr = awkward_csr(rng)
    W = ops.CSR(jnp.asarray(data), jnp.asarray(indices), jnp.asarray(indptr), shape=(M, N))
    x = rng.random(N) < 0.5
    c = rng.normal(size=M).astype(np.float32)
    g = jax.jit(jax.grad(lambda w: jnp.sum(c * W.with_data(w).matmul(x, backend=backend))))
    want = _numpy_weight_grad(True, False, c, x, indices, indptr)
    np.testing.assert_allclose(np.asarray(g(W.data)), want, rtol=1e-5, atol=1e-6)


def _run(code, env):
    full = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    full.update(JAX_PLATFORMS="cpu", NUMBA_NUM_THREADS="2", NUMBA_THREADING_LAYER="omp",
                **env)
    full["PYTHONPATH"] = ROOT + os.pathsep + full.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-c", code], check=False, capture_output=True,
                          text=True, env=full, timeout=600, cwd=ROOT)


_POLICY = textwrap.dedent("""
    import os
    import numpy as np
    from primforge import ops
    W = ops.CSR.from_dense(np.eye(4, dtype=np.float32))
    y = W.matmul(np.arange(4, dtype=np.float32), backend="numba_parallel")
    assert np.allclose(np.asarray(y), np.arange(4)), y
    print("policy", os.environ.get("OMP_WAIT_POLICY"), os.environ.get("GOMP_SPINCOUNT"))
""")


# Each case is a fresh process; the default tier runs the library's choice and one of the
# environment's (the other two take the same path).
@pytest.mark.parametrize("preset,want", [
    ({}, "PASSIVE 10000"),  # spin briefly, then sleep
    ({"OMP_WAIT_POLICY": "ACTIVE"}, "ACTIVE None"),  # the environment's choice, as it is
    pytest.param({"OMP_WAIT_POLICY": "PASSIVE"}, "PASSIVE None", marks=pytest.mark.exhaustive),
    pytest.param({"GOMP_SPINCOUNT": "0"}, "PASSIVE 0", marks=pytest.mark.exhaustive),
])
def test_threaded_backend_makes_idle_openmp_workers_sleep_unless_told(preset, want):
    res = _run(_POLICY, preset)
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"policy {want}" in res.stdout, res.stdout


@pytest.fixture
def fake_times(monkeypatch, tmp_path):
    """Replace the measured run times with ``times[backend]`` (the kernels still run)."""
    monkeypatch.setattr(autotune, "_PENDING", {})
    monkeypatch.setattr(autotune, "_APPLIED", {})
    times: dict[str, float] = {}
    real = bench_run._measure

    def measure(runner, n_warmup, n_runs, n_batch):
        compile_time, measured, out = real(runner, n_warmup, n_runs, n_batch)
        fake = times.get(runner.backend, 1.0)
        return compile_time, tuple(fake for _ in measured), out

    monkeypatch.setattr(bench_run, "_measure", measure)
    return times


@pytest.mark.parametrize("faster", ["numba", "numba_parallel"])
def test_autotune_picks_serial_or_threaded_by_measured_time(fake_times, tmp_path, faster):
    kernel = ops.binary_csrmv_p
    slower = "numba" if faster == "numba_parallel" else "numba_parallel"
    fake_times.update({faster: 1e-4, slower: 2e-4, "jax": 1e-3})
    out = autotune.tune([kernel], platform="cpu", backends=["numba", "numba_parallel"],
                        n_warmup=1, n_runs=2, path=tmp_path / "a.json", apply=False)
    assert out[kernel.name]["backend"] == faster
    # Both candidates agreed with the reference on every benchmark config.
    recs = [r for r in out[kernel.name]["result"].records
            if r.backend in ("numba", "numba_parallel")]
    assert recs and all(r.ok and r.matches_reference for r in recs)


def test_autotune_never_picks_outside_its_candidates(fake_times, tmp_path):
    # The reference ('jax') is the fastest by the fake timer but is not a candidate.
    fake_times.update({"jax": 1e-6, "numba": 2e-4, "numba_parallel": 3e-4})
    out = autotune.tune([ops.csrmv_p], platform="cpu", backends=["numba", "numba_parallel"],
                        n_warmup=1, n_runs=2, path=tmp_path / "a.json", apply=False)
    assert out[ops.csrmv_p.name]["backend"] == "numba"


def test_autotune_drops_a_threaded_candidate_that_disagrees(fake_times, tmp_path,
                                                            monkeypatch):
    # A wrong threaded kernel that is fastest must lose to the correct serial one.
    from primforge.ops.csr import numba as _numba_csr

    real = _numba_csr.parallel_kernel

    def wrong(matrix, binary, transpose, homo, wide=False):
        fn = real(matrix, binary, transpose, homo, wide)
        import numba

        @numba.njit
        def off_by_one(data, indices, indptr, x, out):
            fn(data, indices, indptr, x, out)
            out[...] += 1.0

        return off_by_one

    monkeypatch.setattr(_numba_csr, "parallel_kernel", wrong)
    ops.csrmm_p.clear_cache()  # a threaded kernel built by an earlier test would hide the patch
    fake_times.update({"numba_parallel": 1e-6, "numba": 2e-4, "jax": 1e-3})
    try:
        out = autotune.tune([ops.csrmm_p], platform="cpu",
                            backends=["numba", "numba_parallel"], n_warmup=1, n_runs=2,
                            path=tmp_path / "a.json", apply=False)
    finally:
        monkeypatch.undo()
        ops.csrmm_p.clear_cache()  # nothing built from the wrong kernel outlives the test
    assert out[ops.csrmm_p.name]["backend"] == "numba"
