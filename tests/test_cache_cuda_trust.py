"""Compiled C++/CUDA libraries: a cache entry runs only when it is the code that was asked for.

Each test reproduces one way the library cache, the compiler lookup or the backend's
availability could run other code than the caller's, crash, or fail where it should fall
back, and checks the result against NumPy. Tests that could kill the interpreter (loading a
damaged library) run the load in a subprocess, so a crash is a failure, not a dead runner.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import primforge
from primforge import _cache, autotune
from primforge.backends import _common, _cuda_build
from primforge.backends import cuda as pcuda

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# a * x + SHIFT; SHIFT is substituted per test so each test has its own build key. Both
# handlers here (Affine, Guarded) read their frames through XLA's C API (c_api.h) alone:
# these tests are about the cache, and c_api.h compiles in a fraction of the time the
# templates of ffi.h take (ffi.h handlers are covered by test_backend_cuda.py).
SOURCE = r"""
#include <cstdint>
#include "xla/ffi/api/c_api.h"

extern "C" XLA_FFI_Error* Affine(XLA_FFI_CallFrame* frame) {
  auto* ext = frame->extension_start;  // the struct's name differs by jaxlib release
  if (ext != nullptr && ext->type == XLA_FFI_Extension_Metadata) {  // XLA asks the version
    XLA_FFI_Metadata* meta = reinterpret_cast<XLA_FFI_Metadata_Extension*>(ext)->metadata;
    meta->api_version = XLA_FFI_Api_Version{XLA_FFI_Api_Version_STRUCT_SIZE, nullptr,
                                            XLA_FFI_API_MAJOR, XLA_FFI_API_MINOR};
    meta->traits = 0;
#ifdef XLA_FFI_UNKNOWN_TYPE_ID
    meta->state_type_id = XLA_FFI_UNKNOWN_TYPE_ID;
#endif
    return nullptr;
  }
  // One float32 argument, one float32 result, one attribute: the float32 scalar a.
  auto* x = static_cast<XLA_FFI_Buffer*>(frame->args.args[0]);
  auto* y = static_cast<XLA_FFI_Buffer*>(frame->rets.rets[0]);
  float a = *static_cast<float*>(static_cast<XLA_FFI_Scalar*>(frame->attrs.attrs[0])->value);
  int64_t n = 1;
  for (int64_t d = 0; d < x->rank; ++d) n *= x->dims[d];
  const float* in = static_cast<const float*>(x->data);
  float* out = static_cast<float*>(y->data);
  for (int64_t i = 0; i < n; ++i) out[i] = a * in[i] + SHIFT;
  return nullptr;
}
"""
HANDLERS = ["Affine"]  # declared in C, not by ffi.h's XLA_FFI_DEFINE_HANDLER_SYMBOL

FAILING = r"""
#include <cstdint>
#include <cstring>
#include "xla/ffi/api/c_api.h"

extern "C" XLA_FFI_Error* Guarded(XLA_FFI_CallFrame* frame) {
  auto* ext = frame->extension_start;  // the struct's name differs by jaxlib release
  if (ext != nullptr && ext->type == XLA_FFI_Extension_Metadata) {  // XLA asks the version
    XLA_FFI_Metadata* meta = reinterpret_cast<XLA_FFI_Metadata_Extension*>(ext)->metadata;
    meta->api_version = XLA_FFI_Api_Version{XLA_FFI_Api_Version_STRUCT_SIZE, nullptr,
                                            XLA_FFI_API_MAJOR, XLA_FFI_API_MINOR};
    meta->traits = 0;
#ifdef XLA_FFI_UNKNOWN_TYPE_ID
    meta->state_type_id = XLA_FFI_UNKNOWN_TYPE_ID;
#endif
    return nullptr;
  }
  auto* x = static_cast<XLA_FFI_Buffer*>(frame->args.args[0]);
  auto* y = static_cast<XLA_FFI_Buffer*>(frame->rets.rets[0]);
  int64_t n = 1;
  for (int64_t d = 0; d < x->rank; ++d) n *= x->dims[d];
  if (n > 2) {
    XLA_FFI_Error_Create_Args args;
    std::memset(&args, 0, sizeof(args));
    args.struct_size = XLA_FFI_Error_Create_Args_STRUCT_SIZE;
    args.message = "at most 2 elements, got more";
    args.errc = XLA_FFI_Error_Code_INVALID_ARGUMENT;
    return frame->api->XLA_FFI_Error_Create(&args);
  }
  for (int64_t i = 0; i < n; ++i)
    static_cast<float*>(y->data)[i] = static_cast<const float*>(x->data)[i];
  return nullptr;
}
"""

X = np.array([0.0, 1.0, 2.5, -4.0], dtype=np.float32)


def source(shift: float) -> str:
    return SOURCE.replace("SHIFT", f"{float(shift)!r}f")


def load_affine(src: str, **kw):
    return pcuda.load_cpp_inline(src, handlers=HANDLERS, **kw)


def run_affine(module, a: float = 3.0) -> np.ndarray:
    outs = jax.ShapeDtypeStruct(X.shape, jnp.float32)
    return np.asarray(module.call("Affine", X, outs=outs, a=np.float32(a)))


@pytest.fixture
def cache_root(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("PRIMFORGE_CACHE_DIR", str(root))
    monkeypatch.delenv("PRIMFORGE_CACHE", raising=False)
    _cache._WARNED.clear()
    getattr(pcuda, "_WARNED", set()).clear()
    return root


def cache_warnings(record) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, _cache.CacheWarning)]


# ------------------------------------------------------------------ subprocess helpers
_SCRIPT = textwrap.dedent("""
    import json, sys, warnings
    import numpy as np, jax, jax.numpy as jnp
    warnings.simplefilter("always")
    from primforge.backends import cuda as pcuda
    src, name = sys.argv[1], sys.argv[2]
    with open(src) as f:
        m = pcuda.load_cpp_inline(f.read(), name=name, handlers=["Affine"])
    x = np.array([0.0, 1.0, 2.5, -4.0], dtype=np.float32)
    y = m.call("Affine", x, outs=jax.ShapeDtypeStruct(x.shape, jnp.float32), a=np.float32(3))
    print(json.dumps({"path": m.path, "cached": m.cached, "y": np.asarray(y).tolist()}))
""")


def run_process(tmp_path, cache: str, shift: float, name: str):
    """Load SOURCE with ``shift`` in a fresh interpreter using cache root ``cache``."""
    script = tmp_path / "load.py"
    script.write_text(_SCRIPT)
    src = tmp_path / f"src_{shift}.cc"
    src.write_text(source(shift))
    env = dict(os.environ, PRIMFORGE_CACHE_DIR=cache, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
    env.pop("PRIMFORGE_CACHE", None)
    proc = subprocess.run([sys.executable, str(script), str(src), name], capture_output=True,
                          text=True, env=env, timeout=300, cwd=str(tmp_path), check=False)
    info = None
    if proc.returncode == 0:
        info = json.loads(proc.stdout.strip().splitlines()[-1])
    return proc, info


def expect_ok(proc, info, shift):
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stderr[-3000:]}"
    np.testing.assert_allclose(info["y"], 3 * X + shift, rtol=1e-6)


# ------------------------------------------------------------------ damaged / planted entries
def test_planted_library_in_the_cache_is_not_loaded(tmp_path):
    """A library put at the cache's path by someone else is rebuilt, not run (one warning)."""
    cache, other = str(tmp_path / "c1"), str(tmp_path / "c2")
    proc, info = run_process(tmp_path, cache, 1.0, "t_plant")
    expect_ok(proc, info, 1.0)
    # The planted library: the same module built from a source that adds 100 instead.
    proc, planted = run_process(tmp_path, other, 100.0, "t_plant")
    expect_ok(proc, planted, 100.0)
    shutil.copyfile(planted["path"], info["path"])
    proc, again = run_process(tmp_path, cache, 1.0, "t_plant")
    expect_ok(proc, again, 1.0)
    assert not again["cached"]
    assert proc.stderr.count("CacheWarning") == 1, proc.stderr
    assert "digest" in proc.stderr
    proc, third = run_process(tmp_path, cache, 1.0, "t_plant")  # repaired: served quietly
    expect_ok(proc, third, 1.0)
    assert third["cached"] and "CacheWarning" not in proc.stderr


def test_truncated_library_is_rebuilt_not_crashing(tmp_path):
    """A half-written library (a crash or full disk mid-copy) is rebuilt with one warning."""
    cache = str(tmp_path / "c")
    proc, info = run_process(tmp_path, cache, 2.0, "t_trunc")
    expect_ok(proc, info, 2.0)
    size = os.path.getsize(info["path"])
    with open(info["path"], "r+b") as f:
        f.truncate(size // 2)
    proc, again = run_process(tmp_path, cache, 2.0, "t_trunc")
    expect_ok(proc, again, 2.0)  # not SIGBUS, not an OSError from dlopen
    assert proc.stderr.count("CacheWarning") == 1, proc.stderr
    proc, third = run_process(tmp_path, cache, 2.0, "t_trunc")
    expect_ok(proc, third, 2.0)
    assert third["cached"] and "CacheWarning" not in proc.stderr


def test_symlink_at_the_library_path_is_not_followed(tmp_path, cache_root):
    """A symlink planted where the library goes is neither loaded nor written through."""
    m = pcuda._load(source(3.0), kind="cpp", name="t_link", handlers=HANDLERS, flags=(),
                    arch=None, include_dirs=(), verbose=False, register=False)
    victim = tmp_path / "victim.so"
    victim.write_bytes(b"victim content")
    os.unlink(m.path)
    os.symlink(victim, m.path)
    with pytest.warns(_cache.CacheWarning):
        m2 = load_affine(source(3.0), name="t_link")
    np.testing.assert_allclose(run_affine(m2), 3 * X + 3.0, rtol=1e-6)
    assert victim.read_bytes() == b"victim content"
    assert not os.path.islink(m2.path)


def test_cache_files_are_private(cache_root):
    m = load_affine(source(4.0), name="t_modes")
    assert os.path.dirname(m.path) == str(cache_root / "cuda")
    for folder in (cache_root, cache_root / "cuda"):
        assert stat.S_IMODE(os.lstat(folder).st_mode) == 0o700
    for entry in os.listdir(cache_root / "cuda"):
        assert stat.S_IMODE(os.lstat(cache_root / "cuda" / entry).st_mode) == 0o600, entry


# ------------------------------------------------------------------ untrusted / unusable folders
def test_world_writable_cache_folder_is_refused_with_one_warning(cache_root):
    cache_root.mkdir(mode=0o700)
    os.chmod(cache_root, 0o777)
    with pytest.warns(_cache.CacheWarning, match="writable by other users") as record:
        m = load_affine(source(5.0), name="t_ww")
    assert len(cache_warnings(record)) == 1
    np.testing.assert_allclose(run_affine(m), 3 * X + 5.0, rtol=1e-6)
    assert not str(m.path).startswith(str(cache_root))
    assert os.listdir(cache_root) == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning for the same folder
        m2 = load_affine(source(5.5), name="t_ww2")
    np.testing.assert_allclose(run_affine(m2), 3 * X + 5.5, rtol=1e-6)


def test_cache_folder_owned_by_another_user_is_refused(cache_root, monkeypatch):
    cache_root.mkdir(mode=0o700)
    monkeypatch.setattr(os, "getuid", lambda: os.lstat(cache_root).st_uid + 1)
    with pytest.warns(_cache.CacheWarning, match="owned by uid"):
        m = load_affine(source(6.0), name="t_owner")
    np.testing.assert_allclose(run_affine(m), 3 * X + 6.0, rtol=1e-6)
    assert os.listdir(cache_root) == []


def test_cache_root_that_is_a_file_runs_uncached(tmp_path, monkeypatch, cache_root):
    blocker = tmp_path / "blocker"
    blocker.write_text("not a folder")
    monkeypatch.setenv("PRIMFORGE_CACHE_DIR", str(blocker / "cache"))
    with pytest.warns(_cache.CacheWarning) as record:
        m = load_affine(source(7.0), name="t_file")
    assert len(cache_warnings(record)) == 1
    np.testing.assert_allclose(run_affine(m), 3 * X + 7.0, rtol=1e-6)
    assert blocker.read_text() == "not a folder"


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS, errno.EACCES])
def test_full_or_read_only_cache_runs_uncached(cache_root, monkeypatch, code):
    """Every write into the cache fails (tests run as root, so chmod can't simulate it)."""
    (cache_root / "cuda").mkdir(parents=True, mode=0o700)
    os.chmod(cache_root, 0o700)
    inside = str(cache_root)

    def refuse(path):
        if os.path.abspath(os.fspath(path)).startswith(inside):
            raise OSError(code, os.strerror(code), os.fspath(path))

    real_replace, real_mkstemp, real_mkdtemp = os.replace, tempfile.mkstemp, tempfile.mkdtemp
    real_open = os.open

    def replace(src, dst, **kw):
        refuse(dst)
        return real_replace(src, dst, **kw)

    def mkstemp(suffix=None, prefix=None, dir=None, text=False):
        refuse(dir or tempfile.gettempdir())
        return real_mkstemp(suffix, prefix, dir, text)

    def mkdtemp(suffix=None, prefix=None, dir=None):
        refuse(dir or tempfile.gettempdir())
        return real_mkdtemp(suffix, prefix, dir)

    def open_(path, flags, *a, **kw):
        if flags & os.O_CREAT:
            refuse(path)
        return real_open(path, flags, *a, **kw)

    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)
    monkeypatch.setattr(os, "open", open_)
    shift = 8.0 + code
    with pytest.warns(_cache.CacheWarning, match="cannot write"):
        m = load_affine(source(shift), name=f"t_ro{code}")
    np.testing.assert_allclose(run_affine(m), 3 * X + shift, rtol=1e-6)
    assert os.listdir(cache_root / "cuda") == []


def test_unusable_cache_in_a_fresh_process_runs_uncached(tmp_path):
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    proc, info = run_process(tmp_path, str(blocker / "cache"), 9.0, "t_sub_ro")
    expect_ok(proc, info, 9.0)
    assert proc.stderr.count("CacheWarning") == 1, proc.stderr


def test_cache_switched_off_writes_nothing(cache_root, monkeypatch):
    monkeypatch.setenv("PRIMFORGE_CACHE", "0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m = load_affine(source(10.0), name="t_off")
    np.testing.assert_allclose(run_affine(m), 3 * X + 10.0, rtol=1e-6)
    assert not cache_root.exists()


# ------------------------------------------------------------------ the key
def test_edited_header_found_through_angle_include_or_flag_rebuilds(tmp_path, cache_root):
    """Headers reached by ``#include <...>`` in include_dirs or by ``-I`` flags are keyed."""
    inc = tmp_path / "inc"
    inc.mkdir()
    outs = jax.ShapeDtypeStruct(X.shape, jnp.float32)
    for how in ("angle", "flag"):
        (inc / "shift.h").write_text("#define SHIFT 1.0f\n")
        src = SOURCE.replace('#include "xla/ffi/api/c_api.h"',
                             '#include "xla/ffi/api/c_api.h"\n#include <shift.h>')
        kw = ({"include_dirs": [str(inc)]} if how == "angle" else {"flags": [f"-I{inc}"]})
        name = f"t_hdr_{how}"
        m1 = load_affine(src, name=name, **kw)
        y1 = m1.call("Affine", X, outs=outs, a=np.float32(3))
        np.testing.assert_allclose(np.asarray(y1), 3 * X + 1.0, rtol=1e-6)
        (inc / "shift.h").write_text("#define SHIFT 20.0f\n")
        m2 = load_affine(src, name=name, **kw)
        y2 = m2.call("Affine", X, outs=outs, a=np.float32(3))
        np.testing.assert_allclose(np.asarray(y2), 3 * X + 20.0, rtol=1e-6)


def test_same_name_different_source_never_shares_a_library(cache_root):
    a = load_affine(source(11.0), name="t_samename")
    b = load_affine(source(12.0), name="t_samename")
    assert a.path != b.path and a.target("Affine") != b.target("Affine")
    np.testing.assert_allclose(run_affine(a), 3 * X + 11.0, rtol=1e-6)
    np.testing.assert_allclose(run_affine(b), 3 * X + 12.0, rtol=1e-6)


def test_key_covers_compiler_identity_and_versions(cache_root, monkeypatch):
    kw = {"kind": "cpp", "flags": (), "arch": None, "include_dirs": ()}
    base = pcuda._recipe("int x;", "", **kw).key
    monkeypatch.setattr(_cuda_build, "compiler_version", lambda c: "g++ (other) 99.0")
    assert pcuda._recipe("int x;", "", **kw).key != base
    monkeypatch.undo()
    monkeypatch.setattr(jax, "__version__", "0.0.0-other")
    assert pcuda._recipe("int x;", "", **kw).key != base
    monkeypatch.undo()
    monkeypatch.setattr(_common, "jaxlib_version", lambda: "0.0.0-other")
    assert pcuda._recipe("int x;", "", **kw).key != base


def test_repeated_loads_do_not_rebuild_or_reload(cache_root, monkeypatch):
    for switch in ("1", "0"):  # cached on disk, and uncached
        monkeypatch.setenv("PRIMFORGE_CACHE", switch)
        src = source(13.0 + float(switch))
        first = load_affine(src, name="t_repeat")
        calls = []
        real_run, real_cdll = subprocess.run, pcuda.ctypes.CDLL

        def spy(real, what, calls=calls):
            return lambda *a, **k: calls.append(what) or real(*a, **k)

        monkeypatch.setattr(subprocess, "run", spy(real_run, "run"))
        monkeypatch.setattr(pcuda.ctypes, "CDLL", spy(real_cdll, "dlopen"))
        again = load_affine(src, name="t_repeat")
        monkeypatch.setattr(subprocess, "run", real_run)
        monkeypatch.setattr(pcuda.ctypes, "CDLL", real_cdll)
        assert calls == [] and again.cached and again.library is first.library
        np.testing.assert_allclose(run_affine(again), 3 * X + 13.0 + float(switch), rtol=1e-6)


# ------------------------------------------------------------------ compiler lookup
def _plant(folder, name: str, marker) -> None:
    exe = folder / name
    exe.parent.mkdir(parents=True, exist_ok=True)
    exe.write_text(f"#!/bin/sh\necho planted > {marker}\nexit 1\n")
    exe.chmod(0o755)


def test_nvcc_planted_in_the_current_directory_is_not_used(tmp_path, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    marker = tmp_path / "ran"
    _plant(work, "nvcc", marker)
    _plant(work, "nvidia/cu13/bin/nvcc", marker)  # the pip layout, relative to the cwd
    _plant(work, "bin/nvcc", marker)
    monkeypatch.chdir(work)
    monkeypatch.setenv("PATH", os.pathsep.join([".", "", "bin", "/nonexistent"]))
    monkeypatch.setenv("CUDA_HOME", "bin/..")
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.delenv("PRIMFORGE_NVCC", raising=False)
    monkeypatch.setattr(sys, "path", ["", ".", *sys.path])
    monkeypatch.setattr(os.path, "isfile", lambda p, _f=os.path.isfile: (
        False if str(p).startswith("/usr/local/cuda") else _f(p)))
    found = pcuda.find_nvcc()
    assert found is None or (os.path.isabs(found)
                             and not os.path.realpath(found).startswith(str(work)))
    assert not marker.exists()


def test_relative_primforge_nvcc_is_ignored_with_a_warning(tmp_path, monkeypatch):
    _plant(tmp_path, "nvcc", tmp_path / "ran")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PRIMFORGE_NVCC", "nvcc")
    getattr(pcuda, "_WARNED", set()).clear()
    with pytest.warns(UserWarning, match="PRIMFORGE_NVCC"):
        found = pcuda.find_nvcc()
    assert found is None or not os.path.realpath(found).startswith(str(tmp_path))


def test_cxx_planted_in_the_current_directory_is_not_used(tmp_path, monkeypatch, cache_root):
    work = tmp_path / "work"
    work.mkdir()
    marker = tmp_path / "ran"
    for exe in ("g++", "c++", "clang++"):
        _plant(work, exe, marker)
    real = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if real is None:
        pytest.skip("no host C++ compiler on PATH")
    monkeypatch.chdir(work)
    monkeypatch.setenv("PATH", os.pathsep.join([".", "", os.path.dirname(real)]))
    monkeypatch.delenv("CXX", raising=False)
    m = load_affine(source(14.0), name="t_cxx_cwd")
    np.testing.assert_allclose(run_affine(m), 3 * X + 14.0, rtol=1e-6)
    assert not marker.exists()


# ------------------------------------------------------------------ availability per platform
@pytest.fixture
def fresh_availability():
    """``is_available`` is cached: probe again under the test's compilers, and after it."""
    pcuda.is_available.cache_clear()
    yield
    pcuda.is_available.cache_clear()


def _probe_kernel(name):
    k = primforge.XLACustomKernel(name, replace=True)
    for platform in ("cpu", "gpu"):
        k.def_kernel("jax", platform, lambda **kw: lambda x: x * 2.0)
        k.def_cuda_raw_kernel(lambda **kw: lambda x: x * 100.0, platform=platform,
                              asdefault=True)
    return k


def _built(k, platform):
    s = jax.ShapeDtypeStruct((3,), jnp.float32)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        fn = k.build(platform, ins=(s,), outs=(s,))
    return np.asarray(fn(jnp.ones(3))[0]), record


def test_cuda_raw_on_gpu_needs_nvcc_not_just_a_cxx(monkeypatch, fresh_availability):
    monkeypatch.setattr(pcuda, "find_nvcc", lambda: None)
    monkeypatch.setattr(pcuda, "find_cxx", lambda: "/usr/bin/g++", raising=False)
    monkeypatch.setattr(pcuda, "_find_cxx", lambda: "/usr/bin/g++", raising=False)
    k = _probe_kernel("t_avail_gpu")
    y, record = _built(k, "gpu")
    np.testing.assert_allclose(y, 2.0)  # fell back to the jax backend
    assert any(issubclass(w.category, primforge.BackendUnavailableWarning) for w in record)
    y, _ = _built(k, "cpu")
    np.testing.assert_allclose(y, 100.0)  # the C++ twin is fine
    assert not pcuda.is_available("gpu") and pcuda.is_available("cpu")


def test_cuda_raw_on_cpu_needs_a_cxx_not_just_nvcc(monkeypatch, fresh_availability):
    monkeypatch.setattr(pcuda, "find_nvcc", lambda: "/opt/cuda/bin/nvcc")
    monkeypatch.setattr(pcuda, "find_cxx", lambda: None, raising=False)
    monkeypatch.setattr(pcuda, "_find_cxx", lambda: None, raising=False)
    k = _probe_kernel("t_avail_cpu")
    y, record = _built(k, "cpu")
    np.testing.assert_allclose(y, 2.0)
    assert any(issubclass(w.category, primforge.BackendUnavailableWarning) for w in record)
    y, _ = _built(k, "gpu")
    np.testing.assert_allclose(y, 100.0)
    assert pcuda.is_available("gpu") and not pcuda.is_available("cpu")


# ------------------------------------------------------------------ handler errors
def test_handler_error_names_module_and_handler(cache_root):
    m = pcuda.load_cpp_inline(FAILING, name="t_guarded", handlers=["Guarded"])
    outs = jax.ShapeDtypeStruct((3,), jnp.float32)
    np.testing.assert_allclose(
        np.asarray(m.call("Guarded", X[:2], outs=jax.ShapeDtypeStruct((2,), jnp.float32))),
        X[:2])
    pattern = r"module 't_guarded', handler 'Guarded': at most 2 elements, got more"
    with pytest.raises(jax.errors.JaxRuntimeError, match=pattern):
        m.call("Guarded", X[:3], outs=outs)
    with pytest.raises(jax.errors.JaxRuntimeError, match=pattern):
        jax.jit(m.function("Guarded", outs=outs))(X[:3]).block_until_ready()
    k = primforge.XLACustomKernel("t_guarded_kernel", replace=True)
    k.def_cuda_raw_kernel(lambda outs, **kw: m.function("Guarded", outs=outs[0]),
                          platform="cpu")
    with pytest.raises(jax.errors.JaxRuntimeError, match=pattern):
        jax.jit(lambda x: k(x, outs=outs))(X[:3]).block_until_ready()


def test_compile_errors_still_quote_the_user_source(cache_root):
    bad = source(15.0).replace("out[i] = a * in[i]", "out[i] = a * missing_name[i]")
    with pytest.raises(pcuda.CompileError, match="missing_name") as info:
        load_affine(bad, name="t_bad_src")
    assert "out[i] = a * missing_name[i]" in str(info.value)


# ------------------------------------------------------------------ the autotune file
def test_autotune_write_does_not_follow_a_planted_temporary_symlink(tmp_path, monkeypatch):
    folder = tmp_path / "tune"
    folder.mkdir(mode=0o700)
    path = folder / "autotune.json"
    path.write_text(json.dumps({"format": "primforge-autotune", "version": 1, "kernels": {
        "a": {"cpu": {"backend": "x"}}, "b": {"cpu": {"backend": "y"}}}}))
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    # Every name the writer could pick from its pid.
    for suffix in (f".{os.getpid()}.tmp", ".tmp", ".write-test"):
        os.symlink(victim, folder / ("autotune.json" + suffix))
    autotune.clear(path, kernels=["a"])
    assert victim.read_text() == "precious"
    assert autotune.choices(path) == {"b": {"cpu": "y"}}
    assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600


def test_autotune_default_file_in_untrusted_folder_is_not_written(cache_root, monkeypatch):
    cache_root.mkdir(mode=0o700)
    os.chmod(cache_root, 0o777)
    with pytest.warns(_cache.CacheWarning, match="writable by other users"):
        autotune._write({"format": "primforge-autotune", "version": 1, "kernels": {}})
    assert os.listdir(cache_root) == []


def test_autotune_write_on_full_disk_warns_instead_of_failing(tmp_path, monkeypatch):
    path = tmp_path / "autotune.json"
    real_replace = os.replace

    def replace(src, dst, **kw):
        if os.fspath(dst) == str(path):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fspath(dst))
        return real_replace(src, dst, **kw)

    monkeypatch.setattr(os, "replace", replace)
    _cache._WARNED.clear()
    with pytest.warns(_cache.CacheWarning, match="cannot write"):
        autotune._write({"format": "primforge-autotune", "version": 1, "kernels": {}}, path)
    assert not path.exists() and os.listdir(tmp_path) == []


def test_autotune_symlinked_file_is_not_read(tmp_path):
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps({"kernels": {"a": {"cpu": {"backend": "x"}}}}))
    path = tmp_path / "autotune.json"
    os.symlink(elsewhere, path)
    _cache._WARNED.clear()
    with pytest.warns(_cache.CacheWarning, match="symbolic link"):
        assert autotune.choices(path) == {}


def test_csr_products_on_gpu_fall_back_when_nvcc_is_missing(monkeypatch, fresh_availability):
    """The shipped CSR kernels: asking for cuda_raw on a GPU without nvcc falls back."""
    from primforge.ops.csr import api as _kernels

    monkeypatch.setattr(pcuda, "find_nvcc", lambda: None)
    monkeypatch.setattr(pcuda, "find_cxx", lambda: "/usr/bin/g++", raising=False)
    monkeypatch.setattr(pcuda, "_find_cxx", lambda: "/usr/bin/g++", raising=False)
    for kernel in _kernels.KERNELS.values():
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            on_gpu = kernel._select("gpu", None, ((None, "gpu", "cuda_raw"),))
            on_cpu = kernel._select("cpu", None, ((None, "cpu", "cuda_raw"),))
        assert on_gpu.backend != "cuda_raw", kernel.name
        assert on_cpu.backend == "cuda_raw", kernel.name


# ------------------------------------------------------------------ the store's helpers used here
def test_checked_folder_refuses_what_directory_refuses(tmp_path):
    good = tmp_path / "good"
    assert _cache.checked_folder(str(good)) == str(good)
    assert stat.S_IMODE(os.lstat(good).st_mode) == 0o700
    bad = tmp_path / "bad"
    bad.mkdir()
    os.chmod(bad, 0o775)
    _cache._WARNED.clear()
    with pytest.warns(_cache.CacheWarning, match="writable by other users"):
        assert _cache.checked_folder(str(bad)) is None
    link = tmp_path / "link"
    os.symlink(good, link)
    with pytest.warns(_cache.CacheWarning, match="symbolic link"):
        assert _cache.checked_folder(str(link)) is None


def test_plain_entry_is_atomic_private_and_has_no_digest(tmp_path):
    folder = _cache.checked_folder(str(tmp_path / "f"))
    assert _cache.write_bytes(folder, "settings.json", b"{}", digest=False)
    assert sorted(os.listdir(folder)) == ["settings.json"]
    assert stat.S_IMODE(os.lstat(os.path.join(folder, "settings.json")).st_mode) == 0o600
