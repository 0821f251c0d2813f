"""The launcher of primforge.distributed leaves no process behind.

Whatever ends a run (a signal to the launcher, a failing rank, every rank done, the launcher
killed), no rank and no process a rank started is left running. Each rank script writes its
pid and the pids of the processes it started to a file; the tests read them, check by pid
that every one is gone, and kill what is left in a ``finally`` so that a failing test does
not leave processes behind. The launcher runs from its own file (``_launch.py`` imports
nothing of primforge, so the command starts without importing JAX), except in one test that
runs ``python -m primforge.distributed`` itself.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from primforge.distributed import _launch, launch

ROOT = Path(__file__).resolve().parents[1]
LAUNCH_FILE = ROOT / "primforge" / "distributed" / "_launch.py"
DEADLINE = 20.0  # seconds: a bound on every wait here, far above what one takes

# The launcher's command line, from its file, with the stopping signals at their defaults
# whatever this test process inherited (a shell's background job ignores SIGINT).
LAUNCHER = textwrap.dedent("""
    import importlib.util, signal, sys
    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    spec = importlib.util.spec_from_file_location("pf_launch", sys.argv[1])
    module = importlib.util.module_from_spec(spec)
    sys.modules["pf_launch"] = module
    spec.loader.exec_module(module)
    sys.exit(module.main(sys.argv[2:]))
    """)

# Each rank: start CHILDREN `sleep 600` processes, write "pid child..." to PIDS/<rank>,
# then do what ACTION says.
RANK_SCRIPT = """
import os, signal, subprocess, sys, time


def running(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


rank = int(os.environ["PRIMFORGE_PROCESS_ID"])
pids = sys.argv[1]
plan = dict(a.split("=") for a in sys.argv[2].split(";"))
what = plan.get(str(rank), "sleep")
if "deaf" in what:  # SIGTERM ignored by the rank and (inherited) by its children
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
children = [subprocess.Popen(["sleep", "600"]) for _ in range(what.count("child"))]
tmp = os.path.join(pids, f".{rank}")
with open(tmp, "w") as f:
    f.write(" ".join(str(p) for p in [os.getpid(), *(c.pid for c in children)]))
os.replace(tmp, os.path.join(pids, str(rank)))
print("ready", rank, flush=True)
if what.startswith("exit0"):
    os._exit(0)  # its children stay behind, in its process group
if what.startswith("fail"):
    # Fails once every other rank has written its file and those that exit have exited.
    others = [r for r in range(int(plan["n"])) if r != rank]
    while not all(os.path.exists(os.path.join(pids, str(r))) for r in others):
        time.sleep(0.02)
    for r in others:
        if plan.get(str(r), "sleep").startswith("exit0"):
            with open(os.path.join(pids, str(r))) as f:
                pid = int(f.read().split()[0])
            while running(pid):
                time.sleep(0.02)
    sys.exit(3)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead and waiting to be reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _still_alive(pids, deadline: float = DEADLINE) -> list[int]:
    """The pids still alive once all are gone or ``deadline`` seconds have passed."""
    end = time.monotonic() + deadline
    left = [p for p in pids if _alive(p)]
    while left and time.monotonic() < end:
        time.sleep(0.05)
        left = [p for p in left if _alive(p)]
    return left


class Run:
    """The pid files of one run, and the kill of whatever is left at the end."""

    def __init__(self, tmp_path: Path, n: int, plan: dict[int, str]):
        self.n = n
        self.pids_dir = tmp_path / "pids"
        self.pids_dir.mkdir(parents=True)
        self.script = tmp_path / "rank.py"
        self.script.write_text(RANK_SCRIPT, encoding="utf-8")
        self.plan = ";".join([f"n={n}", *(f"{r}={w}" for r, w in plan.items())])
        self.extra: list[int] = []

    @property
    def args(self) -> list[str]:
        return [str(self.script), str(self.pids_dir), self.plan]

    def pids(self) -> list[int]:
        out = list(self.extra)
        for f in self.pids_dir.iterdir():
            if not f.name.startswith("."):
                out += [int(p) for p in f.read_text().split()]
        return out

    def wait_ready(self, ranks) -> list[int]:
        end = time.monotonic() + DEADLINE
        while time.monotonic() < end:
            if all((self.pids_dir / str(r)).exists() for r in ranks):
                return self.pids()
            time.sleep(0.05)
        raise AssertionError(f"the ranks never wrote their pids: {self.pids()}")

    def kill_leftovers(self) -> None:
        for pid in self.pids():
            if _alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass


@pytest.fixture
def run(tmp_path):
    runs: list[Run] = []

    def make(n: int, plan: dict[int, str]) -> Run:
        runs.append(Run(tmp_path / f"run{len(runs)}", n, plan))
        return runs[-1]

    yield make
    for r in runs:
        r.kill_leftovers()


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    for name in ("JAX_COORDINATOR_ADDRESS", "PRIMFORGE_NUM_PROCESSES", "PRIMFORGE_PROCESS_ID"):
        env.pop(name, None)
    return env


def _start_launcher(r: Run, *options: str, module: bool = False) -> subprocess.Popen:
    head = ([sys.executable, "-m", "primforge.distributed"] if module
            else [sys.executable, "-c", LAUNCHER, str(LAUNCH_FILE)])
    proc = subprocess.Popen([*head, "-n", str(r.n), "--timeout", "120", *options, *r.args],
                            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, stdin=subprocess.DEVNULL)
    r.extra.append(proc.pid)
    return proc


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP", "SIGINT"])
def test_a_signal_to_the_launcher_stops_every_rank_and_what_it_started(run, sig):
    """Rank 0 and its child end at SIGTERM; rank 1 and its child ignore it and end at the
    SIGKILL after the grace period. The launcher exits with 128 + the signal."""
    r = run(2, {0: "child", 1: "child,deaf"})
    proc = _start_launcher(r, "--grace", "0.5")
    try:
        pids = r.wait_ready(range(2))
        assert len(pids) == 5  # the launcher, two ranks, two children
        proc.send_signal(getattr(signal, sig))
        _, err = proc.communicate(timeout=DEADLINE)
        assert proc.returncode == 128 + getattr(signal, sig), err
        assert f"{sig} received; every rank was stopped" in err
        assert _still_alive(pids) == []
    finally:
        proc.kill()
        proc.communicate()


def test_sigterm_to_the_module_command_stops_every_rank(run):
    """The same through ``python -m primforge.distributed`` itself (what `timeout` or a CI
    cancel sends to)."""
    r = run(2, {0: "child", 1: "child"})
    proc = _start_launcher(r, "--grace", "2", module=True)
    try:
        pids = r.wait_ready(range(2))
        proc.terminate()
        _, err = proc.communicate(timeout=DEADLINE + 30)
        assert proc.returncode == 128 + signal.SIGTERM, err
        assert _still_alive(pids) == []
    finally:
        proc.kill()
        proc.communicate()


def test_a_failing_rank_stops_the_others_and_what_an_exited_rank_left(run):
    """Rank 0 starts a child and exits 0 (its child lives on in its process group); rank 1
    sleeps with a child; then rank 2 fails. Every one of them is stopped."""
    r = run(3, {0: "exit0,child", 1: "child", 2: "fail"})
    try:
        with pytest.raises(_launch.LaunchError, match="rank 2 of 3 exited with code 3"):
            launch(r.script, r.args[1:], num_processes=3, timeout=60, grace=1, echo=False,
                   env=_env())
        pids = r.wait_ready(range(3))
        assert len(pids) == 5
        assert _still_alive(pids) == []
    finally:
        r.kill_leftovers()


def test_what_the_ranks_leave_running_is_stopped_when_every_rank_succeeds(run):
    r = run(2, {0: "exit0,child", 1: "exit0,child,child"})
    outputs = launch(r.script, r.args[1:], num_processes=2, timeout=60, grace=1,
                     echo=False, env=_env())
    assert outputs == ["ready 0\n", "ready 1\n"]
    pids = r.pids()
    assert len(pids) == 5
    assert _still_alive(pids) == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_ranks_end_when_the_launcher_is_killed(run):
    """SIGKILL gives the launcher no chance to stop anything: each rank ends by itself."""
    r = run(2, {0: "sleep", 1: "deaf"})
    proc = _start_launcher(r, "--grace", "1")
    try:
        ranks = r.wait_ready(range(2))
        proc.kill()
        proc.communicate(timeout=DEADLINE)
        assert _still_alive(ranks) == []
    finally:
        proc.kill()
        proc.communicate()


def test_the_rank_does_not_pass_the_launcher_pid_to_the_script(tmp_path):
    script = tmp_path / "env.py"
    script.write_text("import os; print(os.environ.get('PRIMFORGE_LAUNCHER_PID'))\n")
    assert launch(script, num_processes=1, timeout=60, echo=False, env=_env()) == ["None\n"]


# --- Arguments: every bad value refused by name before any process starts -----------------

BAD_COUNTS = [0, -1, 1.5, 2.0, math.nan, math.inf, True, "2", None]
BAD_TIMEOUTS = [0, -1, math.nan, math.inf, -math.inf, 10**400, True, "10"]
BAD_GRACES = [-1, -0.5, math.nan, math.inf, -math.inf, True, False, "1", None]


@pytest.fixture
def no_process_starts(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a process was started")

    monkeypatch.setattr(_launch, "_Rank", refuse)


def test_bad_numbers_are_refused_by_name_before_any_process(tmp_path, no_process_starts):
    script = tmp_path / "s.py"
    script.write_text("pass\n")
    cases = ([("num_processes", v, "a positive integer") for v in BAD_COUNTS]
             + [("devices_per_process", v, "a positive integer") for v in BAD_COUNTS
                if v is not None]
             + [("timeout", v, "a positive number of seconds") for v in BAD_TIMEOUTS]
             + [("grace", v, "a number of seconds >= 0") for v in BAD_GRACES])
    for name, value, expected in cases:
        with pytest.raises(ValueError) as info:
            launch(script, **{name: value}, echo=False)
        msg = str(info.value)
        assert msg.startswith(f"{name} must be {expected}") and repr(value) in msg, (name, msg)
    with pytest.raises(TypeError, match="args must be a sequence of arguments"):
        launch(script, "--flag", echo=False)


@pytest.mark.parametrize("option,value,expected", [
    ("--timeout", "nan", "a positive finite number of seconds"),
    ("--grace", "inf", "a finite number of seconds >= 0"),
    ("--num-processes", "0", "a positive integer"),
])
def test_bad_numbers_on_the_command_line_are_named(tmp_path, capsys, no_process_starts,
                                                   option, value, expected):
    script = tmp_path / "s.py"
    script.write_text("pass\n")
    with pytest.raises(SystemExit) as info:
        _launch.main([option, value, str(script)])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"{option}: expected {expected}, got {value!r}" in err, err


@pytest.mark.exhaustive
def test_every_bad_number_on_the_command_line_is_named(tmp_path, capsys, no_process_starts):
    script = tmp_path / "s.py"
    script.write_text("pass\n")
    for option in ("--num-processes", "--devices-per-process", "--timeout", "--grace"):
        counts = option in ("--num-processes", "--devices-per-process")
        values = (["0", "-1", "1.5", "nan", "inf", "x", ""] if counts
                  else ["nan", "inf", "-inf", "-1", "x", ""] + (["0"] if option != "--grace"
                                                               else []))
        for value in values:
            with pytest.raises(SystemExit) as info:
                _launch.main([f"{option}={value}", str(script)])
            assert info.value.code == 2
            err = capsys.readouterr().err
            assert f"{option}: expected" in err and repr(value) in err, (option, value, err)


@pytest.mark.exhaustive
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP", "SIGINT"])
def test_a_second_signal_cuts_the_grace_period_short(run, sig):
    """With a grace period of 10 minutes, a second signal sends SIGKILL at once."""
    r = run(2, {0: "deaf,child", 1: "deaf"})
    proc = _start_launcher(r, "--grace", "600")
    try:
        pids = r.wait_ready(range(2))
        proc.send_signal(getattr(signal, sig))
        time.sleep(0.5)
        assert proc.poll() is None  # waiting for the deaf ranks
        proc.send_signal(getattr(signal, sig))
        _, err = proc.communicate(timeout=DEADLINE)
        assert proc.returncode == 128 + getattr(signal, sig), err
        assert _still_alive(pids) == []
    finally:
        proc.kill()
        proc.communicate()


@pytest.mark.exhaustive
def test_a_signal_while_the_ranks_start_stops_those_started(run):
    r = run(8, {})
    proc = _start_launcher(r, "--grace", "1")
    try:
        while not any(r.pids_dir.iterdir()) and proc.poll() is None:
            time.sleep(0.005)
        proc.terminate()
        _, err = proc.communicate(timeout=DEADLINE)
        assert proc.returncode == 128 + signal.SIGTERM, err
        assert _still_alive(r.pids()) == []
    finally:
        proc.kill()
        proc.communicate()


@pytest.mark.exhaustive
def test_an_ignored_sighup_stays_ignored(run):
    """Under ``nohup`` (SIGHUP ignored) the launcher and its ranks go on."""
    r = run(1, {0: "exit0"})
    code = LAUNCHER.replace("for s in (signal.SIGTERM, signal.SIGHUP)",
                            "signal.signal(signal.SIGHUP, signal.SIG_IGN)\nfor s in ()")
    script = r.pids_dir.parent / "slow.py"
    script.write_text("import os, time\nopen(os.path.join(__import__('sys').argv[1], '0'), "
                      "'w').write(str(os.getpid()))\ntime.sleep(1.5)\nprint('done')\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(LAUNCH_FILE), "-n", "1",
                             "--timeout", "60", str(script), str(r.pids_dir)], env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        r.wait_ready([0])
        proc.send_signal(signal.SIGHUP)
        out, err = proc.communicate(timeout=DEADLINE)
        assert proc.returncode == 0, err
        assert "[0] done" in out
    finally:
        proc.kill()
        proc.communicate()
