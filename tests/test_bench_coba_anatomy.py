"""benchmarks/coba_anatomy.py: each part it times computes what its name says (NumPy)."""

import numpy as np
from _scripts import load_script

from primforge.sim import coba


def _load():
    return load_script("benchmarks/coba_anatomy.py", "coba_anatomy")


def test_the_parts_compute_the_plain_step_and_its_pieces():
    anatomy = _load()
    net = coba.build(400, 0.1, seed=3)
    n_steps = 20
    fns, rate = anatomy.variants(coba, net, n_steps)
    assert set(fns) == {"loop", "neurons", "silent step", "step", "simulate",
                        "step, recomputed", "simulate, recomputed"} and rate > 0
    run = {k: fn(*args) for k, (fn, args) in fns.items()}

    # computing the neuron update once or in each reader's fusion: the same numbers
    for got, want in zip(run["step, recomputed"], run["step"], strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    for key in ("per_neuron", "v"):
        np.testing.assert_array_equal(np.asarray(run["simulate, recomputed"][key]),
                                      np.asarray(run["simulate"][key]))

    # the whole step, without recording, ends where the simulator ends
    np.testing.assert_array_equal(np.asarray(run["step"][0]), np.asarray(run["simulate"]["v"]))
    # the loop carries the state unchanged and counts the steps
    state, count = run["loop"]
    assert int(count) == n_steps
    for got, want in zip(state, fns["loop"][1][0]):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))

    # the neurons alone: Euler steps with decaying conductances and no input (NumPy)
    v, ge, gi = (np.asarray(a, np.float64) for a in (net.v0, net.ge0, net.gi0))
    ref = np.zeros(net.n, np.int64)
    for _ in range(n_steps):
        active = ref == 0
        dv = (coba.EL - v) + ge * (coba.EE - v) + gi * (coba.EI - v)
        v = np.where(active, v + float(coba.K_M) * dv, v)
        spike = active & (v > coba.VT)
        ref = np.where(spike, coba.REF_STEPS, np.where(active, 0, ref - 1))
        v = np.where(spike, coba.VR, v)
        ge, gi = ge * float(coba.DECAY_E), gi * float(coba.DECAY_I)
    np.testing.assert_allclose(np.asarray(run["neurons"][0]), v, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(np.asarray(run["neurons"][1]), ge, rtol=1e-4)

    # the silent step: the neurons' arithmetic, with products that add exact zeros
    for got, want in zip(run["silent step"], run["neurons"], strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    # ... while the real step's products move the state away from it
    assert not np.array_equal(np.asarray(run["step"][1]), np.asarray(run["neurons"][1]))


def test_the_fused_variants_count_each_neurons_spikes_as_the_raster_does():
    """Each neuron's spike count, kept by the fused kernel (updating the state in place or
    copying it) and summed beside it by XLA (the reduction over the steps' axis, and row by
    row), is the NumPy sum of the spikes the simulator records for every neuron, at one
    and at several steps a call."""
    anatomy = _load()
    net = coba.scaled(1, seed=3, conn="jitc")
    n_steps = 40
    args = (net.v0, net.ge0, net.gi0, net.w_exc, net.w_inh)
    for k in (1, 8):
        fns, rate = anatomy.fused_variants(coba, net, n_steps, k)
        assert set(fns) == {"kernel", "copying", "rows", "columns", "simulate"} and rate > 0
        raster = coba.simulator(net, n_steps, fused=True, steps_per_call=k,
                                raster=net.n)(*args)["raster"]
        want = np.asarray(raster).astype(np.int64).sum(axis=0)
        assert want.sum() > 0
        run = {name: fn(*a) for name, (fn, a) in fns.items()}
        for name in ("kernel", "copying", "rows", "columns", "simulate"):
            np.testing.assert_array_equal(np.asarray(run[name]["per_neuron"]), want)
            # every variant ends in the same state
            np.testing.assert_array_equal(np.asarray(run[name]["v"]),
                                          np.asarray(run["simulate"]["v"]))
