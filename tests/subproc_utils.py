"""Run Python snippets in fresh processes and turn crashes into readable test failures.

Design: the tests that need a fresh interpreter (several processes sharing one cache folder,
a file edited between two runs, a different hash seed, a kernel that may take the process
down) go through :func:`run_python`. The child gets a controlled environment
(:func:`child_env`: ``JAX_PLATFORMS=cpu``, the cache folder, ``PYTHONHASHSEED``, and this
checkout first on ``PYTHONPATH`` so the primforge under test is the one imported). Its
script starts with :data:`PRELUDE`, which gives it ``emit(tag, value)`` to send values back
(arrays included) and reports every warning as a line the parent can count. The parent
reads them with :meth:`ProcResult.results` / :meth:`ProcResult.warnings`, and
:func:`check` fails the test, quoting the child's output, when it died by a signal, printed
a C library heap-corruption message, timed out or exited non-zero. :class:`Worker` keeps one
child alive across many requests (a fuzz case each) and restarts it after a crash.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

__all__ = [
    "CRASH_MARKERS",
    "PRELUDE",
    "ROOT",
    "ProcResult",
    "Worker",
    "WorkerCrashed",
    "check",
    "child_env",
    "edit_file",
    "run_concurrently",
    "run_python",
    "write_script",
]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Text that glibc, the kernel or CPython print when a process corrupts or loses its memory.
CRASH_MARKERS = (
    "corrupted size vs. prev_size",
    "double free or corruption",
    "free(): invalid",
    "malloc(): ",
    "malloc_consolidate(): ",
    "munmap_chunk(): invalid pointer",
    "stack smashing detected",
    "Segmentation fault",
    "Bus error",
    "Fatal Python error",
)

# Variables that would change what a child does behind the test's back.
_SCRUB = (
    "PRIMFORGE_CACHE",
    "PRIMFORGE_CACHE_DIR",
    "PRIMFORGE_DEBUG",
    "NUMBA_BOUNDSCHECK",
    "NUMBA_CACHE_DIR",
    "NUMBA_DISABLE_JIT",
    "NUMBA_DEBUG_CACHE",
    "XDG_CACHE_HOME",
    "PYTHONDONTWRITEBYTECODE",
    "PYTHONWARNINGS",
)

PRELUDE = '''\
import json as _pf_json
import sys as _pf_sys
import warnings as _pf_warnings

import numpy as _pf_np

_pf_warnings.simplefilter("always")


def _pf_showwarning(message, category, filename, lineno, file=None, line=None):
    rec = {"category": category.__name__, "message": str(message)}
    print("PFWARNING " + _pf_json.dumps(rec), file=_pf_sys.stderr, flush=True)


_pf_warnings.showwarning = _pf_showwarning


def _pf_plain(value):
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        a = _pf_np.asarray(value)
        flat = a.reshape(-1)
        data = {"re": flat.real.tolist(), "im": flat.imag.tolist()} if a.dtype.kind == "c" \\
            else flat.tolist()
        return {"__array__": True, "dtype": a.dtype.name, "shape": list(a.shape), "data": data}
    if isinstance(value, (list, tuple)):
        return [_pf_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _pf_plain(v) for k, v in value.items()}
    return value


def emit(tag, value):
    """Send ``value`` (JSON-able, arrays allowed) to the parent test under ``tag``."""
    print("PFRESULT " + _pf_json.dumps({"tag": tag, "value": _pf_plain(value)}), flush=True)

'''


def _decode(value: Any) -> Any:
    if isinstance(value, dict) and value.get("__array__"):
        data = value["data"]
        if isinstance(data, dict):
            flat = np.asarray(data["re"], np.float64) + 1j * np.asarray(data["im"], np.float64)
        else:
            flat = np.asarray(data)
        return flat.astype(value["dtype"]).reshape(value["shape"])
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if isinstance(value, dict):
        return {k: _decode(v) for k, v in value.items()}
    return value


@dataclasses.dataclass
class ProcResult:
    """What a child process did: its command, exit status, output and duration.

    Example:
        >>> r = ProcResult(["python", "x.py"], -11, "", "", 0.5)
        >>> r.crashed, r.signal_name
        (True, 'SIGSEGV')
        >>> ProcResult(["python"], 1, "", "corrupted size vs. prev_size", 0.1).crashed
        True
        >>> ProcResult(["python"], 0, 'PFRESULT {"tag": "y", "value": 3}', "", 0.1).results()
        {'y': 3}
    """

    cmd: list[str]
    returncode: int | None
    stdout: str
    stderr: str
    elapsed: float
    timed_out: bool = False
    label: str = ""

    @property
    def signal_name(self) -> str | None:
        """Name of the signal that killed the child (``None`` when it exited)."""
        if self.returncode is None or self.returncode >= 0:
            return None
        try:
            return signal.Signals(-self.returncode).name
        except ValueError:
            return f"signal {-self.returncode}"

    @property
    def crash_markers(self) -> list[str]:
        """The heap-corruption / fatal-error texts found in the child's output."""
        text = self.stdout + self.stderr
        return [m for m in CRASH_MARKERS if m in text]

    @property
    def crashed(self) -> bool:
        """Killed by a signal, or printed a memory-corruption or fatal-error message."""
        return self.signal_name is not None or bool(self.crash_markers)

    def results(self) -> dict[str, Any]:
        """``tag -> value`` for every ``emit`` of the child (arrays rebuilt as NumPy)."""
        out = {}
        for line in self.stdout.splitlines():
            if line.startswith("PFRESULT "):
                rec = json.loads(line[len("PFRESULT ") :])
                out[rec["tag"]] = _decode(rec["value"])
        return out

    def warnings(self, category: str | None = None) -> list[dict[str, str]]:
        """Warnings the child reported (``category`` filters on the class name)."""
        out = []
        for line in self.stderr.splitlines():
            if line.startswith("PFWARNING "):
                rec = json.loads(line[len("PFWARNING ") :])
                if category is None or rec["category"] == category:
                    out.append(rec)
        return out

    def describe(self, limit: int = 6000) -> str:
        """A report of the run for a failure message, with the output quoted (tail)."""
        if self.timed_out:
            status = f"timed out after {self.elapsed:.0f} s"
        elif self.signal_name:
            status = f"killed by {self.signal_name} (return code {self.returncode})"
        else:
            status = f"exit status {self.returncode}"
        if self.crash_markers:
            status += f"; crash text in output: {self.crash_markers}"

        def tail(text):
            text = text.rstrip()
            return text if len(text) <= limit else "[...]\n" + text[-limit:]

        label = f" [{self.label}]" if self.label else ""
        return (
            f"child process{label} {status}\ncommand: {' '.join(self.cmd)}\n"
            f"--- stdout ---\n{tail(self.stdout)}\n--- stderr ---\n{tail(self.stderr)}\n---"
        )


def child_env(
    cache_dir: str | None,
    *,
    hashseed: int | str = 0,
    pythonpath: Iterable[str] = (),
    extra: Mapping[str, str | None] | None = None,
) -> dict[str, str]:
    """The environment for a child: CPU JAX, this checkout's primforge, a given cache folder.

    Args:
        cache_dir: value of ``PRIMFORGE_CACHE_DIR`` (``None``: leave it unset).
        hashseed: ``PYTHONHASHSEED``.
        pythonpath: folders put before this checkout on ``PYTHONPATH``.
        extra: more variables; a ``None`` value removes the variable.

    Example:
        >>> env = child_env("/tmp/c", hashseed=3, extra={"NUMBA_BOUNDSCHECK": "1"})
        >>> env["PRIMFORGE_CACHE_DIR"], env["PYTHONHASHSEED"], env["JAX_PLATFORMS"]
        ('/tmp/c', '3', 'cpu')
        >>> env["PYTHONPATH"].split(os.pathsep)[-1] == ROOT
        True
    """
    env = {k: v for k, v in os.environ.items() if k not in _SCRUB}
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONHASHSEED"] = str(hashseed)
    env["PYTHONFAULTHANDLER"] = "1"  # a signal prints the Python stack before dying
    env["PYTHONPATH"] = os.pathsep.join([*pythonpath, ROOT])
    if cache_dir is not None:
        env["PRIMFORGE_CACHE_DIR"] = str(cache_dir)
    for k, v in (extra or {}).items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = str(v)
    return env


def write_script(folder: str, name: str, body: str) -> str:
    """Write :data:`PRELUDE` + the dedented ``body`` to ``folder/name``; return the path.

    Example:
        >>> import tempfile
        >>> p = write_script(tempfile.mkdtemp(), "s.py", "emit('x', 1)")
        >>> import pathlib
        >>> pathlib.Path(p).read_text().endswith("emit('x', 1)\\n")
        True
    """
    path = os.path.join(folder, name)
    with open(path, "w", encoding="utf-8") as f:
        f.write(PRELUDE + textwrap.dedent(body).strip("\n") + "\n")
    return path


def edit_file(path: str, text: str) -> None:
    """Rewrite a source file as an editor would, with a modification time clearly later.

    The time is moved at least two seconds past the old one, so that Python's own bytecode
    cache (which compares whole seconds and the size) cannot mistake the new file for the
    old; whatever primforge caches must then notice the change by itself.

    Example:
        >>> import tempfile
        >>> import pathlib, tempfile
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "m.py"
        >>> _ = p.write_text("A = 1\\n")
        >>> before = p.stat().st_mtime
        >>> edit_file(str(p), "A = 22\\n")
        >>> p.stat().st_mtime >= before + 2, p.read_text()
        (True, 'A = 22\\n')
    """
    old = os.stat(path).st_mtime if os.path.exists(path) else time.time()
    with open(path, "w", encoding="utf-8") as f:
        f.write(textwrap.dedent(text))
    new = max(old + 2, time.time())
    os.utime(path, (new, new))


def run_python(
    script: str | None = None,
    *,
    code: str | None = None,
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    timeout: float = 120,
    label: str = "",
) -> ProcResult:
    """Run a script file (or ``code`` with ``-c``) in a fresh interpreter; never raises.

    Example:
        >>> r = run_python(code="import sys; print('hi'); sys.exit(3)", env=child_env(None))
        >>> r.returncode, r.stdout.strip(), r.crashed
        (3, 'hi', False)
        >>> run_python(code="import os; os.abort()", env=child_env(None)).signal_name
        'SIGABRT'
    """
    if (script is None) == (code is None):
        raise TypeError("give exactly one of script= and code=")
    cmd = [sys.executable, script] if script is not None else [sys.executable, "-c", code]
    cmd += [str(a) for a in args]
    start = time.monotonic()
    try:
        proc = subprocess.run(
            cmd,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as e:

        def text(b):
            return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")

        return ProcResult(
            cmd, None, text(e.stdout), text(e.stderr), time.monotonic() - start, True, label
        )
    return ProcResult(
        cmd, proc.returncode, proc.stdout, proc.stderr, time.monotonic() - start, False, label
    )


def run_concurrently(jobs: Sequence[Mapping[str, Any]]) -> list[ProcResult]:
    """Start every job (keyword arguments of :func:`run_python`) at once; results in order.

    Example:
        >>> rs = run_concurrently([dict(code=f"print({i})", env=child_env(None)) for i in (1, 2)])
        >>> [r.stdout.strip() for r in rs]
        ['1', '2']
    """
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(jobs))) as pool:
        futures = [pool.submit(run_python, **job) for job in jobs]
        return [f.result() for f in futures]


def check(result: ProcResult, what: str = "") -> ProcResult:
    """Fail the current test (quoting the output) unless the child exited cleanly with 0.

    A signal, a heap-corruption message, a timeout and a non-zero exit are each reported
    as such, so a crash is never mistaken for a wrong value or lost with the test runner.

    Example:
        >>> import pytest
        >>> check(ProcResult(["python"], 0, "fine", "", 0.1)).stdout
        'fine'
        >>> with pytest.raises(pytest.fail.Exception, match="CRASH: run 2"):
        ...     check(ProcResult(["python"], -7, "", "", 0.1), "run 2")
    """
    import pytest

    if result.timed_out or result.crashed or result.returncode != 0:
        kind = (
            "TIMEOUT" if result.timed_out else "CRASH" if result.crashed else "ERROR"
        )
        head = f"{kind}{': ' + what if what else ''}"
        pytest.fail(f"{head}\n{result.describe()}", pytrace=False)
    return result


class WorkerCrashed(Exception):
    """The persistent worker died (or hung) while answering a request; ``.result`` says how."""

    def __init__(self, result: ProcResult, request: Any):
        self.result = result
        self.request = request
        super().__init__(f"worker died on request {request!r}\n{result.describe()}")


class Worker:
    """A persistent child answering one JSON request per line with one ``PFREPLY`` line.

    The script reads requests from stdin and prints ``PFREPLY <json>`` per request. If the
    child dies or hangs, :meth:`request` raises :class:`WorkerCrashed` carrying the exit
    status and the output of that request, and the next request starts a fresh child, so
    one crashing case is reported with its input and the rest still run.

    Example:
        >>> import tempfile
        >>> src = ("import json, os, sys\\n"
        ...        "for line in sys.stdin:\\n"
        ...        "    n = json.loads(line)\\n"
        ...        "    if n < 0: os.abort()\\n"
        ...        "    print('PFREPLY ' + json.dumps(2 * n), flush=True)\\n")
        >>> path = os.path.join(tempfile.mkdtemp(), "w.py")
        >>> with open(path, "w") as f:
        ...     _ = f.write(src)
        >>> w = Worker(path, env=child_env(None))
        >>> w.request(21)
        42
        >>> try:
        ...     w.request(-1)
        ... except WorkerCrashed as e:
        ...     print(e.result.signal_name)
        SIGABRT
        >>> w.request(5)
        10
        >>> w.close()
    """

    def __init__(self, script: str, *, env: Mapping[str, str], cwd: str | None = None):
        self.script, self.env, self.cwd = script, dict(env), cwd
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def _start(self) -> None:
        import queue
        import tempfile
        import threading

        self.stderr = tempfile.TemporaryFile(mode="w+b")  # noqa: SIM115 (closed by close())
        self.proc = subprocess.Popen(
            [sys.executable, self.script],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            env=self.env,
            cwd=self.cwd,
            text=True,
            errors="replace",
            bufsize=1,
        )
        self.starts += 1
        self.lines: queue.Queue = queue.Queue()

        def pump(stream, q):
            for line in stream:
                q.put(line)
            q.put(None)

        self.pump = threading.Thread(target=pump, args=(self.proc.stdout, self.lines), daemon=True)
        self.pump.start()

    def _stderr_since(self, pos: int) -> str:
        self.stderr.flush()
        self.stderr.seek(pos)
        return self.stderr.read().decode(errors="replace")

    def request(self, obj: Any, timeout: float = 300) -> Any:
        """Send ``obj`` (JSON-able); return the decoded reply or raise :class:`WorkerCrashed`."""
        import queue

        if self.proc is None or self.proc.poll() is not None:
            self.close()
            self._start()
        self.stderr.seek(0, os.SEEK_END)
        err_pos = self.stderr.tell()
        start = time.monotonic()
        noise = []
        try:
            self.proc.stdin.write(json.dumps(obj) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # reported below from the exit status
        timed_out = False
        while True:
            left = timeout - (time.monotonic() - start)
            try:
                line = self.lines.get(timeout=max(left, 0.01))
            except queue.Empty:
                timed_out = True
                self.proc.kill()
                break
            if line is None:
                break
            if line.startswith("PFREPLY "):
                return json.loads(line[len("PFREPLY ") :])
            noise.append(line)
        try:
            rc = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        result = ProcResult(
            [sys.executable, self.script],
            None if timed_out else rc,
            "".join(noise),
            self._stderr_since(err_pos),
            time.monotonic() - start,
            timed_out,
            "persistent worker",
        )
        self._close_pipes()
        self.proc = None
        raise WorkerCrashed(result, obj)

    def _close_pipes(self) -> None:
        self.pump.join(timeout=10)  # the child is gone: its stdout reaches EOF
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass

    def close(self) -> None:
        """Stop the child (if running)."""
        if self.proc is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self._close_pipes()
            self.proc = None
        if getattr(self, "stderr", None) is not None:
            self.stderr.close()
            self.stderr = None
