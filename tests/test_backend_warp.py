"""Warp backend: kernels on Warp's CPU device against NumPy, CUDA lowering, XLA:GPU compiles
and Warp's own CUDA build for sm_90/sm_80 on any machine, GPU run."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

wp = pytest.importorskip("warp", reason="optional backend: pip install 'primforge[warp]'")

from gpu_utils import (
    GPU_TARGETS,
    compile_for_targets,
    lower_for_cuda,
    requires_gpu,
    requires_gpu_compiler,
)

import primforge
from primforge.backends.warp import warp_kernel
from primforge.kernel.kernel import KernelError


@wp.kernel
def _axpb(x: wp.array(dtype=wp.float32), a: float, y: wp.array(dtype=wp.float32),
          out: wp.array(dtype=wp.float32)):
    i = wp.tid()
    out[i] = a * x[i] + y[i]


@wp.kernel
def _rowsum(x: wp.array2d(dtype=wp.float32), out: wp.array(dtype=wp.float32)):
    i = wp.tid()
    s = wp.float32(0.0)
    for j in range(x.shape[1]):
        s += x[i, j]
    out[i] = s


def _kernel(name, platform):
    k = primforge.XLACustomKernel(name, replace=True)
    k.def_warp_kernel(lambda a, **kw: warp_kernel(_axpb, scalars={"a": a}), platform=platform)
    return k


def test_cpu_matches_numpy():
    k = _kernel("t_warp_axpb", "cpu")
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(2, 100)).astype(np.float32)
    out = k(x, y, outs=jax.ShapeDtypeStruct((100,), jnp.float32), a=3.0)
    np.testing.assert_allclose(np.asarray(out), 3 * x + y, rtol=1e-6)


def test_row_reduction_with_explicit_dim_and_vmap():
    k = primforge.XLACustomKernel("t_warp_rowsum", replace=True)
    k.def_warp_kernel(lambda ins, **kw: warp_kernel(_rowsum, dim=ins[0].shape[0]), platform="cpu")
    x = np.random.default_rng(1).normal(size=(4, 6, 9)).astype(np.float32)
    f = lambda x: k(x, outs=jax.ShapeDtypeStruct((x.shape[0],), jnp.float32))
    np.testing.assert_allclose(np.asarray(jax.jit(jax.vmap(f))(x)), x.sum(2), rtol=1e-5)


def test_wrong_arity_names_the_parameters():
    k = _kernel("t_warp_arity", "cpu")
    with pytest.raises(KernelError, match="expects 2 input array"):
        k(jnp.ones(3), outs=jax.ShapeDtypeStruct((3,), jnp.float32), a=1.0)


def test_gpu_lowering_on_any_machine():
    k = _kernel("t_warp_lower", "gpu")
    text = lower_for_cuda(
        lambda x, y: k(x, y, outs=jax.ShapeDtypeStruct((8,), jnp.float32), a=2.0),
        jnp.ones(8, jnp.float32), jnp.ones(8, jnp.float32))
    assert "stablehlo.custom_call" in text


@requires_gpu_compiler
def test_gpu_compiles_for_every_target():
    """XLA:GPU accepts Warp's CUDA custom call (registered for CUDA without a GPU)."""
    k = _kernel("t_warp_compile", "gpu")
    f = lambda x, y: k(x, y, outs=jax.ShapeDtypeStruct((8,), jnp.float32), a=2.0)
    x = jnp.ones(8, jnp.float32)
    for fn, args in [(f, (x, x)), (jax.vmap(f), (jnp.ones((3, 8)), jnp.ones((3, 8))))]:
        for result in compile_for_targets(fn, *args, backend="warp").values():
            assert [c.kind for c in result.kernels if c.name in result.custom_calls] == [
                "kCustomCall"], result.describe()


@pytest.mark.parametrize("target", GPU_TARGETS)
def test_warp_builds_the_kernels_cuda_code_for_every_target(target, tmp_path):
    """What XLA never sees: Warp's generated CUDA, built ahead of time into a cubin (NVRTC)."""
    arch = {"h100": 90, "a100": 80}[target]
    for kernel in (_axpb, _rowsum):
        paths = wp.compile_aot_module(kernel.module, arch=arch, module_dir=tmp_path)
        cubins = [p for p in paths if str(p).endswith(f".sm{arch}.cubin")]
        assert cubins and all(p.stat().st_size > 0 for p in cubins), paths


@requires_gpu
def test_gpu_run_matches_numpy():
    k = _kernel("t_warp_gpu", "gpu")
    x = np.arange(64, dtype=np.float32)
    out = k(x, x, outs=jax.ShapeDtypeStruct((64,), jnp.float32), a=0.5)
    np.testing.assert_allclose(np.asarray(out), 1.5 * x, rtol=1e-6)
