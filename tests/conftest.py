"""Test-suite configuration."""

import itertools
import os
import pathlib
import re
import subprocess
import sys

import pytest

# --- XLA:CPU's classic emitters for the suite's programs --------------------------------
# A run compiles thousands of small XLA:CPU programs (the jax.numpy around the kernels, the
# references, eager calls); with XLA:CPU's classic emitters
# (``--xla_cpu_use_fusion_emitters=false``) each compiles in 60-75% of the time, and a
# whole run (default tier and pairwise part, 2 workers) took 1,016 s against 1,148 s.
# primforge's kernels are FFI calls, which the flag does not touch, and XLA:GPU compiles
# do not read it. It is added to ``XLA_FLAGS`` (and so reaches the workers and the tests'
# child processes that keep ``XLA_FLAGS``) only where the installed jaxlib accepts it: XLA
# aborts on a flag it does not know, so a child process tries it first.
# ``PRIMFORGE_TEST_XLA_DEFAULTS=1`` runs with XLA's defaults.
XLA_TEST_FLAG = "--xla_cpu_use_fusion_emitters=false"


def _xla_accepts(flags: str) -> bool:
    env = {**os.environ, "XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"}
    try:
        proc = subprocess.run([sys.executable, "-c", "import jax; jax.devices('cpu')"],
                              env=env, capture_output=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


def _use_classic_cpu_emitters() -> None:
    flags = os.environ.get("XLA_FLAGS", "")
    if (os.environ.get("PRIMFORGE_TEST_XLA_DEFAULTS", "") not in ("", "0")
            or "xla_cpu_use_fusion_emitters" in flags):
        return
    wanted = f"{flags} {XLA_TEST_FLAG}".strip()
    if _xla_accepts(wanted):
        os.environ["XLA_FLAGS"] = wanted


_use_classic_cpu_emitters()

# Scripts run in subprocesses (several simulated devices, several processes): they parse
# their own command line at import, so pytest must not import them for doctests.
collect_ignore_glob = ["sharding_scripts/*"]


def pytest_terminal_summary(terminalreporter):
    """How many functions XLA:GPU compiled, per backend and target (see gpu_utils)."""
    import sys

    gpu_utils = sys.modules.get("gpu_utils")
    if gpu_utils is None or not gpu_utils.COMPILED:
        return
    terminalreporter.section("XLA:GPU compiles (functions per backend and target)")
    targets = gpu_utils.GPU_TARGETS
    terminalreporter.write_line(f"{'backend':12s}" + "".join(f"{t:>8s}" for t in targets))
    for backend in sorted({b for b, _ in gpu_utils.COMPILED}):
        row = "".join(f"{gpu_utils.COMPILED[backend, t]:8d}" for t in targets)
        terminalreporter.write_line(f"{backend:12s}{row}")


# --- pytest-xdist: each test file on one worker ------------------------------------------
# xdist's default distribution spreads a file's tests over the workers, and every worker
# that runs one of them builds the file's module-scoped fixtures again (a subprocess, a
# simulation, a site build) and compiles again the Numba kernels its tests share (each
# variant is compiled once per process). With -n, each file goes to one worker as a whole;
# xdist hands out the files with the most tests first, so the run ends on small ones.


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "load":  # what -n N chooses unless told otherwise
        return None
    from xdist.scheduler import LoadFileScheduling

    return LoadFileScheduling(config, log)


# --- Two tiers: the default run and the exhaustive one -----------------------------------
# A test function parametrized over many cases keeps, in the default run, a subset that
# covers every token of its cases' ids (every backend, dtype, direction, event type, ...
# appears at least once); the other cases get the ``exhaustive`` marker. The default
# options deselect them (``-m "not exhaustive"``); ``-m exhaustive`` runs exactly those,
# and ``-m "exhaustive or not exhaustive"`` runs everything. The sweeps named in
# EXHAUSTIVE_SWEEPS go to the exhaustive tier whole, and a test file may mark tests
# ``exhaustive`` itself (the multi-process trust tests, the XLA:GPU compile sweeps and the
# GPU acceptance command's rehearsal keep one test of each kind in the default tier). CI
# runs the default tier.
# Of a matrix's exhaustive cases, those that run no parameter value and no pair of values
# (each value tagged with its position in the id) that no other kept case runs are also
# marked ``beyond_pairs``: ``-m "exhaustive and not beyond_pairs"`` runs the pairwise part,
# where every two parameters meet in every combination of their values, and ``-m
# exhaustive`` all of them together.

#: Parametrized functions with at most this many cases keep all of them in the default run.
SMALL_MATRIX = 3
#: Tests that sweep a whole family through one mechanism the default tier tests on its own:
#: ``primforge check`` over every kernel and backend of an operator family (tests/test_cli.py
#: covers the command; tests/test_ops_bench.py runs its comparison for the other families),
#: the multi-process fuzz of random kernels against the ``jax`` backend, the threaded CSR
#: backend hammered from many threads in a subprocess, and the XLA:GPU compiles of the
#: operators' gradients, JVPs and batched forms (the default tier compiles every variant
#: of every operator's GPU kernels for every target, plain and transposed).
EXHAUSTIVE_SWEEPS = re.compile(
    r"test_cli_check_passes_for_the_\w+_kernels$"
    r"|test_numba_backend_matches_jax_backend$"
    r"|test_parallel_backend_survives_concurrent_calls_in_a_subprocess$"
    r"|test_(grad|vmap|jvp|grad_jvp_and_vmap)_compiles?$"
    r"|test_the_real_gpu_tests_shapes_compile$"
    r"|test_grad_and_vmap_of_pallas_update_compile$")
_TOKEN_SPLIT = re.compile(r"[-_/,.:= \[\]]+")


def _tokens(item):
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return frozenset()
    return frozenset(t for t in _TOKEN_SPLIT.split(callspec.id) if t)


def _greedy_cover(items, features, covered=frozenset()):
    """Greedy choice among ``items`` of ones that together have every feature (a set per
    item, from ``features``) not in ``covered``; ties go to the earliest item."""
    uncovered = set().union(*(features(i) for i in items)) - covered
    chosen = []
    while uncovered:
        best = max(items, key=lambda i: (len(features(i) & uncovered), -items.index(i)))
        gain = features(best) & uncovered
        if not gain:
            break
        chosen.append(best)
        uncovered -= gain
    return chosen


def _covering_subset(items):
    """Greedy cover of the cases' id tokens (deterministic)."""
    return _greedy_cover(items, _tokens) or items[:1]


def _pairs(item):
    """The parameter values a case runs, alone and in pairs (ids split at their dashes, each
    part tagged with its position, so ``False`` as the first and as the third value differ):
    a case of a one-parameter matrix is a value of its own, which no other case runs."""
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return frozenset()
    parts = list(enumerate(callspec.id.split("-")))
    return frozenset([*((p,) for p in parts), *itertools.combinations(parts, 2)])


def _pair_cover(cases, kept):
    """Greedy choice among ``cases`` of the ones that run a parameter value, or a pair of
    values together, that no case of ``kept`` runs (deterministic)."""
    return _greedy_cover(cases, _pairs, frozenset().union(*(_pairs(i) for i in kept)))


_HERE = pathlib.Path(__file__).resolve().parent

#: The doctests of an optional backend's modules run where its package is installed.
DOCTESTS_NEED = {"warp.py": "warp", "triton.py": "triton", "_triton_ir.py": "triton",
                 "numba_cuda.py": "numba_cuda"}


def _skip_doctests_of_missing_backends(items):
    backends = _HERE.parent / "primforge" / "backends"
    found = [(item, DOCTESTS_NEED[item.path.name]) for item in items
             if item.path.name in DOCTESTS_NEED and type(item).__name__ == "DoctestItem"
             and item.path.parent == backends]
    if not found:  # no import of primforge (and JAX) for a run that has none of them
        return
    from primforge.backends._common import package_installed

    for item, package in found:
        if not package_installed(package):
            item.add_marker(pytest.mark.skip(
                reason=f"optional backend: its package {package!r} is not installed"))


def pytest_collection_modifyitems(config, items):
    _skip_doctests_of_missing_backends(items)
    groups = {}
    for item in items:
        if getattr(item, "callspec", None) is None:
            continue
        key = (item.nodeid.split("::")[0], getattr(item, "originalname", item.name))
        groups.setdefault(key, []).append(item)
    # A case its file marks exhaustive covers nothing for the default tier: the cover is
    # chosen among the others.
    marked = {id(i) for i in items if i.get_closest_marker("exhaustive") is not None}
    marker = pytest.mark.exhaustive
    for item in items:
        if EXHAUSTIVE_SWEEPS.search(getattr(item, "originalname", item.name)):
            item.add_marker(marker)
    beyond = pytest.mark.beyond_pairs
    for cases in groups.values():
        cases = [i for i in cases if id(i) not in marked]
        if len(cases) <= SMALL_MATRIX:
            continue
        kept = _covering_subset(cases)
        keep = {id(i) for i in kept}
        rest = [i for i in cases if id(i) not in keep]
        pairs = {id(i) for i in _pair_cover(rest, kept)}
        for item in rest:
            item.add_marker(marker)
            if id(item) not in pairs:
                item.add_marker(beyond)
