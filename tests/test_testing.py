"""primforge.testing: XLA:GPU compiles for a target description, on a machine without a GPU."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gpu_utils import has_gpu_driver, requires_gpu_compiler

from primforge import _compat, testing

THUNKS = textwrap.dedent("""\
    001: kCustomCall   [source       | next=002 (1)] kCustomCall
    002: kCustomKernel [prev=001 (1) | sink        ] loop_add_fusion grid: [4, 2, 1] \
threads: [128, 1, 1]  shared_memory: 64 bytes
""")
META = textwrap.dedent("""\
    thunk_metadata {
      thunk_info {
        profile_annotation: "ffi_call.1"
        thunk_id: 1
      }
      thunk_kind: "kCustomCall"
    }
""")
HLO = ('  %ffi_call.1 = f32[8]{0} custom-call(%x.1), custom_call_target="my_handler", '
       'api_version=API_VERSION_TYPED_FFI\n')


# ----------------------------------------------------------------------------- no plugin needed
def test_thunk_sequence_gives_launch_shapes_and_names_custom_calls_by_target():
    kernels = testing._parse_thunks(THUNKS, META, HLO)
    assert kernels == (
        testing.GpuKernel("my_handler", "kCustomCall"),
        testing.GpuKernel("loop_add_fusion", "kCustomKernel", (4, 2, 1), (128, 1, 1), 64),
    )
    assert kernels[1].threads == 1024 and kernels[0].threads is None


def test_targets_ship_with_the_package_and_describe_their_architecture():
    assert "major: 9" in testing.target_config("h100")
    assert "major: 8" in testing.target_config("A100")
    with pytest.raises(ValueError, match=r"target='sm_90': expected one of 'a100', 'h100'"):
        testing.target_config("sm_90")


def test_missing_plugin_is_named_with_the_extra(monkeypatch):
    def version(dist):
        raise importlib.metadata.PackageNotFoundError(dist)

    monkeypatch.setattr(importlib.metadata, "version", version)
    reason = testing.unavailable_reason()
    assert "jax-cuda12-plugin" in reason and 'pip install -e ".[gpu-compile]"' in reason
    with pytest.raises(testing.GpuCompilerUnavailable, match=r'pip install -e "\.\[gpu-compile\]"'):
        testing.compile_for_gpu(jnp.sin, jnp.ones(4))


def test_a_plugin_of_another_jax_version_is_refused(monkeypatch):
    monkeypatch.setattr(importlib.metadata, "version", lambda dist: "0.0.1")
    import jaxlib

    reason = testing.unavailable_reason()
    assert "0.0.1 does not match jaxlib " + jaxlib.__version__ in reason
    assert f"jax-cuda12-plugin=={jaxlib.__version__}" in reason


def test_missing_ptxas_is_named_with_the_extra(monkeypatch):
    import jaxlib

    monkeypatch.setattr(importlib.metadata, "version", lambda dist: jaxlib.__version__)
    monkeypatch.setattr(testing, "_cuda_dirs", lambda: ["/nonexistent"])
    testing._cuda_dir.cache_clear()
    try:
        reason = testing.unavailable_reason()
    finally:
        testing._cuda_dir.cache_clear()
    assert "needs ptxas" in reason and 'pip install -e ".[gpu-compile]"' in reason


def test_xla_gets_a_cuda_folder_with_ptxas_and_libdevice(tmp_path, monkeypatch):
    def folder(name, libdevice):
        (tmp_path / name / "bin").mkdir(parents=True)
        ptxas = tmp_path / name / "bin" / "ptxas"
        ptxas.write_text("#!/bin/sh\n")
        ptxas.chmod(0o755)
        if libdevice:
            (tmp_path / name / "nvvm" / "libdevice").mkdir(parents=True)
        return str(tmp_path / name)

    bare, full = folder("bare", False), folder("full", True)
    for dirs, want in [([str(tmp_path / "none"), bare, full], full), ([bare], bare),
                       ([str(tmp_path / "none")], None)]:
        monkeypatch.setattr(testing, "_cuda_dirs", lambda dirs=dirs: dirs)
        testing._cuda_dir.cache_clear()
        try:
            assert testing._cuda_dir() == want
        finally:
            testing._cuda_dir.cache_clear()


# ----------------------------------------------------------------------------- with the plugin
@requires_gpu_compiler
@pytest.mark.parametrize("target,sm", [("h100", "sm_90"), ("a100", "sm_80")])
def test_a_jax_function_compiles_with_kernels_and_ptx_for_the_target(target, sm):
    result = testing.compile_for_gpu(lambda x: jnp.sin(x) * 2, jnp.ones(1000, jnp.float32),
                                     target=target, ptx=True)
    assert result.ok and result.sm == sm and result.error is None
    (kernel,) = result.kernels
    assert kernel.threads >= 1000 and kernel.block[0] % 32 == 0
    if _compat.JAX_VERSION < (0, 11):
        assert f".target {sm}" in result.ptx[kernel.name]
    else:  # XLA no longer dumps its PTX (the docstring says so)
        assert kernel.name not in result.ptx
    assert "sine" in result.hlo
    assert kernel.name in result.describe()


@requires_gpu_compiler
def test_a_target_given_as_a_file(tmp_path):
    """Another GPU: the A100 description with fewer cores (a made-up A100 variant)."""
    path = tmp_path / "small_a100.txtpb"
    path.write_text(testing.target_config("a100").replace("core_count: 108", "core_count: 7"))
    result = testing.compile_for_gpu(jnp.sin, jnp.ones(8), target=str(path)).check()
    assert result.sm == "sm_80" and result.target == str(path)
    bad = tmp_path / "bad.txtpb"
    bad.write_text("no_such_field: 1\n")
    with pytest.raises(ValueError, match="does not parse"):
        testing.compile_for_gpu(jnp.sin, jnp.ones(8), target=bad)


@requires_gpu_compiler
def test_pytrees_scalars_and_shape_dtype_structs_are_accepted():
    def f(tree, scale):
        return tree["a"] * scale + tree["b"].sum()

    args = ({"a": np.ones(3, np.float32), "b": jax.ShapeDtypeStruct((4, 2), jnp.float32)}, 2.0)
    result = testing.compile_for_gpu(f, *args, target="a100").check()
    assert result.ok and result.kernels


@requires_gpu_compiler
def test_a_function_without_arguments_is_compiled_for_the_target():
    result = testing.compile_for_gpu(lambda: jnp.sin(jnp.arange(4096.0)), target="a100")
    assert result.ok and result.sm == "sm_80"
    assert any(k.grid is not None and k.threads >= 4096 for k in result.kernels), \
        result.describe()


@requires_gpu_compiler
def test_a_program_without_kernels_compiles():
    result = testing.compile_for_gpu(lambda x: x, jnp.ones(4), target="h100")
    assert result.ok and [k.kind for k in result.kernels] == ["kCopy"]  # no kernel launch


@requires_gpu_compiler
def test_errors_are_attributed_only_to_kernel_names():
    """Candidates are custom-call targets and the kernels they carry, never other attribute
    strings of the program (such as the mesh axis name 'x')."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu

    def body(x_ref, o_ref):
        o_ref[...] = x_ref[...] + 1

    f = lambda x: pl.pallas_call(body, out_shape=x,
                                 compiler_params=plgpu.CompilerParams(num_warps=4))(x)
    mesh = testing._topology(testing.target_config("h100"))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    # JAX 0.11's Pallas asks which GPU a device-less lowering is for.
    with _compat.device_less_gpu_lowering(device_kind=mesh.devices.flat[0].device_kind):
        lowered = jax.jit(f).lower(jax.ShapeDtypeStruct((128,), jnp.float32,
                                                        sharding=sharding))
    names = testing._kernel_names(testing._custom_calls(lowered.compiler_ir("stablehlo")))
    assert names == {"__gpu$xla.gpu.triton", "body"}


@requires_gpu_compiler
def test_an_unknown_ffi_target_fails_by_name_and_check_raises():
    f = lambda x: jax.ffi.ffi_call("pf_no_such_handler", jax.ShapeDtypeStruct(x.shape,
                                                                             x.dtype))(x)
    result = testing.compile_for_gpu(f, jnp.ones(8), target="h100")
    assert not result.ok and result.kernels == ()
    assert result.failed_kernel == "pf_no_such_handler"
    assert "pf_no_such_handler" in result.error and "CUDA" in result.error
    with pytest.raises(testing.GpuCompileError, match="in kernel 'pf_no_such_handler'") as info:
        testing.compile_for_gpu(f, jnp.ones(8), target="h100", check=True)
    assert info.value.result.failed_kernel == "pf_no_such_handler"


@requires_gpu_compiler
@pytest.mark.skipif(has_gpu_driver(),
                    reason="a machine with a GPU driver starts the plugin normally")
def test_plugin_that_cannot_start_says_to_set_jax_platforms():
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    script = textwrap.dedent("""
        import jax.numpy as jnp
        from primforge import testing
        try:
            testing.compile_for_gpu(jnp.sin, jnp.ones(4))
        except testing.GpuCompilerUnavailable as e:
            print("UNAVAILABLE:", e)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, timeout=300, check=False,
                          cwd=os.path.dirname(os.path.dirname(testing.__file__)))
    assert "UNAVAILABLE:" in proc.stdout, proc.stderr[-2000:]
    assert "JAX_PLATFORMS=cpu" in proc.stdout
