"""One elementwise kernel, ``y = 2 x + 1`` on float32, written for every backend.

The acceptance command uses it to ask each backend to launch something (the environment
step) and to time each backend against ``jax.numpy`` and the device copy (the benchmark
step). Built on demand by :func:`affine_kernel`, so importing this module registers nothing.
"""

from __future__ import annotations

import functools

import jax
import numpy as np

from primforge.kernel.kernel import XLACustomKernel

#: Elements per program of the block-wise backends (pallas, triton).
BLOCK = 1024

_CUDA_SOURCE = r"""
#include <cuda_runtime.h>
#include "xla/ffi/api/ffi.h"
namespace ffi = xla::ffi;

__global__ void pf_affine_kernel(const float* x, float* y, size_t n) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n) y[i] = 2.0f * x[i] + 1.0f;
}

static ffi::Error Affine(cudaStream_t stream, ffi::Buffer<ffi::F32> x,
                         ffi::ResultBuffer<ffi::F32> y) {
  size_t n = x.element_count();
  unsigned blocks = (unsigned)((n + 255) / 256);
  pf_affine_kernel<<<blocks, 256, 0, stream>>>(x.typed_data(), y->typed_data(), n);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return ffi::Error::Internal(cudaGetErrorString(err));
  return ffi::Error::Success();
}
XLA_FFI_DEFINE_HANDLER_SYMBOL(PfAffineGpu, Affine,
    ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>()
        .Arg<ffi::Buffer<ffi::F32>>().Ret<ffi::Buffer<ffi::F32>>());
"""

_CPP_SOURCE = r"""
#include "xla/ffi/api/ffi.h"
namespace ffi = xla::ffi;

static ffi::Error Affine(ffi::Buffer<ffi::F32> x, ffi::ResultBuffer<ffi::F32> y) {
  const float* in = x.typed_data();
  float* out = y->typed_data();
  for (size_t i = 0; i < x.element_count(); ++i) out[i] = 2.0f * in[i] + 1.0f;
  return ffi::Error::Success();
}
XLA_FFI_DEFINE_HANDLER_SYMBOL(PfAffineCpu, Affine,
    ffi::Ffi::Bind().Arg<ffi::Buffer<ffi::F32>>().Ret<ffi::Buffer<ffi::F32>>());
"""


def _jax_gen(**_):
    return lambda x: 2 * x + 1


def _numba_gen(**_):
    import numba

    @numba.njit
    def affine(x, out):
        for i in range(x.size):
            out[i] = 2 * x[i] + 1

    return affine


def _pallas_gen(platform, outs, **_):
    from jax.experimental import pallas as pl

    n = outs[0].shape[0]
    block = min(BLOCK, n)

    def body(x_ref, o_ref):
        o_ref[...] = 2 * x_ref[...] + 1

    params = None
    if platform == "gpu":
        from jax.experimental.pallas import triton as plgpu

        params = plgpu.CompilerParams(num_warps=4, num_stages=1)
    spec = pl.BlockSpec((block,), lambda i: (i,))
    return pl.pallas_call(body, out_shape=outs[0], grid=(pl.cdiv(n, block),),
                          in_specs=[spec], out_specs=spec, interpret=platform == "cpu",
                          compiler_params=params)


@functools.cache
def _triton_fn():
    import triton
    import triton.language as tl

    @triton.jit
    def affine(x_ptr, o_ptr, N: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < N
        tl.store(o_ptr + offs, 2.0 * tl.load(x_ptr + offs, mask=m) + 1.0, mask=m)

    return affine


def _triton_gen(ins, **_):
    from primforge.backends.triton import triton_kernel

    n = ins[0].shape[0]
    return triton_kernel(_triton_fn(), grid=(-(-n // BLOCK),), num_warps=4, num_stages=1,
                         N=n, BLOCK=BLOCK)


@functools.cache
def _numba_cuda_fn():
    from numba import cuda

    @cuda.jit
    def affine(x, y):
        i = cuda.grid(1)
        if i < x.size:
            y[i] = 2 * x[i] + 1

    return affine


def _numba_cuda_gen(outs, **_):
    from primforge.backends.numba_cuda import numba_cuda_kernel

    return numba_cuda_kernel(_numba_cuda_fn(), launch_dims=outs[0].shape[0])


@functools.cache
def _warp_fn():
    import warp as wp

    @wp.kernel
    def affine(x: wp.array(dtype=wp.float32), out: wp.array(dtype=wp.float32)):
        i = wp.tid()
        out[i] = 2.0 * x[i] + 1.0

    return affine


def _warp_gen(**_):
    from primforge.backends.warp import warp_kernel

    return warp_kernel(_warp_fn())


def _cuda_raw_gen(platform, outs, **_):
    from primforge.backends import cuda as pcuda

    if platform == "gpu":
        module = pcuda.load_cuda_inline(_CUDA_SOURCE, name="pf_acceptance_affine")
        return module.function("PfAffineGpu", outs=outs[0])
    module = pcuda.load_cpp_inline(_CPP_SOURCE, name="pf_acceptance_affine")
    return module.function("PfAffineCpu", outs=outs[0])


_GENERATORS = {
    "jax": _jax_gen, "numba": _numba_gen, "pallas": _pallas_gen, "triton": _triton_gen,
    "numba_cuda": _numba_cuda_gen, "warp": _warp_gen, "cuda_raw": _cuda_raw_gen,
}
#: Backends with an affine kernel on each platform (cpu: the ones that run without a GPU).
BACKENDS = {
    "gpu": ("pallas", "triton", "numba_cuda", "warp", "cuda_raw"),
    "cpu": ("numba", "pallas", "cuda_raw"),
}


@functools.cache
def affine_kernel(platform: str) -> XLACustomKernel:
    """The ``y = 2 x + 1`` kernel with a ``jax`` reference and every backend of ``platform``.

    Registering a backend whose package is missing is allowed: the call fails, naming it.
    """
    k = XLACustomKernel(f"tools.gpu_acceptance.affine_{platform}", replace=True)
    k.def_kernel("jax", platform, _jax_gen)
    for name in BACKENDS[platform]:
        k.def_kernel(name, platform, _GENERATORS[name])
    return k


def run_affine(platform: str, backend: str, x):
    """``2 x + 1`` through ``backend`` (a jitted call; ``x`` is a 1-D float32 array)."""
    k = affine_kernel(platform)
    out = jax.ShapeDtypeStruct(x.shape, np.float32)
    return k(x, outs=out, backend=backend)
