"""Shared helpers for backend tests: GPU detection and CUDA lowering on any machine."""

from __future__ import annotations

import functools

import jax
import pytest


@functools.cache
def has_gpu() -> bool:
    """Whether JAX sees an NVIDIA GPU."""
    try:
        return any(d.platform == "gpu" for d in jax.devices("gpu"))
    except RuntimeError:
        return False


requires_gpu = pytest.mark.skipif(not has_gpu(), reason="needs an NVIDIA GPU visible to JAX")


def lower_for_cuda(fn, *args) -> str:
    """StableHLO text of ``jax.jit(fn)`` lowered for CUDA (works on a CPU-only machine)."""
    return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
