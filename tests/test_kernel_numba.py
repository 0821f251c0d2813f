"""XLACustomKernel with a Numba CPU backend, checked against its own 'jax' backend."""

import itertools
import math
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import primforge

numba = pytest.importorskip("numba", reason="the numba backend needs primforge[cpu]")

_ids = itertools.count()


@numba.njit
def _affine(x, y, out):
    for i in range(x.size):
        out.flat[i] = 2.0 * x.flat[i] + y.flat[i]


@numba.njit
def _rowsum(m, out):
    for i in range(m.shape[0]):
        s = 0.0
        for j in range(m.shape[1]):
            s += m[i, j]
        out[i] = s


def _affine_kernel(mode="native"):
    k = primforge.XLACustomKernel(f"test_nb_affine_{next(_ids)}")
    k.def_numba_kernel(lambda **kw: _affine)
    k.def_kernel("jax", "cpu", lambda **kw: lambda x, y: 2.0 * x + y)
    k.def_jvp_rule2(lambda t, x, y, **kw: [2.0 * t], lambda t, x, y, **kw: [t])
    if mode == "general":
        k.register_general_batching()
    return k


def _call(k, x, y, backend=None):
    return k(x, y, outs=jax.ShapeDtypeStruct(x.shape, x.dtype), backend=backend)


def test_numba_is_default_and_matches_jax_backend_eager_and_jit():
    k = _affine_kernel()
    assert k.get_default("cpu") == "numba"
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(7, 3)), jnp.float32)
    y = jnp.asarray(rng.normal(size=(7, 3)), jnp.float32)
    want = 2.0 * np.asarray(x) + np.asarray(y)
    np.testing.assert_allclose(_call(k, x, y), want, rtol=1e-6)
    np.testing.assert_allclose(jax.jit(lambda a, b: _call(k, a, b))(x, y), want, rtol=1e-6)
    np.testing.assert_allclose(_call(k, x, y, backend="jax"), want, rtol=1e-6)


@pytest.mark.parametrize("mode", ["native", "general"])
def test_vmap_of_numba_kernel_matches_jax_backend(mode):
    k = _affine_kernel(mode)
    rng = np.random.default_rng(1)
    xs = jnp.asarray(rng.normal(size=(6, 5)), jnp.float32)
    y = jnp.asarray(rng.normal(size=(5,)), jnp.float32)
    f = lambda x, backend=None: _call(k, x, y, backend)
    got = jax.vmap(f)(xs)
    want = jax.vmap(lambda x: f(x, "jax"))(xs)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    nested = jax.vmap(jax.vmap(lambda a, b: _call(k, a, b)), in_axes=(0, None))
    np.testing.assert_allclose(
        nested(jnp.stack([xs, -xs]), xs), 2.0 * np.stack([xs, -xs]) + np.asarray(xs), rtol=1e-6
    )


def test_grad_through_registered_rules_on_numba_kernel():
    k = _affine_kernel()
    x = jnp.linspace(-1.0, 1.0, 4)
    y = jnp.ones(4)
    loss = lambda x, y: jnp.sum(jnp.sin(_call(k, x, y)))
    ref = lambda x, y: jnp.sum(jnp.sin(2.0 * x + y))
    for g, w in zip(jax.grad(loss, (0, 1))(x, y), jax.grad(ref, (0, 1))(x, y)):
        np.testing.assert_allclose(g, w, rtol=1e-5)
    got = jax.vmap(jax.grad(loss))(jnp.stack([x, 2 * x]), jnp.stack([y, y]))
    want = jax.vmap(jax.grad(ref))(jnp.stack([x, 2 * x]), jnp.stack([y, y]))
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_non_elementwise_kernel_under_vmap_sees_per_example_shapes():
    k = primforge.XLACustomKernel(f"test_nb_rowsum_{next(_ids)}")
    k.def_numba_kernel(lambda **kw: _rowsum)
    ms = jnp.arange(2 * 3 * 4, dtype=jnp.float32).reshape(2, 3, 4)
    got = jax.vmap(lambda m: k(m, outs=jax.ShapeDtypeStruct((3,), jnp.float32)))(ms)
    np.testing.assert_allclose(got, np.asarray(ms).sum(-1))


def test_parallel_numba_kernel_at_large_size():
    @numba.njit(parallel=True)
    def par(x, out):
        for i in numba.prange(x.size):
            out[i] = math.sqrt(abs(x[i])) + 1.0

    k = primforge.XLACustomKernel(f"test_nb_parallel_{next(_ids)}")
    k.def_numba_kernel(lambda **kw: par)
    x = jnp.linspace(-5, 5, 1_000_003, dtype=jnp.float32)
    got = jax.jit(lambda x: k(x, outs=jax.ShapeDtypeStruct(x.shape, x.dtype)))(x)
    np.testing.assert_allclose(got, np.sqrt(np.abs(np.asarray(x))) + 1.0, rtol=1e-6)


_HIDE_NUMBA = textwrap.dedent(
    """
    import sys, warnings
    sys.modules["numba"] = None  # import numba -> ImportError
    import jax, jax.numpy as jnp, primforge
    k = primforge.XLACustomKernel("fallback_demo")
    def numba_gen(**kw):
        import numba
        raise AssertionError("must not be called")
    k.def_numba_kernel(numba_gen)
    k.def_kernel("jax", "cpu", lambda **kw: lambda x: x * 10)
    o = jax.ShapeDtypeStruct((2,), jnp.float32)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        a = k(jnp.ones(2), outs=o)
        b = k(jnp.ones(2) * 2, outs=o)
    msgs = [str(x.message) for x in w
            if issubclass(x.category, primforge.BackendUnavailableWarning)]
    print("RESULT", a.tolist(), b.tolist(), len(msgs))
    print("MSG", msgs[0])
    try:
        k(jnp.ones(2), outs=o, backend="numba")
    except primforge.KernelError as e:
        print("EXPLICIT", e)
    """
)


def test_missing_numba_falls_back_with_one_warning_and_explicit_request_errors():
    out = subprocess.run([sys.executable, "-c", _HIDE_NUMBA], capture_output=True, text=True,
                         check=False, timeout=300, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert out.returncode == 0, out.stderr
    assert "RESULT [10.0, 10.0] [20.0, 20.0] 1" in out.stdout
    assert 'pip install -e ".[cpu]"' in out.stdout.split("MSG", 1)[1]
    assert "EXPLICIT" in out.stdout and '".[cpu]"' in out.stdout.split("EXPLICIT", 1)[1]


def test_import_primforge_does_not_import_numba():
    code = "import sys, primforge; print('numba' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
