"""The same operators on every backend available here: latency, throughput, bandwidth.

Operators (float32):
    affine       y = 2 x + 1                        (n)
    rowsum       y[i] = sum_j x[i, j]               (rows x cols)
    gather       y[i] = x[idx[i]]                   (n from n)
    scatter_add  y = zeros(m); y[idx[i]] += x[i]    (n into m)

Backends: jax (always), numba (CPU), pallas (interpret mode on CPU, at a small size only:
the interpreter is an oracle, not a fast path), warp, cuda_raw (the C++ twin on CPU, nvcc
CUDA on GPU), and on a GPU also triton and numba_cuda. Every result is checked against
NumPy before it is timed. Output: a table on stdout and ``benchmarks/results/backends.json``;
on a GPU the table adds achieved memory bandwidth as a fraction of the device's peak.

Run: ``python benchmarks/backends.py [--quick]``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform as _platform
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import primforge
from primforge.backends import get_backend
from primforge.backends.cuda import find_nvcc

F32 = jnp.float32
# Peak DRAM bandwidth (GB/s) of common NVIDIA parts, by substring of the device kind.
PEAK_GBPS = {"H200": 4800, "H100 PCIe": 2000, "H100": 3350, "A100-SXM4-80GB": 2039,
             "A100": 1555, "L40S": 864, "L4": 300, "A10": 600, "V100": 900, "T4": 320}

# ----------------------------------------------------------------------------- CPU C++ twin
CPP_SOURCE = r"""
#include <cstring>
#include "xla/ffi/api/ffi.h"
namespace ffi = xla::ffi;
using F = ffi::Buffer<ffi::F32>;
using R = ffi::ResultBuffer<ffi::F32>;

static ffi::Error Affine(F x, R y) {
  const float* a = x.typed_data(); float* b = y->typed_data();
  for (size_t i = 0; i < x.element_count(); ++i) b[i] = 2.0f * a[i] + 1.0f;
  return ffi::Error::Success();
}
static ffi::Error RowSum(F x, R y) {
  auto d = x.dimensions(); int64_t r = d[0], c = d[1];
  const float* a = x.typed_data(); float* b = y->typed_data();
  for (int64_t i = 0; i < r; ++i) {
    float s = 0;
    for (int64_t j = 0; j < c; ++j) s += a[i * c + j];
    b[i] = s;
  }
  return ffi::Error::Success();
}
static ffi::Error Gather(F x, ffi::Buffer<ffi::S32> idx, R y) {
  const float* a = x.typed_data(); const int32_t* k = idx.typed_data(); float* b = y->typed_data();
  for (size_t i = 0; i < idx.element_count(); ++i) b[i] = a[k[i]];
  return ffi::Error::Success();
}
static ffi::Error ScatterAdd(F x, ffi::Buffer<ffi::S32> idx, R y) {
  const float* a = x.typed_data(); const int32_t* k = idx.typed_data(); float* b = y->typed_data();
  std::memset(b, 0, y->size_bytes());
  for (size_t i = 0; i < idx.element_count(); ++i) b[k[i]] += a[i];
  return ffi::Error::Success();
}
XLA_FFI_DEFINE_HANDLER_SYMBOL(PfAffine, Affine, ffi::Ffi::Bind().Arg<F>().Ret<F>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(PfRowSum, RowSum, ffi::Ffi::Bind().Arg<F>().Ret<F>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(PfGather, Gather,
    ffi::Ffi::Bind().Arg<F>().Arg<ffi::Buffer<ffi::S32>>().Ret<F>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(PfScatterAdd, ScatterAdd,
    ffi::Ffi::Bind().Arg<F>().Arg<ffi::Buffer<ffi::S32>>().Ret<F>());
"""

CUDA_SOURCE = r"""
#include <cuda_runtime.h>
#include "xla/ffi/api/ffi.h"
namespace ffi = xla::ffi;
using F = ffi::Buffer<ffi::F32>;
using R = ffi::ResultBuffer<ffi::F32>;
using I = ffi::Buffer<ffi::S32>;

__global__ void affine_k(const float* a, float* b, size_t n) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; if (i < n) b[i] = 2.0f * a[i] + 1.0f; }
__global__ void rowsum_k(const float* a, float* b, int64_t r, int64_t c) {
  // one block per row, shared-memory tree reduction
  __shared__ float s[256];
  int64_t row = blockIdx.x; float acc = 0;
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) acc += a[row * c + j];
  s[threadIdx.x] = acc; __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w) s[threadIdx.x] += s[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) b[row] = s[0]; }
__global__ void gather_k(const float* a, const int32_t* k, float* b, size_t n) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; if (i < n) b[i] = a[k[i]]; }
__global__ void scatter_k(const float* a, const int32_t* k, float* b, size_t n) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; if (i < n) atomicAdd(b + k[i], a[i]); }

static unsigned blocks(size_t n) { return (unsigned)((n + 255) / 256); }
static ffi::Error Affine(cudaStream_t s, F x, R y) {
  size_t n = x.element_count();
  affine_k<<<blocks(n), 256, 0, s>>>(x.typed_data(), y->typed_data(), n);
  return ffi::Error::Success(); }
static ffi::Error RowSum(cudaStream_t s, F x, R y) {
  auto d = x.dimensions();
  rowsum_k<<<(unsigned)d[0], 256, 0, s>>>(x.typed_data(), y->typed_data(), d[0], d[1]);
  return ffi::Error::Success(); }
static ffi::Error Gather(cudaStream_t s, F x, I idx, R y) {
  size_t n = idx.element_count();
  gather_k<<<blocks(n), 256, 0, s>>>(x.typed_data(), idx.typed_data(), y->typed_data(), n);
  return ffi::Error::Success(); }
static ffi::Error ScatterAdd(cudaStream_t s, F x, I idx, R y) {
  size_t n = idx.element_count();
  cudaMemsetAsync(y->typed_data(), 0, y->size_bytes(), s);
  scatter_k<<<blocks(n), 256, 0, s>>>(x.typed_data(), idx.typed_data(), y->typed_data(), n);
  return ffi::Error::Success(); }
#define BIND ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>()
XLA_FFI_DEFINE_HANDLER_SYMBOL(PfAffine, Affine, BIND.Arg<F>().Ret<F>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(PfRowSum, RowSum, BIND.Arg<F>().Ret<F>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(PfGather, Gather, BIND.Arg<F>().Arg<I>().Ret<F>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(PfScatterAdd, ScatterAdd, BIND.Arg<F>().Arg<I>().Ret<F>());
"""
HANDLERS = {"affine": "PfAffine", "rowsum": "PfRowSum", "gather": "PfGather",
            "scatter_add": "PfScatterAdd"}


# ----------------------------------------------------------------------------- generators
def jax_gen(op):
    return {
        "affine": lambda **kw: lambda x: 2 * x + 1,
        "rowsum": lambda **kw: lambda x: jnp.sum(x, axis=1),
        "gather": lambda **kw: lambda x, i: x[i],
        "scatter_add": lambda outs, **kw: lambda x, i: jnp.zeros(outs[0].shape, F32).at[i].add(x),
    }[op]


def numba_gen(op):
    import numba

    @numba.njit
    def affine(x, y):
        for i in range(x.size):
            y[i] = 2 * x[i] + 1

    @numba.njit
    def rowsum(x, y):
        for i in range(x.shape[0]):
            s = np.float32(0)
            for j in range(x.shape[1]):
                s += x[i, j]
            y[i] = s

    @numba.njit
    def gather(x, idx, y):
        for i in range(idx.size):
            y[i] = x[idx[i]]

    @numba.njit
    def scatter_add(x, idx, y):
        y[:] = 0
        for i in range(idx.size):
            y[idx[i]] += x[i]

    fn = {"affine": affine, "rowsum": rowsum, "gather": gather, "scatter_add": scatter_add}[op]
    return lambda **kw: fn


def pallas_gen(op, platform):
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu

    def body_affine(x_ref, o_ref):
        o_ref[...] = 2 * x_ref[...] + 1

    def body_rowsum(x_ref, o_ref):
        o_ref[...] = jnp.sum(x_ref[...], axis=1)

    def body_gather(x_ref, i_ref, o_ref):
        o_ref[...] = x_ref[...][i_ref[...]]

    body = {"affine": body_affine, "rowsum": body_rowsum, "gather": body_gather}.get(op)
    if body is None:
        return None
    block = 1024

    def gen(outs, ins, **kw):
        interpret = platform == "cpu"
        if platform == "gpu" and op == "affine":
            n = ins[0].shape[0]
            spec = pl.BlockSpec((block,), lambda i: (i,))
            return pl.pallas_call(body, out_shape=outs[0], grid=(pl.cdiv(n, block),),
                                  in_specs=[spec], out_specs=spec,
                                  compiler_params=plgpu.CompilerParams(num_warps=4))
        params = plgpu.CompilerParams(num_warps=4) if platform == "gpu" else None
        return pl.pallas_call(body, out_shape=outs[0], interpret=interpret,
                              compiler_params=params)

    return gen


def warp_gen(op):
    import warp as wp

    from primforge.backends.warp import warp_kernel

    if op == "scatter_add":
        return None  # needs a zeroed in-out buffer; primforge.warp_kernel does not alias yet
    kern, dim = _WARP_KERNELS(wp)[op]
    return lambda ins, outs, **kw: warp_kernel(kern, dim=dim(ins, outs))


_WARP_CACHE = {}


def _WARP_KERNELS(wp):
    if _WARP_CACHE:
        return _WARP_CACHE

    @wp.kernel
    def affine(x: wp.array(dtype=wp.float32), y: wp.array(dtype=wp.float32)):
        i = wp.tid()
        y[i] = 2.0 * x[i] + 1.0

    @wp.kernel
    def rowsum(x: wp.array2d(dtype=wp.float32), y: wp.array(dtype=wp.float32)):
        i = wp.tid()
        s = wp.float32(0.0)
        for j in range(x.shape[1]):
            s += x[i, j]
        y[i] = s

    @wp.kernel
    def gather(x: wp.array(dtype=wp.float32), idx: wp.array(dtype=wp.int32),
               y: wp.array(dtype=wp.float32)):
        i = wp.tid()
        y[i] = x[idx[i]]

    first = lambda ins, outs: outs[0].shape
    _WARP_CACHE.update({"affine": (affine, first), "rowsum": (rowsum, first),
                        "gather": (gather, first)})
    return _WARP_CACHE


def cuda_raw_gen(op, platform):
    from primforge.backends import cuda as pcuda

    if platform == "gpu":
        module = pcuda.load_cuda_inline(CUDA_SOURCE, name="pf_bench")
    else:
        module = pcuda.load_cpp_inline(CPP_SOURCE, name="pf_bench_cpu")
    return lambda outs, **kw: module.function(HANDLERS[op], outs=outs[0])


def triton_gen(op):
    import triton
    import triton.language as tl

    from primforge.backends.triton import triton_kernel

    kernels = _triton_kernels(triton, tl)
    if op == "rowsum":
        def gen(ins, **kw):
            r, c = ins[0].shape
            return triton_kernel(kernels[op], grid=(r,), C=c, BLOCK=triton.next_power_of_2(c))
        return gen

    def gen(ins, **kw):
        n = ins[-1].shape[0] if op != "affine" else ins[0].shape[0]
        return triton_kernel(kernels[op], grid=(triton.cdiv(n, 1024),), N=n, BLOCK=1024)
    return gen


def _triton_kernels(triton, tl):
    @triton.jit
    def affine(x, y, N: tl.constexpr, BLOCK: tl.constexpr):
        o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = o < N
        tl.store(y + o, 2.0 * tl.load(x + o, mask=m) + 1.0, mask=m)

    @triton.jit
    def rowsum(x, y, C: tl.constexpr, BLOCK: tl.constexpr):
        r = tl.program_id(0)
        o = tl.arange(0, BLOCK)
        v = tl.load(x + r * C + o, mask=o < C, other=0.0)
        tl.store(y + r, tl.sum(v, axis=0))

    @triton.jit
    def gather(x, idx, y, N: tl.constexpr, BLOCK: tl.constexpr):
        o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = o < N
        tl.store(y + o, tl.load(x + tl.load(idx + o, mask=m, other=0), mask=m), mask=m)

    return {"affine": affine, "rowsum": rowsum, "gather": gather}


def numba_cuda_gen(op):
    from numba import cuda

    from primforge.backends.numba_cuda import numba_cuda_kernel

    @cuda.jit
    def affine(x, y):
        i = cuda.grid(1)
        if i < x.size:
            y[i] = 2 * x[i] + 1

    @cuda.jit
    def rowsum(x, y):
        i = cuda.grid(1)
        if i < x.shape[0]:
            s = 0.0
            for j in range(x.shape[1]):
                s += x[i, j]
            y[i] = s

    @cuda.jit
    def gather(x, idx, y):
        i = cuda.grid(1)
        if i < idx.size:
            y[i] = x[idx[i]]

    fn = {"affine": affine, "rowsum": rowsum, "gather": gather}.get(op)
    if fn is None:
        return None
    return lambda outs, **kw: numba_cuda_kernel(fn, launch_dims=int(np.prod(outs[0].shape)))


# ----------------------------------------------------------------------------- driver
def problems(quick: bool, small: bool):
    rng = np.random.default_rng(0)
    n = 4096 if small else (1 << 18 if quick else 1 << 22)
    r, c = (64, 64) if small else ((512, 512) if quick else (4096, 1024))
    x = rng.normal(size=n).astype(np.float32)
    xm = rng.normal(size=(r, c)).astype(np.float32)
    idx = rng.integers(0, n, size=n).astype(np.int32)
    m = max(1, n // 16)
    sidx = rng.integers(0, m, size=n).astype(np.int32)
    scat = np.zeros(m, np.float32)
    np.add.at(scat, sidx, x)
    return {
        # op: (args, out struct, numpy reference, bytes moved)
        "affine": ((x,), (n,), 2 * x + 1, 8 * n),
        "rowsum": ((xm,), (r,), xm.sum(1), 4 * r * c + 4 * r),
        "gather": ((x, idx), (n,), x[idx], 12 * n),
        "scatter_add": ((x, sidx), (m,), scat, 8 * n + 4 * m),
    }


def time_call(fn, args, reps):
    out = fn(*args)
    jax.block_until_ready(out)
    for _ in range(2):
        jax.block_until_ready(fn(*args))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return out, statistics.median(times)


def peak_gbps(device) -> float | None:
    kind = getattr(device, "device_kind", "")
    for key, value in PEAK_GBPS.items():
        if key in kind:
            return float(value)
    return None


def backend_generators(platform):
    gens = {"jax": jax_gen}
    if platform == "cpu" and get_backend("numba").is_available():
        gens["numba"] = numba_gen
    gens["pallas"] = lambda op: pallas_gen(op, platform)
    if importlib.util.find_spec("warp") is not None:
        gens["warp"] = warp_gen
    if get_backend("cuda_raw").is_available() and (
            platform == "cpu" or find_nvcc()):
        gens["cuda_raw"] = lambda op: cuda_raw_gen(op, platform)
    if platform == "gpu":
        if get_backend("triton").is_available():
            gens["triton"] = lambda op: _triton_or_none(op)
        if get_backend("numba_cuda").is_available():
            gens["numba_cuda"] = numba_cuda_gen
    return gens


def _triton_or_none(op):
    return None if op == "scatter_add" else triton_gen(op)


def run(quick: bool = False, reps: int = 20):
    device = jax.devices()[0]
    platform = "gpu" if device.platform == "gpu" else device.platform
    peak = peak_gbps(device) if platform == "gpu" else None
    rows = []
    for backend, make_gen in backend_generators(platform).items():
        small = backend == "pallas" and platform == "cpu"
        for op, (args, shape, ref, nbytes) in problems(quick, small).items():
            row = {"op": op, "backend": backend, "platform": platform,
                   "size": "x".join(str(s) for s in args[0].shape)}
            try:
                gen = make_gen(op)
                if gen is None:
                    continue
                k = primforge.XLACustomKernel(f"bench_{backend}_{op}", replace=True)
                k.def_kernel(backend, platform, gen)
                out_struct = jax.ShapeDtypeStruct(shape, F32)
                fn = jax.jit(lambda *a, k=k, s=out_struct: k(*a, outs=s))
                dev_args = [jax.device_put(a, device) for a in args]
                out, t = time_call(fn, dev_args, reps)
                tol = 1e-3 * max(1.0, float(np.abs(ref).max()))
                np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-3, atol=tol)
                row.update(us=t * 1e6, gbps=nbytes / t / 1e9, ok=True)
                if peak:
                    row["peak_fraction"] = row["gbps"] / peak
            except Exception as e:  # noqa: BLE001 - report and continue with the others
                row.update(ok=False, error=f"{type(e).__name__}: {str(e).splitlines()[0][:160]}")
            rows.append(row)
    return {"device": str(getattr(device, "device_kind", device)), "platform": platform,
            "peak_gbps": peak, "jax": jax.__version__, "python": sys.version.split()[0],
            "machine": _platform.machine(), "quick": quick, "rows": rows}


def table(result) -> str:
    peak = result["peak_gbps"]
    head = "| op | backend | size | median µs | GB/s |" + (" % of peak |" if peak else "")
    lines = [head, "|" + " --- |" * (head.count("|") - 1)]
    for r in result["rows"]:
        if not r["ok"]:
            lines.append(f"| {r['op']} | {r['backend']} | {r['size']} | failed: {r['error']} | |"
                         + (" |" if peak else ""))
            continue
        line = f"| {r['op']} | {r['backend']} | {r['size']} | {r['us']:.1f} | {r['gbps']:.2f} |"
        if peak:
            line += f" {100 * r['peak_fraction']:.1f} |"
        lines.append(line)
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results",
                                                      "backends.json"))
    args = parser.parse_args(argv)
    result = run(args.quick, args.reps)
    print(f"device: {result['device']} ({result['platform']}), jax {result['jax']}")
    print(table(result))
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
