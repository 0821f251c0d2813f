"""A network with per-synapse delays: primforge's spikes are Brian2's, step for step.

``tests/data/brian2_delays.json`` holds the network and the spikes Brian2 (an independent
simulator, runtime target 'numpy') produced for it; it was written by

    /work/venv-brian/bin/python tools/brian2_delays.py

so this test does not need Brian2. The model (non-leaky integrators on a dyadic grid, see
the tool's docstring) is exact in float32 and float64, so spike times must agree exactly.
The same test runs an independent NumPy simulation (arrivals by absolute step, float64).
"""

from __future__ import annotations

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from primforge.ops import CSR, delay_buffer, delay_read, delayed_matvec

DATA = pathlib.Path(__file__).resolve().parent / "data" / "brian2_delays.json"


@pytest.fixture(scope="module")
def net():
    return json.loads(DATA.read_text())


def _csr(net):
    """The synapses as a CSR (rows presynaptic) and their delays in its stored order."""
    pre, post = np.asarray(net["pre"]), np.asarray(net["post"])
    order = np.lexsort((post, pre))
    n = net["n"]
    indptr = np.concatenate([[0], np.cumsum(np.bincount(pre, minlength=n))]).astype(np.int32)
    W = CSR(np.asarray(net["weight"], np.float32)[order], post[order].astype(np.int32), indptr,
            shape=(n, n))
    return W, np.asarray(net["delay"], np.int32)[order]


def _primforge(net, W, delays, backend):
    """Brian2's schedule per step: integrate, threshold, deliver (add, then read), reset."""
    drive = jnp.asarray(net["drive_per_step"], jnp.float32)

    def step(state, t):
        v, buf = state
        v = v + drive
        spikes = v > 1
        buf = delayed_matvec(W, spikes, delays, buf, t, backend=backend)
        now, buf = delay_read(buf, t)
        v = jnp.where(spikes, 0.0, v + now)
        return (v, buf), spikes

    state = (jnp.zeros(net["n"], jnp.float32), delay_buffer(net["max_delay"], net["n"]))
    run = jax.jit(lambda s: jax.lax.scan(step, s, jnp.arange(net["steps"]))[1])
    return np.asarray(run(state))


def _numpy(net):
    """Independent float64 simulation: arrivals by absolute step, no ring buffer."""
    n, steps = net["n"], net["steps"]
    arrivals = np.zeros((steps + net["max_delay"] + 1, n))
    v = np.zeros(n)
    raster = np.zeros((steps, n), bool)
    pre, post = np.asarray(net["pre"]), np.asarray(net["post"])
    weight, delay = np.asarray(net["weight"]), np.asarray(net["delay"])
    for t in range(steps):
        v = v + np.asarray(net["drive_per_step"])
        spikes = v > 1
        fired = spikes[pre]
        np.add.at(arrivals, (t + delay[fired], post[fired]), weight[fired])
        v = np.where(spikes, 0.0, v + arrivals[t])
        raster[t] = spikes
    return raster


def _brian2(net):
    raster = np.zeros((net["steps"], net["n"]), bool)
    raster[net["spike_steps"], net["spike_neurons"]] = True
    return raster


@pytest.mark.parametrize("backend", ["numba", pytest.param("jax", marks=pytest.mark.exhaustive)])
def test_spike_times_match_brian2_and_numpy(net, backend):
    brian = _brian2(net)
    assert brian.sum() == len(net["spike_steps"]) > 100
    np.testing.assert_array_equal(_numpy(net), brian)
    W, delays = _csr(net)
    got = _primforge(net, W, delays, backend)
    np.testing.assert_array_equal(got, brian)
    # The delays shape the spike trains: without them the network fires differently.
    assert (_primforge(net, W, np.zeros_like(delays), backend) != brian).any()
