"""The GPU kernels of benchmarks/backends.py, compiled by XLA:GPU for sm_90 and sm_80.

That benchmark is the first thing to run on a lent GPU; compiling its kernels here, at the
sizes it runs them, finds what would fail there before a GPU is needed. Triton and
numba_cuda kernels are included when their packages are installed.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from _scripts import load_script
from gpu_utils import compile_for_targets, requires_gpu_compiler

import primforge

pytestmark = requires_gpu_compiler


def _benchmark():
    # registered: numba-cuda kernels need their module importable
    return load_script("benchmarks/backends.py", "primforge_bench_backends", register=True)


ALL = ("affine", "rowsum", "gather", "scatter_add")
OPS = {"jax": ALL, "cuda_raw": ALL, "pallas": ALL[:3], "warp": ALL[:3], "triton": ALL[:3],
       "numba_cuda": ALL[:3]}  # the benchmark has no scatter-add for the last four
KNOWN = {
    ("pallas", "gather"): pytest.mark.xfail(
        strict=True, raises=primforge.KernelError,
        reason="the benchmark's Pallas gather indexes a ref with an array, which Pallas' "
        "Triton lowering does not implement (gather)"),
    ("pallas", "rowsum"): pytest.mark.xfail(
        run=False, reason="the benchmark's Pallas row sum is one program over the whole "
        "matrix (no grid): XLA:GPU takes minutes to compile it (2 min for 512x512 here)"),
}


@pytest.mark.parametrize("backend,op", [
    pytest.param(b, op, marks=KNOWN.get((b, op), ()), id=f"{b}-{op}")
    for b, ops in OPS.items() for op in ops])
def test_benchmark_kernel_compiles_for_every_target(backend, op):
    bench = _benchmark()
    make_gen = bench.backend_generators("gpu").get(backend)
    if make_gen is None:
        pytest.skip(f"the {backend} backend is not available here (its extra is missing)")
    gen = make_gen(op)
    assert gen is not None, f"the benchmark no longer has a {backend} kernel for {op}"
    args, shape, _, _ = bench.problems(quick=False, small=False)[op]
    k = primforge.XLACustomKernel(f"t_bench_{backend}_{op}", replace=True)
    k.def_kernel(backend, "gpu", gen)
    out = jax.ShapeDtypeStruct(shape, jnp.float32)
    structs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args]
    results = compile_for_targets(lambda *a: k(*a, outs=out), *structs, backend=backend)
    for result in results.values():
        assert result.kernels, result.describe()
