"""Shared helpers for backend tests: GPU detection, CUDA lowering and XLA:GPU compiles.

``compile_for_targets`` compiles a function with XLA:GPU for every target in ``GPU_TARGETS``
(sm_90 and sm_80) through :func:`primforge.testing.compile_for_gpu`, fails the test with
XLA's error if any target rejects it, and counts the compiles per backend and target for
the summary that ``conftest.py`` prints at the end of the run. ``compile_cases_for_targets``
compiles many cases as one program per target and checks each case's kernel on its own.
"""

from __future__ import annotations

import collections
import ctypes
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


@functools.cache
def has_gpu_driver() -> bool:
    """Whether an NVIDIA driver is installed, whether or not this process lets JAX use it
    (``JAX_PLATFORMS=cpu`` hides the GPU from :func:`has_gpu` but not from a subprocess)."""
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


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


def compile_cases_for_targets(cases, *, backend: str, expect=None, targets=GPU_TARGETS):
    """XLA:GPU-compile several cases as one program per target; check each case's kernel.

    ``cases`` maps a label to ``(fn, args)``. The program returns every case's outputs and
    the cases share no value, so XLA:GPU compiles each case's kernels as it would alone, in
    one compile instead of one per case. When a target rejects the program, every case is
    compiled alone for it and the failure names the cases XLA rejects. ``expect`` maps a
    label to a predicate on kernel names: each such case must own a launch of a kernel the
    predicate accepts (launches are matched one to one, so a case that fell back to plain
    XLA code is found even when another case launches a kernel of the same name).

    Returns ``{target: GpuCompileResult}`` of the whole program.
    """
    labels = list(cases)

    def program(all_args):
        outs = []
        for label, args in zip(labels, all_args):
            try:
                outs.append(cases[label][0](*args))
            except Exception as e:
                e.add_note(f"(while tracing the case {label})")
                raise
        return outs

    all_args = [cases[label][1] for label in labels]
    results = {}
    for target in targets:
        result = testing.compile_for_gpu(program, all_args, target=target)
        if not result.ok:
            rejected = []
            for label in labels:
                alone = testing.compile_for_gpu(cases[label][0], *cases[label][1], target=target)
                if not alone.ok:
                    rejected.append(f"{label}: {alone.describe()}")
            pytest.fail(f"XLA:GPU ({target}) rejects the cases:\n" + "\n".join(
                rejected or [f"(only together) {result.describe()}"]), pytrace=False)
        COMPILED[backend, target] += len(labels)
        results[target] = result
        if expect:
            missing = _unmatched(expect, [k.name for k in result.kernels])
            assert not missing, (f"{target}: no kernel launch of their own for {missing}",
                                 [k.name for k in result.kernels])
    return results


def _unmatched(expect, launches):
    """Labels left without a launch when each takes its own launch its predicate accepts."""
    free = list(launches)
    candidates = {label: [i for i, n in enumerate(free) if pred(n)]
                  for label, pred in expect.items()}
    taken, missing = set(), []
    for label in sorted(candidates, key=lambda lb: len(candidates[lb])):
        pick = next((i for i in candidates[label] if i not in taken), None)
        if pick is None:
            missing.append(label)
        else:
            taken.add(pick)
    return missing
