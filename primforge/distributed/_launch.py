"""Start N local processes of one script, joined by ``jax.distributed``; stop all on failure.

Each rank is ``python SCRIPT ARGS...`` in a session (and process group) of its own, with the
environment that :func:`initialize` reads; a rank whose script raises or exits with a
nonzero code ends at once (``_rank.py``), without waiting in ``jax.distributed``'s shutdown
barrier. The launcher forwards every rank's output line by line and watches the ranks: the
first one that exits with a nonzero code or dies by a signal, the global timeout, or
``SIGTERM`` / ``SIGHUP`` / ``SIGINT`` to the launcher stops every rank's process group
(``SIGTERM``, ``SIGKILL`` after ``grace`` seconds). A group is kept until it is empty, so
the processes a rank started are stopped too after the rank itself has exited. On Linux a
rank also ends (``SIGKILL``) when the launcher dies without stopping it.
"""

from __future__ import annotations

import argparse
import collections
import math
import numbers
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Self

#: Environment variables the launcher sets for each rank (``JAX_COORDINATOR_ADDRESS`` is
#: also read by ``jax.distributed.initialize`` itself).
COORDINATOR = "JAX_COORDINATOR_ADDRESS"
NUM_PROCESSES = "PRIMFORGE_NUM_PROCESSES"
PROCESS_ID = "PRIMFORGE_PROCESS_ID"
#: Variables whose presence means a cluster manager started this process, where
#: ``jax.distributed.initialize()`` finds its arguments by itself.
CLUSTER_VARIABLES = ("SLURM_JOB_ID", "OMPI_COMM_WORLD_SIZE")
_DEVICE_FLAG = "--xla_force_host_platform_device_count"
_TAIL = 40  # lines of a rank's output kept for the error message
_POLL = 0.05  # seconds between two looks at the ranks
#: The launcher's pid, for ``_rank.py`` (which removes it from the script's environment).
LAUNCHER_PID = "PRIMFORGE_LAUNCHER_PID"
#: Signals that stop the run when they reach the launcher (where the platform has them).
_STOP_SIGNALS = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP", "SIGINT")
                      if hasattr(signal, n))
#: Runs each rank's script and ends the rank at once when the script fails.
_RANK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_rank.py")


class LaunchError(RuntimeError):
    """A rank of :func:`launch` failed, or the run went over its timeout.

    Attributes:
        rank: the rank that failed first (``None`` for a timeout).
        returncode: its exit code (negative: killed by that signal; ``None`` for a timeout).
        running: the ranks still running when the run was stopped, for a timeout.
        outputs: every rank's output (stdout and stderr together) up to the stop.

    Example:
        >>> err = LaunchError("rank 1 exited with code 3", rank=1, returncode=3)
        >>> err.rank, err.returncode, str(err)
        (1, 3, 'rank 1 exited with code 3')
    """

    def __init__(self, message: str, *, rank: int | None = None,
                 returncode: int | None = None, running: Sequence[int] = (),
                 outputs: Sequence[str] = ()):
        super().__init__(message)
        self.rank, self.returncode = rank, returncode
        self.running, self.outputs = list(running), list(outputs)


def initialize(**kwargs) -> bool:
    """Join the other processes of this run through ``jax.distributed.initialize``.

    Call it at the start of a script, before any other JAX call. Started by :func:`launch`
    (or ``python -m primforge.distributed``), it passes the coordinator, the number of
    processes and this rank from the environment the launcher set. Under SLURM or Open MPI
    (``SLURM_JOB_ID`` or ``OMPI_COMM_WORLD_SIZE`` set) or with ``JAX_COORDINATOR_ADDRESS``
    set, it calls ``jax.distributed.initialize(**kwargs)``, which finds the coordinator,
    the process count and this process's id by itself. Otherwise the script runs as one
    process and nothing is done, so the same script also runs on its own.

    Args:
        **kwargs: passed to ``jax.distributed.initialize`` (e.g. ``local_device_ids``,
            ``initialization_timeout``).

    Returns:
        Whether ``jax.distributed`` was initialised (``False``: one process).

    Example:
        >>> initialize()  # not started by the launcher, not on a cluster: one process
        False
    """
    import jax

    env = os.environ
    if NUM_PROCESSES in env:
        kwargs.setdefault("coordinator_address", env[COORDINATOR])
        kwargs.setdefault("num_processes", int(env[NUM_PROCESSES]))
        kwargs.setdefault("process_id", int(env[PROCESS_ID]))
        # Everything is given: no cluster detection (the launcher may itself run in a job).
        kwargs.setdefault("cluster_detection_method", "deactivate")
        jax.distributed.initialize(**kwargs)
        return True
    if kwargs or COORDINATOR in env or any(v in env for v in CLUSTER_VARIABLES):
        jax.distributed.initialize(**kwargs)
        return True
    return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_env(base: Mapping[str, str], port: int, n: int, rank: int,
              devices: int | None) -> dict[str, str]:
    env = dict(base)
    env[LAUNCHER_PID] = str(os.getpid())
    env[COORDINATOR] = f"127.0.0.1:{port}"
    env[NUM_PROCESSES] = str(n)
    env[PROCESS_ID] = str(rank)
    if devices is not None:
        flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith(_DEVICE_FLAG)]
        env["XLA_FLAGS"] = " ".join([*flags, f"{_DEVICE_FLAG}={devices}"])
    return env


def _check_count(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _is_seconds(value, *, zero: bool) -> bool:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return False
    try:
        finite = math.isfinite(value)
    except OverflowError:  # an integer beyond any float
        return False
    return finite and (value >= 0 if zero else value > 0)


def _check_arguments(script, args, num_processes, devices_per_process, timeout, grace) -> None:
    """Every argument of :func:`launch` checked before any process starts."""
    _check_count("num_processes", num_processes)
    if devices_per_process is not None:
        _check_count("devices_per_process", devices_per_process)
    if timeout is not None and not _is_seconds(timeout, zero=False):
        raise ValueError("timeout must be a positive number of seconds (finite; None for no "
                         f"limit), got {timeout!r}")
    if not _is_seconds(grace, zero=True):
        raise ValueError(f"grace must be a number of seconds >= 0 (finite), got {grace!r}")
    if isinstance(args, (str, bytes)):
        raise TypeError(f"args must be a sequence of arguments, not one string: {args!r}")
    if not os.path.isfile(script):
        raise FileNotFoundError(f"script: no such file {os.fspath(script)!r}")


def _group_runs(pgid: int) -> bool:
    """Whether process group ``pgid`` has a process that is not a zombie.

    Processes left by a rank that has exited belong to init once stopped, and an init that
    is slow to reap them (in some containers) would keep their group in existence.
    """
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if not sys.platform.startswith("linux"):
        return True
    try:
        entries = [e.name for e in os.scandir("/proc") if e.name.isdigit()]
    except OSError:
        return True
    for pid in entries:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                state, _ppid, group = f.read().rsplit(b")", 1)[1].split()[:3]
        except (OSError, ValueError):
            continue  # ended meanwhile
        if int(group) == pgid and state != b"Z":
            return True
    return False


class _Rank:
    """One child process, a thread that reads its output, and its process group."""

    def __init__(self, rank: int, argv: list[str], env: dict[str, str], echo: bool,
                 lock: threading.Lock):
        self.rank = rank
        self.lines: list[str] = []
        self.closed_at = float("inf")  # when its output closed: about when it exited
        self.proc = subprocess.Popen(
            argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, errors="replace", bufsize=1,
            start_new_session=os.name == "posix",  # its own process group, stopped whole
        )
        # The group's id is the rank's pid. It stays in use (no new process gets that pid)
        # while any process of the group lives, so it is kept until the group is empty.
        self.pgid: int | None = self.proc.pid if os.name == "posix" else None
        self.reader = threading.Thread(target=self._read, args=(echo, lock), daemon=True)
        self.reader.start()

    def _read(self, echo: bool, lock: threading.Lock) -> None:
        with self.proc.stdout:
            for line in self.proc.stdout:
                self.lines.append(line)
                if echo:
                    with lock:
                        sys.stdout.write(f"[{self.rank}] {line}")
                        sys.stdout.flush()
        self.closed_at = time.monotonic()

    def alive(self) -> bool:
        """Whether the rank, or a process left in its group, still runs."""
        self.proc.poll()  # reaps the rank once it has exited
        if self.pgid is None:
            return os.name != "posix" and self.proc.returncode is None
        if not _group_runs(self.pgid):
            self.pgid = None
            return False
        return True

    def signal(self, sig: int) -> None:
        if os.name != "posix":
            if self.proc.poll() is None:
                self.proc.terminate() if sig == signal.SIGTERM else self.proc.kill()
            return
        if self.pgid is None:
            return
        try:
            os.killpg(self.pgid, sig)
        except ProcessLookupError:
            self.pgid = None
        except PermissionError:
            pass

    def tail(self) -> str:
        lines = collections.deque(self.lines, maxlen=_TAIL)
        return "".join(lines) or "(no output)\n"


def _stop(ranks: list[_Rank], grace: float, hurry=lambda: False) -> None:
    """SIGTERM to every rank's process group that still has a process (the rank, or what it
    started), SIGKILL to those left after ``grace`` seconds (at once when ``hurry()``)."""
    live = [r for r in ranks if r.alive()]
    for r in live:
        r.signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    while live and time.monotonic() < deadline and not hurry():
        time.sleep(_POLL)
        live = [r for r in live if r.alive()]
    for r in live:
        r.signal(signal.SIGKILL)
    for r in ranks:
        try:
            r.proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:  # not even SIGKILL ended it yet (the kernel's turn)
            pass
    # What SIGKILL hit is gone in a moment; a short bounded look, so that a return means gone.
    deadline = time.monotonic() + 1.0
    while any(r.alive() for r in live) and time.monotonic() < deadline:
        time.sleep(_POLL / 5)
    # A process outside the groups could still hold a pipe open: wait a bounded time.
    for r in ranks:
        r.reader.join(timeout=2.0)


class _Stopped(SystemExit):
    """The launcher received ``SIGTERM`` or ``SIGHUP``; the code is 128 + the signal."""


class _Signals:
    """``SIGTERM``, ``SIGHUP`` and ``SIGINT`` recorded while :func:`launch` runs, so that the
    ranks are stopped before the launcher goes.

    Only in the main thread (where Python runs signal handlers), and only for a signal whose
    handler is the default one: a handler the program set itself runs as before (and
    whatever it raises stops the ranks on its way out), and an ignored signal stays ignored
    (``nohup``).
    """

    def __init__(self):
        self.received: int | None = None
        self.count = 0
        self._old: dict[int, object] = {}

    def __enter__(self) -> Self:
        if threading.current_thread() is threading.main_thread():
            for sig in _STOP_SIGNALS:
                default = signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL
                old = signal.getsignal(sig)
                if old is default:
                    self._old[sig] = old
                    signal.signal(sig, self._record)
        return self

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)

    def _record(self, signum: int, frame) -> None:
        if self.received is None:
            self.received = signum
        self.count += 1

    def hurry(self) -> bool:
        """A second signal: no grace period left."""
        return self.count > 1

    def raise_received(self) -> None:
        sig = self.received
        if sig == signal.SIGINT:
            raise KeyboardInterrupt
        stopped = _Stopped(128 + sig)
        stopped.signal = signal.Signals(sig).name
        raise stopped


def _describe(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def launch(script: str | os.PathLike, args: Sequence[str] = (), *, num_processes: int = 2,
           devices_per_process: int | None = None, timeout: float | None = None,
           grace: float = 5.0, echo: bool = True,
           env: Mapping[str, str] | None = None) -> list[str]:
    """Run ``python SCRIPT ARGS...`` as ``num_processes`` local processes joined by JAX.

    Each rank gets ``JAX_COORDINATOR_ADDRESS`` (``127.0.0.1`` and a free port) and its rank
    and the process count in ``PRIMFORGE_PROCESS_ID`` / ``PRIMFORGE_NUM_PROCESSES``; the
    script calls :func:`initialize` first, then works on one global mesh
    (``jax.make_mesh`` over ``jax.devices()``, every process's devices). When one rank exits
    with a nonzero code or is killed, the others are stopped (``SIGTERM`` to their process
    groups, ``SIGKILL`` after ``grace`` seconds) and :class:`LaunchError` names the rank,
    its exit code and the last lines of its output. After ``timeout`` seconds every rank is
    stopped the same way and the error names those still running.

    Stopping a rank means its whole process group: what the rank started is stopped too,
    also after the rank itself has exited, and also when every rank succeeded (a process
    that should outlive the run must leave the group, e.g. with ``setsid``). Called from the
    main thread, ``launch`` also stops every rank when this process receives ``SIGTERM``,
    ``SIGHUP`` or ``SIGINT`` while their handlers are the default ones, then raises
    ``SystemExit(128 + signal)`` (``KeyboardInterrupt`` for ``SIGINT``); a second signal
    cuts the grace period short. On Linux a rank ends by itself when this process dies
    without stopping it (e.g. by ``SIGKILL``); what the rank started is then left running.

    Args:
        script: path of the Python script every rank runs.
        args: its command-line arguments (the same for every rank).
        num_processes: how many processes (ranks ``0 .. num_processes - 1``).
        devices_per_process: give each process this many CPU devices (appends
            ``--xla_force_host_platform_device_count`` to ``XLA_FLAGS``); ``None`` leaves
            the devices as JAX finds them.
        timeout: seconds before every rank is stopped; ``None``: no limit.
        grace: seconds between ``SIGTERM`` and ``SIGKILL`` when ranks are stopped.
        echo: forward each rank's output to this process's stdout, prefixed ``[rank]``.
        env: the environment the ranks start from (default: this process's).

    Returns:
        Every rank's output (stdout and stderr together), by rank.

    Raises:
        LaunchError: a rank failed, or the run went over ``timeout``.
        ValueError: a bad argument (before any process starts): ``num_processes`` and
            ``devices_per_process`` must be positive integers, ``timeout`` a positive finite
            number of seconds or ``None``, ``grace`` a finite number of seconds >= 0.
        TypeError: ``args`` is one string rather than a sequence of arguments.
        FileNotFoundError: ``script`` is not a file.
        SystemExit: ``SIGTERM`` or ``SIGHUP`` stopped the run (code 128 + the signal).
        KeyboardInterrupt: ``SIGINT`` stopped the run.

    Example:
        >>> import pathlib, tempfile
        >>> script = pathlib.Path(tempfile.mkdtemp()) / "hello.py"
        >>> _ = script.write_text("import os; print('rank', os.environ['PRIMFORGE_PROCESS_ID'])")
        >>> launch(script, num_processes=2, timeout=60, echo=False)
        ['rank 0\\n', 'rank 1\\n']
    """
    _check_arguments(script, args, num_processes, devices_per_process, timeout, grace)
    num_processes = int(num_processes)
    devices_per_process = None if devices_per_process is None else int(devices_per_process)
    timeout, grace = (None if timeout is None else float(timeout)), float(grace)
    args = [str(a) for a in args]
    base = dict(os.environ if env is None else env)
    port = _free_port()
    with _Signals() as signals:
        try:
            outputs = _supervise(script, args, num_processes, devices_per_process, timeout,
                                 grace, echo, base, port, signals)
        except LaunchError:
            if signals.received is not None:  # a signal came while the ranks were stopped
                signals.raise_received()
            raise
        if signals.received is not None:
            signals.raise_received()
        return outputs


def _supervise(script, args, num_processes, devices_per_process, timeout, grace, echo, base,
               port, signals: _Signals) -> list[str]:
    lock = threading.Lock()
    ranks: list[_Rank] = []
    start = time.monotonic()
    try:
        for i in range(num_processes):
            if signals.received is not None:
                break
            argv = [sys.executable, _RANK, os.fspath(script), *args]
            ranks.append(_Rank(i, argv, _rank_env(base, port, num_processes, i,
                                                  devices_per_process), echo, lock))
        while signals.received is None:
            codes = [r.proc.poll() for r in ranks]
            failed = [r for r, c in zip(ranks, codes) if c not in (None, 0)]
            if failed:
                # Several seen at once (one rank's death can make another fail): the first.
                failed = min(failed, key=lambda r: (r.closed_at, r.rank))
                _stop(ranks, grace, signals.hurry)
                code = failed.proc.returncode
                raise LaunchError(
                    f"rank {failed.rank} of {num_processes} {_describe(code)}; the other "
                    f"ranks were stopped. Last lines of rank {failed.rank}:\n{failed.tail()}",
                    rank=failed.rank, returncode=code,
                    outputs=["".join(r.lines) for r in ranks])
            if all(c == 0 for c in codes):
                _stop(ranks, grace, signals.hurry)  # what the ranks left running, if anything
                return ["".join(r.lines) for r in ranks]
            if timeout is not None and time.monotonic() - start > timeout:
                running = [r.rank for r, c in zip(ranks, codes) if c is None]
                _stop(ranks, grace, signals.hurry)
                tails = "".join(f"--- rank {i}:\n{ranks[i].tail()}" for i in running)
                raise LaunchError(
                    f"timeout after {timeout:g} s: rank(s) {', '.join(map(str, running))} of "
                    f"{num_processes} still running were stopped. Last lines:\n{tails}",
                    running=running, outputs=["".join(r.lines) for r in ranks])
            time.sleep(_POLL)
        return []  # a signal: the caller raises it once the ranks are stopped
    finally:
        # A signal, an error above, or nothing left: every group that still has a process.
        _stop(ranks, grace, signals.hurry)


def _cli_count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _cli_seconds(*, zero: bool):
    what = "a finite number of seconds >= 0" if zero else "a positive finite number of seconds"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not _is_seconds(value, zero=zero):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value

    return parse


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m primforge.distributed``: :func:`launch` from the command line.

    Returns 0 when every rank succeeded, 1 when one failed, 124 after the timeout, and
    128 + the signal when ``SIGTERM`` (143), ``SIGHUP`` (129) or ``SIGINT`` (130) stopped
    the run; a bad argument exits with status 2 before any process starts.

    Example:
        >>> main(["--help"])  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        SystemExit: 0
    """
    p = argparse.ArgumentParser(
        prog="python -m primforge.distributed",
        description="Run SCRIPT as N local processes joined by jax.distributed (the script "
                    "calls primforge.distributed.initialize() first). If one process fails, "
                    "or this command receives SIGTERM, SIGHUP or SIGINT, every process is "
                    "stopped (with what it started) and the exit status is nonzero.")
    p.add_argument("-n", "--num-processes", type=_cli_count, default=2, metavar="N",
                   help="number of processes (default 2)")
    p.add_argument("--devices-per-process", type=_cli_count, default=None, metavar="D",
                   help="CPU devices per process (XLA_FLAGS=--xla_force_host_platform_"
                        "device_count=D)")
    p.add_argument("--timeout", type=_cli_seconds(zero=False), default=None, metavar="S",
                   help="stop every process after S seconds (exit status 124)")
    p.add_argument("--grace", type=_cli_seconds(zero=True), default=5.0, metavar="S",
                   help="seconds between SIGTERM and SIGKILL when stopping (default 5)")
    p.add_argument("script", help="the Python script each process runs")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    ns = p.parse_args(argv)
    try:
        launch(ns.script, ns.args, num_processes=ns.num_processes,
               devices_per_process=ns.devices_per_process, timeout=ns.timeout,
               grace=ns.grace)
    except (ValueError, TypeError, FileNotFoundError) as e:
        p.error(str(e))
    except LaunchError as e:
        print(f"primforge.distributed: {e}", file=sys.stderr, flush=True)
        return 1 if e.rank is not None else 124
    except _Stopped as e:
        print(f"primforge.distributed: {e.signal} received; every rank was stopped",
              file=sys.stderr, flush=True)
        return e.code
    except KeyboardInterrupt:
        print("primforge.distributed: SIGINT received; every rank was stopped",
              file=sys.stderr, flush=True)
        return 128 + signal.SIGINT
    return 0
