"""Every family of primforge.ops that splits across devices, run across 2 processes.

The script (sharding_scripts/ops_processes.py) checks each process's shards against NumPy
and the one-device call, and that no compiled program gathers a matrix array. As one
process of 4 devices it runs in the ops-sharding script's process (tests/test_ops_sharding.py).
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
#: What would make a script join other processes (primforge.distributed.initialize).
MULTIPROCESS_VARIABLES = ("JAX_COORDINATOR_ADDRESS", "PRIMFORGE_NUM_PROCESSES",
                          "PRIMFORGE_PROCESS_ID", "SLURM_JOB_ID", "OMPI_COMM_WORLD_SIZE")
_CLEAR = ("XLA_FLAGS", *MULTIPROCESS_VARIABLES)


def _env(**extra):
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT), **extra)
    for name in _CLEAR:
        if name not in extra:
            env.pop(name, None)
    return env


def line(rank, n):
    """What the script prints in process ``rank`` of ``n`` when every check passed."""
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
        assert line(rank, 2) in text, text[-4000:]
