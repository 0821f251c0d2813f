"""The default tier keeps, of every large parametrized matrix, cases that cover each token
of the case ids; the rest is marked ``exhaustive`` (its pairwise part runs with
``-m "exhaustive and not beyond_pairs"``)."""

from __future__ import annotations

import importlib.util
import itertools
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

# This directory's conftest, by path (another conftest module may hold the name).
_spec = importlib.util.spec_from_file_location("_tiers_conftest",
                                               Path(__file__).with_name("conftest.py"))
conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(conftest)


def _fake(ids):
    return [types.SimpleNamespace(callspec=types.SimpleNamespace(id=i)) for i in ids]


def test_the_subset_covers_every_token_of_a_full_product():
    ids = ["-".join(p) for p in itertools.product(
        ["csrmv", "binary_csrmv", "csrmm"], ["pallas", "cuda_raw", "numba"],
        ["float32", "float64"], ["T", "N"])]
    items = _fake(ids)
    chosen = conftest._covering_subset(items)
    every = set().union(*(conftest._tokens(i) for i in items))
    assert set().union(*(conftest._tokens(i) for i in chosen)) == every
    assert len(chosen) < len(items) // 4    # the point of the tier: far fewer cases
    assert chosen == conftest._covering_subset(items)   # deterministic


def test_the_pairwise_part_of_the_exhaustive_tier_runs_every_pair_of_values():
    levels = [["csrmv", "binary_csrmv", "csrmm"], ["pallas", "cuda_raw", "numba"],
              ["float32", "float64"], ["T", "N"]]
    items = _fake(["-".join(p) for p in itertools.product(*levels)])
    kept = conftest._covering_subset(items)
    rest = [i for i in items if i not in kept]
    chosen = conftest._pair_cover(rest, kept)
    ran = [tuple(i.callspec.id.split("-")) for i in [*kept, *chosen]]
    # Every two parameters, every two of their values: some case runs them together.
    for (a, la), (b, lb) in itertools.combinations(enumerate(levels), 2):
        assert {(r[a], r[b]) for r in ran} == set(itertools.product(la, lb)), (a, b)
    assert len(kept) + len(chosen) <= len(items) // 2   # yet far fewer than all 36
    assert chosen == conftest._pair_cover(rest, kept)   # deterministic
    # A value in another position is another value: (False, True) is not (True, False).
    flags = _fake(["-".join(p) for p in itertools.product(["False", "True"], repeat=3)])
    two = conftest._pair_cover(flags, [])
    pairs = {(r[a], r[b], a, b) for r in (tuple(i.callspec.id.split("-")) for i in two)
             for a, b in itertools.combinations(range(3), 2)}
    assert len(pairs) == 12


def test_cases_with_one_token_each_are_all_kept():
    items = _fake([f"case{i}" for i in range(10)])
    assert len(conftest._covering_subset(items)) == 10


def _run(tmp_path, *args):
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-p", "no:xdist", *args], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, check=False)
    return proc.stdout.strip().splitlines()[-1]


def test_collection_marks_only_the_rest_of_large_matrices(tmp_path):
    (tmp_path / "conftest.py").write_text(Path(conftest.__file__).read_text())
    (tmp_path / "test_m.py").write_text(textwrap.dedent("""
        import pytest
        @pytest.mark.parametrize("a", ["x", "y", "z"])
        @pytest.mark.parametrize("b", ["p", "q", "r"])
        def test_big(a, b): pass
        @pytest.mark.parametrize("a", [1, 2])
        def test_small(a): pass
        def test_plain(): pass
        def test_cli_check_passes_for_the_demo_kernels(): pass
    """))
    # 3 cases cover x, y, z and p, q, r; the small matrix and the plain test stay whole;
    # a named sweep goes to the exhaustive tier.
    assert _run(tmp_path, "-m", "not exhaustive").startswith("6 passed, 7 deselected")
    assert _run(tmp_path, "-m", "exhaustive").startswith("7 passed, 6 deselected")
    assert _run(tmp_path).startswith("13 passed")
    # Of the 6 exhaustive cases of test_big, the pairs (a, b) are all distinct: every one
    # runs in the pairwise part of the tier, and nothing is beyond it.
    assert _run(tmp_path, "-m", "beyond_pairs").startswith("13 deselected")


def test_cases_a_file_marks_exhaustive_cover_nothing_for_the_default_tier(tmp_path):
    (tmp_path / "conftest.py").write_text(Path(conftest.__file__).read_text())
    (tmp_path / "test_m.py").write_text(textwrap.dedent("""
        import pytest
        slow = pytest.mark.exhaustive
        @pytest.mark.parametrize("a,b", [
            pytest.param("x", "p", marks=slow), ("x", "q"), ("y", "p"), ("y", "q"),
            ("y", "r"), pytest.param("z", "r", marks=slow)])
        def test_big(a, b): pass
    """))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "--co", "-p",
                           "no:cacheprovider", "-p", "no:xdist", "-m", "not exhaustive"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          check=False)
    kept = sorted(line.split("[")[1].rstrip("]") for line in proc.stdout.splitlines()
                  if "::test_big[" in line)
    # The two marked cases stay out; of the other four, three cover x, y, p, q and r (a
    # cover counting the marked cases would have kept x-p, y-q and z-r, and so run y-q
    # alone: x, p and r in no case).
    assert len(kept) == 3, proc.stdout
    assert {v for k in kept for v in k.split("-")} == {"x", "y", "p", "q", "r"}, kept


def test_cases_whose_pairs_other_cases_run_are_marked_beyond_pairs(tmp_path):
    (tmp_path / "conftest.py").write_text(Path(conftest.__file__).read_text())
    (tmp_path / "test_m.py").write_text(textwrap.dedent("""
        import pytest
        @pytest.mark.parametrize("c", ["u", "v"])
        @pytest.mark.parametrize("b", ["p", "q"])
        @pytest.mark.parametrize("a", ["x", "y"])
        def test_big(a, b, c): pass
    """))

    def ids(marks):
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "--co", "-p",
                               "no:cacheprovider", "-p", "no:xdist", "-m", marks],
                              cwd=tmp_path, capture_output=True, text=True, timeout=120,
                              check=False)
        return [line.split("[")[1].rstrip("]").split("-")
                for line in proc.stdout.splitlines() if "::test_big[" in line]

    default, ci, beyond = (ids(m) for m in (
        "not exhaustive", "exhaustive and not beyond_pairs", "beyond_pairs"))
    assert len(default) + len(ci) + len(beyond) == 8
    assert len(default) == 2 and beyond   # two cases show each value; some add no pair
    ran = default + ci
    for a, b in itertools.combinations(range(3), 2):
        assert len({(r[a], r[b]) for r in ran}) == 4, (a, b)


def test_with_workers_each_file_runs_on_one_worker_and_files_spread(tmp_path):
    """xdist's default distribution hands a file's tests to both workers, and each built
    the file's module-scoped fixture (and compiled the kernels the tests share); the
    conftest's scheduler keeps each file on one worker, and the files on both."""
    (tmp_path / "conftest.py").write_text(Path(conftest.__file__).read_text())
    record = textwrap.dedent("""
        import os, pathlib, pytest
        def record(name):
            with open(pathlib.Path(os.environ["RECORDS"]) / name, "a") as f:
                f.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")
    """)
    (tmp_path / "test_built.py").write_text(record + textwrap.dedent("""
        @pytest.fixture(scope="module")
        def built():
            record("builds")
        @pytest.mark.parametrize("i", range(6))
        def test_uses_it(built, i): pass
    """))
    (tmp_path / "test_plain.py").write_text(record + textwrap.dedent("""
        @pytest.mark.parametrize("i", range(6))
        def test_plain(i):
            record("plain")
    """))
    records = tmp_path / "records"
    records.mkdir()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-n", "2"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, check=False, env={**os.environ, "RECORDS": str(records)})
    assert proc.stdout.strip().splitlines()[-1].startswith("12 passed"), proc.stdout
    assert len((records / "builds").read_text().split()) == 1  # one worker built it
    plain = set((records / "plain").read_text().split())
    assert len(plain) == 1  # a parametrized test without a fixture: one worker too
    assert plain | set((records / "builds").read_text().split()) == {"gw0", "gw1"}


def test_an_installed_benchmark_plugin_does_not_stop_a_run_with_workers(tmp_path):
    """pytest-benchmark (installed on some machines, unused here) warns at configure time
    when xdist is active, and the suite's warnings-as-errors turned that into an internal
    error of every run; the suite's options leave that plugin out."""
    site = tmp_path / "site"
    dist = site / "fakebench-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fakebench\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[pytest11]\nbenchmark = fakebench_plugin\n")
    (site / "fakebench_plugin.py").write_text(textwrap.dedent("""
        import warnings
        import pytest
        def pytest_configure(config):
            if config.pluginmanager.hasplugin("xdist"):
                warnings.warn(pytest.PytestWarning("benchmarks are disabled under xdist"))
    """))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(site), os.environ.get("PYTHONPATH")]))}
    root = Path(__file__).resolve().parents[1]
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
           "tests/test_tiers.py::test_cases_with_one_token_each_are_all_kept"]
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=300,
                          check=False, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # The plugin is really there: asked for by name, it is loaded and its warning fails.
    proc = subprocess.run([*cmd, "-p", "fakebench_plugin"], cwd=root, capture_output=True,
                          text=True, timeout=300, check=False, env=env)
    assert proc.returncode != 0 and "benchmarks are disabled" in proc.stdout + proc.stderr


def test_the_classic_cpu_emitters_flag_is_added_only_where_xla_accepts_it(monkeypatch):
    calls = []

    def accepts(answer):
        def probe(flags):
            calls.append(flags)
            return answer
        return probe

    monkeypatch.delenv("PRIMFORGE_TEST_XLA_DEFAULTS", raising=False)
    monkeypatch.setenv("XLA_FLAGS", "--xla_foo=1")
    monkeypatch.setattr(conftest, "_xla_accepts", accepts(False))
    conftest._use_classic_cpu_emitters()
    assert os.environ["XLA_FLAGS"] == "--xla_foo=1"  # refused: left as it was
    monkeypatch.setattr(conftest, "_xla_accepts", accepts(True))
    conftest._use_classic_cpu_emitters()
    assert os.environ["XLA_FLAGS"] == f"--xla_foo=1 {conftest.XLA_TEST_FLAG}"
    assert calls == [os.environ["XLA_FLAGS"]] * 2  # the whole line is what is tried
    conftest._use_classic_cpu_emitters()  # already there: not tried again
    assert len(calls) == 2 and os.environ["XLA_FLAGS"].count("fusion_emitters") == 1
    monkeypatch.setenv("XLA_FLAGS", "")
    monkeypatch.setenv("PRIMFORGE_TEST_XLA_DEFAULTS", "1")
    conftest._use_classic_cpu_emitters()  # asked for XLA's defaults
    assert os.environ["XLA_FLAGS"] == "" and len(calls) == 2


def test_the_probe_refuses_a_flag_xla_does_not_know():
    assert not conftest._xla_accepts("--xla_no_such_flag_anywhere=1")  # XLA aborts on it
    assert conftest._xla_accepts("")
