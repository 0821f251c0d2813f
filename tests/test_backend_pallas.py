"""Pallas backend: CPU interpret mode against NumPy, CUDA lowering and XLA:GPU compiles for
sm_90/sm_80 on any machine, GPU run."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gpu_utils import (
    GPU_TARGETS,
    compile_for_targets,
    lower_for_cuda,
    requires_gpu,
    requires_gpu_compiler,
)
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

import primforge
from primforge import _compat
from primforge.kernel.kernel import KernelError


def _affine_gen(platform, outs, **kw):
    def body(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2.0 + 1.0

    params = plgpu.CompilerParams(num_warps=4, num_stages=2) if platform == "gpu" else None
    return pl.pallas_call(body, out_shape=outs[0], interpret=platform == "cpu",
                          compiler_params=params)


def _rowsum_gen(platform, ins, outs, **kw):

    def body(x_ref, o_ref):
        o_ref[...] = jnp.sum(x_ref[...], axis=1)

    params = plgpu.CompilerParams(num_warps=4) if platform == "gpu" else None
    return pl.pallas_call(body, out_shape=outs[0], interpret=platform == "cpu",
                          compiler_params=params)


def _make(name, gen):
    k = primforge.XLACustomKernel(name, replace=True)
    k.def_pallas_kernel("cpu", gen)
    k.def_pallas_kernel("gpu", gen)
    return k


def test_elementwise_cpu_interpret_matches_numpy():
    k = _make("t_pallas_affine", _affine_gen)
    x = np.random.default_rng(0).normal(size=(64,)).astype(np.float32)
    out = jax.jit(lambda x: k(x, outs=jax.ShapeDtypeStruct(x.shape, x.dtype)))(x)
    np.testing.assert_allclose(np.asarray(out), 2 * x + 1, rtol=1e-6)


def test_row_reduction_cpu_and_vmap():
    k = _make("t_pallas_rowsum", _rowsum_gen)
    x = np.random.default_rng(1).normal(size=(3, 8, 16)).astype(np.float32)
    f = lambda x: k(x, outs=jax.ShapeDtypeStruct(x.shape[:1], x.dtype))
    np.testing.assert_allclose(np.asarray(f(x[0])), x[0].sum(1), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(jax.vmap(f)(x)), x.sum(2), rtol=1e-5)


def test_cpu_without_interpret_is_a_clear_error():
    def gen(outs, **kw):
        return pl.pallas_call(lambda x, o: o.__setitem__(..., x[...]), out_shape=outs[0])

    k = primforge.XLACustomKernel("t_pallas_nointerp", replace=True)
    k.def_pallas_kernel("cpu", gen)
    with pytest.raises(KernelError, match="interpret"):
        k(jnp.ones(4), outs=jax.ShapeDtypeStruct((4,), jnp.float32))


def test_gpu_lowering_on_any_machine():
    k = _make("t_pallas_lower", _affine_gen)
    text = lower_for_cuda(lambda x: k(x, outs=jax.ShapeDtypeStruct(x.shape, x.dtype)),
                          jnp.ones(128, jnp.float32))
    assert "__gpu$xla.gpu.triton" in text
    assert "num_warps = 4" in text and "num_stages = 2" in text


def test_tpu_lowering_on_any_machine():
    """The same generator registered for 'tpu' lowers to a Mosaic call without a TPU."""
    k = primforge.XLACustomKernel("t_pallas_tpu", replace=True)
    k.def_pallas_kernel("tpu", _affine_gen)
    k.def_pallas_kernel("cpu", _affine_gen)
    x = jnp.ones((8, 128), jnp.float32)
    f = lambda x: k(x, outs=jax.ShapeDtypeStruct(x.shape, x.dtype))
    text = jax.jit(f).trace(x).lower(lowering_platforms=("tpu",)).as_text()
    assert "tpu_custom_call" in text and "xla.gpu.triton" not in text
    np.testing.assert_allclose(np.asarray(f(x)), 3 * np.ones((8, 128)))  # the CPU twin


@requires_gpu_compiler
def test_gpu_compiles_for_every_target_with_the_requested_warps():
    """XLA:GPU compiles the Triton kernel for sm_90 and sm_80; 4 warps give 128 threads."""
    k = _make("t_pallas_compile", _affine_gen)
    f = lambda x: k(x, outs=jax.ShapeDtypeStruct(x.shape, x.dtype))
    results = compile_for_targets(f, jnp.ones(128, jnp.float32), backend="pallas", ptx=True)
    for target in GPU_TARGETS:
        (body,) = [kern for kern in results[target].kernels if kern.name == "body"]
        assert body.block == (128, 1, 1) and body.grid == (1, 1, 1), (target, body)
        if _compat.JAX_VERSION < (0, 11):  # JAX 0.11's XLA dumps no PTX of its kernels
            assert f".target {results[target].sm}" in results[target].ptx["body"]


@requires_gpu_compiler
def test_gpu_row_reduction_and_its_vmap_compile_for_every_target():
    k = _make("t_pallas_rowsum_compile", _rowsum_gen)
    f = lambda x: k(x, outs=jax.ShapeDtypeStruct(x.shape[:1], x.dtype))
    compile_for_targets(f, jnp.ones((8, 16), jnp.float32), backend="pallas")
    results = compile_for_targets(jax.vmap(f), jnp.ones((3, 8, 16), jnp.float32),
                                  backend="pallas")
    for result in results.values():  # one launch per batch element: a grid of 3
        assert [kern.grid for kern in result.kernels if kern.name == "body"] == [(3, 1, 1)]


@requires_gpu
def test_gpu_run_matches_numpy():
    k = _make("t_pallas_gpu", _affine_gen)
    x = np.arange(256, dtype=np.float32)
    out = k(jax.device_put(x, jax.devices("gpu")[0]), outs=jax.ShapeDtypeStruct(x.shape, x.dtype))
    np.testing.assert_allclose(np.asarray(out), 2 * x + 1)
