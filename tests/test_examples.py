"""The README's demo and the examples run and agree with jax.numpy."""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_quickstart_runs_and_matches_jax_numpy():
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "quickstart.py")],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert "all results match jax.numpy" in out.stdout
    assert "made 1 kernel call" in out.stdout


def test_readme_commands_match_ci():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    test_cmd = ('python -m pip install -e ".[test,gpu-compile]" && '
                "JAX_PLATFORMS=cpu python -m pytest -n auto")
    assert test_cmd in readme.split("## What it looks like")[0]
    assert ci.rstrip().splitlines()[-1] == test_cmd  # CI's last command is the README's
