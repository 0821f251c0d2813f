"""examples/coba.py, run as a script: its options, its printed summary and its plot.

The network, its steps and simulators are primforge.sim.coba's (tests/test_sim_coba.py
checks them against an independent NumPy simulation); here the script's command line.
"""

import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "coba.py"


def run(*args):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, str(SCRIPT), *args], check=False,
                          capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)


def test_command_line_prints_rates_and_writes_the_plot(tmp_path):
    png = tmp_path / "coba.png"
    out = run("--neurons", "400", "--prob", "0.2", "--duration", "0.02", "--fused", "--json",
              "--plot", str(png), "--xla-threads", "1")
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["neurons"] == 400 and summary["impl"] == "primforge fused"
    assert summary["rate_exc_hz"] >= 0 and summary["s_per_sim_s"] > 0
    assert png.stat().st_size > 1000


def test_command_line_prints_a_readable_summary_of_the_plain_run():
    out = run("--neurons", "400", "--prob", "0.2", "--duration", "0.02", "--conn", "jitc",
              "--seed", "3")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[0].startswith("COBA primforge plain (jitc): 400 neurons, ")
    assert lines[0].endswith(" synapses, 0.02 s simulated, seed 3")
    assert lines[1].startswith("  rates: E ") and lines[1].endswith(" Hz")
    assert lines[2].startswith("  wall time: ") and "s per simulated second" in lines[2]
    assert lines[3].startswith("  peak memory: ") and lines[3].endswith(" MiB")


def test_help_lists_every_option():
    out = run("--help")
    assert out.returncode == 0, out.stderr
    for option in ("--scale", "--conn", "--duration", "--seed", "--fused", "--backend",
                   "--steps-per-call", "--threads", "--thread-min-neurons", "--fixed-threads",
                   "--neurons", "--prob", "--plot", "--xla-threads", "--json"):
        assert option in out.stdout, option
