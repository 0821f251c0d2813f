"""What the wheel must not contain: a test runner or release tooling.

``python tools/wheel_contents.py WHEEL`` prints what it checked and exits 1, naming the
files, when the wheel holds any of:

- a path with ``gpu_acceptance`` in it (the GPU acceptance command lives in ``tools/``);
- a pytest plugin module (``*_pytest_plugin*``) or a ``conftest.py``;
- anything under a ``tests/`` folder;
- a ``.py`` file that imports pytest (``import pytest`` / ``from pytest``, at any indent).

``tools/check_wheel.sh`` and ``tests/test_packaging.py`` both call :func:`problems`.
"""

from __future__ import annotations

import re
import sys
import zipfile
from pathlib import PurePosixPath

#: What is checked, in the words printed.
CHECKS = ("paths containing 'gpu_acceptance'", "pytest plugin modules (*_pytest_plugin*)",
          "conftest.py", "files under a tests/ folder", ".py files that import pytest")

_IMPORTS_PYTEST = re.compile(rb"^(import pytest|from pytest|\s+import pytest)", re.MULTILINE)


def problems(wheel: str | zipfile.ZipFile) -> list[str]:
    """``"path: why"`` for each file of ``wheel`` (a path or an open zip) that is a test
    runner or release tooling; empty when there is none."""
    zf = wheel if isinstance(wheel, zipfile.ZipFile) else zipfile.ZipFile(wheel)
    found = []
    for name in sorted(zf.namelist()):
        path = PurePosixPath(name)
        if "gpu_acceptance" in name:
            found.append(f"{name}: release tooling (gpu_acceptance)")
        elif "_pytest_plugin" in path.name:
            found.append(f"{name}: a pytest plugin module")
        elif path.name == "conftest.py":
            found.append(f"{name}: a conftest.py")
        elif "tests" in path.parts[:-1]:
            found.append(f"{name}: under a tests/ folder")
        elif name.endswith(".py") and _IMPORTS_PYTEST.search(zf.read(name)):
            found.append(f"{name}: imports pytest")
    return found


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python tools/wheel_contents.py WHEEL", file=sys.stderr)
        return 2
    with zipfile.ZipFile(argv[0]) as zf:
        count = len(zf.namelist())
        found = problems(zf)
    print(f"checked {count} files of {argv[0]} for: " + "; ".join(CHECKS))
    if found:
        print("the wheel contains a test runner or release tooling:")
        for line in found:
            print(f"  {line}")
        return 1
    print("no test runner or release tooling in the wheel")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
