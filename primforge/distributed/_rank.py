"""Run one rank's script; on failure, exit at once with its code (run by file path).

``python _rank.py SCRIPT ARGS...`` runs SCRIPT as ``__main__``. If it raises, or exits with
a nonzero code, the traceback (or message) is printed and the process ends with
``os._exit``: ``jax.distributed`` would otherwise hold the exit in its shutdown barrier,
waiting for ranks that may never arrive, and the launcher could not see the failure.
On Linux the rank also asks the kernel for ``SIGKILL`` when the launcher dies
(``PR_SET_PDEATHSIG``), so that a launcher killed without a chance to stop its ranks does
not leave them running. Only the standard library is used, so nothing is imported before
the script's own imports.
"""

import os
import runpy
import signal
import sys
import traceback

#: Set by the launcher to its pid (the same name as ``_launch.LAUNCHER_PID``; this file
#: runs by path and imports nothing of primforge).
LAUNCHER_PID = "PRIMFORGE_LAUNCHER_PID"
_PR_SET_PDEATHSIG = 1


def _end_with_the_launcher() -> None:
    """``SIGKILL`` to this process when its parent, the launcher, dies (Linux)."""
    launcher = os.environ.pop(LAUNCHER_PID, "")
    if not launcher.isdigit() or not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGKILL), ctypes.c_ulong(0),
                      ctypes.c_ulong(0), ctypes.c_ulong(0)) != 0:
            return
    except (OSError, AttributeError):  # no C library to ask: the launcher stops the rank
        return
    if os.getppid() != int(launcher):  # it died before the request: nobody would stop us
        os.kill(os.getpid(), signal.SIGKILL)


def _flush_and_exit(code: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def main() -> None:
    _end_with_the_launcher()
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        code = e.code
        if code is None or code == 0:
            raise
        if not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
        _flush_and_exit(code)
    except BaseException:  # noqa: BLE001 - reported, then the rank ends with code 1
        traceback.print_exc()
        _flush_and_exit(1)


if __name__ == "__main__":
    main()
