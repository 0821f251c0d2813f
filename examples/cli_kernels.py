"""A small kernel module for the ``primforge`` command (used in docs/cli.md).

``demo_softclip(x) = 2 * tanh(x / 2)`` with two CPU backends: ``jax`` (the reference) and
``numba`` (a Numba loop run through XLA's FFI). It has a call function and benchmark data,
so ``list``, ``check``, ``bench`` and ``autotune`` all work on it::

    primforge bench demo_softclip --import examples/cli_kernels.py --plot softclip.png
"""

import math

import jax
import jax.numpy as jnp

import primforge
from primforge.bench import BenchmarkConfig

LIMIT = 2.0

softclip = primforge.XLACustomKernel(
    "demo_softclip", "Smooth clamp: 2 * tanh(x / 2).", replace=True
)


def _numba(**_):
    import numba

    @numba.njit
    def kernel(x, out):
        for i in range(x.size):
            out.flat[i] = LIMIT * math.tanh(x.flat[i] / LIMIT)

    return kernel


softclip.def_kernel("jax", "cpu", lambda **_: lambda x: LIMIT * jnp.tanh(x / LIMIT))
try:
    import numba  # noqa: F401
except ImportError:  # pragma: no cover - numba is the ``cpu`` extra
    pass
else:
    softclip.def_numba_kernel(_numba)
softclip.def_tags("demo", "elementwise")


@softclip.def_call
def call(x, backend=None):
    return softclip(x, outs=jax.ShapeDtypeStruct(x.shape, x.dtype), backend=backend)


@softclip.def_benchmark_data
def data(*, platform):
    key = jax.random.key(0)
    return [
        BenchmarkConfig(args=(jax.random.normal(key, (n,), jnp.float32),), n=n)
        for n in (1_000, 100_000, 1_000_000)
    ]
