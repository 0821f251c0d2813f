"""A primitive defined rule by rule (the seven steps of docs/primitives.md).

``build(n)`` makes a fresh ``multiply_add`` primitive with the first ``n`` steps done. For
each step we check that without it the transformation that needs it fails with an error
naming the rule, the primitive and the call that adds it, and that with it the result
matches jax.numpy.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.interpreters import ad, mlir

from primforge.primitive import ETPPrimitive, MissingRuleError


def build(steps: int) -> ETPPrimitive:
    # Step 1: the primitive object.
    p = ETPPrimitive("multiply_add")

    def multiply_add(x, y, z):
        return p.bind(x, y, z)

    if steps >= 2:  # Step 2: eager evaluation, here in plain NumPy.

        @p.def_impl
        def impl(x, y, z):
            return np.add(np.multiply(x, y), z)

    if steps >= 3:  # Step 3: abstract evaluation (shapes and dtypes only).

        @p.def_abstract_eval
        def abstract_eval(xs, ys, zs):
            if not xs.shape == ys.shape == zs.shape:
                raise TypeError(f"multiply_add: shapes differ: {xs.shape}, {ys.shape}, {zs.shape}")
            return xs.update(weak_type=xs.weak_type and ys.weak_type and zs.weak_type)

    if steps >= 4:  # Step 4: lowering to MLIR, for every platform, from jax.numpy code.
        p.def_lowering(mlir.lower_fun(lambda x, y, z: x * y + z, multiple_results=False))

    if steps >= 5:  # Step 5: JVP. The tangent uses the primitive itself, linearly.

        @p.def_jvp
        def jvp(primals, tangents):
            x, y, z = primals
            xt, yt, zt = (ad.instantiate_zeros(t) for t in tangents)
            return multiply_add(x, y, z), multiply_add(xt, y, multiply_add(x, yt, zt))

    if steps >= 6:  # Step 6: transpose, for the linear uses made by the JVP.

        @p.def_transpose
        def transpose(ct, x, y, z):
            if type(ct) is ad.Zero:
                return [
                    None if not ad.is_undefined_primal(a) else ad.Zero(a.aval) for a in (x, y, z)
                ]
            ct_z = ct if ad.is_undefined_primal(z) else None
            if ad.is_undefined_primal(x) and not ad.is_undefined_primal(y):
                return [multiply_add(ct, y, jnp.zeros_like(ct)), None, ct_z]
            if ad.is_undefined_primal(y) and not ad.is_undefined_primal(x):
                return [None, multiply_add(x, ct, jnp.zeros_like(ct)), ct_z]
            if not ad.is_undefined_primal(x) and not ad.is_undefined_primal(y):
                return [None, None, ct_z]
            raise ValueError("multiply_add is not linear in x and y together")

    if steps >= 7:  # Step 7: batching: move batch axes to the front, broadcast the others.

        @p.def_batching
        def batch(args, dims):
            size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
            moved = [
                jnp.broadcast_to(a, (size, *a.shape)) if d is None else jnp.moveaxis(a, d, 0)
                for a, d in zip(args, dims)
            ]
            return multiply_add(*moved), 0

    p.user_fn = multiply_add
    return p


def square_add_ref(a, b):
    return a * a + b


X = jnp.array([1.0, 2.0, -3.0])
Y = jnp.array([0.5, 4.0, 2.0])


def test_step1_without_impl():
    p = build(1)
    with pytest.raises(MissingRuleError) as err:
        p.user_fn(2.0, 2.0, 10.0)
    msg = str(err.value)
    assert "'multiply_add'" in msg and "evaluation (impl) rule" in msg
    assert "multiply_add_p.def_impl(impl)" in msg


def test_step2_impl():
    p = build(2)
    np.testing.assert_allclose(p.user_fn(X, X, Y), square_add_ref(X, Y))
    with pytest.raises(MissingRuleError, match=r"(?s)abstract evaluation rule.*def_abstract_eval"):
        jax.jit(p.user_fn)(X, X, Y)


def test_step3_abstract_eval():
    p = build(3)
    jaxpr = jax.make_jaxpr(lambda a, b: p.user_fn(a, a, b))(X, Y)
    assert [e.primitive.name for e in jaxpr.jaxpr.eqns] == ["multiply_add"]
    assert jax.eval_shape(p.user_fn, X, X, Y).shape == (3,)
    with pytest.raises(TypeError, match="shapes differ"):
        jax.eval_shape(p.user_fn, X, X, jnp.ones(2))
    with pytest.raises(MissingRuleError, match=r"(?s)lowering rule for platform cpu.*def_lowering"):
        jax.jit(p.user_fn)(X, X, Y)


def test_step4_lowering():
    p = build(4)
    np.testing.assert_allclose(jax.jit(lambda a, b: p.user_fn(a, a, b))(X, Y), square_add_ref(X, Y))
    with pytest.raises(MissingRuleError, match=r"(?s)'multiply_add' has no JVP rule.*def_jvp"):
        jax.jvp(p.user_fn, (X, X, Y), (Y, Y, Y))


def test_step5_jvp():
    p = build(5)
    out, t = jax.jvp(lambda a, b: p.user_fn(a, a, b), (X, Y), (Y, X))
    ref_out, ref_t = jax.jvp(square_add_ref, (X, Y), (Y, X))
    np.testing.assert_allclose(out, ref_out)
    np.testing.assert_allclose(t, ref_t)
    with pytest.raises(MissingRuleError, match=r"(?s)no transpose rule.*def_transpose"):
        jax.grad(lambda a: jnp.sum(p.user_fn(a, a, Y)))(X)


def test_step6_transpose():
    p = build(6)

    def loss(fn):
        return lambda a, b: jnp.sum(jnp.sin(fn(a, b)))

    got = jax.grad(loss(lambda a, b: p.user_fn(a, a, b)), argnums=(0, 1))(X, Y)
    want = jax.grad(loss(square_add_ref), argnums=(0, 1))(X, Y)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6)
    np.testing.assert_allclose(jax.jit(jax.grad(lambda a: jnp.sum(p.user_fn(a, a, Y))))(X), 2 * X)
    with pytest.raises(MissingRuleError, match=r"(?s)no batching rule.*def_batching"):
        jax.vmap(p.user_fn)(jnp.ones((2, 3)), jnp.ones((2, 3)), jnp.ones((2, 3)))


def test_step7_batching():
    p = build(7)
    xs = jnp.stack([X, 2 * X])
    ys = jnp.stack([Y, -Y], axis=1)
    got = jax.vmap(p.user_fn, in_axes=(0, None, 1))(xs, Y, ys)
    want = np.stack([np.asarray(xs[i] * Y + ys[:, i]) for i in range(2)])
    np.testing.assert_allclose(got, want)
    g = jax.jit(jax.vmap(jax.grad(lambda a, b: jnp.sum(p.user_fn(a, a, b)))))(xs, ys.T)
    np.testing.assert_allclose(g, 2 * xs)


def test_unmapped_args_need_no_batching_rule():
    p = build(4)
    f = jax.vmap(lambda unused: p.user_fn(X, X, Y))
    np.testing.assert_allclose(f(jnp.ones(2)), np.stack([square_add_ref(X, Y)] * 2))
