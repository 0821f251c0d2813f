"""Run one rank's script; on failure, exit at once with its code (run by file path).

``python _rank.py SCRIPT ARGS...`` runs SCRIPT as ``__main__``. If it raises, or exits with
a nonzero code, the traceback (or message) is printed and the process ends with
``os._exit``: ``jax.distributed`` would otherwise hold the exit in its shutdown barrier,
waiting for ranks that may never arrive, and the launcher could not see the failure.
Only the standard library is used, so nothing is imported before the script's own imports.
"""

import os
import runpy
import sys
import traceback


def _flush_and_exit(code: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def main() -> None:
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
