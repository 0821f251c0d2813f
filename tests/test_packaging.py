"""Packaging: the wheel ships every module and every run-time source file, and the version
is written in one place.

The wheel is built (not installed) into a temporary folder with ``python -m build
--no-isolation``, and its file list is compared with the source tree. Installing it into a
fresh virtual environment and running the quickstart is slower and needs the network; it
is described in CHANGELOG.md's release checklist and was checked by hand.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

import primforge

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "primforge"


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _build_requirements_met() -> str | None:
    """Why the wheel cannot be built without isolation here (None when it can)."""
    if importlib.util.find_spec("build") is None:
        return "the 'build' package is not installed (pip install build)"
    import setuptools

    for req in _pyproject()["build-system"]["requires"]:
        m = re.fullmatch(r"setuptools>=(\d+)", req.replace(" ", ""))
        have = int(setuptools.__version__.split(".")[0])
        if m and have < int(m.group(1)):
            return f"setuptools {setuptools.__version__} is older than the build needs ({req})"
    return None


def _tracked_files() -> list[str] | None:
    proc = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                          check=False)
    return proc.stdout.split() if proc.returncode == 0 and proc.stdout.strip() else None


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    why = _build_requirements_met()
    if why:
        pytest.skip(why)
    # Build from a copy of the tracked files: what a release is built from, and the
    # source tree gets no build residue (egg-info, build/).
    src = tmp_path_factory.mktemp("src")
    tracked = _tracked_files()
    if tracked is None:  # pragma: no cover - an unpacked source archive
        shutil.copytree(ROOT, src, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
    else:
        for rel in tracked:
            if (ROOT / rel).is_file():
                (src / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / rel, src / rel)
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out),
         str(src)],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (path,) = out.glob("primforge-*.whl")
    return zipfile.ZipFile(path)


def _source_files() -> set[str]:
    """Every file under primforge/ a user needs (tracked by git, or on disk)."""
    files = _tracked_files()
    if files is None:  # pragma: no cover - an unpacked source archive
        files = [str(p.relative_to(ROOT)) for p in PACKAGE.rglob("*") if p.is_file()]
    return {f for f in files if f.startswith("primforge/") and "__pycache__" not in f}


def test_wheel_ships_every_module_and_every_csrc_source(wheel):
    names = set(wheel.namelist())
    source = _source_files()
    assert any(f.startswith("primforge/ops/csr/csrc/") for f in source)  # the check is not vacuous
    missing = sorted(source - names)
    assert not missing, f"files of the source tree missing from the wheel: {missing}"
    assert "primforge/py.typed" in names


def test_wheel_metadata_version_and_console_script(wheel):
    meta_name = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    meta = wheel.read(meta_name).decode()
    version = re.search(r"^Version: (.+)$", meta, re.MULTILINE).group(1).strip()
    assert version == primforge.__version__
    entry = wheel.read(meta_name.replace("METADATA", "entry_points.txt")).decode()
    assert re.search(r"^primforge\s*=\s*primforge\.cli:main$", entry, re.MULTILINE)
    requires = re.findall(r"^Requires-Dist: (.+)$", meta, re.MULTILINE)
    assert any(r.startswith("jax") for r in requires)


def test_version_is_written_once():
    project = _pyproject()["project"]
    assert "version" not in project and "version" in project.get("dynamic", [])
    dynamic = _pyproject()["tool"]["setuptools"]["dynamic"]["version"]
    assert dynamic == {"attr": "primforge.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+([ab]|rc|\.dev|\.post)?\d*", primforge.__version__)
    # The changelog's newest released section (if any) is not newer than the code.
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert "## [Unreleased]" in changelog


def test_installed_metadata_matches_the_package():
    # pip records where it installed from; build metadata lying in the source tree
    # (primforge.egg-info) has no such record and may be stale, so it is not considered.
    ours = [
        d for d in importlib.metadata.distributions(name="primforge")
        if str(ROOT) in (d.read_text("direct_url.json") or "")
    ]
    if not ours:
        pytest.skip("primforge was not pip-installed from this source tree (running from source)")
    for dist in ours:
        assert dist.version == primforge.__version__


def _wheel_contents():
    """tools/wheel_contents.py, the checker tools/check_wheel.sh runs, loaded by path."""
    path = ROOT / "tools" / "wheel_contents.py"
    spec = importlib.util.spec_from_file_location("primforge_wheel_contents", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_wheel_holds_no_test_runner_or_release_tooling(wheel):
    assert _wheel_contents().problems(wheel) == []


def test_the_wheel_check_finds_planted_tooling(tmp_path):
    planted = tmp_path / "primforge-0.0.0-py3-none-any.whl"
    with zipfile.ZipFile(planted, "w") as zf:
        zf.writestr("primforge/__init__.py", "import jax\n")
        zf.writestr("primforge/gpu_acceptance/_driver.py", "import os\n")
        zf.writestr("primforge/_pytest_plugin.py", "")
        zf.writestr("primforge/tests/test_x.py", "")
        zf.writestr("conftest.py", "")
        zf.writestr("primforge/helpers.py", "def f():\n    import pytest\n")
    checker = _wheel_contents()
    found = checker.problems(str(planted))
    assert [line.split(":")[0] for line in found] == [
        "conftest.py", "primforge/_pytest_plugin.py", "primforge/gpu_acceptance/_driver.py",
        "primforge/helpers.py", "primforge/tests/test_x.py"]
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "wheel_contents.py"),
                           str(planted)], capture_output=True, text=True, check=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "primforge/gpu_acceptance/_driver.py" in proc.stdout
    assert "checked 6 files" in proc.stdout
