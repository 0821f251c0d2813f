"""benchmarks/coba_threads.py: the three ways it times run the same steps, and it says so."""

import pathlib
import subprocess

import numpy as np
import pytest
from _scripts import load_script

pytest.importorskip("numba")
ROOT = pathlib.Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.exhaustive  # compiles both fused kernels


@pytest.fixture(scope="module")
def bench():
    return load_script("benchmarks/coba_threads.py", "coba_threads")


@pytest.fixture(scope="module")
def coba(bench):
    """The example, loaded once for the file: its kernels compile once (a minute for the
    threaded one)."""
    return bench._example()


def test_the_three_ways_run_the_same_steps_and_a_difference_is_caught(monkeypatch, bench,
                                                                      coba):
    settled, outputs, ways = bench.runners(coba, 1, 300)
    assert tuple(ways) == bench.WAYS
    results = []
    for way in bench.WAYS:
        out = outputs(40)
        ways[way]([x.copy() for x in settled], out)
        results.append(out)
    assert results[0][4].any()  # neurons fire in these steps
    for other in results[1:]:
        for got, want in zip(other, results[0]):
            np.testing.assert_array_equal(got, want)

    row = bench.measure(coba, 1, 40, 2, 300)
    assert row["one thread"]["ratio"] == 1.0 and row["fired_per_step"] > 0
    for way in bench.WAYS:
        assert len(row[way]["all"]) == 2
        assert row[way]["q1"] <= row[way]["us_per_step"] <= row[way]["q3"]

    # calls of 10 steps, each from where the one before ended: where one call of 40 ends
    state = [x.copy() for x in settled]
    for call in range(4):
        out = outputs(10)
        ways["two threads"](state, out)
        state = out[:4]
    for got, want in zip(out, results[0]):
        np.testing.assert_array_equal(got, want[-10:] if got.ndim == 2 else want)
    row = bench.measure(coba, 1, 40, 1, 300, per_call=10)
    assert row["steps_per_call"] == 10 and len(row["two threads"]["all"]) == 1
    with pytest.raises(ValueError, match="multiple"):
        bench.measure(coba, 1, 40, 1, 300, per_call=15)

    # a way whose spikes differ from the first run's stops the benchmark
    real = bench.runners

    def flipped(*args):
        settled, outputs, ways = real(*args)
        two = ways["two threads"]

        def wrong(state, out):
            two(state, out)
            out[4][-1, 0] = ~out[4][-1, 0]

        return settled, outputs, {**ways, "two threads": wrong}

    monkeypatch.setattr(bench, "runners", flipped)
    with pytest.raises(AssertionError, match="two threads at 1x differs"):
        bench.measure(coba, 1, 40, 1, 300)


def test_against_a_revision_loads_that_revision_s_example_and_runs_its_kernel(tmp_path, bench,
                                                                             coba):
    """``--against REV``: examples/coba.py as the git revision has it (here the checked-out
    one), loaded as a module of its own, and its two-thread kernel run as a fifth way."""
    if not (ROOT / ".git").exists():
        pytest.skip("needs the repository's git history (a copy of the files has none)")
    other = bench.example_at("HEAD", tmp_path)
    assert other.__file__ != coba.__file__ and other is not coba
    committed = subprocess.run(["git", "-C", str(ROOT), "show", "HEAD:examples/coba.py"],
                               capture_output=True, text=True, check=True).stdout
    assert pathlib.Path(other.__file__).read_text() == committed
    # Compiling the revision's threaded kernel takes as long as the present one's (about a
    # minute): the fifth way is checked with the present module's kernel, the one the first
    # test compiled when both run in this process, passed in as the revision's.
    ran = []

    class Revision:
        _THREAD_BLOCK = other._THREAD_BLOCK

        @staticmethod
        def _numba_jitc_loop_threaded(prob):
            ran.append(prob)
            return coba._numba_jitc_loop_threaded(prob)

    settled, outputs, ways = bench.runners(coba, 1, 300, Revision)
    assert tuple(ways) == bench.WAYS + ("two threads at REV",)
    one, earlier = outputs(30), outputs(30)
    ways["one thread"]([x.copy() for x in settled], one)
    ways["two threads at REV"]([x.copy() for x in settled], earlier)
    assert ran == [coba.scaled(1, conn="jitc").w_exc.prob]
    for got, want in zip(earlier, one):
        np.testing.assert_array_equal(got, want)
