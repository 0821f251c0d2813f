"""primforge.distributed: several JAX processes for one script, on one machine or a cluster.

* :func:`launch` (or ``python -m primforge.distributed -n N script.py``) starts N local
  processes joined by ``jax.distributed`` and stops them all when one fails;
* :func:`initialize`, called first by the script, joins them (or, under SLURM or Open MPI,
  lets ``jax.distributed.initialize()`` find the job's processes by itself).

Everything else is JAX's own runtime: one global mesh over every process's devices, XLA's
collectives (gloo on CPU, NCCL on GPU), and the sharding rules of the kernels.
"""

from primforge.distributed._launch import LaunchError, initialize, launch

__all__ = ["LaunchError", "initialize", "launch"]
