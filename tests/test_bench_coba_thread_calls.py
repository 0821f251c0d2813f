"""benchmarks/coba_thread_calls.py: every call is timed and gives the spikes of the
simulator's raster; the summary's figures are the NumPy ones."""

import numpy as np
from _scripts import load_script

from primforge.sim import coba


def _load():
    return load_script("benchmarks/coba_thread_calls.py", "coba_thread_calls")


def test_each_call_is_timed_and_gives_the_rasters_spike_counts():
    calls = _load()
    net = coba.scaled(1, seed=2, conn="jitc")
    raster = coba.simulator(net, 40, fused=True, steps_per_call=4, raster=net.n)(
        net.v0, net.ge0, net.gi0, net.w_exc, net.w_inh)["raster"]
    want = np.asarray(raster).astype(np.int64).sum(axis=0)
    assert want.sum() > 0
    for threads in (1, 2):
        got = calls.time_calls(coba, net, threads, 40, 4, 3)
        assert len(got["ms"]) == 3 and all(ms > 0 for ms in got["ms"])
        np.testing.assert_array_equal(np.asarray(got["per_neuron"]), want)


def test_summary():
    calls = _load()
    rng = np.random.default_rng(0)
    ms = list(rng.uniform(30.0, 40.0, 50)) + [100.0, 120.0, 61.0]
    got = calls.summarize(ms, reference_ms=40.0)
    q1, median, q3 = np.percentile(ms, [25, 50, 75])
    np.testing.assert_allclose([got["q1_ms"], got["median_ms"], got["q3_ms"]], [q1, median, q3])
    assert got["max_ms"] == 120.0 and got["calls"] == 53
    assert got["slow_calls"] == 3  # 61, 100 and 120 are over 1.5 x 40
