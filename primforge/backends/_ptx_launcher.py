"""The PTX launcher: a host-only XLA FFI handler that launches a PTX kernel on XLA's stream.

Built once with :func:`~.cuda.load_cpp_inline`; buffers are passed one pointer each
('plain') or in Numba's kernel ABI ('numba').
"""

from __future__ import annotations

import functools

from primforge.backends import cuda

__all__ = ["HANDLER", "launcher"]

#: The handler symbol the launcher module exports.
HANDLER = "PrimforgePtxLaunch"

_LAUNCHER_SOURCE = r"""
#include <dlfcn.h>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;
typedef int CUresult;
typedef struct CUctx_st* CUcontext;
typedef struct CUmod_st* CUmodule;
typedef struct CUfunc_st* CUfunction;
typedef struct CUstream_st* CUstream;

namespace {
struct Driver {
  CUresult (*ctx_get_current)(CUcontext*) = nullptr;
  CUresult (*module_load_data)(CUmodule*, const void*) = nullptr;
  CUresult (*module_get_function)(CUfunction*, CUmodule, const char*) = nullptr;
  CUresult (*launch_kernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                            unsigned, unsigned, CUstream, void**, void**) = nullptr;
  CUresult (*get_error_string)(CUresult, const char**) = nullptr;
  std::string error;
};

const Driver& driver() {
  static Driver d = [] {
    Driver d;
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!lib) { d.error = "cannot open libcuda.so.1 (no NVIDIA driver?)"; return d; }
    d.ctx_get_current = (decltype(d.ctx_get_current))dlsym(lib, "cuCtxGetCurrent");
    d.module_load_data = (decltype(d.module_load_data))dlsym(lib, "cuModuleLoadData");
    d.module_get_function = (decltype(d.module_get_function))dlsym(lib, "cuModuleGetFunction");
    d.launch_kernel = (decltype(d.launch_kernel))dlsym(lib, "cuLaunchKernel");
    d.get_error_string = (decltype(d.get_error_string))dlsym(lib, "cuGetErrorString");
    if (!d.ctx_get_current || !d.module_load_data || !d.module_get_function || !d.launch_kernel)
      d.error = "libcuda.so.1 lacks the driver API entry points";
    return d;
  }();
  return d;
}

std::string describe(CUresult r) {
  const char* s = nullptr;
  if (driver().get_error_string) driver().get_error_string(r, &s);
  return std::to_string(r) + (s ? std::string(" (") + s + ")" : std::string());
}

std::mutex cache_mutex;
std::map<std::tuple<CUcontext, size_t, std::string>, CUfunction> cache;

ffi::Error Launch(CUstream stream, ffi::RemainingArgs args, ffi::RemainingRets rets,
                  std::string_view ptx, std::string_view kernel, std::string_view abi,
                  ffi::Span<const int64_t> grid, ffi::Span<const int64_t> block,
                  int64_t shared_mem) {
  const Driver& d = driver();
  if (!d.error.empty()) return ffi::Error::Internal(d.error);
  if (grid.size() != 3 || block.size() != 3)
    return ffi::Error::InvalidArgument("grid and block must have 3 entries");
  CUcontext ctx = nullptr;
  CUresult r = d.ctx_get_current(&ctx);
  if (r != 0) return ffi::Error::Internal("cuCtxGetCurrent failed: " + describe(r));
  std::string name(kernel);
  size_t h = std::hash<std::string_view>{}(ptx);
  CUfunction fn = nullptr;
  {
    std::lock_guard<std::mutex> lock(cache_mutex);
    auto key = std::make_tuple(ctx, h, name);
    auto it = cache.find(key);
    if (it != cache.end()) {
      fn = it->second;
    } else {
      std::string image(ptx);  // NUL-terminated copy for the driver's PTX JIT
      CUmodule mod = nullptr;
      r = d.module_load_data(&mod, image.c_str());
      if (r != 0) return ffi::Error::Internal("cuModuleLoadData failed: " + describe(r));
      r = d.module_get_function(&fn, mod, name.c_str());
      if (r != 0)
        return ffi::Error::Internal("cuModuleGetFunction(" + name + ") failed: " + describe(r));
      cache[key] = fn;
    }
  }
  // Storage for every kernel parameter; params[i] points into it.
  std::vector<int64_t> slots;
  std::vector<size_t> offsets;
  const bool numba_abi = abi == "numba";
  auto add_buffer = [&](void* data, ffi::Span<const int64_t> dims, size_t itemsize) {
    if (!numba_abi) {
      offsets.push_back(slots.size());
      slots.push_back((int64_t)(intptr_t)data);
      return;
    }
    int64_t n = 1;
    for (int64_t v : dims) n *= v;
    for (int64_t v : {int64_t(0), int64_t(0), n, int64_t(itemsize), (int64_t)(intptr_t)data}) {
      offsets.push_back(slots.size()); slots.push_back(v);
    }
    for (int64_t v : dims) { offsets.push_back(slots.size()); slots.push_back(v); }
    std::vector<int64_t> strides(dims.size());
    int64_t s = itemsize;
    for (size_t i = dims.size(); i-- > 0;) { strides[i] = s; s *= dims[i]; }
    for (int64_t v : strides) { offsets.push_back(slots.size()); slots.push_back(v); }
  };
  for (size_t i = 0; i < args.size(); ++i) {
    auto b = args.get<ffi::AnyBuffer>(i);
    if (!b.has_value()) return ffi::Error::InvalidArgument("argument is not a buffer");
    add_buffer(b->untyped_data(), b->dimensions(), ffi::ByteWidth(b->element_type()));
  }
  for (size_t i = 0; i < rets.size(); ++i) {
    auto b = rets.get<ffi::AnyBuffer>(i);
    if (!b.has_value()) return ffi::Error::InvalidArgument("result is not a buffer");
    add_buffer((*b)->untyped_data(), (*b)->dimensions(), ffi::ByteWidth((*b)->element_type()));
  }
  std::vector<void*> params;
  for (size_t off : offsets) params.push_back(&slots[off]);
  r = d.launch_kernel(fn, grid[0], grid[1], grid[2], block[0], block[1], block[2],
                      (unsigned)shared_mem, stream, params.data(), nullptr);
  if (r != 0) return ffi::Error::Internal("cuLaunchKernel(" + name + ") failed: " + describe(r));
  return ffi::Error::Success();
}
}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    PrimforgePtxLaunch, Launch,
    ffi::Ffi::Bind()
        .Ctx<ffi::PlatformStream<CUstream>>()
        .RemainingArgs()
        .RemainingRets()
        .Attr<std::string_view>("ptx")
        .Attr<std::string_view>("kernel")
        .Attr<std::string_view>("abi")
        .Attr<ffi::Span<const int64_t>>("grid")
        .Attr<ffi::Span<const int64_t>>("block")
        .Attr<int64_t>("shared_mem"));
"""



@functools.cache
def launcher() -> cuda.FFIModule:
    """The PTX launcher module (compiled once, cached on disk, registered for CUDA).

    Returns:
        A :class:`primforge.backends.cuda.FFIModule` exporting ``PrimforgePtxLaunch``,
        which launches a PTX kernel with attributes ``ptx``, ``kernel``, ``abi`` ('numba' or
        'plain': one pointer per buffer), ``grid``, ``block`` and ``shared_mem``.

    Example:
        >>> launcher().target('PrimforgePtxLaunch')  # doctest: +ELLIPSIS
        'primforge_ptx_launcher...PrimforgePtxLaunch'
    """
    return cuda.load_cpp_inline(_LAUNCHER_SOURCE, name="primforge_ptx_launcher",
                                handlers=[HANDLER], platform="gpu")
