"""cuda_raw backend: the C++ twin runs here; nvcc compiles CUDA here for sm_90 and sm_80;
lowering for CUDA; XLA:GPU compiles the FFI call for both targets."""

import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gpu_utils import compile_for_targets, lower_for_cuda, requires_gpu, requires_gpu_compiler

import primforge
from primforge.backends import _cuda_find
from primforge.backends import cuda as pcuda

CPP_SOURCE = r"""
#include "xla/ffi/api/ffi.h"
namespace ffi = xla::ffi;

static ffi::Error Axpb(ffi::Buffer<ffi::F32> x, ffi::ResultBuffer<ffi::F32> y, float a, float b) {
  const float* in = x.typed_data();
  float* out = y->typed_data();
  for (size_t i = 0; i < x.element_count(); ++i) out[i] = a * in[i] + b;
  return ffi::Error::Success();
}
XLA_FFI_DEFINE_HANDLER_SYMBOL(AxpbCpu, Axpb,
    ffi::Ffi::Bind().Arg<ffi::Buffer<ffi::F32>>().Ret<ffi::Buffer<ffi::F32>>()
        .Attr<float>("a").Attr<float>("b"));
"""

CUDA_SOURCE = r"""
#include <cuda_runtime.h>
#include "xla/ffi/api/ffi.h"
namespace ffi = xla::ffi;

__global__ void axpb_kernel(const float* x, float* y, float a, float b, size_t n) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + b;
}

static ffi::Error Axpb(cudaStream_t stream, ffi::Buffer<ffi::F32> x,
                       ffi::ResultBuffer<ffi::F32> y, float a, float b) {
  size_t n = x.element_count();
  unsigned blocks = (unsigned)((n + 255) / 256);
  axpb_kernel<<<blocks, 256, 0, stream>>>(x.typed_data(), y->typed_data(), a, b, n);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return ffi::Error::Internal(cudaGetErrorString(err));
  return ffi::Error::Success();
}
XLA_FFI_DEFINE_HANDLER_SYMBOL(AxpbGpu, Axpb,
    ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>()
        .Arg<ffi::Buffer<ffi::F32>>().Ret<ffi::Buffer<ffi::F32>>()
        .Attr<float>("a").Attr<float>("b"));
"""

needs_nvcc = pytest.mark.skipif(pcuda.find_nvcc() is None, reason="nvcc not found (CUDA toolkit "
                                "or pip install 'primforge[cuda]')")


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("PRIMFORGE_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "pfcache"))


def test_cpp_twin_runs_and_matches_numpy():
    m = pcuda.load_cpp_inline(CPP_SOURCE, name="t_axpb")
    x = np.linspace(-1, 1, 50, dtype=np.float32)
    out = jax.jit(lambda x: m.call("AxpbCpu", x, outs=jax.ShapeDtypeStruct(x.shape, x.dtype),
                                   a=np.float32(3), b=np.float32(-1)))(x)
    np.testing.assert_allclose(np.asarray(out), 3 * x - 1, rtol=1e-6)


# The tests that need a working library of CPP_SOURCE share one (name "t_axpb": the name
# is part of the library, so each other name would be another compilation of the same code).
def test_library_is_cached_on_disk_by_source_and_flags():
    m1 = pcuda.load_cpp_inline(CPP_SOURCE, name="t_axpb")
    m2 = pcuda.load_cpp_inline(CPP_SOURCE, name="t_axpb")
    assert m2.cached and m1.path == m2.path and os.path.exists(m1.path)
    m3 = pcuda.load_cpp_inline(CPP_SOURCE, name="t_axpb", flags=["-DPF_VARIANT=1"])
    assert m3.path != m1.path and not m3.cached


def test_build_key_helpers(tmp_path):
    """Architecture spellings, include paths named by flags, the header digest, wrappers."""
    from primforge.backends import _cuda_build as build
    assert [build._normalize_arch(a) for a in ("9.0", 80, "sm_90a", "compute_75")] == [
        "sm_90", "sm_80", "sm_90a", "sm_75"]
    with pytest.raises(ValueError, match="arch must look like"):
        build._normalize_arch("hopper")
    flags = ["-I/a", "-isystem", "/b", "-include", "c.h", "--include-path=/d", "-O2"]
    assert build._flag_paths(flags) == (["/a", "/b", "/d"], ["c.h"])
    # The digest covers included local headers only, not the source text itself.
    assert build._local_headers_digest("int x;", []) == build._local_headers_digest("int y;", [])
    (tmp_path / "h.h").write_text("int a;\n")
    src = '#include "h.h"\n'
    before = build._local_headers_digest(src, [str(tmp_path)])
    (tmp_path / "h.h").write_text("int b;\n")
    assert build._local_headers_digest(src, [str(tmp_path)]) != before
    assert "PrimforgeNamed_Scale" in build._wrapper_source("demo", ["Scale"])


def test_editing_an_included_header_rebuilds_the_library(tmp_path):
    """The cache key covers local headers (followed recursively), not just the source."""
    (tmp_path / "inner.h").write_text("static const float kScale = 2.0f;\n")
    (tmp_path / "outer.h").write_text('#include "inner.h"\n')
    src = CPP_SOURCE.replace('#include "xla/ffi/api/ffi.h"',
                             '#include "xla/ffi/api/ffi.h"\n#include "outer.h"').replace(
        "out[i] = a * in[i] + b", "out[i] = kScale * (a * in[i] + b)")
    outs = jax.ShapeDtypeStruct((3,), jnp.float32)
    x = np.arange(3, dtype=np.float32)
    m1 = pcuda.load_cpp_inline(src, name="t_hdr", include_dirs=[str(tmp_path)])
    y1 = m1.call("AxpbCpu", x, outs=outs, a=np.float32(1), b=np.float32(0))
    np.testing.assert_allclose(np.asarray(y1), 2 * x)
    (tmp_path / "inner.h").write_text("static const float kScale = 5.0f;\n")
    m2 = pcuda.load_cpp_inline(src, name="t_hdr", include_dirs=[str(tmp_path)])
    assert m2.path != m1.path and not m2.cached
    y2 = m2.call("AxpbCpu", x, outs=outs, a=np.float32(1), b=np.float32(0))
    np.testing.assert_allclose(np.asarray(y2), 5 * x)


def test_through_xla_custom_kernel_with_vmap():
    m = pcuda.load_cpp_inline(CPP_SOURCE, name="t_axpb")
    k = primforge.XLACustomKernel("t_cuda_raw_cpu", replace=True)
    k.def_cuda_raw_kernel(
        lambda outs, a, **kw: m.function("AxpbCpu", outs=outs[0], a=np.float32(a),
                                         b=np.float32(0.5)),
        platform="cpu")
    x = np.random.default_rng(0).normal(size=(3, 7)).astype(np.float32)
    f = lambda x: k(x, outs=jax.ShapeDtypeStruct(x.shape, x.dtype), a=2.0)
    np.testing.assert_allclose(np.asarray(jax.vmap(f)(x)), 2 * x + 0.5, rtol=1e-6)


def test_compile_error_quotes_the_source_line():
    bad = CPP_SOURCE.replace("out[i] = a * in[i] + b;", "out[i] = a * undefined_name[i];")
    with pytest.raises(pcuda.CompileError, match=r"undefined_name") as info:
        pcuda.load_cpp_inline(bad, name="t_bad")
    assert "source lines:" in str(info.value)
    assert "out[i] = a * undefined_name[i];" in str(info.value)


def test_missing_handler_is_reported():
    with pytest.raises(ValueError, match="does not export handler 'Nope'"):
        pcuda.load_cpp_inline(CPP_SOURCE, name="t_nohandler", handlers=["Nope"])


@needs_nvcc
def test_nvcc_compile_error_quotes_the_source_line():
    bad = CUDA_SOURCE.replace("if (i < n) y[i]", "if (i < n) z[i]")
    with pytest.raises(pcuda.CompileError) as info:
        pcuda.load_cuda_inline(bad, name="t_bad_cu", arch="sm_80", register=False)
    msg = str(info.value)
    assert "nvcc" in msg and "z[i]" in msg and "source lines:" in msg


@needs_nvcc
def test_nvcc_builds_and_gpu_lowering_on_any_machine(tmp_path):
    path = tmp_path / "axpb.cu"
    path.write_text(CUDA_SOURCE)
    m = pcuda.load_cuda_file(path, arch="sm_80")
    assert m.platform == "CUDA" and os.path.exists(m.path)
    k = primforge.XLACustomKernel("t_cuda_raw_gpu", replace=True)
    k.def_cuda_raw_kernel(lambda outs, **kw: m.function("AxpbGpu", outs=outs[0],
                                                         a=np.float32(2), b=np.float32(1)))
    text = lower_for_cuda(lambda x: k(x, outs=jax.ShapeDtypeStruct(x.shape, x.dtype)),
                          jnp.ones(16, jnp.float32))
    assert m.target("AxpbGpu") in text


@needs_nvcc
@requires_gpu_compiler
@pytest.mark.parametrize("target,arch", [("h100", "sm_90"), ("a100", "sm_80")])
def test_nvcc_builds_for_the_target_and_xla_gpu_compiles_the_call(target, arch):
    """nvcc builds the kernel for the target's architecture, the handler registers for CUDA
    without a GPU, and XLA:GPU compiles the program that calls it (for that target)."""
    m = pcuda.load_cuda_inline(CUDA_SOURCE, name=f"t_axpb_{arch}", arch=arch)
    k = primforge.XLACustomKernel(f"t_cuda_raw_compile_{arch}", replace=True)
    k.def_cuda_raw_kernel(lambda outs, **kw: m.function("AxpbGpu", outs=outs[0],
                                                         a=np.float32(2), b=np.float32(1)))
    f = lambda x: k(x, outs=jax.ShapeDtypeStruct(x.shape, x.dtype))
    for fn, x in [(f, jnp.ones(16, jnp.float32)), (jax.vmap(f), jnp.ones((3, 16)))]:
        (result,) = compile_for_targets(fn, x, backend="cuda_raw", targets=(target,)).values()
        assert m.target("AxpbGpu") in [c.name for c in result.kernels], result.describe()


@requires_gpu_compiler
def test_a_handler_registered_only_for_the_cpu_fails_the_gpu_compile_by_name():
    """The check can fail: the C++ twin's target exists for 'cpu' only, so XLA:GPU rejects
    the call and the error names it."""
    from primforge import testing

    m = pcuda.load_cpp_inline(CPP_SOURCE, name="t_axpb")  # registered for the cpu only
    f = lambda x: m.call("AxpbCpu", x, outs=jax.ShapeDtypeStruct(x.shape, x.dtype),
                         a=np.float32(3), b=np.float32(-1))
    result = testing.compile_for_gpu(f, jnp.ones(4, jnp.float32), target="a100")
    assert not result.ok and result.failed_kernel == m.target("AxpbCpu")
    assert "CUDA" in result.error


def test_find_nvcc_in_pip_layout(tmp_path, monkeypatch):
    """The NVIDIA pip package's nvcc is found through its installed metadata."""
    site_dir = tmp_path / "site-packages"
    fake = site_dir / "nvidia" / "cu13" / "bin"
    fake.mkdir(parents=True)
    nvcc = fake / "nvcc"
    nvcc.write_text("#!/bin/sh\n")
    nvcc.chmod(0o755)
    info = site_dir / "nvidia_cuda_nvcc-13.0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: nvidia-cuda-nvcc\n"
                                   "Version: 13.0.0\n")
    (info / "RECORD").write_text("nvidia/cu13/bin/nvcc,,\n"
                                 "nvidia_cuda_nvcc-13.0.0.dist-info/METADATA,,\n")
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("PRIMFORGE_NVCC", raising=False)
    monkeypatch.setenv("CUDA_HOME", "/nonexistent")
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setattr(_cuda_find, "_site_dirs", lambda: [str(site_dir)])
    monkeypatch.setattr(os.path, "isfile", lambda p, _f=os.path.isfile: (
        False if p.startswith("/usr/local/cuda") else _f(p)))
    assert pcuda.find_nvcc() == str(nvcc)


@requires_gpu
@needs_nvcc
def test_gpu_run_matches_numpy():
    m = pcuda.load_cuda_inline(CUDA_SOURCE, name="t_axpb_gpu")
    x = np.arange(1000, dtype=np.float32)
    out = m.call("AxpbGpu", jax.device_put(x, jax.devices("gpu")[0]),
                 outs=jax.ShapeDtypeStruct(x.shape, x.dtype), a=np.float32(2), b=np.float32(1))
    np.testing.assert_allclose(np.asarray(out), 2 * x + 1)
    assert shutil.which  # keep import used
