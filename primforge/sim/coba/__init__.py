"""The COBA benchmark network (Brette et al. 2007, Benchmark 1) on primforge.

Conductance-based leaky integrate-and-fire neurons (:mod:`~primforge.sim.coba.network`:
4,000 neurons at 1x, 80 inputs each, self-sustained activity from the initial state).
A step integrates the neurons (forward Euler, dt = 0.1 ms), detects their spikes,
propagates them to the conductances and resets; it runs two ways that give the same
spike trains, bit for bit:

* plain (:func:`plain_step`): ``jax.numpy`` for the neurons and two event-driven products
  of :mod:`primforge.ops` (stored CSR, or just-in-time connectivity regenerated from a
  seed: :class:`JitConn`);
* fused (:func:`fused_step`): one kernel call (``coba_step_p``, ``coba_jitc_step_p``) that
  advances the network whole steps in one Numba loop, on several threads over
  just-in-time connectivity when the network is large enough.

The simulators (:func:`simulator`, :func:`thread_choosing_simulator`, :func:`simulate`)
run either under ``lax.scan`` and record what the benchmark reports. The modules go from
the model up: ``network``, ``plain``, ``numba_loop`` and ``numba_threaded`` (the fused
loops), ``kernels``, ``simulator``.

>>> from primforge.sim import coba
>>> net = coba.build(400, 0.2)
>>> result = coba.simulate(net, 0.01)
>>> result["counts"].shape, net.n_exc
((100, 2), 320)
"""

from primforge.sim.coba.kernels import coba_jitc_step_p, coba_step_p, fused_step, threads_used
from primforge.sim.coba.network import JitConn, Network, build, scaled
from primforge.sim.coba.plain import fired_per_population, neuron_update, plain_step
from primforge.sim.coba.simulator import (
    chunk_steps_for,
    simulate,
    simulator,
    thread_choosing_simulator,
)

# isort: split
# The model's constants (float32 where the steps use them) and the simulators' settings,
# for code that writes steps of its own (``coba.DT``, ``coba.DECAY_E``, ...).
from primforge.sim.coba.kernels import THREAD_MIN_NEURONS  # noqa: F401  (re-exported)
from primforge.sim.coba.network import (  # noqa: F401  (re-exported)
    DECAY_E,
    DECAY_I,
    DT,
    EE,
    EI,
    EL,
    EXC_FRACTION,
    F32,
    K_M,
    N_BASE,
    P_BASE,
    REF_STEPS,
    REFRACTORY,
    TAUE,
    TAUI,
    TAUM,
    VR,
    VT,
    WE,
    WI,
)
from primforge.sim.coba.simulator import CHUNK_NEURON_STEPS, RASTER_NEURONS  # noqa: F401

__all__ = [
    "JitConn",
    "Network",
    "build",
    "chunk_steps_for",
    "coba_jitc_step_p",
    "coba_step_p",
    "fired_per_population",
    "fused_step",
    "neuron_update",
    "plain_step",
    "scaled",
    "simulate",
    "simulator",
    "thread_choosing_simulator",
    "threads_used",
]
