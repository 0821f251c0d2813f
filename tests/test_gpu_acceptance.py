"""The GPU acceptance command, rehearsed on the CPU: every step runs (small selections) and
is reported with a status; report.json has the structure the docs describe."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import jax
import pytest

from primforge.backends import KNOWN_BACKENDS

ROOT = pathlib.Path(__file__).resolve().parents[1]
# The command lives in the repository's tools/, not in the installed package.
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tools.gpu_acceptance import STEPS, _driver
from tools.gpu_acceptance._pytest_plugin import GPU_SKIP_REASON

STATUSES = {"passed", "failed", "timeout", "error", "skipped"}


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory):
    out = tmp_path_factory.mktemp("acceptance")
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, "-m", "tools.gpu_acceptance", "--out", str(out), "--rehearse",
           "--total", "280", "--budgets", "env=60,bench=60,gpu_tests=60,kernels=60,cpu_suite=60",
           "--kernels", "primforge.ops.binary_csrmv", "--backends", "numba",
           "--gpu-tests", "tests/test_ops_csr_cuda.py",
           "--suite", "tests/test_registry.py -k tag_filtering", "--workers", "1"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=320,
                          check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, proc.stdout, json.loads((out / "report.json").read_text())


def test_every_step_is_reported_with_a_status(rehearsal):
    out, stdout, report = rehearsal
    assert report["mode"] == "rehearsal" and report["platform"] == "cpu"
    assert tuple(report["steps"]) == STEPS
    for name, step in report["steps"].items():
        assert step["status"] in STATUSES, (name, step)
    # the summary comes last, one line per step; the files stay few and shallow
    tail = stdout.strip().splitlines()[-len(STEPS) - 2:]
    assert [line.split()[0] for line in tail[:-1][-len(STEPS):]] == list(STEPS)
    files = [p for p in out.rglob("*") if p.is_file()]
    assert {"report.json", "report.md"} <= {p.name for p in files} and len(files) <= 8
    assert all(len(p.relative_to(out).parts) <= 2 for p in files)
    md = (out / "report.md").read_text()
    assert all(f"## {name}:" in md for name in STEPS)


def test_environment_lists_every_backend_with_a_reason(rehearsal):
    env = rehearsal[2]["steps"]["env"]
    assert env["status"] == "passed"
    assert env["info"]["versions"]["jax"] == jax.__version__
    named = {b["name"]: b for b in env["backends"]}
    assert set(named) == set(KNOWN_BACKENDS) - {"jax"}
    for b in named.values():  # never silently skipped: ran, or says why not
        assert b["ran"] is True or b["reason"], b
    assert named["numba"]["ran"] is True


def test_gpu_tests_are_found_and_skip_for_want_of_a_gpu(rehearsal):
    step = rehearsal[2]["steps"]["gpu_tests"]
    assert step["status"] == "skipped" and step["tests"]
    assert all(t["outcome"] == "skipped" and GPU_SKIP_REASON in t["message"]
               for t in step["tests"])


def test_kernel_checks_cover_forward_grad_and_vmap(rehearsal):
    step = rehearsal[2]["steps"]["kernels"]
    got = {(c["kernel"], c["backend"], c["check"]): c["status"] for c in step["checks"]}
    assert got == {("primforge.ops.binary_csrmv", "numba", t): "pass"
                   for t in ("forward", "grad", "vmap")}


def test_benchmarks_time_every_group(rehearsal):
    rows = rehearsal[2]["steps"]["bench"]["rows"]
    ew = {r["contender"]: r for r in rows if r["group"] == "elementwise"}
    assert {"device copy", "jnp 2x+1", "numba"} <= set(ew)
    assert all(r["gbps"] > 0 for r in ew.values())
    csr = {r["contender"] for r in rows if r["group"] == "csr" and "time_s" in r}
    assert {"jax", "numba", "BCOO"} <= csr
    coba = [r for r in rows if r["group"] == "coba"]
    assert coba and all(r.get("s_per_sim_s", 0) > 0 for r in coba), coba


def test_cpu_suite_records_each_test(rehearsal):
    step = rehearsal[2]["steps"]["cpu_suite"]
    assert step["status"] == "passed" and step["counts"]["passed"] >= 1


def test_a_step_over_its_budget_is_stopped_and_recorded(tmp_path):
    step = _driver._Step("bench", [sys.executable, "-c", "import time; time.sleep(120)"],
                         dict(os.environ), 1.0, tmp_path, tmp_path)
    while not step.poll():
        time.sleep(0.1)
    assert step.timed_out and step.proc.returncode is not None
    from tools.gpu_acceptance import _report

    result = _report.summarize("bench", step.read(), step)
    assert result["status"] == "timeout" and "budget" in result["reason"]


def test_bad_budget_names_the_step():
    with pytest.raises(SystemExit):
        _driver.parser().parse_args(["--out", "x", "--budgets", "gpu=5"])
    with pytest.raises(Exception, match="unknown step 'gpu'"):
        _driver._parse_budgets("gpu=5")


@pytest.mark.exhaustive  # a second run of the driver; the default tier runs the rehearsal
def test_the_environment_step_runs_even_when_not_selected(tmp_path):
    # It decides whether the other steps run on the GPU or as a rehearsal: without it a
    # GPU machine ran the selected steps as a CPU rehearsal.
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, "-m", "tools.gpu_acceptance", "--out", str(tmp_path),
           "--total", "120", "--steps", "kernels", "--kernels", "no.such.kernel*"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=200,
                          check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    steps = json.loads((tmp_path / "report.json").read_text())["steps"]
    assert steps["env"]["status"] in {"passed", "failed"} and steps["env"]["info"]["jax_devices"]
    assert steps["bench"]["status"] == "skipped" and steps["kernels"]["status"] != "skipped"


def test_suite_runs_do_not_load_the_benchmark_plugin():
    # pytest-benchmark, where installed, warns at configure time under xdist, which the
    # suite's warnings-as-errors turned into an internal error before any test ran.
    cmd = _driver._pytest_cmd("tests", 4)
    assert cmd[cmd.index("no:benchmark") - 1] == "-p"


# --- Bad arguments: refused with one line before any step runs ----------------------------


@pytest.fixture
def no_step_runs(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a step was started")

    monkeypatch.setattr(_driver, "_Step", refuse)


def _unwritable_folder(tmp_path: pathlib.Path) -> pathlib.Path:
    if os.geteuid() != 0:
        folder = tmp_path / "read-only"
        folder.mkdir()
        folder.chmod(0o555)
        return folder
    return pathlib.Path("/proc/pf-acceptance-out")  # root writes anywhere but here


def test_a_bad_out_folder_is_refused_in_one_line_before_any_step(tmp_path, capsys,
                                                                 no_step_runs):
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder\n")
    report_folder = tmp_path / "taken"
    (report_folder / "report.json").mkdir(parents=True)
    cases = {
        a_file: "is a file, not a folder",
        a_file / "sub" / "out": f"{a_file} is a file, not a folder",
        report_folder: "report.json is a folder",
        _unwritable_folder(tmp_path): None,  # "not writable" or "cannot create the folder"
    }
    try:
        for out, expected in cases.items():
            assert _driver.main(["--out", str(out), "--rehearse"]) == 2, out
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and err.startswith(
                f"python -m tools.gpu_acceptance: error: --out {out}: "), err
            if expected is None:
                assert "not writable (" in err or "cannot create the folder (" in err, err
            else:
                assert expected in err, err
    finally:
        if os.geteuid() != 0:
            (tmp_path / "read-only").chmod(0o755)
    assert a_file.read_text() == "not a folder\n"


def test_the_command_with_out_a_file_exits_with_an_error_not_a_traceback(tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-m", "tools.gpu_acceptance", "--out",
                           str(a_file / "out")], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert f"error: --out {a_file / 'out'}: {a_file} is a file, not a folder" in proc.stderr


@pytest.mark.parametrize("option,value,expected", [
    ("--total", "nan", "expected a positive finite number of seconds"),
    ("--budgets", "env=inf", "a positive finite number of seconds"),
    ("--workers", "0", "expected a positive integer"),
])
def test_bad_numbers_are_refused_by_name(capsys, option, value, expected):
    with pytest.raises(SystemExit) as info:
        _driver.parser().parse_args(["--out", "x", option, value])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {option}: " in err and expected in err, err


@pytest.mark.exhaustive
def test_every_bad_number_is_refused_by_name(capsys):
    bad = {"--total": ["nan", "inf", "-inf", "-1", "0", "x", ""],
           "--max-cases": ["0", "-1", "1.5", "nan", "x"],
           "--workers": ["0", "-1", "1.5", "inf", "x"],
           "--budgets": [f"bench={v}" for v in ("nan", "inf", "-1", "0", "x", "")]}
    for option, values in bad.items():
        for value in values:
            with pytest.raises(SystemExit) as info:
                _driver.parser().parse_args(["--out", "x", f"{option}={value}"])
            assert info.value.code == 2
            err = capsys.readouterr().err
            assert f"argument {option}: " in err, (option, value, err)


# --- A signal to the driver stops the running steps ---------------------------------------

# The driver, each step replaced by a script that starts a `sleep 600`, writes its pid and
# its child's to PIDS/<step> and sleeps.
_DRIVER = """
import os, signal, sys
for s in (signal.SIGTERM, signal.SIGHUP):
    signal.signal(s, signal.SIG_DFL)
signal.signal(signal.SIGINT, signal.default_int_handler)
from tools.gpu_acceptance import _driver
STEP = ("import os, subprocess, sys, time\\n"
        "c = subprocess.Popen(['sleep', '600'])\\n"
        "path = os.path.join(sys.argv[1], sys.argv[2])\\n"
        "open(path + '.tmp', 'w').write(f'{os.getpid()} {c.pid}')\\n"
        "os.replace(path + '.tmp', path)\\n"
        "time.sleep(600)\\n")
original = _driver._Step.__init__
def fake(self, name, cmd, env, budget, work, out):
    original(self, name, [sys.executable, "-c", STEP, sys.argv[1], name], env, budget, work,
             out)
_driver._Step.__init__ = fake
sys.exit(_driver.main(sys.argv[2:]))
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie is dead
    except (ProcessLookupError, FileNotFoundError):
        return False


def _signal_the_driver(tmp_path: pathlib.Path, sig: signal.Signals) -> None:
    pids_dir = tmp_path / "pids"
    pids_dir.mkdir()
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen([sys.executable, "-c", _DRIVER, str(pids_dir), "--out",
                             str(tmp_path / "out"), "--rehearse", "--steps", "env"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    pids = [proc.pid]
    try:
        deadline = time.monotonic() + 60
        while not (pids_dir / "env").exists() and proc.poll() is None:
            assert time.monotonic() < deadline, "the step never started"
            time.sleep(0.05)
        pids += [int(p) for p in (pids_dir / "env").read_text().split()]
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 128 + sig, err[-3000:]
        assert f"{sig.name} received; the running steps were stopped" in err
        deadline = time.monotonic() + 20
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [p for p in pids if _alive(p)] == []
    finally:
        for p in pids:
            if _alive(p):
                os.kill(p, signal.SIGKILL)
        proc.communicate()


def test_sigterm_to_the_command_stops_the_running_step_and_its_children(tmp_path):
    _signal_the_driver(tmp_path, signal.SIGTERM)


@pytest.mark.exhaustive
@pytest.mark.parametrize("sig", ["SIGHUP", "SIGINT"])
def test_sighup_and_sigint_to_the_command_stop_the_running_step(tmp_path, sig):
    _signal_the_driver(tmp_path, signal.Signals[sig])
