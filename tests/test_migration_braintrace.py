"""Code written for braintrace's register_primitive runs on primforge with only its import changed.

The example (tests/migration/braintrace_example.py) is checked against jax.numpy and
finite differences; a primitive with several results answers ``jax.vjp`` and
``jax.linear_transpose`` with the tuple cotangents Python code gives.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.test_util import check_grads
from migration._load import load

import primforge

bt = load("braintrace_example")

RNG = np.random.default_rng(1)
X = jnp.asarray(RNG.normal(size=(3,)), jnp.float32)
W = jnp.asarray(RNG.normal(size=(3, 4)), jnp.float32)
B = jnp.asarray(RNG.normal(size=(4,)), jnp.float32)


def _dense_ref(x, w, b, scale=1.0):
    y = scale * (x @ w) + b
    return y, jnp.tanh(y)


def test_single_result_primitive_as_documented():
    y = bt.mm_p.bind(jnp.ones((2, 3)), jnp.ones((3, 4)))
    assert y.shape == (2, 4)
    np.testing.assert_allclose(bt.mm_p.bind(X[None], W), np.asarray(X)[None] @ np.asarray(W),
                               rtol=1e-5)
    check_grads(lambda x, w: bt.mm_p.bind(x, w), (X[None], W), order=2, modes=("fwd", "rev"))
    assert primforge.is_etp_primitive(bt.mm_p) and primforge.is_batched(bt.mm_p)
    dw = primforge.get_etp_rule(bt.mm_p, "xy_to_dw")(X, jnp.ones(4), W)
    np.testing.assert_allclose(dw, np.outer(np.asarray(X), np.ones(4)))


def test_several_results_come_back_as_a_tuple():
    out = bt.dense(X, W, B, scale=0.5)
    assert isinstance(out, tuple) and len(out) == 2
    for got, want in zip(out, _dense_ref(X, W, B, 0.5)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert isinstance(jax.jit(lambda x: bt.dense_p.bind(x, W, B, scale=2.0))(X), tuple)


def test_vjp_takes_a_tuple_cotangent():
    ct = (jnp.asarray(RNG.normal(size=4), jnp.float32),
          jnp.asarray(RNG.normal(size=4), jnp.float32))
    f = lambda x, w, b: bt.dense_p.bind(x, w, b, scale=0.7)
    _, vjp = jax.vjp(f, X, W, B)
    got = vjp(ct)
    _, vjp_ref = jax.vjp(lambda x, w, b: _dense_ref(x, w, b, 0.7), X, W, B)
    for g, r in zip(got, vjp_ref(ct)):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-5)
    check_grads(f, (X, W, B), order=2, modes=("fwd", "rev"), atol=1e-2, rtol=1e-2)


def test_linear_transpose_takes_a_tuple_cotangent():
    lin = primforge.register_primitive(
        "migrated_two_linear", lambda x, *, a: (a * x, x[::-1]), multiple_results=True)
    x = jnp.arange(4.0)
    t = jax.linear_transpose(lambda x: lin.bind(x, a=3.0), x)
    (got,) = t((jnp.ones(4), jnp.arange(4.0)))
    np.testing.assert_allclose(got, 3 * np.ones(4) + np.arange(4.0)[::-1])


def test_vmap_and_jvp_of_several_results_match_jax_numpy():
    xs = jnp.asarray(RNG.normal(size=(5, 3)), jnp.float32)
    got = jax.vmap(lambda x: bt.dense(x, W, B))(xs)
    want = jax.vmap(lambda x: _dense_ref(x, W, B))(xs)
    assert isinstance(got, tuple)
    for g, r in zip(got, want):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)
    tx = jnp.ones_like(X)
    (_, t_got) = jax.jvp(lambda x: bt.dense(x, W, B), (X,), (tx,))
    (_, t_want) = jax.jvp(lambda x: _dense_ref(x, W, B), (X,), (tx,))
    for g, r in zip(t_got, t_want):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)


def test_metadata_reaches_the_registries():
    assert primforge.get_trainable_invars_fn(bt.dense_p)({}) == {"weight": 1, "bias": 2}
    assert primforge.get_x_invar_index(bt.dense_p) == 0
    assert primforge.get_y_outvar_index(bt.dense_p) == 0


def test_single_output_per_input_jvp_rule_may_return_a_bare_tangent():
    p = primforge.register_primitive("migrated_one_of_many", lambda x: (jnp.sin(x),),
                                     multiple_results=True)
    primforge.defjvp(p, lambda t, x: jnp.cos(x) * t)
    x = jnp.linspace(-1.0, 1.0, 5)
    (y,), (ty,) = jax.jvp(p.bind, (x,), (jnp.ones(5),))
    np.testing.assert_allclose(y, np.sin(np.asarray(x)), rtol=1e-6)
    np.testing.assert_allclose(ty, np.cos(np.asarray(x)), rtol=1e-6)


def test_a_wrong_tangent_count_names_the_rule():
    import pytest

    p = primforge.register_primitive("migrated_two_of_many", lambda x: (x, 2 * x),
                                     multiple_results=True)

    def my_rule(t, x):
        return t

    primforge.defjvp(p, my_rule)
    with pytest.raises(TypeError, match=r"JVP rule 0 \(.*my_rule\).*2 outputs.*sequence of 2"):
        jax.jvp(p.bind, (jnp.ones(2),), (jnp.ones(2),))
