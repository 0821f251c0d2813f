"""register_primitive, static params, defjvp, rule slots and metadata of ETPPrimitive."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.core import Primitive
from jax.interpreters import ad, mlir
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from primforge.primitive import (
    ETP_RULE_TABLES,
    ETPPrimitive,
    FrozenDict,
    HashableCallable,
    defjvp,
    etp_primitives,
    get_etp_rule,
    get_trainable_invars_fn,
    get_x_invar_index,
    get_y_outvar_index,
    is_batched,
    is_etp_primitive,
    is_gradient_enabled,
    per_input_jvp,
    register_primitive,
    static_param,
)

# -- spec 001's documented example, in our words ----------------------------------------


def test_register_primitive_matmul_example():
    demo_p = register_primitive("test_etp_demo_mm", lambda x, w: x @ w, batched=True)
    y = demo_p.bind(jnp.ones((2, 3)), jnp.ones((3, 4)))
    assert y.shape == (2, 4)
    np.testing.assert_allclose(y, np.full((2, 4), 3.0))
    assert is_batched(demo_p) and demo_p.batched


# -- static params ---------------------------------------------------------------------


def test_impl_sees_hashable_params():
    seen = {}

    def impl(x, *, shape, opts, fn):
        seen.update(shape=shape, opts=opts, fn=fn)
        return fn(x.reshape(shape)) * opts["k"]

    p = register_primitive("test_param_kinds", impl)
    out = p.bind(jnp.arange(6.0), shape=[2, 3], opts={"k": 2.0}, fn=lambda v: v + 1)
    np.testing.assert_allclose(out, (np.arange(6.0).reshape(2, 3) + 1) * 2)
    assert seen["shape"] == (2, 3) and isinstance(seen["shape"], tuple)
    assert isinstance(seen["opts"], FrozenDict) and seen["opts"] == FrozenDict(k=2.0)
    assert isinstance(seen["fn"], HashableCallable)
    # the params recorded in the jaxpr are the hashable ones
    eqn = jax.make_jaxpr(lambda x: p.bind(x, shape=[2, 3], opts={"k": 1.0}, fn=jnp.sin))(
        jnp.arange(6.0)
    ).jaxpr.eqns[0]
    assert eqn.params["shape"] == (2, 3)
    hash(tuple(eqn.params.items()))


@pytest.mark.parametrize(
    "bad",
    [np.ones(3), jnp.ones(3), np.array(1.0), [1, np.ones(2)]],
    ids=["numpy", "jax", "numpy0d", "nested"],
)
def test_array_param_is_rejected(bad):
    p = register_primitive("test_array_param", lambda x, *, w: x)
    with pytest.raises(TypeError,
                       match=r"static param 'w.*is an array.*an operand of a primitive's `bind`"):
        p.bind(jnp.ones(3), w=bad)


def test_traced_array_param_is_rejected_at_trace_time():
    p = register_primitive("test_traced_param", lambda x, *, w: x)
    with pytest.raises(TypeError, match="test_traced_param.*'w'.*array"):
        jax.jit(lambda x: p.bind(x, w=x))(jnp.ones(3))


def test_unhashable_object_param_is_rejected():
    class Unhashable:
        __hash__ = None

    p = register_primitive("test_unhashable_param", lambda x, *, cfg: x)
    with pytest.raises(TypeError, match="'cfg' of type Unhashable is not hashable"):
        p.bind(jnp.ones(3), cfg=Unhashable())


def test_numpy_scalar_and_dtype_params_pass():
    p = register_primitive("test_scalar_param", lambda x, *, s, dt: (x * s).astype(dt))
    out = p.bind(jnp.ones(2), s=np.float32(3.0), dt=jnp.int32)
    assert out.dtype == jnp.int32
    np.testing.assert_array_equal(out, [3, 3])


def test_hashable_callable_keys():
    def make(k):
        return lambda v: v * k

    assert static_param(make(2.0)) == static_param(make(2.0))
    assert hash(static_param(make(2.0))) == hash(static_param(make(2.0)))
    assert static_param(make(2.0)) != static_param(make(3.0))
    assert static_param(make(1)) != static_param(make(1.0))  # types are part of the key
    assert static_param(lambda v: v) != static_param(lambda v: -v)
    # unhashable closure contents fall back to identity, never to a false match
    a = np.ones(2)
    assert static_param(make(a)) == static_param(make(a))
    assert static_param(make(a)) != static_param(make(np.ones(2)))

    def with_default(v, k=[1, 2]):  # noqa: B006
        return v

    assert static_param(with_default) == static_param(with_default)


def test_recursive_closure_is_hashable():
    def outer():
        def rec(n):
            return 0 if n == 0 else rec(n - 1)

        return rec

    assert static_param(outer()) == static_param(outer())


def test_recreated_lambda_does_not_retrace():
    count = [0]

    def impl(x, *, fn):
        count[0] += 1  # runs only while JAX traces the impl
        return fn(x)

    p = register_primitive("test_no_retrace", impl)
    x = jnp.arange(3.0)

    def double():  # each call re-creates an identical lambda (same code object)
        return lambda v: v * 2.0

    for _ in range(3):  # eager: the impl's jit is cached on the params
        np.testing.assert_allclose(p.bind(x, fn=double()), x * 2.0)
    assert count[0] == 1
    # Under jit, the first outer trace traces the impl for abstract evaluation and for
    # lowering; later outer jits with a re-created lambda (new jit objects, so the outer
    # function is traced again) reuse those traces.
    jax.jit(lambda x: p.bind(x, fn=double()))(x)
    after_first_jit = count[0]
    for _ in range(3):
        np.testing.assert_allclose(jax.jit(lambda x: p.bind(x, fn=double()))(x), x * 2)
    assert count[0] == after_first_jit
    # a different computation is a different key
    np.testing.assert_allclose(p.bind(x, fn=lambda v: v * 3.0), x * 3.0)
    assert count[0] == after_first_jit + 1

    def scaled(k):
        return lambda v: v * k

    p.bind(x, fn=scaled(5.0))
    p.bind(x, fn=scaled(5.0))
    assert count[0] == after_first_jit + 2
    np.testing.assert_allclose(p.bind(x, fn=scaled(6.0)), x * 6.0)
    assert count[0] == after_first_jit + 3


# -- registration errors ---------------------------------------------------------------


def test_non_callable_impl():
    with pytest.raises(TypeError, match=r"register_primitive\('bad'\): impl_fn must be a callable"):
        register_primitive("bad", 3)


def test_wrong_operand_count():
    p = register_primitive("test_two_operands", lambda x, y: x + y)
    assert p.num_inputs == 2
    with pytest.raises(TypeError, match="takes 2 positional operand.*got 3"):
        p.bind(1.0, 2.0, 3.0)


def test_multiple_results_mismatch():
    p = register_primitive("test_should_be_multi", lambda x: (x, x))
    with pytest.raises(TypeError, match="multiple_results=True"):
        p.bind(jnp.ones(2))
    q = register_primitive("test_should_be_single", lambda x: x, multiple_results=True)
    with pytest.raises(TypeError, match="must return a tuple or list"):
        q.bind(jnp.ones(2))


def test_arity_unknown_for_varargs():
    p = register_primitive("test_varargs", lambda *xs: sum(xs))
    assert p.num_inputs is None
    np.testing.assert_allclose(p.bind(1.0, 2.0, 3.0), 6.0)


# -- abstract evaluation ---------------------------------------------------------------


def test_abstract_eval_shapes_and_dtypes():
    p = register_primitive(
        "test_abstract", lambda x, i: (x.sum(0), i.astype(jnp.bool_)), multiple_results=True
    )
    out = jax.eval_shape(
        p.bind, jax.ShapeDtypeStruct((4, 3), jnp.float32), jax.ShapeDtypeStruct((2,), jnp.int32)
    )
    assert [(o.shape, o.dtype) for o in out] == [((3,), jnp.float32), ((2,), jnp.bool_)]


def test_inside_shard_map_forward_and_grad():
    # The abstract eval keeps shard_map's varying-axes types, so grad through a JVP that
    # binds the primitive again (via defjvp) works inside shard_map.
    p = register_primitive("test_sharded_scale", lambda x, w: x * w)
    defjvp(p, lambda t, x, w: p.bind(t, w), lambda t, x, w: p.bind(x, t))
    mesh = jax.make_mesh((1,), ("i",))

    def local_loss(x, w):
        return jax.lax.psum(jnp.sum(p.bind(x, w) ** 2), "i")

    f = jax.shard_map(
        jax.grad(local_loss, argnums=(0, 1)),
        mesh=mesh,
        in_specs=(P("i"), P("i")),
        out_specs=(P("i"), P("i")),
    )
    x = jax.device_put(jnp.arange(4.0), NamedSharding(mesh, P("i")))
    w = jax.device_put(jnp.full(4, 2.0), NamedSharding(mesh, P("i")))
    gx, gw = jax.jit(f)(x, w)
    np.testing.assert_allclose(gx, 2 * np.arange(4.0) * 4.0)
    np.testing.assert_allclose(gw, 2 * np.arange(4.0) ** 2 * 2.0)


# -- defjvp ----------------------------------------------------------------------------


def test_defjvp_spec_example():
    # spec 000: one rule per input of a two-input primitive
    my_prim = register_primitive("test_defjvp_example", lambda x, y: x * y)

    def jvp_rule_input0(tangent, x, y, **kw):
        return tangent * y

    def jvp_rule_input1(tangent, x, y, **kw):
        return tangent * x

    defjvp(my_prim, jvp_rule_input0, jvp_rule_input1)
    x, y = jnp.array([1.0, 2.0]), jnp.array([3.0, 5.0])
    tx, ty = jnp.array([1.0, 0.5]), jnp.array([2.0, -1.0])
    out, t = jax.jvp(my_prim.bind, (x, y), (tx, ty))
    np.testing.assert_allclose(out, x * y)
    np.testing.assert_allclose(t, tx * y + x * ty)
    np.testing.assert_allclose(jax.grad(lambda x: jnp.sum(my_prim.bind(x, y)))(x), y)


def test_defjvp_rules_receive_params_and_none_means_zero():
    p = register_primitive("test_defjvp_params", lambda x, y, *, k: k * x + jnp.sin(y))
    defjvp(p, lambda t, x, y, *, k: k * t, None)
    x, y = jnp.float32(1.0), jnp.float32(2.0)
    _, t = jax.jvp(lambda x, y: p.bind(x, y, k=3.0), (x, y), (jnp.float32(1.0), jnp.float32(7.0)))
    np.testing.assert_allclose(t, 3.0)  # y's contribution is declared zero


def test_defjvp_skips_rules_of_symbolic_zero_tangents():
    p = register_primitive("test_defjvp_zero_skip", lambda x, y: x * y)

    def never(t, x, y):
        raise AssertionError("rule of an input with a symbolic-zero tangent was called")

    defjvp(p, lambda t, x, y: t * y, never)
    y = jnp.float32(4.0)
    np.testing.assert_allclose(jax.grad(lambda x: p.bind(x, y))(jnp.float32(2.0)), 4.0)


def test_defjvp_multiple_results():
    p = register_primitive(
        "test_defjvp_multi", lambda x, y: (x * y, x + y, x > y), multiple_results=True
    )
    defjvp(p, lambda t, x, y: (t * y, t, None), lambda t, x, y: [t * x, t, None])
    x, y = jnp.array([1.0, 4.0]), jnp.array([3.0, 2.0])
    tx, ty = jnp.array([1.0, 2.0]), jnp.array([0.5, 1.0])
    _outs, tans = jax.jvp(p.bind, (x, y), (tx, ty))
    np.testing.assert_allclose(tans[0], tx * y + x * ty)
    np.testing.assert_allclose(tans[1], tx + ty)
    assert tans[2].dtype == jax.dtypes.float0
    g = jax.grad(lambda x: jnp.sum(p.bind(x, y)[0] + p.bind(x, y)[1] ** 2))(x)
    np.testing.assert_allclose(g, y + 2 * (x + y))


def test_defjvp_on_hand_built_primitive():
    p = Primitive("test_defjvp_plain")
    p.def_impl(lambda x: jnp.exp(x))
    p.def_abstract_eval(lambda a: a.update())
    mlir.register_lowering(p, mlir.lower_fun(jnp.exp, multiple_results=False))
    defjvp(p, lambda t, x: t * p.bind(x))
    np.testing.assert_allclose(jax.jit(jax.grad(p.bind))(1.0), np.exp(1.0), rtol=1e-6)


def test_defjvp_arity_checked_at_definition():
    p = register_primitive("test_defjvp_arity", lambda x, y: x + y)
    with pytest.raises(ValueError, match="'test_defjvp_arity' takes 2 input.*3 JVP rule"):
        defjvp(p, None, None, None)


def test_defjvp_arity_checked_at_first_jvp_when_unknown():
    p = Primitive("test_defjvp_late")
    p.def_impl(lambda x, y: x + y)
    defjvp(p, lambda t, x, y: t)
    with pytest.raises(ValueError, match="'test_defjvp_late' was bound with 2 input.*1 per-input"):
        jax.jvp(p.bind, (1.0, 2.0), (1.0, 1.0))


def test_defjvp_rejects_non_primitive_and_bad_rules():
    with pytest.raises(TypeError, match="defjvp: primitive must be a jax.extend.core.Primitive"):
        defjvp("not a primitive", None)
    p = register_primitive("test_defjvp_bad_rule", lambda x: x)
    with pytest.raises(TypeError, match="JVP rule 0 .* must be callable or None"):
        defjvp(p, 3)


def test_defjvp_multiple_results_rule_must_return_sequence():
    p = register_primitive("test_defjvp_bad_multi", lambda x: (x, x), multiple_results=True)
    defjvp(p, lambda t, x: t)
    with pytest.raises(TypeError, match="must return a sequence of 2 tangents"):
        jax.jvp(p.bind, (1.0,), (1.0,))


def test_defjvp_unwraps_kernel_and_uses_install_hook():
    p = register_primitive("test_defjvp_kernel", lambda x: 2 * x)

    class FakeKernel:
        primitive = p
        installed = None

        def _install_jvp(self, jvp_fn):
            FakeKernel.installed = jvp_fn
            ad.primitive_jvps[p] = jvp_fn

    defjvp(FakeKernel(), lambda t, x: 10 * t)  # deliberately not 2*t: shows the rule is used
    assert FakeKernel.installed is not None and FakeKernel.installed.rules[0] is not None
    np.testing.assert_allclose(jax.jvp(p.bind, (1.0,), (1.0,))[1], 10.0)

    class KernelWithoutHook:
        primitive = p

    defjvp(KernelWithoutHook(), lambda t, x: 3 * t)
    np.testing.assert_allclose(jax.jvp(p.bind, (1.0,), (1.0,))[1], 3.0)


def test_per_input_jvp_builder_directly():
    p = register_primitive("test_per_input_builder", lambda x, y: x * y)
    jvp = per_input_jvp(p, [lambda t, x, y: t * y, lambda t, x, y: t * x])
    out, t = jvp(
        (jnp.float32(2.0), jnp.float32(3.0)),
        (jnp.float32(1.0), ad.Zero(jax.typeof(jnp.float32(0.0)))),
    )
    np.testing.assert_allclose(out, 6.0)
    np.testing.assert_allclose(t, 3.0)
    _, t0 = jvp((jnp.float32(2.0), jnp.float32(3.0)), (ad.Zero(jax.typeof(jnp.float32(0.0))),) * 2)
    assert type(t0) is ad.Zero


# -- rule slots and metadata -----------------------------------------------------------


def test_rule_slots_and_metadata():
    def tif(params):
        return {"weight": 1, "bias": 2}

    p = register_primitive(
        "test_etp_linear",
        lambda x, w, b: x @ w + b,
        batched=True,
        gradient_enabled=True,
        trainable_invars_fn=tif,
        x_invar_index=0,
        y_outvar_index=0,
    )
    assert is_etp_primitive(p) and p in etp_primitives()
    assert p.batched and p.gradient_enabled and is_gradient_enabled(p)
    assert p.trainable_invars_fn is tif and get_trainable_invars_fn(p) is tif
    assert get_x_invar_index(p) == 0 and get_y_outvar_index(p) == 0

    def yw(h, trace):
        return trace

    def xy(x, h, w):
        return x * h

    p.register_yw_to_w(yw)
    p.register_etp_rules(xy_to_dw=xy, init_pp=lambda *a: 0)
    assert get_etp_rule(p, "yw_to_w") is yw and get_etp_rule(p, "xy_to_dw") is xy
    assert get_etp_rule(p, "init_drtrl") is None and get_etp_rule(p, "init_pp") is not None
    assert p in ETP_RULE_TABLES["xy_to_dw"] and p not in ETP_RULE_TABLES["init_drtrl"]
    p.register_init_drtrl(lambda *a: 1)
    assert get_etp_rule(p, "init_drtrl")() == 1
    with pytest.raises(ValueError, match="kind must be one of"):
        get_etp_rule(p, "nope")
    with pytest.raises(TypeError, match="yw_to_w rule must be callable"):
        p.register_yw_to_w(5)


def test_queries_on_other_primitives():
    assert not is_etp_primitive(jax.lax.sin_p) and not is_batched(jax.lax.sin_p)
    assert (
        get_x_invar_index(jax.lax.sin_p) is None and get_etp_rule(jax.lax.sin_p, "yw_to_w") is None
    )
    q = ETPPrimitive("test_no_x", x_invar_index=None, y_outvar_index=1)
    assert get_x_invar_index(q) is None and get_y_outvar_index(q) == 1
    assert not q.batched and not q.gradient_enabled and q.trainable_invars_fn is None


def test_lowers_for_every_platform():
    # The derived lowering is platform independent: it lowers for CUDA and TPU on a CPU
    # machine too (nothing runs there).
    p = register_primitive(
        "test_lower_all", lambda x, y: (jnp.sin(x) @ y, x.sum()), multiple_results=True
    )
    traced = jax.jit(lambda x, y: p.bind(x, y)).trace(jnp.ones((2, 3)), jnp.ones((3, 2)))
    for platforms in [("cuda",), ("tpu",), ("cpu", "cuda")]:
        text = traced.lower(lowering_platforms=platforms).as_text()
        assert "sine" in text and "dot_general" in text
