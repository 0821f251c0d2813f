"""Every family of primforge.ops that splits across devices, run across 2 processes.

The script (sharding_scripts/ops_processes.py) checks each process's shards against NumPy
and the one-device call, and that no compiled program gathers a matrix array.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "sharding_scripts" / "ops_processes.py"
N_CHECKS = 18  # the checks the script makes in each process
_CLEAR = ("XLA_FLAGS", "JAX_COORDINATOR_ADDRESS", "PRIMFORGE_NUM_PROCESSES",
          "PRIMFORGE_PROCESS_ID", "SLURM_JOB_ID", "OMPI_COMM_WORLD_SIZE")


def _env(**extra):
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT), **extra)
    for name in _CLEAR:
        if name not in extra:
            env.pop(name, None)
    return env


def _line(rank, n):
    return (f"process {rank} of {n}: {N_CHECKS} checks match NumPy and one device; "
            f"no matrix array gathered")


@pytest.mark.exhaustive  # the default tier runs two processes in test_ops_csr_blocks.py
def test_every_split_family_on_two_processes_of_two_devices():
    """CSR row blocks (W @ x, x @ W, both plasticity updates, grad, vmap), fixed number
    (A @ x, A.T @ x, grad, vmap, plasticity), dense events and plasticity, and a user
    kernel with its own rule, on one mesh over 2 processes x 2 CPU devices. Bounded: the
    launcher stops both processes at its timeout, and fails when one fails."""
    argv = [sys.executable, "-m", "primforge.distributed", "-n", "2", "--devices-per-process",
            "2", "--timeout", "120", str(SCRIPT)]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=180, cwd=ROOT,
                         env=_env(), check=False)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-4000:]
    for rank in (0, 1):
        assert _line(rank, 2) in text, text[-4000:]


@pytest.mark.exhaustive
def test_every_split_family_on_one_process_of_four_devices():
    """The same script as one process of 4 simulated CPU devices."""
    env = _env(XLA_FLAGS="--xla_force_host_platform_device_count=4")
    out = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True,
                         timeout=300, cwd=ROOT, env=env, check=False)
    assert out.returncode == 0 and _line(0, 1) in out.stdout, (out.stdout + out.stderr)[-4000:]
