"""Benchmark hooks of the ops kernels: call function, benchmark data, `primforge check`."""

import os
import subprocess
import sys

import numpy as np
import pytest

from primforge import ops
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
    # A fresh interpreter, no --import: the command registers primforge.ops by itself.
    import json

    env = {k: v for k, v in os.environ.items() if k != "PRIMFORGE_AUTOTUNE"}
    env.update(JAX_PLATFORMS="cpu")
    proc = subprocess.run(
        [sys.executable, "-m", "primforge", "list", "--json", "--tags", "csr"],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    listed = {k["name"] for k in json.loads(proc.stdout)}
    # the four products and the vector product reading packed events
    assert listed == {kernel.name for kernel in KERNELS} | {PACKED.name}, listed


def test_cli_check_passes_for_the_ops_kernels(capsys, monkeypatch):
    # In this process: no second interpreter importing JAX and compiling the Numba kernels
    # again (discovery by a fresh process is the test above). No stored autotune choices
    # are applied (PRIMFORGE_AUTOTUNE unset) and `check` writes none.
    from primforge.cli import main

    monkeypatch.delenv("PRIMFORGE_AUTOTUNE", raising=False)
    code = main(["check", "--tags", "csr", "--platform", "cpu"])
    out = capsys.readouterr().out
    assert code == 0, out
    for kernel in KERNELS:
        assert f"PASS  {kernel.name}: 5 backend(s) x 4 config(s) against jax" in out, out
    assert f"PASS  {PACKED.name}: 2 backend(s) x 4 config(s) against jax" in out, out
    assert "5 of 5 kernel(s) passed on cpu" in out, out
