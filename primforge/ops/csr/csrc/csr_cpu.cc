// C++ twin of csr_cuda.cu: the same per-thread bodies (csr_body.h) run sequentially over
// (row, lane) on the CPU, with the warp collectives (sum over a column's lanes, any-vote)
// written as loops. It exists to test the device logic on machines without a GPU; the
// numba kernels remain the CPU default.
#define PF_CSR_DISPATCH 1
#include <cmath>
#include <cstring>
#include <limits>

#include "csr_body.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using pf_csr::kLanes;

template <typename P>
void gather_rows(const P& p) {
  using V = typename P::Value;
  const int lanes = pf_csr::column_lanes(p.k);
  const int64_t passes = pf_csr::column_passes(p.k, lanes);
  V partial[kLanes];
  for (int64_t i = 0; i < p.m; ++i) {
    int64_t start = 0, end = 0;
    for (int lane = 0; lane < kLanes; ++lane) pf_csr::row_bounds(p, i, lane, &start, &end);
    for (int64_t pass = 0; pass < passes; ++pass) {
      const int64_t c0 = pass * lanes;
      for (int lane = 0; lane < kLanes; ++lane) {
        partial[lane] = pf_csr::gather_partial(p, start, end, c0, lane, lanes);
      }
      // Lane l < L receives the sum over lanes l, l + L, l + 2L, ... (the shuffle tree).
      for (int lane = 0; lane < lanes; ++lane) {
        V total = V(0);
        for (int src = lane; src < kLanes; src += lanes) total += partial[src];
        pf_csr::gather_store(p, i, c0, lane, lanes, total);
      }
    }
  }
}

template <typename P>
void scatter_rows(const P& p) {
  const int lanes = pf_csr::column_lanes(p.k);
  const int64_t passes = pf_csr::column_passes(p.k, lanes);
  for (int64_t i = 0; i < p.m; ++i) {
    int64_t start = 0, end = 0;
    for (int lane = 0; lane < kLanes; ++lane) pf_csr::row_bounds(p, i, lane, &start, &end);
    bool active = false;
    for (int lane = 0; lane < kLanes; ++lane) active = pf_csr::scatter_probe(p, i, lane) || active;
    if (!active) continue;  // the event-driven skip
    for (int64_t pass = 0; pass < passes; ++pass) {
      for (int lane = 0; lane < kLanes; ++lane) {
        pf_csr::scatter_pass(p, i, start, end, pass * lanes, lane, lanes);
      }
    }
  }
}

ffi::Error CsrImpl(ffi::AnyBuffer data, ffi::AnyBuffer indices, ffi::AnyBuffer indptr,
                   ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> out,
                   ffi::Result<ffi::Buffer<ffi::S32>> flag, bool homo, bool transpose,
                   bool binary) {
  int32_t* flag_ptr = flag->typed_data();
  *flag_ptr = 0;
  return pf_csr::dispatch(
      data, indices, indptr, x, *out, flag_ptr, homo, transpose, binary,
      [&](const auto& p, bool t) -> ffi::Error {
        using V = typename std::decay_t<decltype(p)>::Value;
        const int64_t size = static_cast<int64_t>(out->element_count());
        if (t) std::memset(p.out, 0, sizeof(V) * size);
        pf_csr::check_ends(p);
        if (t) {
          scatter_rows(p);
        } else {
          gather_rows(p);
        }
        if (*flag_ptr != 0) {
          for (int64_t e = 0; e < size; ++e) p.out[e] = std::numeric_limits<V>::quiet_NaN();
        }
        return ffi::Error::Success();
      });
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(PfCsrCpu, CsrImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()  // data
                                  .Arg<ffi::AnyBuffer>()  // indices
                                  .Arg<ffi::AnyBuffer>()  // indptr
                                  .Arg<ffi::AnyBuffer>()  // x
                                  .Ret<ffi::AnyBuffer>()  // out
                                  .Ret<ffi::Buffer<ffi::S32>>()  // flag (1,)
                                  .Attr<bool>("homo")
                                  .Attr<bool>("transpose")
                                  .Attr<bool>("binary"));
