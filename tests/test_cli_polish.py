"""The `primforge` command as a user meets it: --import of a module in the current folder or
of a file, --stat checked before anything runs and followed by the table, progress lines,
autotune --show with every stored choice, and the PNG plot.

Expected values are computed here, independently: statistics with NumPy from the raw
times the command saves, stored choices from what the test itself wrote.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from primforge import autotune
from primforge.bench import STATS
from primforge.cli import _STATS, main

REPO = Path(__file__).resolve().parents[1]

# A kernel module written into a temporary folder. Its benchmark data function leaves a
# file behind, so a test can tell whether anything was benchmarked.
KERNELS = textwrap.dedent(
    """
    import os
    import jax, jax.numpy as jnp
    import primforge
    from primforge.bench import BenchmarkConfig
    from {helper} import HELPER_VALUE

    k = primforge.XLACustomKernel("{name}", "Doubles.", replace=True)
    k.def_kernel("jax", "cpu", lambda **kw: lambda x: 2 * x)
    k.def_kernel("alt", "cpu", lambda **kw: lambda x: x + x)
    k.def_tags("{name}_tag")
    k.def_call(lambda x, backend=None: k(
        x, outs=jax.ShapeDtypeStruct(x.shape, x.dtype), backend=backend))

    def _data(*, platform):
        with open(os.environ["PF_POLISH_MARKER"], "a") as f:
            f.write("ran\\n")
        return [BenchmarkConfig(args=(jnp.ones(n, jnp.float32),), n=n) for n in (8, 64)]

    k.def_benchmark_data(_data)
    """
)


def write_kernels(folder: Path, module: str, kernel: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    helper = f"{module}_helper"
    (folder / f"{helper}.py").write_text("HELPER_VALUE = 1\n")
    path = folder / f"{module}.py"
    path.write_text(KERNELS.format(name=kernel, helper=helper))
    return path


@pytest.fixture
def env(tmp_path, monkeypatch):
    """A private cache and a marker file; the module/kernel names are unique per test."""
    marker = tmp_path / "marker.txt"
    monkeypatch.setenv("PRIMFORGE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PF_POLISH_MARKER", str(marker))
    monkeypatch.delenv("PRIMFORGE_AUTOTUNE", raising=False)
    full = {k: v for k, v in os.environ.items() if k != "PRIMFORGE_AUTOTUNE"}
    full.update(PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu")
    return {"marker": marker, "env": full, "tmp": tmp_path}


def launcher(tmp: Path) -> Path:
    """A script in its own folder that runs the command, as the installed console script
    does: the folder of the script, not the current directory, is on sys.path."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "primforge_launcher.py"
    script.write_text("import sys\nfrom primforge.cli import main\nsys.exit(main())\n")
    return script


def command(env, *args, cwd):
    return subprocess.run(
        [sys.executable, str(launcher(env["tmp"])), *args], env=env["env"], cwd=cwd,
        capture_output=True, text=True, timeout=300, check=False,
    )


@pytest.fixture
def cli(env, monkeypatch, capfd):
    """``cli(*args, cwd=...)``: the command run in this process, in ``cwd``, for the tests
    where a fresh interpreter is not the point (the module search path of the launcher is
    tested with :func:`command`). Output is captured at the file-descriptor level, as a
    child's would be; the test's modules imported by the call are forgotten afterwards and
    ``sys.path`` restored, so the next call imports them afresh, as a new process would.
    Returns a ``CompletedProcess`` like :func:`command`."""
    tmp = str(env["tmp"])

    def run(*args, cwd):
        path = list(sys.path)
        capfd.readouterr()
        with monkeypatch.context() as m:
            m.chdir(cwd)
            try:
                code = main(list(args))
            except SystemExit as e:  # argparse rejects bad options this way
                code = e.code
            finally:
                sys.path[:] = path
                for name, mod in list(sys.modules.items()):
                    if (getattr(mod, "__file__", None) or "").startswith(tmp):
                        del sys.modules[name]
        out, err = capfd.readouterr()
        return subprocess.CompletedProcess(list(args), code, out, err)

    return run


def test_import_finds_a_module_in_the_current_directory(env):
    work = env["tmp"] / "work"
    write_kernels(work, "polish_cwd_mod", "pf_polish_cwd")
    proc = command(env, "list", "--json", "--import", "polish_cwd_mod", cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert "pf_polish_cwd" in [k["name"] for k in json.loads(proc.stdout)]


def test_import_accepts_relative_and_absolute_file_paths(env, cli):
    work = env["tmp"] / "work"
    path = write_kernels(work / "sub", "polish_file_mod", "pf_polish_file")
    for target in ("sub/polish_file_mod.py", str(path)):
        proc = cli("list", "--json", "--import", target, cwd=work)
        assert proc.returncode == 0, proc.stderr
        assert "pf_polish_file" in [k["name"] for k in json.loads(proc.stdout)]
    proc = cli("list", "--import", "sub/missing.py", cwd=work)
    assert proc.returncode == 2
    assert "--import 'sub/missing.py': no such file" in proc.stderr


def test_import_of_a_file_in_process_registers_its_kernels(env, capsys):
    path = write_kernels(env["tmp"] / "inproc", "polish_inproc_mod", "pf_polish_inproc")
    try:
        assert main(["list", "--json", "--import", str(path)]) == 0
        names = [k["name"] for k in json.loads(capsys.readouterr().out)]
        assert "pf_polish_inproc" in names
        # The same file again is fine; another file under the same module name is not.
        assert main(["list", "--import", str(path)]) == 0
        other = write_kernels(env["tmp"] / "other", "polish_inproc_mod", "pf_polish_other")
        assert main(["list", "--import", str(other)]) == 2
        assert "already imported" in capsys.readouterr().err
    finally:
        sys.modules.pop("polish_inproc_mod", None)
        sys.modules.pop("polish_inproc_mod_helper", None)


def test_the_cli_statistics_are_the_benchmark_statistics():
    assert tuple(_STATS) == tuple(STATS)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--stat", "bogus"], "invalid choice: 'bogus'"),
        (["--n-runs", "0"], "expected an integer >= 1, got 0"),
        (["--n-warmup", "-1"], "expected an integer >= 0, got -1"),
        (["--speedup-against", "nope"], "--speedup-against 'nope': not a backend"),
        (["--plot", "out.svg"], "expected a file ending in .png"),
    ],
)
def test_bad_bench_options_are_rejected_before_anything_runs(env, cli, args, message):
    work = env["tmp"] / "work"
    write_kernels(work, "polish_bad_mod", "pf_polish_bad")
    proc = cli("bench", "pf_polish_bad", *args, "--import", "polish_bad_mod", cwd=work)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert not env["marker"].exists(), "a benchmark ran before the option was rejected"


def test_stat_mean_drives_the_column_the_best_marker_and_the_speedups(env, cli):
    work = env["tmp"] / "work"
    write_kernels(work, "polish_mean_mod", "pf_polish_mean")
    out = work / "res.json"
    proc = cli("bench", "pf_polish_mean", "--stat", "mean", "--n-runs", "7",
                   "--speedup-against", "jax", "--output", str(out), "--quiet",
                   "--import", "polish_mean_mod", cwd=work)
    assert proc.returncode == 0, proc.stderr
    records = json.loads(out.read_text())["records"]
    means = {(r["config"], r["backend"]): float(np.mean(r["times"])) for r in records}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("pf_polish_mean")]
    header = proc.stdout.splitlines()[0].split()
    assert header[3] == "mean"  # the chosen statistic is the first time column
    assert len(lines) == len(means) == 4
    for config in ("n=8", "n=64"):
        best = min(("jax", "alt"), key=lambda b: means[(config, b)])
        for line in lines:
            cells = line.split()
            if cells[1] != config:
                continue
            backend = cells[2]
            assert ("*" in line) == (backend == best), line
            want = means[(config, "jax")] / means[(config, backend)]
            assert float(line.split()[-2].rstrip("x")) == pytest.approx(want, abs=0.006)


# Lines jaxlib's native logging writes to stderr by itself (e.g. when JAX's CUDA plugin is
# installed on a machine without a GPU); not primforge's to silence.
_NATIVE_LOG = re.compile(r"^(WARNING: All log messages before absl|[IWEF]\d{4} )")


def _own_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.strip() and not _NATIVE_LOG.match(ln)]


def test_progress_lines_on_stderr_and_quiet(env, cli):
    work = env["tmp"] / "work"
    write_kernels(work, "polish_prog_a", "pf_polish_prog_a")
    write_kernels(work, "polish_prog_b", "pf_polish_prog_b")
    base = ["pf_polish_prog_a", "pf_polish_prog_b", "--import", "polish_prog_a", "--import",
            "polish_prog_b"]
    proc = cli("bench", *base, "--n-runs", "2", cwd=work)
    assert proc.returncode == 0, proc.stderr
    steps = [ln for ln in proc.stderr.splitlines() if "] benchmarking " in ln]
    assert [s.split()[1:4] for s in steps] == [
        ["[1/2]", "benchmarking", "pf_polish_prog_a"],
        ["[2/2]", "benchmarking", "pf_polish_prog_b"],
    ]
    assert "benchmarking 2 kernel(s) in" in proc.stderr
    assert "\r" not in proc.stderr  # no terminal bar when stderr is not a terminal
    quiet = cli("bench", *base, "--n-runs", "2", "--quiet", cwd=work)
    assert quiet.returncode == 0, quiet.stderr
    assert _own_lines(quiet.stderr) == [], quiet.stderr
    checked = cli("check", *base, cwd=work)
    assert checked.returncode == 0, checked.stderr
    assert "[2/2] checking pf_polish_prog_b" in checked.stderr
    tuned = cli("autotune", *base, "--n-runs", "2", cwd=work)
    assert tuned.returncode == 0, tuned.stderr
    assert "[1/2] tuning pf_polish_prog_a" in tuned.stderr


def test_autotune_show_lists_every_stored_choice_with_device_and_jax(env, capsys):
    # The store as written by autotune: kernel -> platform -> entry.
    stored = {
        "format": "primforge-autotune",
        "version": 1,
        "kernels": {
            "pf_polish_not_imported": {
                "cpu": {"backend": "alt", "device_kind": "cpu", "jax_version": "0.10.2"},
                "gpu": {"backend": "triton", "device_kind": "NVIDIA H100", "jax_version": "0.9.0"},
            },
            "pf_polish_older_entry": {"cpu": {"backend": "jax"}},
            "pf_polish_device_key": {"cpu": {"backend": "jax", "device": "cpu",
                                             "jax_version": "0.8.2"}},
        },
    }
    path = autotune.cache_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)  # private, as autotune wants
    path.write_text(json.dumps(stored))
    path.chmod(0o600)
    assert main(["autotune", "--show"]) == 0
    out = capsys.readouterr().out
    rows = [ln.split() for ln in out.splitlines()]
    header = next(r for r in rows if r[:1] == ["NAME"])
    assert header == ["NAME", "PLATFORM", "BACKEND", "DEVICE", "JAX"]
    body = [r for r in rows if r and r[0].startswith("pf_polish_")]
    assert body == [
        ["pf_polish_device_key", "cpu", "jax", "cpu", "0.8.2"],
        ["pf_polish_not_imported", "cpu", "alt", "cpu", "0.10.2"],
        ["pf_polish_not_imported", "gpu", "triton", "NVIDIA", "H100", "0.9.0"],
        ["pf_polish_older_entry", "cpu", "jax", "-", "-"],
    ]
    # Names narrow the listing.
    assert main(["autotune", "--show", "pf_polish_older_entry_missing"]) == 2
    capsys.readouterr()


def test_autotune_then_show_lists_the_tuned_choice(env, cli):
    work = env["tmp"] / "work"
    write_kernels(work, "polish_tune_mod", "pf_polish_tune")
    proc = cli("autotune", "pf_polish_tune", "--n-runs", "2", "--quiet",
                   "--import", "polish_tune_mod", cwd=work)
    assert proc.returncode == 0, proc.stderr
    want = autotune.choices()["pf_polish_tune"]["cpu"]
    assert want in ("jax", "alt")
    # Listed by a fresh process, which does not import the kernel's module.
    shown = command(env, "autotune", "--show", cwd=work)
    assert shown.returncode == 0, shown.stderr
    row = next(ln.split() for ln in shown.stdout.splitlines() if ln.startswith("pf_polish_tune"))
    assert row[:3] == ["pf_polish_tune", "cpu", want]


def test_bench_plot_writes_a_png(env, cli):
    pytest.importorskip("matplotlib", reason="the plot needs matplotlib (primforge[plot])")
    work = env["tmp"] / "work"
    write_kernels(work, "polish_plot_mod", "pf_polish_plot")
    png = work / "plot.png"
    proc = cli("bench", "pf_polish_plot", "--n-runs", "3", "--quiet", "--plot",
                   str(png), "--import", "polish_plot_mod", cwd=work)
    assert proc.returncode == 0, proc.stderr
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000
    assert f"plotted {png}" in proc.stdout
