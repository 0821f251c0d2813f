"""examples/coba_distributed.py: COBA split by neurons over 2 processes x 2 devices gives
the spike trains of one process, bit for bit.

The reference is examples/coba.py's plain step (the whole network on one device, the
jitc product over every column, no collective), which the example runs in each process
with ``--check`` and compares with the distributed run: every step's spikes of every
neuron and the final potentials of the process's own neurons.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "coba_distributed.py"
LIMIT = 150  # seconds: a bound far above what the run takes


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["JAX_PLATFORMS"] = "cpu"
    env.pop("XLA_FLAGS", None)
    for name in ("JAX_COORDINATOR_ADDRESS", "PRIMFORGE_NUM_PROCESSES", "PRIMFORGE_PROCESS_ID",
                 "SLURM_JOB_ID", "OMPI_COMM_WORLD_SIZE"):
        env.pop(name, None)
    return env


def test_two_processes_give_the_spike_trains_of_one(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "primforge.distributed", "-n", "2", "--devices-per-process",
         "2", "--timeout", str(LIMIT), str(EXAMPLE), "--duration", "0.01", "--check",
         "--json"], cwd=tmp_path, env=_env(), capture_output=True, text=True,
        timeout=LIMIT + 30, check=False)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    runs = {}
    for line in r.stdout.splitlines():
        rank, _, rest = line.partition("] ")
        if rest.startswith("{"):
            runs[int(rank.strip("["))] = json.loads(rest)
    assert sorted(runs) == [0, 1], r.stdout[-3000:]
    for rank, run in runs.items():
        assert (run["process"], run["processes"], run["devices"]) == (rank, 2, 4)
        assert run["check"] == "same spike trains and potentials as one process"
        assert run["bytes_per_step"] == 4 * 1024 // 8  # 4 blocks of 1024 neurons, 1 bit each
    assert runs[0]["spikes"] == runs[1]["spikes"] and min(runs[0]["spikes"]) > 0
