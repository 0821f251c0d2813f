"""XLACustomKernel with pure-JAX generators: registration, selection, shapes, batching, AD."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import primforge
from primforge import KernelError, XLACustomKernel

_ids = itertools.count()


def fresh(prefix="k"):
    return XLACustomKernel(f"test_{prefix}_{next(_ids)}")


def f32(*shape):
    return jax.ShapeDtypeStruct(shape, jnp.float32)


# ---------------------------------------------------------------- registration / defaults
def test_first_kernel_per_platform_is_default_and_asdefault_overrides():
    k = fresh()
    k.def_kernel("jax", "cpu", lambda **kw: lambda x: x)
    k.def_kernel("b", "cpu", lambda **kw: lambda x: x)
    k.def_kernel("g", "gpu", lambda **kw: lambda x: x)
    assert k.defaults == {"cpu": "jax", "gpu": "g"}
    k.def_kernel("c", "cpu", lambda **kw: lambda x: x, asdefault=True)
    assert k.get_default("cpu") == "c"
    assert k.available_backends("cpu") == ["jax", "b", "c"]
    assert k.available_backends("tpu") == []
    d = k.defaults
    d["cpu"] = "zzz"
    assert k.get_default("cpu") == "c"  # a copy


def test_set_default_errors_name_what_exists():
    k = fresh()
    with pytest.raises(ValueError, match="no kernels registered for platform 'gpu'"):
        k.set_default("gpu", "jax")
    k.def_kernel("jax", "cpu", lambda **kw: lambda x: x)
    with pytest.raises(ValueError, match=r"no 'numba' backend on 'cpu'; available: \['jax'\]"):
        k.set_default("cpu", "numba")


def test_def_kernel_rejects_bad_arguments():
    k = fresh()
    with pytest.raises(TypeError, match="'kg'"):
        k.def_kernel("jax", "cpu", 3)
    with pytest.raises(TypeError, match="'backend'"):
        k.def_kernel(1, "cpu", lambda **kw: None)
    with pytest.raises(ValueError, match="unknown platform"):
        k.def_kernel("jax", "moon", lambda **kw: None)


def test_duplicate_name_warns_and_replaces_silently_with_replace():
    from primforge.registry import KernelReplacedWarning

    k = fresh()
    k.def_kernel("jax", "cpu", lambda **kw: lambda x: x + 1)
    with pytest.warns(KernelReplacedWarning, match=repr(k.name)):
        k1 = XLACustomKernel(k.name)
    assert primforge.get_kernel(k.name) is k1
    k2 = XLACustomKernel(k.name, replace=True)
    assert primforge.get_kernel(k.name) is k2
    # The replaced object keeps working.
    np.testing.assert_allclose(k(jnp.arange(3.0), outs=f32(3)), np.arange(3.0) + 1)


# ---------------------------------------------------------------- outs handling
def test_outs_structure_is_mirrored():
    k = fresh()
    k.def_kernel("jax", "cpu", lambda **kw: lambda x: (x + 1, x * 2))
    x = jnp.arange(3.0)
    a, b = k(x, outs=(f32(3), f32(3)))
    lst = k(x, outs=[f32(3), f32(3)])
    assert isinstance(lst, list)
    np.testing.assert_allclose(a, np.arange(3.0) + 1)
    np.testing.assert_allclose(b, np.arange(3.0) * 2)
    single = fresh()
    single.def_kernel("jax", "cpu", lambda **kw: lambda x: x + 1)
    assert isinstance(single(x, outs=f32(3)), jax.Array)


def test_wrong_outs_are_clear_errors_at_trace_time():
    k = fresh()
    k.def_kernel("jax", "cpu", lambda **kw: lambda x: x + 1)
    x = jnp.arange(3.0)
    # A shape where outs is expected: the error says what to write instead.
    for shape in [(3,), x.shape, [3, 2], (np.int64(3),)]:
        with pytest.raises(TypeError, match=r"is a shape.*jax\.ShapeDtypeStruct\(\(3,?"):
            k(x, outs=shape)
    with pytest.raises(TypeError, match=r"outs\[0\] must be a jax.ShapeDtypeStruct.*got int: 3; "
                       r"describe each output .* outs=jax.ShapeDtypeStruct\(x.shape, x.dtype\)"):
        k(x, outs=(3, "float32"))
    with pytest.raises(TypeError, match=r"^outs must be a jax.ShapeDtypeStruct.*got int"):
        k(x, outs=3)
    with pytest.raises(TypeError, match="needs outs="):
        k(x)
    with pytest.raises(ValueError, match="at least one output"):
        k(x, outs=[])
    # With a 'jax' reference, outs is checked against its jax.eval_shape when traced.
    with pytest.raises(ValueError, match=r"outs\[0\] is float32\[4\] .* reference .* float32\[3\]"):
        jax.jit(lambda x: k(x, outs=f32(4))).trace(x)
    # Without one, the kernel producing (3,) for outs (4,) is caught when lowering.
    k2 = fresh()
    k2.def_kernel("plain", "cpu", lambda **kw: lambda x: x + 1)
    with pytest.raises(KernelError,
                       match=r"returned outputs .*\(3,\).* but outs declares .*\(4,\)"):
        jax.jit(lambda x: k2(x, outs=f32(4))).trace(x).lower()


def test_shape_rule_infers_and_checks_outs():
    k = fresh()
    k.def_kernel("jax", "cpu", lambda **kw: lambda a, b: a @ b)

    @k.def_abstract_eval
    def _(a, b, **kw):
        if a.shape[1] != b.shape[0]:
            raise ValueError(f"inner dimensions differ: {a.shape} vs {b.shape}")
        return jax.ShapeDtypeStruct((a.shape[0], b.shape[1]), a.dtype)

    a, b = jnp.ones((2, 3)), jnp.ones((3, 5))
    np.testing.assert_allclose(k(a, b), np.ones((2, 3)) @ np.ones((3, 5)))
    with pytest.raises(ValueError, match="inner dimensions differ"):
        jax.jit(lambda a: k(a, jnp.ones((4, 5)))).trace(a)
    with pytest.raises(ValueError, match="do not match what its shape rule infers"):
        k(a, b, outs=f32(2, 4))


# ---------------------------------------------------------------- params
def test_static_params_reach_the_generator_and_unhashable_ones_are_frozen_or_rejected():
    seen = []

    def gen(scale, offsets, **kw):
        seen.append((scale, offsets))
        return lambda x: x * scale + jnp.asarray(offsets, jnp.float32)

    k = fresh()
    k.def_kernel("jax", "cpu", gen)
    x = jnp.arange(2.0)
    y = k(x, outs=f32(2), scale=3.0, offsets=[1.0, 2.0])  # list frozen to a tuple
    np.testing.assert_allclose(y, np.arange(2.0) * 3 + np.array([1.0, 2.0]))
    assert seen[-1] == (3.0, (1.0, 2.0))
    with pytest.raises(TypeError, match="param 'offsets' is an array"):
        k(x, outs=f32(2), scale=3.0, offsets=np.ones(2))
    with pytest.raises(TypeError, match="reserved param"):
        k(x, outs=f32(2), batch=3)


def test_generator_sees_ins_and_outs():
    got = {}

    def gen(ins, outs):
        got["ins"], got["outs"] = ins, outs
        return lambda x: x

    k = fresh()
    k.def_kernel("jax", "cpu", gen)
    k(jnp.ones((2, 3), jnp.int32), outs=jax.ShapeDtypeStruct((2, 3), jnp.int32))
    assert got["ins"] == (jax.ShapeDtypeStruct((2, 3), jnp.int32),)
    assert got["outs"] == (jax.ShapeDtypeStruct((2, 3), jnp.int32),)


# ---------------------------------------------------------------- selection
def _two_backend_kernel():
    k = fresh("sel")
    k.def_kernel("jax", "cpu", lambda **kw: lambda x: x + 1)
    k.def_kernel("alt", "cpu", lambda **kw: lambda x: x + 100)
    return k


def test_backend_per_call_per_context_and_default():
    k = _two_backend_kernel()
    x = jnp.zeros(1)
    assert k(x, outs=f32(1))[0] == 1
    assert k(x, outs=f32(1), backend="alt")[0] == 100
    with primforge.use_backend("cpu", "alt"):
        assert k(x, outs=f32(1))[0] == 100
        assert k(x, outs=f32(1), backend="jax")[0] == 1  # per call beats context
    with k.use_backend("cpu", "alt"):
        assert k(x, outs=f32(1))[0] == 100
    other = _two_backend_kernel()
    with primforge.use_backend("cpu", "alt", kernel=other.name):
        assert k(x, outs=f32(1))[0] == 1
    with pytest.raises(ValueError, match="has no backend 'nope'"):
        k(x, outs=f32(1), backend="nope")


def test_set_default_and_context_take_effect_on_an_already_jitted_function():
    k = _two_backend_kernel()
    f = jax.jit(lambda x: k(x, outs=f32(1)))
    x = jnp.zeros(1)
    assert f(x)[0] == 1
    k.set_default("cpu", "alt")
    assert f(x)[0] == 100
    with primforge.use_backend("cpu", "jax"):
        assert f(x)[0] == 1
    assert f(x)[0] == 100


def test_context_inside_a_jitted_function_is_captured_at_trace_time():
    k = _two_backend_kernel()

    @jax.jit
    def f(x):
        with primforge.use_backend("cpu", "alt"):
            a = k(x, outs=f32(1))
        return a, k(x, outs=f32(1))

    a, b = f(jnp.zeros(1))
    assert (a[0], b[0]) == (100, 1)


def test_build_failure_names_primitive_backend_cause_and_alternatives():
    k = fresh("broken")

    def broken(**kw):
        raise RuntimeError("generator exploded")

    k.def_kernel("bad", "cpu", broken)
    k.def_kernel("jax", "cpu", lambda **kw: lambda x: x)
    with pytest.raises(KernelError) as info:
        k(jnp.ones(2), outs=f32(2))
    msg = str(info.value)
    for part in (k.name, "'bad'", "generator exploded", "backend='jax'", "use_backend",
                 "set_default"):
        assert part in msg
    np.testing.assert_allclose(k(jnp.ones(2), outs=f32(2), backend="jax"), np.ones(2))


def test_missing_platform_is_a_clear_error():
    k = fresh()
    k.def_kernel("jax", "gpu", lambda **kw: lambda x: x)
    with pytest.raises(KernelError, match="no kernel for platform 'cpu'"):
        k(jnp.ones(2), outs=f32(2))


# ---------------------------------------------------------------- batching
def _mul_kernel(mode="native"):
    k = fresh("mul")
    k.def_kernel("jax", "cpu", lambda **kw: lambda x, y: (x * y, x + y))
    if mode == "general":
        k.register_general_batching()
    return k


def _call_mul(k, x, y):
    return k(x, y, outs=[f32(*x.shape[-1:]), f32(*x.shape[-1:])])


def _ref(x, y):
    return [x * y, x + y]


@pytest.mark.parametrize("mode", ["native", "general"])
@pytest.mark.parametrize("in_axes", [(0, 0), (1, None), (None, 0), (-1, 1)])
def test_vmap_matches_jax_numpy(mode, in_axes):
    k = _mul_kernel(mode)
    rng = np.random.default_rng(0)
    shape_x = (4, 3) if in_axes[0] in (0, None) else (3, 4)
    shape_y = (4, 3) if in_axes[1] in (0, None) else (3, 4)
    x = jnp.asarray(rng.normal(size=shape_x if in_axes[0] is not None else (3,)), jnp.float32)
    y = jnp.asarray(rng.normal(size=shape_y if in_axes[1] is not None else (3,)), jnp.float32)
    got = jax.vmap(lambda a, b: _call_mul(k, a, b), in_axes=in_axes)(x, y)
    want = jax.vmap(_ref, in_axes=in_axes)(x, y)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6)


def test_native_vmap_is_one_call_and_general_is_a_scan():
    x = jnp.ones((8, 3))
    native = jax.make_jaxpr(jax.vmap(lambda a: _call_mul(_mul_kernel(), a, a)))(x)
    assert "scan" not in str(native) and len(native.eqns) == 1
    general = jax.make_jaxpr(jax.vmap(lambda a: _call_mul(_mul_kernel("general"), a, a)))(x)
    assert "scan" in str(general)


def test_nested_vmap_with_mixed_mapping():
    k = _mul_kernel()
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.normal(size=(5, 3)), jnp.float32)  # mapped by the inner vmap
    y = jnp.asarray(rng.normal(size=(2, 3)), jnp.float32)  # mapped by the outer vmap
    f = lambda a, b: _call_mul(k, a, b)
    got = jax.vmap(jax.vmap(f, in_axes=(0, None)), in_axes=(None, 0))(x, y)
    want = jax.vmap(jax.vmap(_ref, in_axes=(0, None)), in_axes=(None, 0))(x, y)
    for g, w in zip(got, want):
        assert g.shape == (2, 5, 3)
        np.testing.assert_allclose(g, w, rtol=1e-6)


def test_generator_that_declares_batch_shape_handles_the_batch_itself():
    shapes = []

    def gen(batch_shape, ins, **kw):
        shapes.append((batch_shape, ins[0].shape))
        return lambda x, y: x @ y.T if False else x * y

    k = fresh("bs")
    k.def_kernel("jax", "cpu", gen)
    x, y = jnp.ones((6, 3)), jnp.arange(3.0)
    got = jax.vmap(lambda a: k(a, y, outs=f32(3)))(x)
    np.testing.assert_allclose(got, np.ones((6, 3)) * np.arange(3.0))
    assert ((6,), (6, 3)) in shapes


def test_custom_batching_rule_is_used():
    k = fresh("custom")
    k.def_kernel("jax", "cpu", lambda **kw: lambda x: x * 2)
    calls = []

    def rule(args, axes, *, outs, **params):
        calls.append(axes)
        (x,), (ax,) = args, axes
        x = jnp.moveaxis(x, ax, 0)
        return [k(x, outs=jax.ShapeDtypeStruct(x.shape, outs[0].dtype), **params)], [0]

    k.def_batching_rule(rule)
    got = jax.vmap(lambda x: k(x, outs=f32(2)), in_axes=1)(jnp.ones((2, 5)))
    np.testing.assert_allclose(got, 2 * np.ones((5, 2)))
    assert calls == [(1,)]


# ---------------------------------------------------------------- autodiff
def _linear_kernel():
    """y = A @ x with a JVP through the kernel and a transpose rule using A.T."""
    k = fresh("lin")
    k.def_kernel("jax", "cpu",
                 lambda transpose=False, **kw: (lambda a, x: (a.T if transpose else a) @ x))

    def jvp(primals, tangents, *, outs, transpose=False, **kw):
        a, x = primals
        ta, tx = tangents
        out = k(a, x, outs=outs, transpose=transpose, **kw)
        t = jnp.zeros(outs[0].shape, outs[0].dtype)
        if type(tx) is not jax.interpreters.ad.Zero:
            t = t + k(a, tx, outs=outs, transpose=transpose, **kw)[0]
        if type(ta) is not jax.interpreters.ad.Zero:
            t = t + ((ta.T if transpose else ta) @ x)
        return out, [t]

    def transpose(cts, a, x, *, outs, transpose=False, **kw):
        (ct,) = cts
        assert not jax.interpreters.ad.is_undefined_primal(a)
        n = a.shape[0] if transpose else a.shape[1]
        return [None, k(a, ct, outs=[f32(n)], transpose=not transpose, **kw)[0]]

    k.def_jvp_rule(jvp)
    k.def_transpose_rule(transpose)
    return k


def _matvec(k, a, x):
    return k(a, x, outs=[f32(a.shape[0])])[0]


def test_grad_jvp_vjp_linear_transpose_against_jax_numpy():
    k = _linear_kernel()
    rng = np.random.default_rng(2)
    a = jnp.asarray(rng.normal(size=(4, 3)), jnp.float32)
    x = jnp.asarray(rng.normal(size=(3,)), jnp.float32)
    loss = lambda a, x: jnp.sum(jnp.sin(_matvec(k, a, x)))
    ref = lambda a, x: jnp.sum(jnp.sin(a @ x))
    for g, w in zip(jax.grad(loss, (0, 1))(a, x), jax.grad(ref, (0, 1))(a, x)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    ct = jnp.arange(4.0)
    (lt,) = jax.linear_transpose(lambda x: _matvec(k, a, x), x)(ct)
    np.testing.assert_allclose(lt, a.T @ ct, rtol=1e-5)
    check_grads(lambda x: _matvec(k, a, x), (x,), order=1, modes=("fwd", "rev"), eps=1e-2,
                rtol=2e-2)


def test_autodiff_composes_with_native_batching():
    k = _linear_kernel()
    rng = np.random.default_rng(3)
    a = jnp.asarray(rng.normal(size=(4, 3)), jnp.float32)
    xs = jnp.asarray(rng.normal(size=(5, 3)), jnp.float32)
    loss = lambda x: jnp.sum(jnp.tanh(_matvec(k, a, x)))
    ref = lambda x: jnp.sum(jnp.tanh(a @ x))
    # vmap of grad: the JVP/transpose run per example.
    np.testing.assert_allclose(jax.vmap(jax.grad(loss))(xs), jax.vmap(jax.grad(ref))(xs),
                               rtol=1e-5, atol=1e-6)
    # grad of vmap: the transpose rule meets a natively batched bind.
    bl = lambda xs: jnp.sum(jax.vmap(lambda x: jnp.tanh(_matvec(k, a, x)))(xs))
    br = lambda xs: jnp.sum(jax.vmap(lambda x: jnp.tanh(a @ x))(xs))
    np.testing.assert_allclose(jax.grad(bl)(xs), jax.grad(br)(xs), rtol=1e-5, atol=1e-6)
    # jvp of vmap, and a gradient w.r.t. an unbatched operand of a batched call.
    tx = jnp.ones_like(xs)
    got = jax.jvp(jax.vmap(lambda x: _matvec(k, a, x)), (xs,), (tx,))
    want = jax.jvp(jax.vmap(lambda x: a @ x), (xs,), (tx,))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    ga = jax.grad(lambda a: jnp.sum(jax.vmap(lambda x: _matvec(k, a, x))(xs) ** 2))(a)
    gr = jax.grad(lambda a: jnp.sum(jax.vmap(lambda x: a @ x)(xs) ** 2))(a)
    np.testing.assert_allclose(ga, gr, rtol=1e-5, atol=1e-5)


def test_per_input_jvp_rules_and_grad_of_grad():
    k = fresh("jvp2")
    k.def_kernel("jax", "cpu", lambda **kw: lambda x, y: x * y)
    k.def_jvp_rule2(lambda t, x, y, **kw: [t * y], lambda t, x, y, **kw: [x * t])
    f = lambda x, y: k(x, y, outs=f32())
    assert float(jax.grad(f)(2.0, 5.0)) == 5.0
    assert float(jax.grad(f, 1)(2.0, 5.0)) == 2.0
    check_grads(f, (2.0, 5.0), order=2, modes=("fwd", "rev"), eps=1e-2, rtol=1e-2)


def test_missing_rules_say_how_to_add_them():
    k = fresh("norules")
    k.def_kernel("jax", "cpu", lambda **kw: lambda x: x * 2)
    f = lambda x: k(x, outs=f32())
    with pytest.raises(NotImplementedError, match="def_jvp_rule"):
        jax.grad(f)(1.0)
    # A JVP that reuses the kernel on the tangent: reverse mode now needs its transpose.
    k.def_jvp_rule(lambda p, t, *, outs, **kw: (k(*p, outs=outs, **kw), k(t[0], outs=outs, **kw)))
    with pytest.raises(NotImplementedError, match="def_transpose_rule"):
        jax.grad(f)(1.0)
    np.testing.assert_allclose(jax.jvp(f, (1.0,), (1.0,))[1], 2.0)


# ---------------------------------------------------------------- misc
def test_eager_and_jit_agree_and_eager_reuses_the_compiled_call():
    k = fresh("eager")
    traces = []

    def gen(**kw):
        traces.append(1)
        return lambda x: x - 1

    k.def_kernel("jax", "cpu", gen)
    x = jnp.arange(4.0)
    a = k(x, outs=f32(4))
    b = k(x, outs=f32(4))
    c = jax.jit(lambda x: k(x, outs=f32(4)))(x)
    np.testing.assert_allclose(a, x - 1)
    np.testing.assert_allclose(b, c)
    assert len(traces) == 1  # the generator runs once per signature


def test_repr_and_registry_listing():
    k = fresh("reg")
    k.def_kernel("jax", "cpu", lambda **kw: lambda x: x)
    k.def_tags("unit", "demo")
    assert "jax" in repr(k)
    assert k in primforge.list_kernels(["unit", "demo"])
    assert k in primforge.list_kernels(["unit", "nothing"], match="any")
    assert k not in primforge.list_kernels(["unit", "nothing"], match="all")


# ---------------------------------------------------------------- params user rules see
def test_every_user_rule_sees_its_params_outs_and_backend_and_rebinds_with_them():
    seen = []
    k = fresh("rule_params")
    k.def_kernel("jax", "cpu", lambda scale=1.0, **kw: lambda x: scale * x)

    def jvp(primals, tangents, **params):
        seen.append(("jvp", tuple(sorted(params))))
        return k.primitive.bind(*primals, **params), k.primitive.bind(*tangents, **params)

    def transpose(cts, x, **params):
        seen.append(("transpose", tuple(sorted(params))))
        return [k.primitive.bind(cts[0], **params)[0]]

    k.def_jvp_rule(jvp)
    k.def_transpose_rule(transpose)
    x = jnp.arange(6.0, dtype=jnp.float32).reshape(2, 3)
    per_row = jax.vmap(lambda r: k(r, outs=f32(3), scale=2.0))  # a natively batched bind
    grad = jax.jit(jax.grad(lambda x: jnp.sum(per_row(x) * x)))(x)
    np.testing.assert_allclose(grad, 4.0 * np.asarray(x))  # d/dx sum(2 x * x) = 4 x
    # Batched or not, JVP or transpose: the call's params, outs and backend, nothing else.
    assert {kind for kind, _ in seen} == {"jvp", "transpose"}
    assert {names for _, names in seen} == {("backend", "outs", "scale")}

    k2 = fresh("rule_params_batching")
    k2.def_kernel("jax", "cpu", lambda scale=1.0, **kw: lambda x: scale * x)

    def batching(args, axes, **params):
        seen.append(("batching", tuple(sorted(params))))
        (a,), (ax,) = args, axes
        big = jax.ShapeDtypeStruct(jnp.moveaxis(a, ax, 0).shape, jnp.float32)
        return [k2.primitive.bind(jnp.moveaxis(a, ax, 0), **{**params, "outs": (big,)})[0]], [0]

    k2.def_batching_rule(batching)
    out = jax.vmap(lambda r: k2(r, outs=f32(3), scale=3.0), in_axes=1)(x.T)
    np.testing.assert_allclose(out, 3.0 * np.asarray(x))
    assert seen[-1] == ("batching", ("backend", "outs", "scale"))
