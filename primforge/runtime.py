"""Process-wide settings of XLA's CPU runtime.

XLA's CPU client runs the parts of a computation it parallelizes (elementwise fusions split
in partitions, Eigen's matrix products) on a thread pool sized once, when JAX creates the
CPU backend: one thread per core unless the environment variable ``PJRT_NPROC`` says
otherwise. For a long ``lax.scan`` over arrays of 10^4 to 10^6 elements (a network
simulation step), handing each fusion to the pool costs more than the extra cores give
back; one thread removes the handoffs. :func:`set_cpu_threads` sets that variable, and
refuses to pretend when it is too late to take effect.
"""

from __future__ import annotations

import operator
import os

from primforge._compat import backends_initialized

__all__ = ["set_cpu_threads"]

_ENV = "PJRT_NPROC"


def set_cpu_threads(n: int) -> None:
    """Size XLA's CPU thread pool to ``n`` threads for this process.

    Must run before JAX creates its CPU backend: before the process's first computation,
    array or device query (importing JAX or primforge does not create it). Later, the pool
    exists and cannot be resized, so the call raises ``RuntimeError`` unless the pool was
    already asked for ``n`` threads (``PJRT_NPROC``). The setting is the environment
    variable ``PJRT_NPROC``, so child processes inherit it. It sizes XLA's pool only:
    Numba kernels that use threads (``--threads`` of a fused step) have their own.

    Args:
      n: threads of the pool, a positive integer.

    Example (in a fresh process, as a program's first lines would do it):

    >>> import subprocess, sys
    >>> code = ("import primforge, jax.numpy as jnp; primforge.set_cpu_threads(1); "
    ...         "print(int(jnp.arange(4).sum()))")
    >>> subprocess.run([sys.executable, "-c", code], capture_output=True,
    ...                text=True).stdout
    '6\\n'
    """
    if isinstance(n, bool):
        raise TypeError(f"set_cpu_threads: n must be a positive integer, got {n!r}")
    try:
        n = operator.index(n)
    except TypeError:
        raise TypeError(f"set_cpu_threads: n must be a positive integer, got "
                        f"{type(n).__name__} {n!r}") from None
    if n < 1:
        raise ValueError(f"set_cpu_threads: n must be a positive integer, got {n}")
    if backends_initialized():
        if os.environ.get(_ENV) == str(n):
            return
        raise RuntimeError(
            f"set_cpu_threads({n}): JAX has already created its CPU backend, whose thread "
            f"pool cannot be resized; call it before the process's first computation "
            f"(right after the imports), or start the process with {_ENV}={n} in its "
            f"environment")
    os.environ[_ENV] = str(n)
