"""The plain COBA step: ``jax.numpy`` for the neurons, two event-driven products.

One step, in the order of Brian's schedule: integrate (refractory neurons hold v), detect
spikes (v > Vt, not refractory), propagate (ge += We^T spikes_E, gi += Wi^T spikes_I),
reset. The neuron update is read by the reset, the products, the spike counts and the
recording; it goes through :func:`~primforge.sim.evaluate_once`, so that XLA's CPU
compiler computes it once instead of inside each reader's fusion. The fused kernels of
:mod:`primforge.sim.coba.kernels` do the same float32 operations in the same order.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from primforge.sim.coba.network import DECAY_E, DECAY_I, EE, EI, EL, F32, K_M, REF_STEPS, VR, VT
from primforge.sim.fusion import evaluate_once

__all__ = ["fired_per_population", "neuron_update", "plain_step"]


def _integrate(v, ge, gi, ref):
    """Euler step of the neurons and spike detection (plain jax.numpy)."""
    active = ref == 0
    dv = (F32(EL) - v) + ge * (F32(EE) - v) + gi * (F32(EI) - v)
    v_new = jnp.where(active, v + K_M * dv, v)
    spike = active & (v_new > F32(VT))
    ref_new = jnp.where(spike, jnp.int32(REF_STEPS), jnp.where(active, 0, ref - 1))
    return v_new, spike, ref_new


def neuron_update(v, ge, gi, ref, *, once: bool = True):
    """The neurons' Euler step and spike detection: ``(v, spike, ref)``.

    Refractory neurons (``ref > 0``) hold their voltage and count down; a neuron that
    crosses the threshold gets the refractory count. The voltage is not reset here (the
    step resets it after propagating). With ``once`` (the default), computed once for all
    its readers (:func:`~primforge.sim.evaluate_once`); the results are the same without.

    >>> import jax.numpy as jnp
    >>> from primforge.sim.coba import neuron_update
    >>> v, spike, ref = neuron_update(jnp.array([-50.1, -60.0], jnp.float32),
    ...                               jnp.array([20.0, 0.0], jnp.float32),
    ...                               jnp.zeros(2, jnp.float32), jnp.array([0, 3], jnp.int32))
    >>> spike.tolist(), ref.tolist()
    ([True, False], [49, 2])
    """
    if once:
        return evaluate_once(_integrate, v, ge, gi, ref)
    return _integrate(v, ge, gi, ref)


def plain_step(w_exc, w_inh, *, once: bool = True) -> Callable:
    """``step(state) -> (state, spikes)``: one step of the network with connectivity
    ``w_exc`` and ``w_inh`` (stored CSR or :class:`~primforge.sim.coba.JitConn`).

    ``state`` is ``(v, ge, gi, ref)``; ``spikes``, bool of shape ``(n,)``. ``once`` as in
    :func:`neuron_update`.

    >>> import jax.numpy as jnp
    >>> from primforge.sim.coba import build, plain_step
    >>> net = build(100, 0.1)
    >>> step = plain_step(net.w_exc, net.w_inh)
    >>> state = (net.v0, net.ge0, net.gi0, jnp.zeros(100, jnp.int32))
    >>> state, spikes = step(state)
    >>> spikes.shape, state[3].dtype
    ((100,), dtype('int32'))
    """
    ne = w_exc.shape[0]

    def step(state):
        v, ge, gi, ref = state
        v, spike, ref = neuron_update(v, ge, gi, ref, once=once)
        ge = ge * DECAY_E + spike[:ne] @ w_exc  # event-driven: visits the spiking rows
        gi = gi * DECAY_I + spike[ne:] @ w_inh
        v = jnp.where(spike, F32(VR), v)
        return (v, ge, gi, ref), spike

    return step


def fired_per_population(spikes: jax.Array, ne: int) -> jax.Array:
    """``(steps, 2)`` int32: the excitatory (the first ``ne``) and inhibitory neurons that
    fired at each step of ``spikes``, ``(steps, n)`` bool.

    >>> import jax.numpy as jnp
    >>> from primforge.sim.coba import fired_per_population
    >>> fired_per_population(jnp.array([[1, 0, 1], [0, 1, 1]], bool), 2).tolist()
    [[1, 1], [1, 1]]
    """
    return jnp.stack([jnp.sum(spikes[:, :ne], axis=1, dtype=jnp.int32),
                      jnp.sum(spikes[:, ne:], axis=1, dtype=jnp.int32)], axis=1)
