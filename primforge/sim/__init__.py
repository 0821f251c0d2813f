"""primforge.sim: the pieces of a simulation loop, and the COBA network built from them.

A simulation advances a state step after step, and on a CPU most of a step's time goes to
what surrounds the arithmetic: XLA computing a neuron update once per reader, a parallel
region opened per step, a thread count that pays on one machine and not on another. This
package holds the answers, each a module of its own that imports nothing else of
primforge, so that the operator library below can use them too:

* :func:`evaluate_once` (``fusion``): a value computed once into memory by XLA's CPU
  compiler, however many operations read it;
* :func:`numba_team` and :class:`NumbaTeam` (``team``): many phases (steps) on the
  threads of one Numba parallel region;
* :class:`OnlineChoice` (``online``): the fastest of several equivalent ways to run the
  chunks of a long computation, chosen while it runs.

:mod:`primforge.sim.coba` builds the COBA benchmark network (Brette et al. 2007) on them
and on :mod:`primforge.ops`: the network, its plain ``jax.numpy`` step, two fused step
kernels and the simulators that run them. It is imported on its own (``from primforge.sim
import coba``), since it loads the operator library and registers its kernels.

>>> from primforge import sim
>>> sim.OnlineChoice(2).pick()
0
"""

from primforge.sim.fusion import evaluate_once
from primforge.sim.online import OnlineChoice
from primforge.sim.team import NumbaTeam, numba_team

__all__ = ["NumbaTeam", "OnlineChoice", "evaluate_once", "numba_team"]
