"""The user-facing surface: names suggested for typos, errors that say what to do, and the
argument contracts that code written for brainevent and kups relies on."""

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numba
import numpy as np
import pytest

import primforge
from primforge import autotune
from primforge.backends.numba import numba_kernel
from primforge.backends.numba_cuda import numba_cuda_kernel
from primforge.cli import main
from primforge.utils import dataclass, non_differentiable

TESTS = Path(__file__).parent
F32 = jax.ShapeDtypeStruct((3,), jnp.float32)


def _kernel(name):
    k = primforge.XLACustomKernel(f"surface_{name}", replace=True)
    k.def_kernel("jax", "cpu", lambda scale=1.0, **kw: lambda x: scale * x)
    return k


@pytest.fixture
def cli_env(tmp_path, monkeypatch):
    """The CLI's demo kernels importable; autotune reads a private store."""
    monkeypatch.syspath_prepend(str(TESTS))
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    monkeypatch.setenv("PRIMFORGE_CACHE_DIR", str(cache))
    monkeypatch.delenv("PRIMFORGE_AUTOTUNE", raising=False)
    return cache


# ------------------------------------------------------------------ did you mean
def test_a_misspelt_backend_is_answered_with_the_close_name():
    k = _kernel("typo")
    with pytest.raises(ValueError, match=r"'nmuba' \(did you mean 'numba'\?\).*'backend'"):
        k(jnp.ones(3), outs=F32, backend="nmuba")
    with pytest.raises(ValueError, match=r"'nmuba' \(the 'backend' argument\) \(did you mean "
                                         r"'numba'\?\)"):
        primforge.use_backend("cpu", "nmuba").__enter__()
    with pytest.raises(ValueError, match=r"'surface_tpyo' \(the 'kernel' argument\) \(did you "
                                         r"mean 'surface_typo'\?\)"):
        primforge.use_backend("cpu", "jax", kernel="surface_tpyo").__enter__()
    with pytest.raises(ValueError, match=r"did you mean 'sequential'"):
        numba_kernel(_copy, F32, vmap_method="sequentail")


def test_cli_answers_an_unknown_kernel_name_with_the_close_ones_only(cli_env, capsys):
    assert main(["info", "pf_demo_scal", "--import", "pf_cli_demo"]) == 2
    err = capsys.readouterr().err
    assert "did you mean 'pf_demo_scale'" in err
    assert "pf_demo_wrong" not in err  # not the whole list
    # A short name finds the dotted name of the library's operator.
    assert main(["info", "csrmvv"]) == 2
    assert "'primforge.ops.csrmv'" in capsys.readouterr().err


def test_autotune_show_and_clear_find_a_stored_entry_by_name(cli_env, capsys):
    """Entries of kernels whose module is not imported: --show lists them, so --clear NAME
    must find them too."""
    (cli_env / "autotune.json").write_text(json.dumps({"kernels": {
        "mypkg.gone": {"cpu": {"backend": "alt"}}, "mypkg.kept": {"cpu": {"backend": "x"}}}}))
    assert main(["autotune", "--show", "mypkg.gone"]) == 0
    assert "mypkg.gone" in capsys.readouterr().out
    assert main(["autotune", "--clear", "mypkg.gone"]) == 0
    assert autotune.choices() == {"mypkg.kept": {"cpu": "x"}}
    assert main(["autotune", "--clear", "mypkg.nope"]) == 2  # neither stored nor registered
    assert "no kernel named 'mypkg.nope'" in capsys.readouterr().err


# ------------------------------------------------------------------ static params
def test_a_traced_static_param_says_what_a_kernel_user_should_do():
    k = _kernel("traced")
    with pytest.raises(TypeError) as info:
        jax.jit(lambda s: k(jnp.ones(3), outs=F32, scale=s))(2.0)
    msg = str(info.value)
    assert "static param 'scale' is a traced value" in msg
    assert "array input" in msg and "static_argnums" in msg and "float(x)" in msg
    # The same value given as a Python float works.
    np.testing.assert_allclose(k(jnp.ones(3), outs=F32, scale=2.0), np.full(3, 2.0))


def test_registration_errors_are_typed_and_name_the_argument():
    k = primforge.XLACustomKernel("surface_register", replace=True)
    gen = lambda **kw: lambda x: x
    with pytest.raises(TypeError, match="'backend'"):
        k.def_kernel(123, "cpu", gen)
    with pytest.raises(TypeError, match="'platform'"):
        k.def_kernel("numba", 123, gen)
    with pytest.raises(TypeError, match="callable"):
        k.def_kernel("numba", "cpu", 3)
    k.def_pallas_kernel("cpu", gen)  # Pallas serves the CPU in interpret mode
    assert k.available_backends("cpu") == ["pallas"]

    class Unhashable:
        __hash__ = None

    k2 = _kernel("unhashable")
    with pytest.raises(TypeError, match=r"'scale'.*hashable"):
        k2(jnp.ones(3), outs=F32, scale=Unhashable())


# ------------------------------------------------------------------ numba_kernel
@numba.njit
def _copy(x, out):
    for i in range(x.size):
        out[i] = 3.0 * x[i]


@pytest.mark.parametrize("method", [None, "sequential", "expand_dims", "broadcast_all"])
def test_numba_kernel_accepts_vmap_method_and_batches_the_same(method):
    k = numba_kernel(_copy, F32, vmap_method=method)
    xs = jnp.arange(6.0, dtype=jnp.float32).reshape(2, 3)
    np.testing.assert_allclose(jax.vmap(k)(xs), 3.0 * np.asarray(xs))


def test_numba_kernel_refuses_what_numba_did_not_compile():
    def plain(x, out):
        out[:] = x

    with pytest.raises(TypeError, match=r"'fn'.*@numba.njit.*got a lambda"):
        numba_kernel(lambda x, out: None, F32)
    with pytest.raises(TypeError, match=r"'fn'.*@numba.njit.*got function"):
        numba_kernel(plain, F32)


# ------------------------------------------------------------------ numba_cuda_kernel
@pytest.mark.parametrize("launch, match", [
    ({"grid": 2}, "'grid' and 'block' go together"),
    ({"block": 64}, "'grid' and 'block' go together"),
    ({}, "no launch configuration"),
    ({"grid": 2, "block": 64, "vmap_method": "sequential"}, "goes with launch_dims"),
    ({"grid": 2, "block": 64, "launch_dims": 128}, "not both"),
])
def test_numba_cuda_kernel_checks_its_launch_when_it_wraps(launch, match):
    # No kernel object is needed: the checks run before numba-cuda is.
    with pytest.raises(ValueError, match=match):
        numba_cuda_kernel(None, F32, **launch)


def test_numba_cuda_kernel_refuses_bfloat16_and_takes_launch_dims_with_vmap_method():
    with pytest.raises(ValueError, match=r"outs\[0\] is bfloat16"):
        numba_cuda_kernel(None, jax.ShapeDtypeStruct((4,), jnp.bfloat16), launch_dims=4)
    k = numba_cuda_kernel(None, F32, launch_dims=3, threads_per_block=32,
                          vmap_method="sequential")
    assert (k.grid, k.block) == ((1,), (32,))


# ------------------------------------------------------------------ benchmark configs
def test_benchmark_configs_take_kernel_kwargs_and_data_kwargs():
    k = _kernel("bench")
    seen = []

    def call(x, *, scale, backend=None):
        seen.append(scale)
        return k(x, outs=jax.ShapeDtypeStruct(x.shape, x.dtype), backend=backend, scale=scale)

    k.def_call(call)
    k.def_benchmark_data(lambda *, platform: [
        primforge.BenchmarkConfig("a", (jnp.ones(4),), kernel_kwargs={"scale": 2.0},
                                  data_kwargs={"n": 4}),
        primforge.BenchmarkConfig("b", (jnp.ones(8),), kernel_kwargs={"scale": 3.0}, n=8),
    ])
    result = k.benchmark(platform="cpu", n_warmup=0, n_runs=1)
    assert sorted(set(seen)) == [2.0, 3.0]
    assert [(r.config, r.params) for r in result.records] == [("a", {"n": 4}), ("b", {"n": 8})]
    cfg = primforge.BenchmarkConfig("c", (), kernel_kwargs={"s": 1})
    assert cfg.kwargs == cfg.kernel_kwargs == {"s": 1}
    with pytest.raises(TypeError, match="'kwargs' or its other name 'kernel_kwargs'"):
        primforge.BenchmarkConfig("d", (), {"s": 1}, kernel_kwargs={"s": 2})


# ------------------------------------------------------------------ utils (kups)
def test_dataclasses_carry_the_jax_dataclass_marker():
    @dataclass
    class Particle:
        x: jax.Array

    assert Particle._jax_dataclass is True
    assert jax.tree.leaves(Particle(jnp.ones(2)))[0].shape == (2,)


def test_differentiating_through_non_differentiable_says_not_differentiable():
    with pytest.raises(Exception, match="not differentiable"):
        jax.grad(lambda x: non_differentiable(x) * 2.0)(1.0)
    assert non_differentiable(jnp.float32(2.0)) == 2.0


# ------------------------------------------------------------------ operator input dtypes
def _op_cases():
    from primforge import ops

    rng = np.random.default_rng(0)
    dense = (rng.random((4, 5)) * (rng.random((4, 5)) < 0.5)).astype(np.float32)
    rows, cols = np.nonzero(dense)
    indptr = np.searchsorted(rows, np.arange(5)).astype(np.int32)
    csr = (dense[rows, cols], cols.astype(np.int32), indptr)
    fixed = (np.ones((4, 2), np.float32), np.array([[0, 1], [2, 3], [4, 0], [1, 2]], np.int32))
    jitc = {"shape": (4, 5), "prob": 0.5}
    v, m = np.arange(5, dtype=np.int32), np.arange(10, dtype=np.int32).reshape(5, 2)
    return [
        ("csrmv", "data", "vector", lambda w, x: ops.csrmv(w, *csr[1:], x, shape=(4, 5)),
         csr[0], v),
        ("csrmm", "data", "matrix", lambda w, x: ops.csrmm(w, *csr[1:], x, shape=(4, 5)),
         csr[0], m),
        ("densemv", "weights", "vector", lambda w, x: ops.densemv(w, x), dense, v),
        ("densemm", "weights", "matrix", lambda w, x: ops.densemm(w, x), dense, m),
        ("fixed_num_mv", "weights", "vector",
         lambda w, x: ops.fixed_num_mv(w, fixed[1], x, shape=(4, 5)), fixed[0], v),
        ("jitc_matvec", "weight", "x", lambda w, x: ops.jitc_matvec(w, 0, x, **jitc), 0.5, v),
        ("jitc_matmat", "weight", "x", lambda w, x: ops.jitc_matmat(w, 0, x, **jitc), 0.5, m),
        ("binary_csrmv", "data", "events",
         lambda w, x: ops.binary_csrmv(w, *csr[1:], x, shape=(4, 5)), csr[0], v),
    ]


def test_operators_promote_integer_input_and_refuse_complex_naming_the_argument():
    """Integer input of a float product is promoted to the weights' dtype, as in jnp.matmul;
    complex input or weights raise TypeError naming the argument."""
    for op, w_name, x_name, call, w, x in _op_cases():
        got = call(w, x)
        if not op.startswith("binary"):
            np.testing.assert_allclose(got, call(w, x.astype(np.float32)), rtol=1e-6,
                                       err_msg=op)
        if op == "csrmv":  # and against NumPy
            np.testing.assert_allclose(got, _dense_of_csr_case() @ x, rtol=1e-6)
        with pytest.raises(TypeError, match=rf"{op}: '{x_name}' is complex"):
            call(w, x.astype(np.complex64))
        with pytest.raises(TypeError, match=rf"{op}: '{w_name}' is complex"):
            call(np.asarray(w, np.complex64), x)


def _dense_of_csr_case():
    rng = np.random.default_rng(0)
    return (rng.random((4, 5)) * (rng.random((4, 5)) < 0.5)).astype(np.float32)


def test_misspelt_platforms_and_default_backends_get_the_close_name():
    k = _kernel("close_names")
    k.def_kernel("numba_parallel", "cpu", lambda **kw: lambda x: x)
    with pytest.raises(ValueError, match=r"'gpuu' \(did you mean 'gpu'\?\)"):
        k.available_backends("gpuu")
    with pytest.raises(ValueError, match=r"'numba_paralel' backend on 'cpu' \(did you mean "
                                         r"'numba_parallel'\?\)"):
        k.set_default("cpu", "numba_paralel")
    k.def_call(lambda x, backend=None: k(x, outs=F32, backend=backend))
    k.def_benchmark_data(lambda *, platform: [primforge.BenchmarkConfig(args=(jnp.ones(3),))])
    with pytest.raises(ValueError, match=r"did you mean 'numba_parallel'\?"):
        k.benchmark(platform="cpu", backends=["numba_paralel"])
