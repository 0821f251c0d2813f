"""numba_cuda backend: simulator run (subprocess), PTX + CUDA lowering here, XLA:GPU compiles
and ptxas assembly for sm_90/sm_80 here, GPU run."""

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("numba_cuda", reason="optional backend: pip install 'primforge[numba-cuda]'")

from gpu_utils import (
    GPU_TARGETS,
    compile_for_targets,
    lower_for_cuda,
    requires_gpu,
    requires_gpu_compiler,
)

import primforge
from primforge.backends import numba_cuda as nc

SIM_SCRIPT = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np, primforge
    from numba import cuda
    from primforge.backends.numba_cuda import numba_cuda_kernel

    @cuda.jit
    def rowsum(x, out):
        i = cuda.grid(1)
        if i < x.shape[0]:
            s = 0.0
            for j in range(x.shape[1]):
                s += x[i, j]
            out[i] = s

    k = primforge.XLACustomKernel('sim_rowsum')
    k.def_kernel('numba_cuda', 'cpu', lambda outs, **kw: numba_cuda_kernel(
        rowsum, launch_dims=int(np.prod(outs[0].shape)), threads_per_block=4))
    x = np.random.default_rng(0).normal(size=(10, 7)).astype(np.float32)
    out = k(x, outs=jax.ShapeDtypeStruct((10,), jnp.float32))
    np.testing.assert_allclose(np.asarray(out), x.sum(1), rtol=1e-5)
    bx = np.stack([x, 2 * x])
    f = lambda x: k(x, outs=jax.ShapeDtypeStruct((10,), jnp.float32))
    np.testing.assert_allclose(np.asarray(jax.vmap(f)(bx)), bx.sum(2), rtol=1e-5)
    print('SIM-OK')
""")


def test_simulator_runs_kernel_through_primforge():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", SIM_SCRIPT], capture_output=True, text=True,
                          env=env, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "SIM-OK" in proc.stdout


def test_cpu_without_simulator_is_a_clear_error():
    from numba import cuda

    @cuda.jit
    def copy(x, o):
        o[0] = x[0]

    k = primforge.XLACustomKernel("t_nc_cpu", replace=True)
    k.def_kernel("numba_cuda", "cpu", lambda **kw: copy)
    with pytest.raises(primforge.KernelError, match="NUMBA_ENABLE_CUDASIM"):
        k(jnp.ones(1), outs=jax.ShapeDtypeStruct((1,), jnp.float32))


def _nvrtc_ok() -> bool:
    try:
        from numba.cuda.cudadrv import nvrtc

        nvrtc.get_supported_ccs()
    except Exception:  # noqa: BLE001
        return False
    return True


needs_ptx = pytest.mark.skipif(not _nvrtc_ok(), reason="NVRTC/NVVM not found: pip install "
                               "nvidia-cuda-nvrtc (CUDA toolkit libraries) to compile PTX")


@needs_ptx
def test_ptx_and_gpu_lowering_on_any_machine():
    from numba import cuda

    @cuda.jit
    def affine(x, o):
        i = cuda.grid(1)
        if i < x.size:
            o[i] = 2.0 * x[i] + 1.0

    k = primforge.XLACustomKernel("t_nc_lower", replace=True)
    k.def_numba_cuda_kernel(lambda outs, **kw: nc.numba_cuda_kernel(
        affine, launch_dims=int(np.prod(outs[0].shape)), threads_per_block=128))
    text = lower_for_cuda(lambda x: k(x, outs=jax.ShapeDtypeStruct(x.shape, x.dtype)),
                          jnp.ones(1000, jnp.float32))
    assert "PrimforgePtxLaunch" in text
    assert "block = dense<[128, 1, 1]>" in text and "grid = dense<[8, 1, 1]>" in text
    assert 'abi = "numba"' in text and ".entry" in text


@needs_ptx
def test_ptx_compiles_with_a_numpy_that_has_no_row_stack():
    # NumPy 2.5 removed numpy.row_stack, which numba-cuda 0.30 looks up on its first
    # compile; a fresh process without the name stands in for that NumPy.
    script = textwrap.dedent("""
        import numpy as np
        if hasattr(np, "row_stack"):
            del np.row_stack
        from numba import cuda
        import jax
        from primforge.backends import numba_cuda as nc

        @cuda.jit
        def affine(x, o):
            i = cuda.grid(1)
            if i < x.size:
                o[i] = 2.0 * x[i] + 1.0

        s = jax.ShapeDtypeStruct((8,), np.float32)
        ptx, entry = nc.compile_ptx(affine, [s], [s])
        print("ENTRY", entry in ptx)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, check=False,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert "ENTRY True" in proc.stdout, proc.stderr[-3000:]


@needs_ptx
@requires_gpu_compiler
def test_gpu_compiles_and_the_ptx_assembles_for_every_target():
    """XLA:GPU compiles the launcher's custom call, and ptxas assembles the kernel's PTX
    (which XLA never looks into) for sm_90 and sm_80, with the launch shape primforge chose."""
    from numba import cuda

    @cuda.jit
    def rowsum(x, out):
        i = cuda.grid(1)
        if i < x.shape[0]:
            s = 0.0
            for j in range(x.shape[1]):
                s += x[i, j]
            out[i] = s

    k = primforge.XLACustomKernel("t_nc_compile", replace=True)
    k.def_numba_cuda_kernel(lambda outs, **kw: nc.numba_cuda_kernel(
        rowsum, launch_dims=int(np.prod(outs[0].shape)), threads_per_block=64))
    f = lambda x: k(x, outs=jax.ShapeDtypeStruct(x.shape[:1], x.dtype))
    for fn, x in [(f, jax.ShapeDtypeStruct((1000, 7), jnp.float32)),
                  (jax.vmap(f), jax.ShapeDtypeStruct((3, 1000, 7), jnp.float64))]:
        with jax.enable_x64(x.dtype == jnp.float64):
            results = compile_for_targets(fn, x, backend="numba_cuda")
        for target in GPU_TARGETS:
            (launch,) = [c for c in results[target].kernels if c.kind == "embedded-ptx"]
            assert launch.grid == (16, 1, 1) and launch.block == (64, 1, 1), launch
            assert "rowsum" in launch.name


@needs_ptx
@requires_gpu_compiler
@pytest.mark.xfail(strict=True, reason="numba_cuda compiles PTX for the local GPU, else sm_80, "
                   "whatever the target being compiled for (make_callable has no view of it)")
def test_ptx_is_built_for_the_target_being_compiled_for():
    from numba import cuda

    @cuda.jit
    def copy(x, o):
        i = cuda.grid(1)
        if i < o.size:
            o[i] = x[i]

    k = primforge.XLACustomKernel("t_nc_target_cc", replace=True)
    k.def_numba_cuda_kernel(lambda outs, **kw: nc.numba_cuda_kernel(
        copy, launch_dims=int(np.prod(outs[0].shape)), threads_per_block=32))
    f = lambda x: k(x, outs=jax.ShapeDtypeStruct(x.shape, x.dtype))
    from primforge import testing

    for target in GPU_TARGETS:
        result = testing.compile_for_gpu(f, jnp.ones(64, jnp.float32), target=target, ptx=True)
        (entry,) = [c.name for c in result.kernels if c.kind == "embedded-ptx"]
        assert f".target {result.sm}" in result.ptx[entry], target


@needs_ptx
@requires_gpu_compiler
def test_ptx_that_does_not_assemble_fails_the_compile_by_kernel_name():
    """The check can fail: PTX asking for more shared memory than any GPU has."""
    from numba import cuda

    @cuda.jit
    def hog(x, o):
        buf = cuda.shared.array(200_000, dtype=np.float32)  # 800 kB of static shared memory
        i = cuda.grid(1)
        buf[i] = x[i]
        cuda.syncthreads()
        if i < o.size:
            o[i] = buf[i]

    from primforge import testing

    k = primforge.XLACustomKernel("t_nc_hog", replace=True)
    k.def_numba_cuda_kernel(lambda outs, **kw: nc.numba_cuda_kernel(
        hog, launch_dims=int(np.prod(outs[0].shape)), threads_per_block=32))
    f = lambda x: k(x, outs=jax.ShapeDtypeStruct(x.shape, x.dtype))
    result = testing.compile_for_gpu(f, jnp.ones(32, jnp.float32), target="h100")
    assert not result.ok and "hog" in result.failed_kernel, result.describe()
    assert "ptxas" in result.error


@requires_gpu
def test_gpu_run_matches_numpy():
    from numba import cuda

    @cuda.jit
    def affine(x, o):
        i = cuda.grid(1)
        if i < x.size:
            o[i] = 2.0 * x[i] + 1.0

    k = primforge.XLACustomKernel("t_nc_gpu", replace=True)
    k.def_numba_cuda_kernel(lambda outs, **kw: nc.numba_cuda_kernel(
        affine, launch_dims=int(np.prod(outs[0].shape)), threads_per_block=128))
    x = np.arange(1000, dtype=np.float32)
    f = lambda x: k(x, outs=jax.ShapeDtypeStruct(x.shape, x.dtype))
    np.testing.assert_allclose(np.asarray(f(x)), 2 * x + 1)
    bx = np.stack([x, -x])
    np.testing.assert_allclose(np.asarray(jax.vmap(f)(bx)), 2 * bx + 1)
