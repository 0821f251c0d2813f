"""The COBA network: its parameters, connectivity and initial state.

Conductance-based leaky integrate-and-fire neurons after Vogels & Abbott (2005), with the
parameters of Brian 1's script for Brette et al. (2007), Benchmark 1: 4,000 neurons (80%
excitatory), every pair connected with probability 0.02, conductances in units of the leak
conductance::

    dv/dt  = (El - v + ge (Ee - v) + gi (Ei - v)) / taum
    dge/dt = -ge / taue          dgi/dt = -gi / taui

The constants are kept as float32 values (``K_M``, ``DECAY_E``, ``DECAY_I``) that every
step implementation shares, so that the plain step and the fused kernels do the same
float32 arithmetic. Connectivity is stored (:class:`~primforge.ops.CSR`, from
:func:`~primforge.ops.fixed_prob`) or regenerated from a seed at every use
(:class:`JitConn`, never stored: the network at 100x fits in a few hundred MiB).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from primforge.ops import CSR, binary_jitc_matvec, fixed_prob
from primforge.utils import dataclass, field

__all__ = ["JitConn", "Network", "build", "scaled"]

DT = 0.1  # ms
TAUM, TAUE, TAUI = 20.0, 5.0, 10.0  # ms
EL, EE, EI = -60.0, 0.0, -80.0  # mV
VT, VR = -50.0, -60.0  # mV
REFRACTORY = 5.0  # ms
WE, WI = 0.6, 6.7  # conductance increments, units of the leak conductance
N_BASE, P_BASE, EXC_FRACTION = 4000, 0.02, 0.8

# Step constants as float32, shared by every implementation (identical arithmetic).
F32 = np.float32
K_M = F32(DT / TAUM)  # dt / taum
DECAY_E = F32(1.0 - DT / TAUE)  # Euler: ge + dt * (-ge / taue)
DECAY_I = F32(1.0 - DT / TAUI)
# Brian's rule: refractory while fewer than 5 ms have passed since the spike, i.e. v is held
# for the 49 steps after the spike and integrates again at the 50th.
REF_STEPS = round(REFRACTORY / DT) - 1


@dataclass
class JitConn:
    """Fixed-probability connectivity regenerated from ``seed`` at every use (never stored).

    ``spikes @ W`` is :func:`primforge.ops.binary_jitc_matvec` with ``transpose=True``: only
    the rows of the spiking neurons are generated.

    >>> import jax.numpy as jnp
    >>> from primforge.sim.coba import JitConn
    >>> w = JitConn(seed=3, weight=0.5, prob=0.1, shape=(20, 30))
    >>> w.nnz, (jnp.zeros(20, bool) @ w).shape
    (60, (30,))
    """

    seed: int = field(static=True)
    weight: float = field(static=True)
    prob: float = field(static=True)
    shape: tuple[int, int] = field(static=True)
    homogeneous = True

    @property
    def nnz(self) -> int:
        """Expected number of synapses.

        >>> JitConn(0, 1.0, 0.02, (4000, 5000)).nnz
        400000
        """
        return round(self.shape[0] * self.shape[1] * self.prob)

    def __rmatmul__(self, spikes):
        return binary_jitc_matvec(self.weight, self.seed, spikes, shape=self.shape,
                                  prob=self.prob, transpose=True)


@dataclasses.dataclass(frozen=True)
class Network:
    """Connectivity and initial state of one COBA network (made by :func:`build`).

    >>> from primforge.sim.coba import build
    >>> net = build(100, 0.1)
    >>> net.n, net.n_exc, net.n_inh, net.w_exc.shape
    (100, 80, 20, (80, 100))
    """

    n: int
    n_exc: int
    w_exc: CSR | JitConn  # (n_exc, n): rows are excitatory sources
    w_inh: CSR | JitConn  # (n - n_exc, n)
    v0: jax.Array
    ge0: jax.Array
    gi0: jax.Array

    @property
    def n_inh(self) -> int:
        """The inhibitory neurons: the last ``n - n_exc``.

        >>> from primforge.sim.coba import build
        >>> build(10, 0.5).n_inh
        2
        """
        return self.n - self.n_exc


def build(n: int = N_BASE, prob: float = P_BASE, *, seed: int = 0,
          we: float = WE, wi: float = WI, conn: str = "csr") -> Network:
    """Random connectivity and Brian 1's initial state for ``n`` neurons.

    Args:
      n: neurons, the first 80% excitatory.
      prob: the probability that a neuron connects to another.
      seed: seeds the connectivity and the initial state.
      we: the conductance an excitatory spike adds to its targets.
      wi: the conductance an inhibitory spike adds to its targets.
      conn: ``'csr'`` (stored) or ``'jitc'`` (regenerated from a seed at every use).

    Returns:
      The :class:`Network`, its state drawn as in Brian 1's script: v from N(-65, 5) mV,
      ge from N(4, 1.5), gi from N(20, 12).

    >>> net = build(200, 0.05, conn="jitc")
    >>> type(net.w_exc).__name__, net.v0.dtype
    ('JitConn', dtype('float32'))
    """
    rng = np.random.default_rng(seed)
    n_exc = round(EXC_FRACTION * n)
    if conn == "csr":
        w_exc = fixed_prob(n_exc, n, prob, weight=we, seed=rng)
        w_inh = fixed_prob(n - n_exc, n, prob, weight=wi, seed=rng)
    elif conn == "jitc":
        s_exc, s_inh = (int(x) for x in rng.integers(0, 2**31, 2))
        w_exc = JitConn(s_exc, float(we), float(prob), (n_exc, n))
        w_inh = JitConn(s_inh, float(wi), float(prob), (n - n_exc, n))
    else:
        raise ValueError(f"build: 'conn' must be 'csr' or 'jitc', got {conn!r}")
    v0 = (rng.standard_normal(n) * 5.0 - 65.0).astype(F32)
    ge0 = (rng.standard_normal(n) * 1.5 + 4.0).astype(F32)
    gi0 = (rng.standard_normal(n) * 12.0 + 20.0).astype(F32)
    return Network(n, n_exc, w_exc, w_inh, jnp.asarray(v0), jnp.asarray(ge0), jnp.asarray(gi0))


def scaled(scale: int, seed: int = 0, conn: str = "csr") -> Network:
    """The network at ``scale`` times 4,000 neurons, 80 inputs per neuron (``p = 0.02 /
    scale``).

    >>> scaled(10, conn="jitc").n, scaled(10, conn="jitc").w_exc.prob
    (40000, 0.002)
    """
    n = N_BASE * scale
    return build(n, P_BASE / scale, seed=seed, conn=conn)
