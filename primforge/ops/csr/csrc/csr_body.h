// Per-thread work of the CSR products, shared by the CUDA kernels (csr_cuda.cu) and their
// C++ twin (csr_cpu.cc), which runs exactly these functions sequentially over (row, lane).
//
// Work layout. One "warp" of kLanes = 32 lanes owns one row i of W at a time. The lanes
// are split into column groups: L lanes (a power of two, min(32, next_pow2(k))) cover L
// consecutive columns of x / out, and the G = 32 / L groups stride over the row's stored
// entries. A vector is the case k = 1 (L = 1, G = 32: every lane walks the row's entries);
// k >= 32 gives L = 32 (each entry is handled by the whole warp, coalesced over columns) and
// several column passes.
//
//   W @ x   (gather):  lane partials, then a sum over the lanes of one column (CUDA:
//                      __shfl_down_sync by offsets 16 .. L; host: a loop), lanes < L store.
//   W.T @ x (scatter): the warp first asks whether any x[i, :] is non-zero (CUDA:
//                      __any_sync; host: an OR over lanes) and skips the row if not: the
//                      event-driven direction. Otherwise lanes add w * x[i, c] (w for binary
//                      events) into out[indices[e], c] with PF_ATOMIC_ADD; out starts at 0.
//
// Structure checks never let a bad value reach a memory access: each row clamps its entry
// range to [0, nnz] and lane 0 flags a decreasing indptr step; check_ends (one thread)
// flags indptr[0] != 0 or indptr[m] > nnz; every visited column index is range-checked
// before use. Any problem sets *flag = 1; the driver then fills the whole output with NaN.
#pragma once

#include <cstdint>
#include <type_traits>

#ifdef __CUDACC__
#define PF_HD __host__ __device__
#define PF_ATOMIC_ADD(p, v) atomicAdd((p), (v))
#else
#define PF_HD
#define PF_ATOMIC_ADD(p, v) (*(p) += (v))
#endif

namespace pf_csr {

constexpr int kLanes = 32;

// Everything one product needs. V: value type (float, double). I: index type of indices and
// indptr (int32_t, int64_t). BINARY: x holds bytes (XLA PRED), an entry counts when non-zero;
// otherwise x has type V.
template <typename V, typename I, bool BINARY>
struct Problem {
  using Value = V;
  using Index = I;
  using Event = std::conditional_t<BINARY, uint8_t, V>;
  static constexpr bool kBinary = BINARY;

  const V* data;       // (nnz,) weights, or (1,) shared weight when homo
  const I* indices;    // (nnz,) column of each stored entry
  const I* indptr;     // (m + 1,) row offsets
  const Event* x;      // (rows_in, k) row-major; rows_in = n (gather) or m (scatter)
  V* out;              // (rows_out, k) row-major; rows_out = m (gather) or n (scatter)
  int32_t* flag;       // set to 1 on malformed structure
  int64_t m;           // rows of W
  int64_t n;           // columns of W
  int64_t nnz;         // stored entries
  int64_t k;           // columns of x and out (1 for vectors)
  bool homo;           // one shared weight data[0]
};

// Lanes per column group: the smallest power of two >= k, at most 32.
PF_HD inline int column_lanes(int64_t k) {
  int lanes = 1;
  while (lanes < kLanes && lanes < k) lanes <<= 1;
  return lanes;
}

// Column passes of one row: ceil(k / L), and at least one so that a row's indices are
// still checked when k == 0.
PF_HD inline int64_t column_passes(int64_t k, int lanes) {
  int64_t p = (k + lanes - 1) / lanes;
  return p > 0 ? p : 1;
}

PF_HD inline void raise_flag(int32_t* flag) { *flag = 1; }

PF_HD inline int64_t clamp64(int64_t v, int64_t lo, int64_t hi) {
  return v < lo ? lo : (v > hi ? hi : v);
}

// indptr must start at 0 and end at most at nnz (entries past it are padding). Run by exactly one thread.
template <typename P>
PF_HD inline void check_ends(const P& p) {
  if (static_cast<int64_t>(p.indptr[0]) != 0 || static_cast<int64_t>(p.indptr[p.m]) > p.nnz) {
    raise_flag(p.flag);
  }
}

// The entry range [*start, *end) of row i, clamped to [0, nnz] (never inverted). Lane 0
// flags a decreasing step; all lanes compute the same range.
template <typename P>
PF_HD inline void row_bounds(const P& p, int64_t i, int lane, int64_t* start, int64_t* end) {
  int64_t a = static_cast<int64_t>(p.indptr[i]);
  int64_t b = static_cast<int64_t>(p.indptr[i + 1]);
  if (lane == 0 && b < a) raise_flag(p.flag);
  a = clamp64(a, 0, p.nnz);
  *start = a;
  *end = clamp64(b, a, p.nnz);
}

// Column index of entry e, or -1 (and the flag) when it lies outside [0, n).
template <typename P>
PF_HD inline int64_t column_of(const P& p, int64_t e) {
  int64_t j = static_cast<int64_t>(p.indices[e]);
  if (j < 0 || j >= p.n) {
    raise_flag(p.flag);
    return -1;
  }
  return j;
}

// ------------------------------------------------------------------ W @ x (gather)
// This lane's partial sum for row i and column c0 + lane % L, over the entries
// start + lane / L, step G. For a shared weight the sum is unweighted (applied at store).
template <typename P>
PF_HD inline typename P::Value gather_partial(const P& p, int64_t start, int64_t end,
                                              int64_t c0, int lane, int lanes) {
  using V = typename P::Value;
  const int groups = kLanes / lanes;
  const int64_t c = c0 + lane % lanes;
  const bool has_col = c < p.k;
  V acc = V(0);
  for (int64_t e = start + lane / lanes; e < end; e += groups) {
    const int64_t j = column_of(p, e);
    if (j < 0 || !has_col) continue;
    const auto xv = p.x[j * p.k + c];
    if constexpr (P::kBinary) {
      if (xv != 0) acc += p.homo ? V(1) : p.data[e];
    } else {
      acc += p.homo ? xv : p.data[e] * xv;
    }
  }
  return acc;
}

// Lanes < L hold the column sums of row i after the reduction: store them.
template <typename P>
PF_HD inline void gather_store(const P& p, int64_t i, int64_t c0, int lane, int lanes,
                               typename P::Value total) {
  const int64_t c = c0 + lane;
  if (lane < lanes && c < p.k) p.out[i * p.k + c] = p.homo ? total * p.data[0] : total;
}

// ------------------------------------------------------------------ W.T @ x (scatter)
// Whether any of x[i, lane], x[i, lane + 32], ... is non-zero (reduced by an any-vote).
template <typename P>
PF_HD inline bool scatter_probe(const P& p, int64_t i, int lane) {
  for (int64_t c = lane; c < p.k; c += kLanes) {
    if (p.x[i * p.k + c] != 0) return true;
  }
  return false;
}

// Add row i's contributions for column c0 + lane % L into out. Every entry of an active
// row is range-checked, also by lanes whose own x value is zero.
template <typename P>
PF_HD inline void scatter_pass(const P& p, int64_t i, int64_t start, int64_t end, int64_t c0,
                               int lane, int lanes) {
  using V = typename P::Value;
  const int groups = kLanes / lanes;
  const int64_t c = c0 + lane % lanes;
  const bool has_col = c < p.k;
  const auto xv = has_col ? p.x[i * p.k + c] : static_cast<typename P::Event>(0);
  const bool fire = xv != 0;
  const V w0 = p.homo ? p.data[0] : V(1);
  for (int64_t e = start + lane / lanes; e < end; e += groups) {
    const int64_t j = column_of(p, e);
    if (j < 0 || !fire) continue;
    const V w = p.homo ? w0 : p.data[e];
    if constexpr (P::kBinary) {
      PF_ATOMIC_ADD(&p.out[j * p.k + c], w);
    } else {
      PF_ATOMIC_ADD(&p.out[j * p.k + c], w * xv);
    }
  }
}

}  // namespace pf_csr

// ------------------------------------------------------------------ host-side dispatch
// Checks the FFI buffers and calls run(problem, transpose) with the Problem type matching
// the run-time dtypes. Host code only; shared by both handlers.
#ifdef PF_CSR_DISPATCH
#include <string>

#include "xla/ffi/api/ffi.h"

namespace pf_csr {

namespace ffi = xla::ffi;

inline std::string dims_str(const ffi::AnyBuffer& b) {
  std::string s = "(";
  auto d = b.dimensions();
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + (d.size() == 1 ? ",)" : ")");
}

template <typename V, typename I, bool BINARY, typename Run>
ffi::Error dispatch_typed(ffi::AnyBuffer data, ffi::AnyBuffer indices, ffi::AnyBuffer indptr,
                          ffi::AnyBuffer x, ffi::AnyBuffer out, int32_t* flag, bool homo,
                          bool transpose, Run&& run) {
  Problem<V, I, BINARY> p;
  p.data = static_cast<const V*>(data.untyped_data());
  p.indices = static_cast<const I*>(indices.untyped_data());
  p.indptr = static_cast<const I*>(indptr.untyped_data());
  p.x = static_cast<const typename Problem<V, I, BINARY>::Event*>(x.untyped_data());
  p.out = static_cast<V*>(out.untyped_data());
  p.flag = flag;
  p.m = static_cast<int64_t>(indptr.element_count()) - 1;
  p.nnz = static_cast<int64_t>(indices.element_count());
  p.k = x.dimensions().size() == 2 ? x.dimensions()[1] : 1;
  p.n = transpose ? out.dimensions()[0] : x.dimensions()[0];
  p.homo = homo;
  return run(p, transpose);
}

template <typename Run>
ffi::Error dispatch(ffi::AnyBuffer data, ffi::AnyBuffer indices, ffi::AnyBuffer indptr,
                    ffi::AnyBuffer x, ffi::AnyBuffer out, int32_t* flag, bool homo,
                    bool transpose, bool binary, Run&& run) {
  using DT = ffi::DataType;
  const DT vt = data.element_type();
  const DT it = indices.element_type();
  if (vt != DT::F32 && vt != DT::F64) {
    return ffi::Error::InvalidArgument("csr: data must be float32 or float64");
  }
  if (out.element_type() != vt) {
    return ffi::Error::InvalidArgument("csr: the output must have data's dtype");
  }
  if ((it != DT::S32 && it != DT::S64) || indptr.element_type() != it) {
    return ffi::Error::InvalidArgument(
        "csr: indices and indptr must both be int32 or both be int64");
  }
  if (binary ? x.element_type() != DT::PRED : x.element_type() != vt) {
    return ffi::Error::InvalidArgument(
        binary ? "csr: binary events must be bool" : "csr: x must have data's dtype");
  }
  const auto xd = x.dimensions();
  const auto od = out.dimensions();
  const int64_t m = static_cast<int64_t>(indptr.element_count()) - 1;
  const int64_t nnz = static_cast<int64_t>(indices.element_count());
  const bool shapes_ok =
      indptr.dimensions().size() == 1 && m >= 0 && indices.dimensions().size() == 1 &&
      (xd.size() == 1 || xd.size() == 2) && od.size() == xd.size() &&
      (xd.size() == 1 || xd[1] == od[1]) && (transpose ? xd[0] : od[0]) == m &&
      data.dimensions().size() == 1 &&
      (homo ? data.element_count() >= 1 : static_cast<int64_t>(data.element_count()) == nnz);
  if (!shapes_ok) {
    return ffi::Error::InvalidArgument(
        "csr: inconsistent shapes: data " + dims_str(data) + ", indices " + dims_str(indices) +
        ", indptr " + dims_str(indptr) + ", x " + dims_str(x) + ", out " + dims_str(out) +
        (transpose ? " (transpose)" : ""));
  }
  const bool f64 = vt == DT::F64;
  const bool i64 = it == DT::S64;
#define PF_CSR_CASE(V, I, B)                                                               \
  return dispatch_typed<V, I, B>(data, indices, indptr, x, out, flag, homo, transpose, run)
  if (binary) {
    if (f64) {
      if (i64) PF_CSR_CASE(double, int64_t, true);
      PF_CSR_CASE(double, int32_t, true);
    }
    if (i64) PF_CSR_CASE(float, int64_t, true);
    PF_CSR_CASE(float, int32_t, true);
  }
  if (f64) {
    if (i64) PF_CSR_CASE(double, int64_t, false);
    PF_CSR_CASE(double, int32_t, false);
  }
  if (i64) PF_CSR_CASE(float, int64_t, false);
  PF_CSR_CASE(float, int32_t, false);
#undef PF_CSR_CASE
}

}  // namespace pf_csr
#endif  // PF_CSR_DISPATCH
