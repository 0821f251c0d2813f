"""Benchmark hooks of the ops kernels: call function, benchmark data, what `primforge check`
compares."""

import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

from primforge import ops, registry
from primforge.bench import BenchmarkMismatchWarning
from primforge.ops._operator import forms_of
from primforge.ops.csr.packed import binary_csrmv_packed_p as PACKED

KERNELS = {
    # kernel -> (binary events, matrix input)
    ops.csrmv_p: (False, False),
    ops.binary_csrmv_p: (True, False),
    ops.csrmm_p: (False, True),
    ops.binary_csrmm_p: (True, True),
}


def dense_reference(cfg, binary):
    """``W @ x`` (or ``W.T @ x``) in plain NumPy from a config's CSR arrays."""
    data, indices, indptr, x = (np.asarray(a) for a in cfg.args)
    m, n = cfg.kwargs["shape"]
    w = np.zeros((m, n), np.float64)
    rows = np.repeat(np.arange(m), np.diff(indptr))
    vals = np.broadcast_to(data.astype(np.float64), indices.shape)
    np.add.at(w, (rows, indices), vals)
    xf = (x != 0).astype(np.float64) if binary else x.astype(np.float64)
    return (w.T if cfg.kwargs["transpose"] else w) @ xf


@pytest.mark.parametrize("kernel", list(KERNELS), ids=lambda k: k.name)
def test_benchmark_data_is_small_deterministic_and_correct(kernel):
    binary, matrix = KERNELS[kernel]
    configs = kernel._benchmark_data_fn(platform="cpu")
    again = kernel._benchmark_data_fn(platform="cpu")
    assert {c.params["n"] for c in configs} == {200, 1000}
    assert {c.params["transpose"] for c in configs} == {False, True}
    assert {c.params["weight"] for c in configs} == {"shared", "per-synapse"}
    for cfg, cfg2 in zip(configs, again, strict=True):
        assert cfg.name == cfg2.name
        for a, b in zip(cfg.args, cfg2.args, strict=True):
            np.testing.assert_array_equal(a, b)
        assert cfg.params["p"] == 0.05 and cfg.params["rate"] == 0.05
        n = cfg.params["n"]
        data, indices, indptr, x = cfg.args
        assert data.shape == ((1,) if cfg.params["weight"] == "shared" else indices.shape)
        assert indptr.shape == (n + 1,) and indptr[-1] == indices.size
        assert x.dtype == (np.bool_ if binary else np.float32)
        assert x.ndim == (2 if matrix else 1) and x.shape[0] == n
        assert abs(indices.size / n**2 - 0.05) < 0.01  # connection probability
        assert 0 < np.count_nonzero(x) / x.size < 0.1  # event rate
        # The call function is the public product: check it against dense NumPy (numba
        # here; the benchmark test below checks that 'jax' agrees with numba).
        got = kernel.call(*cfg.args, **cfg.kwargs, backend="numba")
        np.testing.assert_allclose(np.asarray(got), dense_reference(cfg, binary),
                                   rtol=1e-4, atol=1e-4, err_msg=cfg.name)


# A sweep like `primforge check`; the default tier checks each backend of these products
# against dense NumPy (tests/test_ops_csr*.py) and the call on this data just above.
@pytest.mark.exhaustive
@pytest.mark.parametrize("kernel", list(KERNELS), ids=lambda k: k.name)
def test_benchmark_runs_every_backend_and_agrees(kernel):
    result = kernel.benchmark(platform="cpu", n_warmup=1, n_runs=2)
    records = list(result.records)
    n_configs = len(kernel._benchmark_data_fn(platform="cpu"))
    # jax, numba (serial and opt-in parallel), and the CPU twins of the GPU kernels.
    backends = kernel.available_backends("cpu")
    assert set(backends) == {"jax", "numba", "numba_parallel", "cuda_raw", "pallas"}
    assert len(records) == len(backends) * n_configs
    for backend in backends:
        mine = [r for r in records if r.backend == backend]
        assert len(mine) == n_configs
        for r in mine:
            assert r.success, (r.config, backend, r.error)
            assert r.mismatch is None, (r.config, backend, r.mismatch)
            assert r.ok


def test_cli_finds_the_ops_kernels_in_a_fresh_process():
    # A fresh interpreter, no --import: the command registers primforge.ops by itself, every
    # family of it with its tags.
    import json

    env = {k: v for k, v in os.environ.items() if k != "PRIMFORGE_AUTOTUNE"}
    env.update(JAX_PLATFORMS="cpu")
    proc = subprocess.run(
        [sys.executable, "-m", "primforge", "list", "--json"],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    listed = {k["name"]: set(k["tags"]) for k in json.loads(proc.stdout)
              if k["name"].startswith("primforge.ops.")}
    kernels = [k for k in registry.list_kernels() if k.name.startswith("primforge.ops.")]
    assert listed == {k.name: set(k.tags) for k in kernels}, listed
    # one kernel for CSR: the four products, the packed and the spike-list forms its forms
    csr = {name for name, tags in listed.items() if "csr" in tags}
    assert csr == {"primforge.ops.csr"}, csr
    forms = {f.name for f in forms_of(registry.get_kernel("primforge.ops.csr"))}
    assert forms == {kernel.name for kernel in KERNELS} | {PACKED.name} | {
        "primforge.ops.binary_csrmv_spikes", "primforge.ops.binary_csrmm_spikes"}, forms


# --- Every backend of every ops kernel against the jax reference on its benchmark cases ---
# This is what ``primforge check`` runs. Tests of each family already run some (kernel,
# backend) pairs on every benchmark case against 'jax' (or NumPy); the sweep below runs all
# the others, so each pair runs once in CI. A kernel added to primforge.ops joins the
# sweep by itself.
OPS_KERNELS = sorted((f for k in registry.list_kernels() if k.name.startswith("primforge.ops.")
                      for f in forms_of(k)), key=lambda k: k.name)
_CSR = ("numba", "numba_parallel", "cuda_raw", "pallas")
#: kernel (short name) -> (backends run on every benchmark case against 'jax', by the test)
CHECKED_ELSEWHERE = {
    **{k.name.removeprefix("primforge.ops."): (
        _CSR, "test_ops_bench.py::test_benchmark_runs_every_backend_and_agrees")
       for k in KERNELS},
    **{name: (("numba",),
              "test_ops_jitconn.py::test_benchmark_data_runs_and_matches_sampled_rows")
       for name in ("jitc_matvec", "binary_jitc_matvec", "jitc_matmat", "binary_jitc_matmat")},
    # against NumPy, which the 'jax' backend matches too
    "csr_weight_grad": (("numba", "numba_parallel"),
                        "test_ops_grad_kernels.py::test_csr_benchmark_cases_match_numpy"),
    "fixed_num_weight_grad": (
        ("numba", "numba_parallel"),
        "test_ops_grad_kernels.py::test_fixed_number_benchmark_cases_match_numpy"),
    # the command itself, end to end, on one family
    **{name: (("numba",), "test_ops_delay.py::test_cli_check_passes_for_the_delay_kernels")
       for name in ("delayed_csrmv", "binary_delayed_csrmv", "binary_delayed_jitc_matvec",
                    "delay_read")},
}


def _short(kernel):
    return kernel.name.removeprefix("primforge.ops.")


def _unchecked(kernel):
    covered = CHECKED_ELSEWHERE.get(_short(kernel), ((), None))[0]
    return [b for b in kernel.available_backends("cpu") if b not in ("jax", *covered)]


SWEEP = [k for k in OPS_KERNELS if _unchecked(k)]


def test_the_sweep_and_the_family_tests_cover_every_backend_of_every_ops_kernel():
    assert len(OPS_KERNELS) >= 30 and all(k.has_benchmark_data() for k in OPS_KERNELS)
    names = {_short(k): k for k in OPS_KERNELS}
    for name, (backends, test) in CHECKED_ELSEWHERE.items():
        assert name in names, (name, test)  # no stale entry
        assert set(backends) <= set(names[name].available_backends("cpu")), (name, backends)
        assert "jax" not in backends
    # the kernels no family test covers on every backend, and what the sweep runs for them
    assert {_short(k): _unchecked(k) for k in SWEEP} == {
        "binary_csrmv_packed": ["numba"], "binary_fixed_num_mv_packed": ["numba"],
        "binary_csrmv_spikes": ["numba"], "binary_csrmm_spikes": ["numba"],
        "spike_list": ["numba"],
        "binary_fixed_num_mv_spikes": ["numba"], "binary_fixed_num_mm_spikes": ["numba"],
        "binary_densemv_spikes": ["numba"], "binary_densemm_spikes": ["numba"],
        "binary_jitc_mv_spikes": ["numba"], "binary_jitc_mm_spikes": ["numba"],
        "jitc_matvec": ["pallas"], "binary_jitc_matvec": ["pallas"],
        "jitc_matmat": ["pallas"], "binary_jitc_matmat": ["pallas"],
        "fixed_num_mv": ["numba", "pallas", "numba_parallel"],
        "binary_fixed_num_mv": ["numba", "pallas", "numba_parallel"],
        "fixed_num_mm": ["numba", "pallas", "numba_parallel"],
        "binary_fixed_num_mm": ["numba", "pallas", "numba_parallel"],
        "densemv": ["numba", "pallas"], "binary_densemv": ["numba", "pallas"],
        "densemm": ["numba", "pallas"], "binary_densemm": ["numba", "pallas"],
        "compressed_update": ["numba", "pallas"], "dense_update": ["numba"],
    }


@pytest.mark.exhaustive
@pytest.mark.parametrize("kernel", SWEEP, ids=_short)
def test_benchmark_cases_agree_with_jax_on_the_other_backends(kernel):
    """``primforge check``'s comparison for the (kernel, backend) pairs of ``SWEEP``."""
    backends = _unchecked(kernel)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BenchmarkMismatchWarning)  # reported below
        result = kernel.benchmark(platform="cpu", n_warmup=0, n_runs=1, backends=backends)
    records = list(result.records)
    assert {r.backend for r in records} == set(backends)
    assert len(records) == len(backends) * len(kernel.benchmark_data(platform="cpu"))
    bad = [(r.config, r.backend, r.error, r.mismatch) for r in records if not r.ok]
    assert not bad, bad
    assert all(r.reference == "jax" and r.matches_reference for r in records)
