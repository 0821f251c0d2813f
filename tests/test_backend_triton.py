"""Triton backend: TTIR generation, CUDA lowering and XLA:GPU compiles on any machine, GPU run."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

triton = pytest.importorskip("triton", reason="optional backend: pip install 'primforge[triton]'")
import triton.language as tl
from gpu_utils import compile_for_targets, lower_for_cuda, requires_gpu, requires_gpu_compiler

import primforge
from primforge.backends import triton as ptriton


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


@requires_gpu_compiler
def test_xla_gpu_compiles_the_kernel_and_its_vmap():
    k = _kernel("t_triton_compile")
    f = lambda x, y: k(x, y, outs=jax.ShapeDtypeStruct(x.shape, x.dtype))
    for fn, shape in ((f, (1000,)), (jax.vmap(f), (3, 1000))):
        x = jax.ShapeDtypeStruct(shape, jnp.float32)
        for result in compile_for_targets(fn, x, x, backend="triton").values():
            launches = [k for k in result.kernels if k.name.startswith("_add")]
            assert launches and launches[0].grid == (4, 1, 1), result.describe()
            assert launches[0].block == (64, 1, 1)  # num_warps=2


@requires_gpu_compiler
@pytest.mark.parametrize("target, cc", [("a100", 80), ("h100", 90)])
def test_the_compile_target_sets_the_compute_capability(monkeypatch, target, cc):
    from primforge import testing

    seen = []
    build = ptriton._prepared_ir
    monkeypatch.setattr(ptriton, "_prepared_ir", lambda *key: seen.append(key[5]) or build(*key))
    k = _kernel(f"t_triton_cc_{target}")
    x = jax.ShapeDtypeStruct((256,), jnp.float32)
    testing.compile_for_gpu(lambda x, y: k(x, y, outs=x), x, x, target=target).check()
    assert seen == [cc]


def test_wrong_number_of_pointers_is_explained():
    k = primforge.XLACustomKernel("t_triton_arity", replace=True)
    k.def_triton_kernel(lambda **kw: ptriton.triton_kernel(_add, grid=1, N=4, BLOCK=4))
    with pytest.raises(primforge.KernelError, match="takes 3 pointer"):
        lower_for_cuda(lambda x: k(x, outs=jax.ShapeDtypeStruct((4,), jnp.float32)),
                       jnp.ones(4, jnp.float32))


def test_launch_config_is_validated():
    with pytest.raises(ValueError, match="num_warps"):
        ptriton.triton_kernel(_add, grid=1, num_warps=3)
    # XLA:GPU compiles 64 warps (2048 threads a block); only the launch would fail
    with pytest.raises(ValueError, match="2048 threads per program"):
        ptriton.triton_kernel(_add, grid=1, num_warps=64)
    k = primforge.XLACustomKernel("t_triton_warps", replace=True)
    k.def_triton_kernel(lambda **kw: ptriton.TritonKernel(_add, (1,), 64, 1, {"N": 4, "BLOCK": 4}))
    with pytest.raises(primforge.KernelError, match="2048 threads per program"):
        lower_for_cuda(lambda x: k(x, x, outs=jax.ShapeDtypeStruct((4,), jnp.float32)),
                       jnp.ones(4, jnp.float32))


@pytest.mark.parametrize("grid", [(1, 70000), (1, 1, 65536), (2**31,)])
def test_grid_beyond_cuda_limits_is_refused_at_lowering(grid):
    k = primforge.XLACustomKernel("t_triton_grid", replace=True)
    k.def_triton_kernel(lambda **kw: ptriton.triton_kernel(_add, grid=grid, N=4, BLOCK=4))
    with pytest.raises(primforge.KernelError, match="exceeds CUDA's limits"):
        lower_for_cuda(lambda x: k(x, x, outs=jax.ShapeDtypeStruct((4,), jnp.float32)),
                       jnp.ones(4, jnp.float32))


@requires_gpu
def test_gpu_run_matches_numpy():
    k = _kernel("t_triton_gpu")
    x = np.arange(1000, dtype=np.float32)
    out = k(x, 2 * x, outs=jax.ShapeDtypeStruct(x.shape, x.dtype))
    np.testing.assert_allclose(np.asarray(out), 3 * x)


# -- the IR handed to XLA is what Triton's own pipeline would hand on -----------------------
@triton.jit
def _acc_matmul(a_ptr, b_ptr, c_ptr, K: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr):
    r = tl.arange(0, BM)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BM), dtype=tl.float32)  # tl.zeros is itself a @triton.jit helper
    for k in range(0, K, BK):
        a = tl.load(a_ptr + r[:, None] * K + (k + rk)[None, :])
        b = tl.load(b_ptr + (k + rk)[:, None] * BM + r[None, :])
        acc += tl.dot(a, b)
    tl.store(c_ptr + r[:, None] * BM + r[None, :], acc)


def test_ttir_has_its_helpers_inlined_and_is_canonical():
    text = ptriton.to_ttir(_acc_matmul, ["float16", "float16", "float32"],
                           {"K": 64, "BM": 32, "BK": 16})
    assert "tt.call" not in text and "tt.func private" not in text
    assert "tt.dot" in text and "scf.for" in text
    # canonicalised: the front end's unused overflow checks are gone
    assert "2147483647" not in text


def test_ttir_follows_the_target_compute_capability():
    @triton.jit
    def desc_copy(x_ptr, o_ptr, N: tl.constexpr):
        d = tl.make_tensor_descriptor(x_ptr, shape=[N], strides=[1], block_shape=[N])
        tl.store(o_ptr + tl.arange(0, N), d.load([0]))

    # below sm_90 Triton's first stage rewrites device-side descriptors to plain pointers...
    text = ptriton.to_ttir(desc_copy, ["float32", "float32"], {"N": 64}, cc=80)
    assert "tt.make_tensor_descriptor" not in text and "tt.load" in text
    # ...from sm_90 on they stay, and need a scratch buffer XLA's custom call lacks
    with pytest.raises(ptriton.UnsupportedTritonFeature, match="sm_90.*null pointer"):
        ptriton.to_ttir(desc_copy, ["float32", "float32"], {"N": 64}, cc=90)


class _Device:
    def __init__(self, platform, cc=None):
        self.platform = platform
        if cc is not None:
            self.compute_capability = cc


class _Ctx:
    """The piece of a lowering rule's context the backend reads: the target's devices."""

    def __init__(self, *devices):
        backend = type("Backend", (), {"devices": lambda self: list(devices)})()
        self.module_context = type("ModuleContext", (), {"backend": backend})()


@pytest.mark.parametrize("devices, want", [
    ((_Device("gpu", "8.0"),), 80),
    ((_Device("gpu", "9.0"),), 90),
    ((_Device("gpu", "8.6"),), 86),
    ((_Device("cpu"),), ptriton.DEFAULT_CC),  # a device-less cross-lowering on a CPU machine
])
def test_compute_capability_comes_from_the_lowering_target(devices, want):
    assert ptriton._default_cc(_Ctx(*devices)) == want


# -- the IR's trip through jaxlib's dialect ---------------------------------------------------
def test_ir_goes_as_bytecode_when_jaxlib_reads_it_and_as_text_when_only_xla_does():
    plain = ptriton.to_ttir(_add, ["float32"] * 3, {"N": 8, "BLOCK": 8})
    assert ptriton._to_xla_ir(plain).startswith(b"ML\xefR")  # MLIR bytecode magic

    @triton.jit
    def barrier(o_ptr, N: tl.constexpr):
        tl.store(o_ptr + tl.arange(0, N), tl.zeros((N,), tl.int32))
        tl.debug_barrier()

    text = ptriton.to_ttir(barrier, ["int32"], {"N": 8})
    if "gpu.barrier" in text:  # Triton 3.6 writes the upstream op, which jaxlib reads
        assert ptriton._to_xla_ir(text).startswith(b"ML\xefR")
        text = text.replace("gpu.barrier", "ttg.barrier")  # what Triton 3.9 writes
    assert "ttg.barrier" in text  # a dialect jaxlib's bindings lack and XLA:GPU loads
    assert ptriton._to_xla_ir(text) == text.encode()
    unknown_op = plain.replace("tt.return", '"tt.not_an_op"() : () -> ()\n    tt.return', 1)
    with pytest.raises(Exception, match="tt.not_an_op"):
        ptriton._to_xla_ir(unknown_op)


# -- Triton's interpreter on NumPy arrays (the CPU runner) -----------------------------------
def test_interpret_matches_numpy():
    x = np.arange(1000, dtype=np.float32)
    spec = _gen([jax.ShapeDtypeStruct(x.shape, x.dtype)])
    (out,) = ptriton.interpret(spec, x, 2 * x, outs=jax.ShapeDtypeStruct(x.shape, x.dtype))
    np.testing.assert_array_equal(out, 3 * x)


def test_interpret_runs_in_process_when_this_process_interprets(tmp_path):
    """With TRITON_INTERPRET=1 from the start, no worker: the kernel runs right here."""
    import os
    import pathlib
    import subprocess
    import sys

    script = tmp_path / "run.py"
    script.write_text(
        "import jax, numpy as np\n"
        "from primforge.backends import _triton_interpret as runner, triton as pt\n"
        "import test_backend_triton as t\n"
        "runner.run_in_worker = None  # must not be needed\n"
        "x = np.arange(100, dtype=np.float32)\n"
        "(out,) = pt.interpret(t._gen([jax.ShapeDtypeStruct(x.shape, x.dtype)]), x, 2 * x,\n"
        "                      outs=jax.ShapeDtypeStruct(x.shape, x.dtype))\n"
        "assert runner.interpreting_here() and (out == 3 * x).all(), out\n"
        "print('ok')\n")
    env = dict(os.environ, TRITON_INTERPRET="1",
               PYTHONPATH=os.pathsep.join([str(pathlib.Path(__file__).parent), *sys.path]))
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_interpret_checks_the_pointer_count_before_running():
    with pytest.raises(ValueError, match="takes 3 pointer"):
        ptriton.interpret(ptriton.triton_kernel(_add, grid=1, N=4, BLOCK=4), np.ones(4),
                          outs=jax.ShapeDtypeStruct((4,), np.float64))


def test_interpret_needs_an_importable_kernel():
    @triton.jit
    def local(o_ptr):
        tl.store(o_ptr, 1.0)

    with pytest.raises(ValueError, match="define it at module level"):
        ptriton.interpret(local, outs=jax.ShapeDtypeStruct((1,), np.float32))


@triton.jit
def _bad_shape(x_ptr, o_ptr, N: tl.constexpr):
    tl.store(o_ptr + tl.arange(0, N), tl.load(x_ptr + tl.arange(0, N + 1)))


def test_interpret_reports_the_kernels_own_error():
    with pytest.raises(RuntimeError, match="_bad_shape"):
        ptriton.interpret(ptriton.triton_kernel(_bad_shape, grid=1, N=4), np.ones(4, np.float32),
                          outs=jax.ShapeDtypeStruct((4,), np.float32))


def test_host_buffer_dtypes_survive_buffers_coming_and_going():
    """Triton remembers a tensor's dtype by the dtype object's identity: never reuse one."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    from primforge.backends._triton_interpret import HostBuffer

    want = {"float32": "*fp32", "bool": "*u1", "int64": "*i64"}
    for i in range(300):
        dt = ("float32", "bool", "int64")[i % 3]
        buf = HostBuffer(np.zeros(4, dt))
        assert native_specialize_impl(BaseBackend, buf, False, False, True)[0] == want[dt]
        del buf  # freed at once: the next buffer's dtype may land at the same address


@triton.jit(noinline=True)
def _tile_and_twice(a, N: tl.constexpr):
    return tl.zeros((N,), tl.float32) + a, a * 2


def test_a_noinline_helper_returning_a_tensor_among_others_is_refused():
    @triton.jit
    def uses_it(o_ptr, N: tl.constexpr):
        t, s = _tile_and_twice(1.0, N)
        tl.store(o_ptr + tl.arange(0, N), t + s)

    with pytest.raises(ptriton.UnsupportedTritonFeature, match="noinline=True"):
        ptriton.to_ttir(uses_it, ["float32"], {"N": 16}, cc=80)
