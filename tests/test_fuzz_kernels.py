"""Hypothesis fuzz: a primitive's Numba backend against its ``jax`` backend, in a worker process.

Random cases (op, dtype, rank 0-5 with zero-size dimensions, the layout the input is made
with under ``jax.jit``, optional ``jax.vmap`` with a batched or unbatched second input)
run in a persistent child (:mod:`fuzz_worker`), so a case that crashes the process is a
test failure naming the case, not a dead test runner; the child is restarted for the next
one. Each case runs in two such children sharing one cache folder, the second after the
first and with its closure param values in another order, so what one process stored is
tried by another that compiled other values of the same kernel first. Bounded for the
normal suite: a fixed number of examples, derandomized, no shrinking
(set ``PRIMFORGE_FUZZ_EXAMPLES`` for a longer run).
"""

from __future__ import annotations

import os
import shutil

import pytest
from subproc_utils import Worker, WorkerCrashed, child_env

pytest.importorskip("numba", reason="the numba backend needs primforge[cpu]")
hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies

DTYPES = ["float32", "float64", "int32", "int64", "bool", "complex64", "float16"]
OPS = ["axpy", "square", "sum_all", "sum_last"]
LAYOUTS = ["contig", "transpose", "slice", "reverse", "broadcast"]
EXAMPLES = int(os.environ.get("PRIMFORGE_FUZZ_EXAMPLES", "30"))


@st.composite
def cases(draw):
    """One fuzz case (a JSON-able dict, see :mod:`fuzz_worker`)."""
    rank = draw(st.integers(0, 5))
    shape = draw(st.lists(st.integers(1, 6), min_size=rank, max_size=rank))
    if rank and draw(st.integers(0, 5)) == 0:  # about one case in six is empty
        shape[draw(st.integers(0, rank - 1))] = 0
    op = draw(st.sampled_from(OPS))
    if op == "sum_last" and rank == 0:
        op = "sum_all"
    layout = draw(st.sampled_from(LAYOUTS)) if rank else "contig"
    case = {
        "op": op,
        "dtype": draw(st.sampled_from(DTYPES)),
        "shape": shape,
        "layout": layout,
        "seed": draw(st.integers(0, 2**31 - 1)),
        "factors": draw(st.permutations([2, 3, 5])),
        "vmap": draw(st.none() | st.tuples(st.sampled_from([0, 1, 3]), st.booleans())),
    }
    if layout == "transpose":
        case["perm"] = draw(st.permutations(range(rank)))
    if layout in ("slice", "reverse", "broadcast"):
        case["axis"] = draw(st.integers(0, rank - 1))
    return case


@pytest.fixture(scope="module")
def workers(tmp_path_factory):
    """Two persistent workers sharing one cache folder: each case runs in the first, then in
    the second, which may find what the first compiled on disk."""
    cache = tmp_path_factory.mktemp("fuzz-cache")
    # A copy of the worker in a fresh folder: nothing a run leaves beside the script (by
    # Numba or anyone) is seen by the next run, and the checkout stays clean.
    folder = tmp_path_factory.mktemp("fuzz-src")
    here = os.path.dirname(os.path.abspath(__file__))
    script = str(folder / "fuzz_worker.py")
    shutil.copyfile(os.path.join(here, "fuzz_worker.py"), script)
    pair = [Worker(script, env=child_env(str(cache)), cwd=str(folder)) for _ in range(2)]
    yield pair
    for w in pair:
        w.close()


def _run(workers, case):
    case = dict(case)
    f1, f2, f3 = case.pop("factors")
    # The first process runs params f1, f2; the second f3 (not cached: compiled there), then
    # f1 (cached by the first process), as a user's second run with other values would.
    runs = [
        ("first process", workers[0], dict(case, factors=[f1, f2])),
        ("second process (shared cache)", workers[1], dict(case, factors=[f3, f1])),
    ]
    for which, worker, case in runs:
        try:
            reply = worker.request(case, timeout=240)
        except WorkerCrashed as e:
            kind = "TIMEOUT" if e.result.timed_out else "CRASH"
            pytest.fail(f"{kind} in the {which} on fuzz case {case}\n{e.result.describe()}",
                        pytrace=False)
        if not reply["ok"]:
            pytest.fail(f"MISMATCH in the {which} on fuzz case {case}: {reply['detail']}",
                        pytrace=False)


@hypothesis.settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],
    suppress_health_check=[hypothesis.HealthCheck.too_slow],
)
@hypothesis.given(case=cases())
# First, in two fresh processes: the second compiles param 2, then meets param 3 cached by
# the first (the README's generator, run twice with other values).
@hypothesis.example(
    case={"op": "axpy", "dtype": "float32", "shape": [4], "layout": "contig", "seed": 3,
          "factors": [3, 5, 2], "vmap": None}
)
@hypothesis.example(
    case={"op": "sum_last", "dtype": "float32", "shape": [3, 0, 2], "layout": "transpose",
          "perm": [2, 0, 1], "seed": 0, "factors": [2, 3, 5], "vmap": [0, False]}
)
@hypothesis.example(
    case={"op": "axpy", "dtype": "complex64", "shape": [2, 3, 1, 2, 2], "layout": "slice",
          "axis": 1, "seed": 1, "factors": [3, 5, 2], "vmap": [3, False]}
)
@hypothesis.example(
    case={"op": "square", "dtype": "float16", "shape": [], "layout": "contig", "seed": 2,
          "factors": [5, 2, 3], "vmap": [3, True]}
)
def test_numba_backend_matches_jax_backend(workers, case):
    """Numba and jax backends agree on random ops, dtypes, shapes and layouts, with vmap too."""
    _run(workers, case)
