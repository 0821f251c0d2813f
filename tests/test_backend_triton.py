"""Triton backend: TTIR generation and CUDA lowering on any machine, GPU run."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

triton = pytest.importorskip("triton", reason="optional backend: pip install 'primforge[triton]'")
import triton.language as tl
from gpu_utils import lower_for_cuda, requires_gpu

import primforge
from primforge.kernel.backends import triton as ptriton


@triton.jit
def _add(x_ptr, y_ptr, o_ptr, N: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < N
    tl.store(o_ptr + offs, tl.load(x_ptr + offs, mask=m) + tl.load(y_ptr + offs, mask=m), mask=m)


def _gen(ins, **kw):
    n = ins[0].shape[0]
    return ptriton.triton_kernel(_add, grid=lambda m: (triton.cdiv(m["N"], m["BLOCK"]),),
                                 num_warps=2, num_stages=1, N=n, BLOCK=256)


def _kernel(name):
    k = primforge.XLACustomKernel(name, replace=True)
    k.def_triton_kernel(_gen)
    return k


def test_ttir_is_generated_for_the_call_dtypes():
    text = ptriton.to_ttir(_add, [jnp.float16] * 3, {"N": 10, "BLOCK": 16})
    assert "tt.func" in text and "!tt.ptr<f16>" in text


def test_gpu_lowering_carries_grid_warps_and_stages():
    k = _kernel("t_triton_lower")
    f = lambda x, y: k(x, y, outs=jax.ShapeDtypeStruct(x.shape, x.dtype))
    text = lower_for_cuda(f, jnp.ones(1000, jnp.float32), jnp.ones(1000, jnp.float32))
    assert "__gpu$xla.gpu.triton" in text
    for field in ("grid_x = 4 : i32", "grid_y = 1 : i32", "num_warps = 2 : i32",
                  "num_stages = 1 : i32", 'name = "_add"'):
        assert field in text, field
    vtext = lower_for_cuda(jax.vmap(f), jnp.ones((3, 1000)), jnp.ones((3, 1000)))
    assert "__gpu$xla.gpu.triton" in vtext


def test_wrong_number_of_pointers_is_explained():
    k = primforge.XLACustomKernel("t_triton_arity", replace=True)
    k.def_triton_kernel(lambda **kw: ptriton.triton_kernel(_add, grid=1, N=4, BLOCK=4))
    with pytest.raises(primforge.KernelError, match="takes 3 pointer"):
        lower_for_cuda(lambda x: k(x, outs=jax.ShapeDtypeStruct((4,), jnp.float32)),
                       jnp.ones(4, jnp.float32))


def test_launch_config_is_validated():
    with pytest.raises(ValueError, match="num_warps"):
        ptriton.triton_kernel(_add, grid=1, num_warps=3)


@requires_gpu
def test_gpu_run_matches_numpy():
    k = _kernel("t_triton_gpu")
    x = np.arange(1000, dtype=np.float32)
    out = k(x, 2 * x, outs=jax.ShapeDtypeStruct(x.shape, x.dtype))
    np.testing.assert_allclose(np.asarray(out), 3 * x)
