"""Runs the steps, each in its own process under its own time budget, and writes the report.

The driver itself imports no JAX backend: a step that hangs, crashes the process or takes the
GPU down is stopped (its whole process group) at its budget and recorded, and the next step
runs. Each step's process appends JSON records to a file as results come in, so a step
stopped at its budget keeps what it finished.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import pathlib
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time

from tools.gpu_acceptance import _report

ROOT = pathlib.Path(__file__).resolve().parents[2]

#: The steps, in report order.
STEPS = ("env", "gpu_tests", "kernels", "bench", "cpu_suite")
#: Seconds per step on a GPU machine; steps after 'bench' run at the same time there.
GPU_BUDGETS = {"env": 90, "bench": 140, "gpu_tests": 240, "kernels": 320, "cpu_suite": 240}
#: Seconds per step in a rehearsal (one after another).
REHEARSAL_BUDGETS = {"env": 60, "bench": 90, "gpu_tests": 60, "kernels": 90, "cpu_suite": 60}
DEFAULT_TOTAL = 470
RESERVE_S = 8  # kept back from the total for writing the report
LOG_TAIL = 2 << 20  # bytes of each step's output kept under logs/

_GPU_TEST_ARGS = "tests"
# The GPU-test step runs the exhaustive tier too (the suite's default deselects it).
_EVERY_TIER = ("-m", "exhaustive or not exhaustive")
# The suite without this command's own test and the XLA:GPU compile sweeps (CI runs those;
# here the GPU itself runs the kernels).
_SUITE_ARGS = ("tests primforge --ignore=tests/test_gpu_acceptance.py "
               "--ignore-glob=*gpu_compile* --ignore=tests/test_triton_battery.py")
_REHEARSAL_SUITE_ARGS = "tests/test_registry.py"


def _parse_budgets(text: str) -> dict:
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = part.partition("=")
        if name not in STEPS:
            raise argparse.ArgumentTypeError(
                f"--budgets: unknown step {name!r}; steps: {', '.join(STEPS)}")
        try:
            out[name] = _seconds(value)
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(
                f"--budgets: {part!r} must be STEP=SECONDS, with a positive finite number "
                "of seconds") from None
    return out


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(
            f"expected a positive finite number of seconds, got {text!r}")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _csv(text: str) -> list[str]:
    return [p.strip() for p in text.split(",") if p.strip()]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m tools.gpu_acceptance",
        description="Prove primforge on a GPU machine in one call (or rehearse on a CPU).")
    p.add_argument("--out", required=True, help="folder for report.json, report.md, logs/")
    p.add_argument("--rehearse", action="store_true",
                   help="CPU runners and small sizes even where a GPU is visible "
                        "(automatic without a GPU)")
    p.add_argument("--total", type=_seconds, default=DEFAULT_TOTAL,
                   help=f"seconds for the whole run (default {DEFAULT_TOTAL})")
    p.add_argument("--budgets", type=_parse_budgets, default={},
                   help="per-step seconds, e.g. env=30,bench=120 (steps: "
                        f"{', '.join(STEPS)})")
    p.add_argument("--steps", type=_csv, default=list(STEPS),
                   help="steps to run (the others are reported as not selected); env "
                        "always runs, since it finds out whether JAX sees a GPU")
    p.add_argument("--backends", type=_csv, default=None,
                   help="restrict kernel checks and benchmarks to these backends")
    p.add_argument("--kernels", type=_csv, default=None,
                   help="restrict the kernel checks to these kernel names (fnmatch patterns)")
    p.add_argument("--max-cases", type=_count, default=None,
                   help="benchmark cases per kernel (default 3, rehearsal 1)")
    p.add_argument("--gpu-tests", default=_GPU_TEST_ARGS,
                   help=f"pytest arguments of the GPU test step (default {_GPU_TEST_ARGS!r})")
    p.add_argument("--suite", default=None,
                   help=f"pytest arguments of the CPU suite step (default {_SUITE_ARGS!r}; "
                        f"rehearsal {_REHEARSAL_SUITE_ARGS!r})")
    p.add_argument("--workers", type=_count, default=None,
                   help="pytest-xdist workers of the CPU suite (default: cores - 5 on a GPU "
                        "machine, 2 in a rehearsal)")
    p.add_argument("--serial", action="store_true",
                   help="run every step alone (by default on a GPU machine the GPU tests, "
                        "the kernel checks and the CPU suite run at the same time)")
    return p


class _Step:
    """One step's process: started, polled, stopped at its deadline."""

    def __init__(self, name: str, cmd: list[str], env: dict, budget: float, work: pathlib.Path,
                 out: pathlib.Path):
        self.name, self.budget = name, budget
        self.records = work / f"{name}.jsonl"
        self.log = out / "logs" / f"{name}.log"
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = open(self.log, "wb")  # noqa: SIM115 - closed by poll()
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, env={**env, "PF_ACCEPTANCE_LOG": str(self.records)},
            stdout=self._log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)
        self.timed_out = False
        self.seconds: float | None = None

    def poll(self) -> bool:
        """True once the process has ended (stopping it at its budget)."""
        if self.seconds is not None:
            return True
        if self.proc.poll() is None:
            if time.monotonic() - self.t0 <= self.budget:
                return False
            self.timed_out = True
            self._stop()
        self.seconds = time.monotonic() - self.t0
        self._log_file.close()
        _truncate_head(self.log, LOG_TAIL)
        return True

    def _stop(self) -> None:
        for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue

    def read(self) -> list[dict]:
        if not self.records.exists():
            return []
        out = []
        for line in self.records.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line cut short by the stop
        return out

    def tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def _truncate_head(path: pathlib.Path, keep: int) -> None:
    try:
        size = path.stat().st_size
        if size > keep:
            with open(path, "rb") as f:
                f.seek(size - keep)
                data = f.read()
            path.write_bytes(b"[... earlier output cut ...]\n" + data)
    except OSError:
        pass


def _has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _pytest_cmd(args: str, workers: int | None, extra: tuple[str, ...] = ()) -> list[str]:
    cmd = [sys.executable, "-m", "pytest", *shlex.split(args), *extra, "-q",
           "-p", "no:cacheprovider", "-p", "no:benchmark",
           "--continue-on-collection-errors", "-p", "tools.gpu_acceptance._pytest_plugin"]
    if workers and workers > 1 and _has("xdist"):
        cmd += ["-n", str(workers)]
    return cmd


def check_out(out: pathlib.Path) -> str | None:
    """Why the report cannot be written under ``out`` (``None``: it can), found before any
    step runs. Creates the folder and its ``logs/``."""
    for above in [out, *out.parents]:
        if above.exists() or above.is_symlink():
            if not above.is_dir():
                return ("is a file, not a folder" if above == out
                        else f"{above} is a file, not a folder")
            break
    existed = out.is_dir()
    try:
        (out / "logs").mkdir(parents=True, exist_ok=True)
    except OSError as e:
        what = "not writable" if existed else "cannot create the folder"
        return f"{what} ({e.strerror or e}: {e.filename or out})"
    for name in ("report.json", "report.md"):
        path = out / name
        if path.is_dir():
            return f"{path} is a folder, where the report goes"
    try:
        for name in ("report.json", "report.md"):
            path = out / name
            if path.exists():
                with open(path, "ab"):
                    pass
        for folder in (out, out / "logs"):
            fd, probe = tempfile.mkstemp(dir=folder, prefix=".pf-acceptance-")
            os.close(fd)
            os.unlink(probe)
    except OSError as e:
        return f"not writable ({e.strerror or e}: {getattr(e, 'filename', None) or out})"
    return None


def main(argv: list[str] | None = None) -> int:
    """Run the acceptance steps and write ``report.json`` and ``report.md`` under ``--out``.

    Returns 0 once the report is written, whatever the steps found (the report says it);
    2 with a one-line error, before any step runs, when ``--out`` cannot hold the report
    (a file, a path under a file, a folder that cannot be written); 128 + the signal when
    ``SIGTERM``, ``SIGHUP`` or ``SIGINT`` stopped the run (the running steps' process
    groups are stopped first, and no report is written).
    """
    args = parser().parse_args(argv)
    out = pathlib.Path(args.out).resolve()
    problem = check_out(out)
    if problem is not None:
        print(f"python -m tools.gpu_acceptance: error: --out {args.out}: {problem}",
              file=sys.stderr, flush=True)
        return 2
    started: list[_Step] = []
    signals = _Signals()
    try:
        with signals:
            return _run(args, argv, out, started)
    except (_Stopped, KeyboardInterrupt) as e:
        _stop_steps(started)
        sig = signal.Signals(e.code - 128 if isinstance(e, _Stopped) else signal.SIGINT)
        print(f"python -m tools.gpu_acceptance: {sig.name} received; the running steps "
              "were stopped and no report was written", file=sys.stderr, flush=True)
        return 128 + sig
    finally:
        _stop_steps(started)
        signals.restore()


class _Stopped(SystemExit):
    """``SIGTERM`` or ``SIGHUP`` reached the driver; the code is 128 + the signal."""


class _Signals:
    """While the steps run (main thread only, signals at their default handlers):
    ``SIGTERM`` and ``SIGHUP`` raise :class:`_Stopped` and ``SIGINT`` ``KeyboardInterrupt``,
    once; a later one is ignored, so that the steps' stop runs to its end."""

    def __init__(self):
        self._old: dict = {}
        self.received = False

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for name in ("SIGTERM", "SIGHUP", "SIGINT"):
                sig = getattr(signal, name, None)
                if sig is None:
                    continue
                default = signal.default_int_handler if name == "SIGINT" else signal.SIG_DFL
                if signal.getsignal(sig) is default:
                    self._old[sig] = default
                    signal.signal(sig, self._raise)
        return self

    def __exit__(self, *exc) -> None:
        # Left in place while an exception goes up to main's stop; restored after it.
        if exc[0] is None:
            self.restore()

    def restore(self) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old = {}

    def _raise(self, signum, frame) -> None:
        if self.received:
            return
        self.received = True
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise _Stopped(128 + signum)


def _stop_steps(steps: list[_Step], grace: float = 5.0) -> None:
    """SIGTERM to the process group of every step still running, SIGKILL after ``grace``."""
    running = [s for s in steps if s.proc.poll() is None]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for s in running:
            try:
                os.killpg(s.proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + grace
        for s in running:
            try:
                s.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        running = [s for s in running if s.proc.poll() is None]
        if not running:
            return


def _run(args, argv, out: pathlib.Path, started: list[_Step]) -> int:
    start = time.monotonic()
    deadline = start + args.total - RESERVE_S
    # A run started from a pytest-xdist worker must not make its own pytest runs act as one.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PYTEST_XDIST_") and k != "PYTEST_CURRENT_TEST"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # steps share the GPU
    if args.rehearse:
        env["JAX_PLATFORMS"] = "cpu"
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="pf-acceptance-") as tmp:
        work = pathlib.Path(tmp)

        def budget_of(name: str, rehearse: bool) -> float:
            table = REHEARSAL_BUDGETS if rehearse else GPU_BUDGETS
            own = args.budgets.get(name, table[name])
            return max(0.0, min(own, deadline - time.monotonic()))

        def config(platform: str) -> str:
            return json.dumps({"platform": platform, "backends": args.backends,
                               "kernels": args.kernels,
                               "max_cases": args.max_cases or (1 if platform == "cpu" else 3)})

        def launch(name: str, cmd: list[str], step_env: dict, rehearse: bool):
            if name not in args.steps and name != "env":  # env decides GPU or rehearsal
                results[name] = {"status": "skipped", "reason": "not selected (--steps)"}
                return None
            budget = budget_of(name, rehearse)
            if budget < 3:
                results[name] = {"status": "skipped",
                                 "reason": "no time left in the total budget (--total)"}
                return None
            started.append(_Step(name, cmd, step_env, budget, work, out))
            return started[-1]

        def finish(steps: list) -> None:
            steps = [s for s in steps if s is not None]
            while not all(s.poll() for s in steps):
                time.sleep(0.2)
            for s in steps:
                results[s.name] = _report.summarize(s.name, s.read(), s)

        child = [sys.executable, "-m", "tools.gpu_acceptance._child"]
        finish([launch("env", child + ["env", config(
            "cpu" if args.rehearse else "auto")], env, args.rehearse)])
        platform = _report.platform_of(results.get("env"))
        rehearse = args.rehearse or platform != "gpu"
        if rehearse:
            env["JAX_PLATFORMS"] = "cpu"
        platform = "cpu" if rehearse else "gpu"
        cores = os.cpu_count() or 2
        suite_args = args.suite or (_REHEARSAL_SUITE_ARGS if rehearse else _SUITE_ARGS)
        suite_workers = args.workers or (2 if rehearse else max(2, cores - 5))
        cpu_env = {**env, "JAX_PLATFORMS": "cpu"}

        def child_cmd(name: str) -> list[str]:
            return child + [name, config(platform)]

        gpu_env = {**env, "PF_ACCEPTANCE_SELECT": "gpu"}
        plans = {
            "bench": (child_cmd("bench"), env),
            "gpu_tests": (_pytest_cmd(args.gpu_tests, 1 if rehearse else 4, _EVERY_TIER), gpu_env),
            "kernels": (child_cmd("kernels"), env),
            "cpu_suite": (_pytest_cmd(suite_args, suite_workers), cpu_env),
        }
        for name in ("gpu_tests", "cpu_suite"):
            if not _has("pytest"):
                results[name] = {"status": "skipped", "reason": "missing pytest"}
                plans.pop(name)
        finish([launch("bench", *plans.pop("bench"), rehearse)])
        order = [n for n in ("gpu_tests", "kernels", "cpu_suite") if n in plans]
        if rehearse or args.serial:
            for name in order:
                finish([launch(name, *plans[name], rehearse)])
        else:
            finish([launch(name, *plans[name], rehearse) for name in order])
    report = _report.build(results, steps=STEPS, rehearse=rehearse, platform=platform,
                           seconds=time.monotonic() - start, argv=argv,
                           xdist=_has("xdist"), total=args.total)
    (out / "report.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    (out / "report.md").write_text(_report.markdown(report))
    print(_report.summary(report, out))
    return 0
