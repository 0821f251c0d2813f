"""Spike times of a small network with per-synapse delays, simulated by Brian2.

Writes ``tests/data/brian2_delays.json``: the network (drive, synapses with weights and
delays in steps) and the spikes Brian2 produced, for tests/test_ops_delay_brian2.py.

The model is chosen so that float32 and float64 arithmetic agree exactly: non-leaky
integrators ``dv/dt = a`` with ``dt = 2**-13 s``, drives and weights on a dyadic grid, so
every value of ``v`` is a multiple of ``2**-16`` well inside float32's 24-bit mantissa.
Threshold ``v > 1``, reset ``v = 0``. Brian2's schedule per step: integrate, threshold,
deliver the spikes whose delay ends at this step (delay 0: the same step), reset.

Run (Brian2 in its own environment, runtime target 'numpy'):
    /work/venv-brian/bin/python tools/brian2_delays.py
"""

from __future__ import annotations

import json
import pathlib

import brian2 as b2
import numpy as np

OUT = pathlib.Path(__file__).resolve().parents[1] / "tests" / "data" / "brian2_delays.json"
N, STEPS, MAX_DELAY, P, SEED = 40, 400, 12, 0.15, 2024
DT_EXP = 13  # dt = 2**-13 s


def network(seed: int = SEED) -> dict:
    rs = np.random.RandomState(seed)
    # Drive per step (a * dt): multiples of 2**-10 between 2**-6 and 2**-4.
    drive_steps = rs.randint(16, 65, N) * 2.0**-10
    pre, post = np.nonzero((rs.random_sample((N, N)) < P) & ~np.eye(N, dtype=bool))
    # Weights: multiples of 2**-6, a third of them inhibitory.
    weight = rs.randint(4, 24, len(pre)) * 2.0**-6
    weight[rs.random_sample(len(pre)) < 1 / 3] *= -2
    delay = rs.randint(0, MAX_DELAY + 1, len(pre))
    return {"n": N, "steps": STEPS, "max_delay": MAX_DELAY, "dt_exp": DT_EXP,
            "drive_per_step": drive_steps.tolist(), "pre": pre.tolist(), "post": post.tolist(),
            "weight": weight.tolist(), "delay": delay.tolist()}


def simulate(net: dict) -> tuple[list[int], list[int]]:
    b2.prefs.codegen.target = "numpy"
    dt = 2.0**-net["dt_exp"] * b2.second
    b2.defaultclock.dt = dt
    group = b2.NeuronGroup(net["n"], "dv/dt = a : 1\na : Hz", threshold="v > 1",
                           reset="v = 0", method="euler")
    group.a = np.asarray(net["drive_per_step"]) / dt  # a * dt = drive_per_step
    syn = b2.Synapses(group, group, "w : 1", on_pre="v_post += w")
    syn.connect(i=np.asarray(net["pre"]), j=np.asarray(net["post"]))
    syn.w = np.asarray(net["weight"])
    syn.delay = np.asarray(net["delay"]) * dt
    mon = b2.SpikeMonitor(group)
    b2.run(net["steps"] * dt)
    steps = np.rint(np.asarray(mon.t / dt)).astype(int)
    return steps.tolist(), np.asarray(mon.i).astype(int).tolist()


def main() -> None:
    net = network()
    steps, neurons = simulate(net)
    net.update(spike_steps=steps, spike_neurons=neurons, brian2=b2.__version__,
               command="/work/venv-brian/bin/python tools/brian2_delays.py")
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps(net) + "\n")
    print(f"{len(steps)} spikes of {net['n']} neurons in {net['steps']} steps -> {OUT}")


if __name__ == "__main__":
    main()
