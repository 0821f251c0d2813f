"""Code written for brainevent's XLACustomKernel runs on primforge with only its imports changed.

The example (tests/migration/brainevent_example.py) is checked against NumPy and finite
differences, through jit, vmap, grad and the transpose; then the differences a migrating
user meets: a generator returning a traceable callable or ``numba_kernel(...)`` for the
numba backend, bare tangents from single-output JVP rules, re-registering a name, and
``numba_cuda_kernel(kernel, outs, grid=, block=)`` called on its own.
"""

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads
from migration._load import load, load_again

import primforge

be = load("brainevent_example")

RNG = np.random.default_rng(0)
W = RNG.normal(size=(6, 9)).astype(np.float32)
SPIKES_BOOL = RNG.random(9) < 0.4
SPIKES_FLOAT = (RNG.random(9) * (RNG.random(9) < 0.5)).astype(np.float32)


def _numpy_event_mv(w, s):
    out = np.zeros(w.shape[0], np.float64)
    for i in range(s.shape[0]):
        if s[i]:
            out += w[:, i].astype(np.float64) * float(s[i])
    return out


@pytest.mark.parametrize("spikes", [SPIKES_BOOL, SPIKES_FLOAT], ids=["bool", "float"])
@pytest.mark.parametrize("backend", ["numba", "jax_raw"])
def test_event_mv_matches_numpy(spikes, backend):
    got = be.event_mv_p_call(jnp.asarray(W), jnp.asarray(spikes), backend=backend)
    assert isinstance(got, list) and len(got) == 1  # outs=[...] gives a list, as in brainevent
    np.testing.assert_allclose(got[0], _numpy_event_mv(W, spikes), rtol=1e-5, atol=1e-5)
    jitted = jax.jit(lambda w, s: be.event_mv_p_call(w, s, backend=backend)[0])
    np.testing.assert_allclose(jitted(W, spikes), _numpy_event_mv(W, spikes), rtol=1e-5,
                               atol=1e-5)


def test_event_mv_numba_is_the_default_on_cpu():
    assert be.event_mv_p.defaults["cpu"] == "numba"
    assert set(be.event_mv_p.available_backends("cpu")) == {"numba", "jax_raw"}


def test_event_mv_vmap_over_spikes_matches_numpy():
    batch = np.stack([SPIKES_FLOAT, 2 * SPIKES_FLOAT, np.roll(SPIKES_FLOAT, 3)])
    got = jax.vmap(lambda s: be.event_mv_p_call(jnp.asarray(W), s)[0])(batch)
    want = np.stack([_numpy_event_mv(W, s) for s in batch])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_event_mv_gradients_match_finite_differences():
    w = jnp.asarray(W, jnp.float32)
    s = jnp.asarray(RNG.normal(size=9), jnp.float32)  # every entry active: smooth in s
    f = lambda w, s: be.event_mv_p_call(w, s)[0]
    check_grads(f, (w, s), order=1, modes=("fwd", "rev"), atol=5e-2, rtol=5e-2)
    g = jax.grad(lambda w, s: jnp.sum(f(w, s) ** 2), argnums=(0, 1))(w, s)
    y = np.asarray(W, np.float64) @ np.asarray(s, np.float64)
    np.testing.assert_allclose(g[0], 2 * np.outer(y, np.asarray(s)), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(g[1], 2 * np.asarray(W, np.float64).T @ y, rtol=1e-4, atol=1e-4)


def test_generator_returning_numba_kernel_and_bare_single_output_tangent():
    x, factor = jnp.arange(4.0), jnp.array([3.0])
    np.testing.assert_allclose(be.scale(x, factor), 3 * np.arange(4.0))
    np.testing.assert_allclose(jax.vmap(lambda v: be.scale(v, factor))(jnp.ones((2, 4))),
                               3 * np.ones((2, 4)))
    check_grads(lambda x, f: be.scale(x, f), (x, factor), order=1, modes=("fwd", "rev"),
                atol=1e-2, rtol=1e-2)


def test_numba_generator_returning_the_raw_kernel_still_works():
    import numba

    @numba.njit
    def kernel(x, out):
        for i in range(x.size):
            out[i] = x[i] * x[i]

    k = primforge.XLACustomKernel("migration_raw_numba", replace=True)
    k.def_numba_kernel(lambda **kw: kernel)
    np.testing.assert_allclose(k(jnp.arange(3.0), outs=jax.ShapeDtypeStruct((3,), jnp.float32)),
                               np.arange(3.0) ** 2)


def test_numba_generator_product_of_neither_form_names_both():
    k = primforge.XLACustomKernel("migration_bad_numba", replace=True)
    k.def_numba_kernel(lambda **kw: lambda a, b, c: a)
    with pytest.raises(primforge.KernelError, match=r"plain function with signature \(a, b, c\)"
                       r".*1 input\(s\) then the 1 output\(s\).*traceable JAX callable"):
        k(jnp.ones(2), outs=jax.ShapeDtypeStruct((2,), jnp.float32))


def test_numba_kernel_outs_that_disagree_with_the_call_are_an_error():
    import numba

    @numba.njit
    def kernel(x, out):
        out[0] = x[0]

    k = primforge.XLACustomKernel("migration_outs_mismatch", replace=True)
    k.def_numba_kernel(lambda **kw: primforge.numba_kernel(
        kernel, outs=jax.ShapeDtypeStruct((5,), jnp.float32)))
    with pytest.raises(primforge.KernelError, match=r"declares outputs \[\(\(5,\), 'float32'\)\]"):
        k(jnp.ones(2), outs=jax.ShapeDtypeStruct((2,), jnp.float32))


def test_reimporting_the_module_warns_replaces_and_the_old_kernel_keeps_working():
    old = be.event_mv_p
    with pytest.warns(primforge.registry.KernelReplacedWarning) as caught:
        again = load_again("brainevent_example")
    # One warning per replaced kernel, naming it.
    assert sorted(str(w.message).split("'")[1] for w in caught) == ["migrated_event_mv",
                                                                    "migrated_scale"]
    assert primforge.get_kernel("migrated_event_mv") is again.event_mv_p is not old
    want = _numpy_event_mv(W, SPIKES_BOOL)
    np.testing.assert_allclose(be.event_mv_p_call(W, SPIKES_BOOL)[0], want, rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_allclose(again.event_mv_p_call(W, SPIKES_BOOL)[0], want, rtol=1e-5,
                               atol=1e-5)


NUMBA_CUDA_SCRIPT = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np
    from numba import cuda
    from primforge import XLACustomKernel, numba_cuda_kernel

    @cuda.jit
    def add_kernel(x, y, out):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = x[i] + 2 * y[i]

    n = 10
    x = np.arange(n, dtype=np.float32)
    y = np.linspace(-1, 1, n).astype(np.float32)
    want = x + 2 * y
    spec = jax.ShapeDtypeStruct((n,), jnp.float32)

    # Called on its own, brainevent's way: explicit grid/block, then launch_dims.
    fn = numba_cuda_kernel(add_kernel, outs=spec, grid=3, block=4)
    np.testing.assert_allclose(np.asarray(fn(x, y)), want, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(jax.jit(fn)(x, y)), want, rtol=1e-6)
    fn2 = numba_cuda_kernel(add_kernel, [spec], launch_dims=n, threads_per_block=4)
    (out,) = fn2(x, y)
    np.testing.assert_allclose(np.asarray(out), want, rtol=1e-6)
    bx = np.stack([x, 3 * x])
    np.testing.assert_allclose(np.asarray(jax.vmap(lambda a: fn(a, y))(bx)),
                               bx + 2 * y, rtol=1e-6)

    # From a generator: a function calling it, and the bound kernel itself.
    def gen_callable(**kwargs):
        k = numba_cuda_kernel(add_kernel, outs=kwargs['outs'], launch_dims=n)
        def run(x, y):
            return k(x, y)
        return run

    def gen_kernel(**kwargs):
        return numba_cuda_kernel(add_kernel, kwargs['outs'], grid=1, block=16)

    for i, gen in enumerate((gen_callable, gen_kernel)):
        p = XLACustomKernel(f'mig_nc_{i}')
        p.def_kernel('numba_cuda', 'cpu', gen)
        np.testing.assert_allclose(np.asarray(p(x, y, outs=[spec])[0]), want, rtol=1e-6)
    print('NUMBA-CUDA-OK')
""")


def test_numba_cuda_kernel_with_outs_is_callable_under_the_simulator():
    pytest.importorskip("numba_cuda", reason="optional backend: pip install "
                        "'primforge[numba-cuda]'")
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", NUMBA_CUDA_SCRIPT], capture_output=True,
                          text=True, env=env, timeout=300, check=False,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "NUMBA-CUDA-OK" in proc.stdout


def test_numba_cuda_kernel_launch_configuration_checks():
    from primforge.backends.numba_cuda import numba_cuda_kernel

    k = numba_cuda_kernel(None, launch_dims=(20, 33))
    assert k.block == (16, 16) and k.grid == (2, 3)
    k = numba_cuda_kernel(None, launch_dims=1000, threads_per_block=128)
    assert k.block == (128,) and k.grid == (8,)
    with pytest.raises(ValueError, match="launch_dims or grid/block, not both"):
        numba_cuda_kernel(None, launch_dims=8, grid=1, block=8)
    with pytest.raises(TypeError, match=r"outs\[0\] must be a jax.ShapeDtypeStruct"):
        numba_cuda_kernel(None, outs=[3], launch_dims=2)
    with pytest.raises(TypeError, match="knows its outputs"):
        numba_cuda_kernel(None, launch_dims=2)(jnp.ones(2))


def test_whole_jvp_rule_of_a_single_output_kernel_may_return_bare_arrays():
    k = primforge.XLACustomKernel("migration_bare_jvp", replace=True)
    k.def_kernel("jax", "cpu", lambda **kw: lambda x: jnp.sin(x))
    spec = jax.ShapeDtypeStruct((3,), jnp.float32)

    def jvp(primals, tangents, **kw):  # brainevent users often return bare arrays here
        (x,), (t,) = primals, tangents
        return jnp.sin(x), jnp.cos(x) * t

    k.def_jvp_rule(jvp)
    x = jnp.array([0.1, 0.5, 2.0])
    y, ty = jax.jvp(lambda x: k(x, outs=spec), (x,), (jnp.ones(3),))
    np.testing.assert_allclose(y, np.sin(np.asarray(x)), rtol=1e-6)
    np.testing.assert_allclose(ty, np.cos(np.asarray(x)), rtol=1e-6)

    def bad(primals, tangents, **kw):
        return [jnp.sin(primals[0])], [tangents[0], tangents[0]]

    k.def_jvp_rule(bad)
    with pytest.raises(primforge.KernelError, match=r"JVP rule .*bad must return 1 tangents"):
        jax.jvp(lambda x: k(x, outs=spec), (x,), (jnp.ones(3),))


@pytest.mark.parametrize("backend", ["warp", "triton", "numba_cuda"])
def test_gpu_backends_accept_a_traceable_callable_from_the_generator(backend):
    # brainevent generators return a traceable function for every backend; primforge uses
    # it as it is (lowered for CUDA here: no GPU needed, none of the backend's compilers).
    from gpu_utils import lower_for_cuda

    from primforge.backends import get_backend

    module = get_backend(backend)
    if not module.is_available("gpu"):  # the backend asked for by name needs its package
        pytest.skip(f"optional backend: pip install 'primforge[{module.EXTRA}]'")
    k = primforge.XLACustomKernel(f"migration_callable_{backend}", replace=True)
    k.def_kernel(backend, "gpu", lambda **kw: lambda x: [jnp.sin(x) * 2])
    spec = [jax.ShapeDtypeStruct((8,), jnp.float32)]
    text = lower_for_cuda(lambda x: k(x, outs=spec, backend=backend)[0], jnp.ones(8))
    assert "sine" in text and "custom_call" not in text


def test_warp_on_cpu_accepts_a_traceable_callable_from_the_generator():
    pytest.importorskip("warp", reason="optional backend: pip install 'primforge[warp]'")
    k = primforge.XLACustomKernel("migration_callable_warp_cpu", replace=True)
    k.def_warp_kernel(lambda **kw: lambda x, y: (x * y, x - y), platform="cpu")
    spec = [jax.ShapeDtypeStruct((3,), jnp.float32)] * 2
    x, y = jnp.arange(3.0), jnp.full(3, 2.0)
    a, b = k(x, y, outs=spec)
    np.testing.assert_allclose(a, np.arange(3.0) * 2)
    np.testing.assert_allclose(b, np.arange(3.0) - 2)
    with pytest.raises(primforge.KernelError,
                       match="must return a @wp.kernel.*traceable JAX callable.*got int"):
        k2 = primforge.XLACustomKernel("migration_warp_cpu_bad", replace=True)
        k2.def_warp_kernel(lambda **kw: 42, platform="cpu")
        k2(x, y, outs=spec)
