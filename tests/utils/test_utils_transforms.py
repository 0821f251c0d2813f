"""primforge.utils transformation wrappers and tracing guards."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P
from jax.test_util import check_grads

from primforge.utils import (
    NotJaxCompatibleError,
    is_traced,
    jit,
    linearize,
    no_jax_tracing,
    non_differentiable,
    sequential_vmap_with_vjp,
    shard_map,
    vectorize,
)


def test_jit_direct_and_decorator_forms_match_numpy():
    def poly(x, n):
        return x**n + 1

    x = np.linspace(-1, 1, 5).astype(np.float32)
    np.testing.assert_allclose(jit(poly, static_argnums=1)(x, 3), x**3 + 1, rtol=1e-6)
    deco = jit(static_argnames="n")(poly)
    np.testing.assert_allclose(deco(x, n=2), x**2 + 1, rtol=1e-6)
    assert deco.__name__ == "poly"
    with pytest.raises(TypeError, match="abstracted_axes"):
        jit(poly, abstracted_axes=("n",))


def test_jit_static_argument_retraces_per_value():
    traces = []

    @jit(static_argnums=(1,))
    def f(x, k):
        traces.append(k)
        return x * k

    f(jnp.ones(2), 2)
    f(jnp.ones(2), 2)
    f(jnp.ones(2), 3)
    assert traces == [2, 3]


def test_vectorize_matches_numpy_einsum():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(4, 3, 5)), rng.normal(size=(5,))

    @vectorize(signature="(n),(n)->()")
    def dot(u, v):
        assert u.ndim == 1  # the core function only ever sees core shapes
        return jnp.sum(u * v)

    np.testing.assert_allclose(dot(a, b), np.einsum("ijk,k->ij", a, b), rtol=1e-5)
    scale = vectorize(lambda x, s: x * s["k"], excluded=frozenset({1}))
    np.testing.assert_allclose(scale(jnp.arange(3.0), {"k": 2.0}), [0.0, 2.0, 4.0])


def test_linearize_matches_analytic_derivative():
    x = jnp.array([0.1, 0.5, 1.0])
    y, f_jvp = linearize(jnp.sin, x)
    np.testing.assert_allclose(y, np.sin(np.asarray(x)), rtol=1e-6)
    np.testing.assert_allclose(f_jvp(jnp.ones(3)), np.cos(np.asarray(x)), rtol=1e-6)
    out, f_jvp, aux = linearize(lambda v: (v**2, "aux"), x, has_aux=True)
    assert aux == "aux"
    np.testing.assert_allclose(out, np.asarray(x) ** 2, rtol=1e-6)
    np.testing.assert_allclose(f_jvp(jnp.ones(3)), 2 * np.asarray(x), rtol=1e-6)


def test_shard_map_single_device_mesh():
    mesh = Mesh(np.array(jax.devices()[:1]), ("x",))

    @shard_map(mesh=mesh, in_specs=P("x"), out_specs=P())
    def total(block):
        return jax.lax.psum(jnp.sum(block, keepdims=True), "x")

    np.testing.assert_allclose(total(jnp.arange(8.0)), [28.0])


def test_shard_map_over_four_cpu_devices():
    # A fresh interpreter: the number of fake CPU devices is fixed at JAX start-up.
    script = textwrap.dedent(
        """
        import jax, jax.numpy as jnp, numpy as np
        from jax.sharding import Mesh, PartitionSpec as P
        from primforge.utils import shard_map
        assert len(jax.devices()) == 4
        mesh = Mesh(np.array(jax.devices()), ("x",))
        f = shard_map(lambda b: b - jax.lax.pmean(jnp.mean(b), "x"), mesh=mesh,
                      in_specs=P("x"), out_specs=P("x"))
        x = np.arange(8.0, dtype=np.float32) ** 2
        np.testing.assert_allclose(jax.jit(f)(x), x - x.mean(), rtol=1e-6)
        # each device sees its own block of 2
        g = shard_map(lambda b: jnp.full_like(b, b.shape[0]), mesh=mesh,
                      in_specs=P("x"), out_specs=P("x"))
        np.testing.assert_array_equal(jax.jit(g)(x), np.full(8, 2.0))
        print("OK")
        """
    )
    env = dict(
        os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("OK")


def test_is_traced_inside_and_outside_transformations():
    seen = []

    def probe(x):
        seen.append(is_traced({"a": x, "b": 1.0}))
        return x

    probe(jnp.ones(2))
    jax.jit(probe)(jnp.ones(2))
    jax.vmap(probe)(jnp.ones(2))
    jax.grad(lambda x: probe(x).sum())(jnp.ones(2))
    assert seen == [False, True, True, True]
    assert not is_traced({"a": np.ones(1), "b": "text"})


def test_no_jax_tracing_refuses_traced_arguments():
    @no_jax_tracing
    def host_only(x, *, scale=1):
        return np.asarray(x) * scale

    np.testing.assert_array_equal(host_only(jnp.ones(2), scale=3), [3.0, 3.0])
    for transform in (jax.jit, jax.vmap, jax.grad):
        with pytest.raises(NotJaxCompatibleError, match="host_only"):
            transform(lambda x: host_only(x).sum())(jnp.ones(2))
    with pytest.raises(NotJaxCompatibleError):
        jax.jit(lambda s: host_only(np.ones(1), scale=s))(2.0)  # traced keyword
    # Concrete arguments inside jit are fine.
    np.testing.assert_array_equal(jax.jit(lambda: jnp.asarray(host_only(np.ones(1))))(), [1.0])
    assert host_only.__name__ == "host_only"


def test_non_differentiable_passes_values_and_refuses_derivatives():
    x = jnp.array([1.0, 2.0])
    tree = {"a": x, "b": (jnp.arange(3),)}
    out = jax.jit(non_differentiable)(tree)
    np.testing.assert_array_equal(out["a"], x)
    np.testing.assert_array_equal(jax.vmap(non_differentiable)(x), x)
    with pytest.raises(NotImplementedError, match="non-differentiable"):
        jax.grad(lambda v: jnp.sum(non_differentiable(v) ** 2))(x)
    with pytest.raises(NotImplementedError):
        jax.jvp(non_differentiable, (x,), (jnp.ones(2),))
    # Marked values that do not depend on the differentiated input are fine.
    g = jax.grad(lambda v, c: jnp.sum(v * non_differentiable(c)))(x, jnp.array([3.0, 4.0]))
    np.testing.assert_array_equal(g, [3.0, 4.0])


# --- sequential_vmap_with_vjp -------------------------------------------------------------


@jax.custom_batching.custom_vmap
def _unbatchable_sin(x):
    return jnp.sin(x)


@_unbatchable_sin.def_vmap
def _refuse_batching(axis_size, in_batched, x):
    raise RuntimeError("this operation has no batching rule")


@jax.custom_jvp
def _sin(x):
    return _unbatchable_sin(x)


@_sin.defjvp
def _sin_jvp(primals, tangents):
    (x,), (dx,) = primals, tangents
    return _unbatchable_sin(x), jnp.cos(x) * dx


def _energy(x, w):
    return jnp.sum(_sin(x) * w)


def test_sequential_vmap_with_vjp_batches_what_vmap_cannot():
    xs = jnp.arange(6.0).reshape(2, 3) / 3
    w = jnp.array([1.0, 2.0, 3.0])
    with pytest.raises(RuntimeError, match="no batching rule"):
        jax.vmap(_energy, (0, None))(xs, w)
    f = sequential_vmap_with_vjp(_energy)
    np.testing.assert_allclose(f(xs[0], w), np.sum(np.sin(xs[0]) * w), rtol=1e-6)
    want = np.sum(np.sin(np.asarray(xs)) * np.asarray(w), axis=1)
    np.testing.assert_allclose(jax.vmap(f, (0, None))(xs, w), want, rtol=1e-6)
    # Nested batching under jit loops too.
    nested = jax.jit(jax.vmap(jax.vmap(f, (0, None)), (0, None)))(jnp.stack([xs, 2 * xs]), w)
    np.testing.assert_allclose(nested[1], np.sum(np.sin(2 * np.asarray(xs)) * w, 1), rtol=1e-5)
    assert "scan" in str(jax.make_jaxpr(jax.vmap(f, (0, None)))(xs, w))


def test_sequential_vmap_with_vjp_gradients_match_analytic():
    xs = jnp.arange(6.0).reshape(2, 3) / 3
    w = jnp.array([1.0, 2.0, 3.0])
    f = sequential_vmap_with_vjp(_energy)
    gx, gw = jax.vmap(jax.grad(f, argnums=(0, 1)), (0, None))(xs, w)
    np.testing.assert_allclose(gx, np.cos(np.asarray(xs)) * np.asarray(w), rtol=1e-6)
    np.testing.assert_allclose(gw, np.sin(np.asarray(xs)), rtol=1e-6)
    total = lambda xs, w: jax.vmap(f, (0, None))(xs, w).sum()
    gx, gw = jax.grad(total, argnums=(0, 1))(xs, w)
    np.testing.assert_allclose(gx, np.cos(np.asarray(xs)) * np.asarray(w), rtol=1e-6)
    np.testing.assert_allclose(gw, np.sin(np.asarray(xs)).sum(0), rtol=1e-6)
    check_grads(lambda xs: jax.vmap(f, (0, None))(xs, w), (xs,), order=1, modes=["rev"])
