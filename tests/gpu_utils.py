"""Shared helpers for backend tests: GPU detection, CUDA lowering and XLA:GPU compiles.

``compile_for_targets`` compiles a function with XLA:GPU for every target in ``GPU_TARGETS``
(sm_90 and sm_80) through :func:`primforge.testing.compile_for_gpu`, fails the test with
XLA's error if any target rejects it, and counts the compiles per backend and target for
the summary that ``conftest.py`` prints at the end of the run.
"""

from __future__ import annotations

import collections
import functools

import jax
import pytest

from primforge import testing

#: The targets every GPU code path is compiled for: H100 (sm_90) and A100 (sm_80).
GPU_TARGETS = ("h100", "a100")

#: (backend, target) -> number of functions XLA:GPU compiled in this run.
COMPILED: collections.Counter = collections.Counter()


@functools.cache
def has_gpu() -> bool:
    """Whether JAX sees an NVIDIA GPU."""
    try:
        return any(d.platform == "gpu" for d in jax.devices("gpu"))
    except RuntimeError:
        return False


requires_gpu = pytest.mark.skipif(not has_gpu(), reason="needs an NVIDIA GPU visible to JAX")

_MISSING = testing.unavailable_reason()
requires_gpu_compiler = pytest.mark.skipif(
    _MISSING is not None, reason=f"XLA:GPU compile skipped: {_MISSING}")


def lower_for_cuda(fn, *args) -> str:
    """StableHLO text of ``jax.jit(fn)`` lowered for CUDA (works on a CPU-only machine)."""
    return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def compile_for_targets(fn, *args, backend: str, targets=GPU_TARGETS, ptx: bool = False):
    """XLA:GPU-compile ``jax.jit(fn)`` for each target; fail with XLA's error on rejection.

    Returns ``{target: GpuCompileResult}``.
    """
    results = {}
    for target in targets:
        result = testing.compile_for_gpu(fn, *args, target=target, ptx=ptx)
        if not result.ok:
            pytest.fail(result.describe(), pytrace=False)
        COMPILED[backend, target] += 1
        results[target] = result
    return results
