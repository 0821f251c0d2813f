// CUDA kernels and the XLA FFI handler of the CSR products (bodies in csr_body.h).
//
// One warp per row of W, rows taken in a grid-stride loop (any row count, bounded grid).
// W @ x reduces lane partials with __shfl_down_sync; W.T @ x votes with __any_sync and
// skips rows whose x[i, :] is all zero, then scatters with atomicAdd into an output that
// was zeroed on XLA's stream. A last small kernel fills the output with NaN when the
// structure flag was raised. Nothing synchronises the host.
#define PF_CSR_DISPATCH 1
#include <cuda_runtime.h>

#include <limits>
#include <string>

#include "csr_body.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using pf_csr::kLanes;
constexpr int kBlock = 256;  // 8 warps per block
constexpr int64_t kMaxBlocks = 65535;
constexpr unsigned kFull = 0xffffffffu;

__device__ inline int64_t warp_id() {
  return (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kLanes;
}

__device__ inline int64_t warp_count() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x / kLanes;
}

template <typename P>
__global__ void gather_kernel(P p) {
  using V = typename P::Value;
  const int lane = threadIdx.x % kLanes;
  const int64_t first = warp_id();
  if (first == 0 && lane == 0) pf_csr::check_ends(p);
  const int lanes = pf_csr::column_lanes(p.k);
  const int64_t passes = pf_csr::column_passes(p.k, lanes);
  // Every lane of a warp has the same row, so the loops below are warp-uniform and the
  // shuffles see all 32 lanes.
  for (int64_t i = first; i < p.m; i += warp_count()) {
    int64_t start, end;
    pf_csr::row_bounds(p, i, lane, &start, &end);
    for (int64_t pass = 0; pass < passes; ++pass) {
      const int64_t c0 = pass * lanes;
      V v = pf_csr::gather_partial(p, start, end, c0, lane, lanes);
      for (int offset = kLanes / 2; offset >= lanes; offset >>= 1) {
        v += __shfl_down_sync(kFull, v, offset);
      }
      pf_csr::gather_store(p, i, c0, lane, lanes, v);
    }
  }
}

template <typename P>
__global__ void scatter_kernel(P p) {
  const int lane = threadIdx.x % kLanes;
  const int64_t first = warp_id();
  if (first == 0 && lane == 0) pf_csr::check_ends(p);
  const int lanes = pf_csr::column_lanes(p.k);
  const int64_t passes = pf_csr::column_passes(p.k, lanes);
  for (int64_t i = first; i < p.m; i += warp_count()) {
    int64_t start, end;
    pf_csr::row_bounds(p, i, lane, &start, &end);
    if (!__any_sync(kFull, pf_csr::scatter_probe(p, i, lane))) continue;  // no event
    for (int64_t pass = 0; pass < passes; ++pass) {
      pf_csr::scatter_pass(p, i, start, end, pass * lanes, lane, lanes);
    }
  }
}

// nan comes from the host: std::numeric_limits is not callable in device code without
// --expt-relaxed-constexpr.
template <typename V>
__global__ void poison_kernel(V* out, int64_t size, const int32_t* flag, V nan) {
  if (*flag == 0) return;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < size;
       e += stride) {
    out[e] = nan;
  }
}

unsigned blocks_for(int64_t threads) {
  int64_t b = (threads + kBlock - 1) / kBlock;
  if (b < 1) b = 1;  // one block still runs check_ends when there are no rows
  return static_cast<unsigned>(b < kMaxBlocks ? b : kMaxBlocks);
}

ffi::Error CsrImpl(cudaStream_t stream, ffi::AnyBuffer data, ffi::AnyBuffer indices,
                   ffi::AnyBuffer indptr, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> out,
                   ffi::Result<ffi::Buffer<ffi::S32>> flag, bool homo, bool transpose,
                   bool binary) {
  int32_t* flag_ptr = flag->typed_data();
  const int64_t size = static_cast<int64_t>(out->element_count());
  ffi::Error bad = pf_csr::dispatch(
      data, indices, indptr, x, *out, flag_ptr, homo, transpose, binary,
      [&](const auto& p, bool t) -> ffi::Error {
        using P = std::decay_t<decltype(p)>;
        using V = typename P::Value;
        cudaError_t err = cudaMemsetAsync(flag_ptr, 0, sizeof(int32_t), stream);
        if (err == cudaSuccess && t && size > 0) {
          err = cudaMemsetAsync(p.out, 0, sizeof(V) * size, stream);
        }
        if (err != cudaSuccess) {
          return ffi::Error::Internal(std::string("csr: cudaMemsetAsync failed: ") +
                                      cudaGetErrorString(err));
        }
        const unsigned grid = blocks_for(p.m * kLanes);
        if (t) {
          scatter_kernel<P><<<grid, kBlock, 0, stream>>>(p);
        } else {
          gather_kernel<P><<<grid, kBlock, 0, stream>>>(p);
        }
        // A small grid: when the flag is clear (the normal case) each thread reads it once.
        poison_kernel<V><<<blocks_for(size < 64 * kBlock ? size : 64 * kBlock), kBlock, 0,
                           stream>>>(p.out, size, flag_ptr, std::numeric_limits<V>::quiet_NaN());
        return ffi::Error::Success();
      });
  if (bad.failure()) return bad;
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    return ffi::Error::Internal(std::string("csr: CUDA launch failed: ") +
                                cudaGetErrorString(err));
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(PfCsrGpu, CsrImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()  // data
                                  .Arg<ffi::AnyBuffer>()  // indices
                                  .Arg<ffi::AnyBuffer>()  // indptr
                                  .Arg<ffi::AnyBuffer>()  // x
                                  .Ret<ffi::AnyBuffer>()  // out
                                  .Ret<ffi::Buffer<ffi::S32>>()  // flag (1,)
                                  .Attr<bool>("homo")
                                  .Attr<bool>("transpose")
                                  .Attr<bool>("binary"));
