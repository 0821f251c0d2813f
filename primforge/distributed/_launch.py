"""Start N local processes of one script, joined by ``jax.distributed``; stop all on failure.

Each rank is ``python SCRIPT ARGS...`` in a process group of its own, with the environment that
:func:`initialize` reads; a rank whose script raises or exits with a nonzero code ends at
once (``_rank.py``), without waiting in ``jax.distributed``'s shutdown barrier. The
launcher forwards every rank's output line by line and watches the ranks: the first one
that exits with a nonzero code or dies by a signal, or the global timeout, stops every
other rank (``SIGTERM`` to its process group, ``SIGKILL`` after ``grace`` seconds) and
raises :class:`LaunchError`.
"""

from __future__ import annotations

import argparse
import collections
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence

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
    env[COORDINATOR] = f"127.0.0.1:{port}"
    env[NUM_PROCESSES] = str(n)
    env[PROCESS_ID] = str(rank)
    if devices is not None:
        flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith(_DEVICE_FLAG)]
        env["XLA_FLAGS"] = " ".join([*flags, f"{_DEVICE_FLAG}={devices}"])
    return env


def _check_positive(name: str, value, *, integer: bool) -> None:
    kind = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind) or value <= 0:
        what = "a positive integer" if integer else "a positive number of seconds"
        raise ValueError(f"{name} must be {what}, got {value!r}")


class _Rank:
    """One child process and a thread that reads its output."""

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

    def signal(self, sig: int) -> None:
        if self.proc.poll() is not None:
            return
        try:
            if os.name == "posix":
                os.killpg(self.proc.pid, sig)
            elif sig == signal.SIGTERM:
                self.proc.terminate()
            else:
                self.proc.kill()
        except (ProcessLookupError, PermissionError):
            pass

    def tail(self) -> str:
        lines = collections.deque(self.lines, maxlen=_TAIL)
        return "".join(lines) or "(no output)\n"


def _stop(ranks: list[_Rank], grace: float) -> None:
    """SIGTERM to every running rank, SIGKILL to those still there after ``grace`` s."""
    for r in ranks:
        r.signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for r in ranks:
        try:
            r.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for r in ranks:
        if r.proc.poll() is None:
            r.signal(signal.SIGKILL)
            r.proc.wait()
    # A grandchild could still hold the pipe open: wait for the readers a bounded time.
    for r in ranks:
        r.reader.join(timeout=2.0)


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

    Example:
        >>> import pathlib, tempfile
        >>> script = pathlib.Path(tempfile.mkdtemp()) / "hello.py"
        >>> _ = script.write_text("import os; print('rank', os.environ['PRIMFORGE_PROCESS_ID'])")
        >>> launch(script, num_processes=2, timeout=60, echo=False)
        ['rank 0\\n', 'rank 1\\n']
    """
    _check_positive("num_processes", num_processes, integer=True)
    if devices_per_process is not None:
        _check_positive("devices_per_process", devices_per_process, integer=True)
    if timeout is not None:
        _check_positive("timeout", timeout, integer=False)
    if isinstance(grace, bool) or not isinstance(grace, (int, float)) or grace < 0:
        raise ValueError(f"grace must be a number of seconds >= 0, got {grace!r}")
    if not os.path.isfile(script):
        raise FileNotFoundError(f"script: no such file {os.fspath(script)!r}")
    args = [str(a) for a in args]
    base = dict(os.environ if env is None else env)
    port = _free_port()
    lock = threading.Lock()
    ranks: list[_Rank] = []
    start = time.monotonic()
    try:
        for i in range(num_processes):
            argv = [sys.executable, _RANK, os.fspath(script), *args]
            ranks.append(_Rank(i, argv, _rank_env(base, port, num_processes, i,
                                                  devices_per_process), echo, lock))
        while True:
            codes = [r.proc.poll() for r in ranks]
            failed = [r for r, c in zip(ranks, codes) if c not in (None, 0)]
            if failed:
                # Several seen at once (one rank's death can make another fail): the first.
                failed = min(failed, key=lambda r: (r.closed_at, r.rank))
                _stop(ranks, grace)
                code = failed.proc.returncode
                raise LaunchError(
                    f"rank {failed.rank} of {num_processes} {_describe(code)}; the other "
                    f"ranks were stopped. Last lines of rank {failed.rank}:\n{failed.tail()}",
                    rank=failed.rank, returncode=code,
                    outputs=["".join(r.lines) for r in ranks])
            if all(c == 0 for c in codes):
                for r in ranks:
                    r.reader.join(timeout=2.0)
                return ["".join(r.lines) for r in ranks]
            if timeout is not None and time.monotonic() - start > timeout:
                running = [r.rank for r, c in zip(ranks, codes) if c is None]
                _stop(ranks, grace)
                tails = "".join(f"--- rank {i}:\n{ranks[i].tail()}" for i in running)
                raise LaunchError(
                    f"timeout after {timeout:g} s: rank(s) {', '.join(map(str, running))} of "
                    f"{num_processes} still running were stopped. Last lines:\n{tails}",
                    running=running, outputs=["".join(r.lines) for r in ranks])
            time.sleep(0.05)
    finally:
        if any(r.proc.poll() is None for r in ranks):  # an interrupt or an error above
            _stop(ranks, grace)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m primforge.distributed``: :func:`launch` from the command line.

    Returns 0 when every rank succeeded, 1 when one failed, 124 after the timeout.

    Example:
        >>> main(["--help"])  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        SystemExit: 0
    """
    p = argparse.ArgumentParser(
        prog="python -m primforge.distributed",
        description="Run SCRIPT as N local processes joined by jax.distributed (the script "
                    "calls primforge.distributed.initialize() first). If one process fails, "
                    "the others are stopped and the exit status is nonzero.")
    p.add_argument("-n", "--num-processes", type=int, default=2, metavar="N",
                   help="number of processes (default 2)")
    p.add_argument("--devices-per-process", type=int, default=None, metavar="D",
                   help="CPU devices per process (XLA_FLAGS=--xla_force_host_platform_"
                        "device_count=D)")
    p.add_argument("--timeout", type=float, default=None, metavar="S",
                   help="stop every process after S seconds (exit status 124)")
    p.add_argument("--grace", type=float, default=5.0, metavar="S",
                   help="seconds between SIGTERM and SIGKILL when stopping (default 5)")
    p.add_argument("script", help="the Python script each process runs")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    ns = p.parse_args(argv)
    try:
        launch(ns.script, ns.args, num_processes=ns.num_processes,
               devices_per_process=ns.devices_per_process, timeout=ns.timeout,
               grace=ns.grace)
    except (ValueError, FileNotFoundError) as e:
        p.error(str(e))
    except LaunchError as e:
        print(f"primforge.distributed: {e}", file=sys.stderr, flush=True)
        return 1 if e.rank is not None else 124
    return 0
