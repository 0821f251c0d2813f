"""The plasticity updates compiled by XLA:GPU for sm_90 and sm_80 (no GPU needed).

Both GPU paths of the compressed update (the opt-in Pallas kernel through Triton and ptxas,
and the jax reference, the GPU default), on rows and on columns, with and without bounds,
float32 and float64 weights, int32 and int64 indices; the dense update's jax path; and
``jax.grad`` and ``jax.vmap`` of the Pallas path. Numerics of the same kernels are checked
on the CPU in test_ops_plasticity.py (the Pallas body interpreted).
"""

from __future__ import annotations

import functools

import jax
import pytest
from gpu_utils import compile_for_targets, requires_gpu_compiler

from primforge.ops import plasticity

pytestmark = requires_gpu_compiler

M, N, NNZ = 37, 45, 300
sds = jax.ShapeDtypeStruct


def _args(on_rows, dtype, index_dtype):
    spikes, trace = (M, N) if on_rows else (N, M)
    return (sds((NNZ,), dtype), sds((NNZ,), index_dtype), sds((M + 1,), index_dtype),
            sds((spikes,), "bool"), sds((trace,), dtype))


def _update(backend, on_rows, bounds):
    lo, hi = bounds
    return functools.partial(plasticity._compressed_call, shape=(M, N), on_rows=on_rows,
                             w_min=lo, w_max=hi, backend=backend)


def _pallas_kernel_present(result, on_rows):
    name = "pf_plasticity_rows" if on_rows else "pf_plasticity_cols"
    return any(k.name.startswith(name) for k in result.kernels)


@pytest.mark.parametrize("dtype,index_dtype", [("float32", "int32"), ("float64", "int64")])
@pytest.mark.parametrize("bounds", [(None, None), (0.0, 1.0)], ids=["free", "bounded"])
@pytest.mark.parametrize("on_rows", [True, False], ids=["rows", "cols"])
@pytest.mark.parametrize("backend", ["pallas", "jax"])
def test_compressed_update_compiles(backend, on_rows, bounds, dtype, index_dtype):
    results = compile_for_targets(_update(backend, on_rows, bounds),
                                  *_args(on_rows, dtype, index_dtype), backend=backend)
    if backend == "pallas":
        for target, result in results.items():
            assert _pallas_kernel_present(result, on_rows), (target, result.kernels)


@pytest.mark.parametrize("on_rows", [True, False], ids=["rows", "cols"])
def test_grad_and_vmap_of_pallas_update_compile(on_rows):
    f = _update("pallas", on_rows, (0.0, 1.0))
    data, idx, ptr, spikes, trace = _args(on_rows, "float32", "int32")

    def loss(d, t, i, p, s):
        return f(d, i, p, s, t).sum()

    compile_for_targets(jax.grad(loss, argnums=(0, 1)), data, trace, idx, ptr, spikes,
                        backend="pallas")
    batched = jax.vmap(f, in_axes=(None, None, None, 0, 0))
    compile_for_targets(batched, data, idx, ptr, sds((4,) + spikes.shape, "bool"),
                        sds((4,) + trace.shape, "float32"), backend="pallas")


def test_dense_update_jax_path_compiles():
    f = functools.partial(plasticity._dense_call, on_rows=True, w_min=0.0, w_max=1.0,
                          backend="jax")
    compile_for_targets(f, sds((M, N), "float32"), sds((M,), "bool"), sds((N,), "float32"),
                        backend="jax")
