"""Kernel-layer semantics that used to be silently wrong: each test failed before its fix.

Backend selection following a call through every transformation, re-registration,
static-param and name checks, platform checks at registration, the general batching rule,
``outs`` checks (integer shapes, the ``jax`` reference's ``eval_shape``) and the lowering
error's hint. References are plain ``jax.numpy``.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import primforge
from primforge import KernelError, XLACustomKernel
from primforge.kernel.batching import general_batching_rule, native_batching_rule

_ids = itertools.count()


def fresh(prefix="sem"):
    return XLACustomKernel(f"test_{prefix}_{next(_ids)}")


def f32(*shape):
    return jax.ShapeDtypeStruct(shape, jnp.float32)


def two_backends(jvp="rule"):
    """A linear kernel: 'jax' computes 2x, 'alt' 3x, so the backend used shows in values."""
    k = fresh("two")
    k.def_kernel("jax", "cpu", lambda **kw: lambda x: 2 * x)
    k.def_kernel("alt", "cpu", lambda **kw: lambda x: 3 * x)
    if jvp == "rule":
        # The JVP reuses the kernel for the primal and the tangent (it is linear).
        k.def_jvp_rule(lambda p, t, *, outs, **kw: (k(p[0], outs=outs, **kw),
                                                    k(t[0], outs=outs, **kw)))
    else:
        # Per-input rules: the primal is bound by primforge.defjvp (kernel.primitive.bind).
        k.def_jvp_rule2(lambda t, x, *, outs, **kw: [k(t, outs=outs[0], **kw)])
    k.def_transpose_rule(lambda cts, x, *, outs, **kw: [k(cts[0], outs=outs[0], **kw)])
    return k


# ------------------------------------------------------------ selection follows the call
@pytest.mark.parametrize("jvp", ["rule", "per_input"])
def test_use_backend_inside_a_jitted_function_survives_jvp(jvp):
    k = two_backends(jvp)
    x = jnp.arange(3.0)

    def f(x):
        with primforge.use_backend("cpu", "alt"):
            return k(x, outs=f32(3))

    # jit traces f (inside the block); the JVP of that jaxpr runs after the block exited.
    y, t = jax.jvp(jax.jit(f), (x,), (jnp.ones(3),))
    np.testing.assert_allclose(y, 3 * x)
    np.testing.assert_allclose(t, 3 * jnp.ones(3))
    y, t = jax.jvp(f, (x,), (jnp.ones(3),))
    np.testing.assert_allclose(y, 3 * x)
    np.testing.assert_allclose(t, 3 * jnp.ones(3))


@pytest.mark.parametrize("jvp", ["rule", "per_input"])
def test_use_backend_survives_grad_and_a_later_transpose(jvp):
    k = two_backends(jvp)
    x = jnp.arange(3.0)
    f = lambda x: k(x, outs=f32(3)).sum()
    with primforge.use_backend("cpu", "alt"):
        _, vjp = jax.vjp(f, x)
    # The backward pass runs outside the block: it must still use 'alt' (d(3x)/dx = 3).
    np.testing.assert_allclose(vjp(1.0)[0], jnp.full(3, 3.0))
    np.testing.assert_allclose(jax.jit(jax.grad(jax.jit(
        lambda x: primforge_alt(k, x))))(x), jnp.full(3, 3.0))


def test_a_later_use_backend_does_not_change_an_earlier_calls_backward_pass():
    k = two_backends()
    x = jnp.arange(3.0)
    _, vjp = jax.vjp(lambda x: k(x, outs=f32(3)).sum(), x)  # forward pass on 'jax' (2x)
    with primforge.use_backend("cpu", "alt"):
        np.testing.assert_allclose(vjp(1.0)[0], jnp.full(3, 2.0))


def primforge_alt(k, x):
    with primforge.use_backend("cpu", "alt"):
        return k(x, outs=f32(3)).sum()


def test_use_backend_survives_custom_batching_and_nested_jit():
    k = fresh("custom_batch")
    k.def_kernel("jax", "cpu", lambda **kw: lambda x: 2 * x)
    k.def_kernel("alt", "cpu", lambda **kw: lambda x: 3 * x)

    @k.def_batching_rule
    def rule(args, axes, *, outs, **params):
        x = jnp.moveaxis(args[0], axes[0], 0)
        return [k(x, outs=jax.ShapeDtypeStruct(x.shape, outs[0].dtype), **params)], [0]

    def f(x):
        with primforge.use_backend("cpu", "alt"):
            return jax.jit(lambda y: k(y, outs=f32(2)))(x)

    xs = jnp.arange(6.0).reshape(3, 2)
    np.testing.assert_allclose(jax.vmap(jax.jit(f))(xs), 3 * xs)
    np.testing.assert_allclose(jax.jit(jax.vmap(f))(xs), 3 * xs)


def test_kernel_specific_override_follows_into_rules_of_other_kernels():
    # A rule of kernel a calls kernel b: b's override, active at the call, must hold there.
    b = fresh("inner")
    b.def_kernel("jax", "cpu", lambda **kw: lambda x: 2 * x)
    b.def_kernel("alt", "cpu", lambda **kw: lambda x: 3 * x)
    a = fresh("outer")
    a.def_kernel("jax", "cpu", lambda **kw: lambda x: x)
    a.def_jvp_rule(lambda p, t, *, outs, **kw: (a(p[0], outs=outs, **kw),
                                                b(t[0], outs=outs)))

    def f(x):
        with primforge.use_backend("cpu", "alt", kernel=b):
            return a(x, outs=f32(2))

    _, t = jax.jvp(jax.jit(f), (jnp.ones(2),), (jnp.ones(2),))
    np.testing.assert_allclose(t, jnp.full(2, 3.0))


# ------------------------------------------------------------ re-registration
def test_reregistering_a_generator_serves_the_new_one_eager_and_jitted():
    k = fresh("rereg")
    k.def_kernel("jax", "cpu", lambda **kw: lambda x: 2 * x)
    x = jnp.arange(3.0)
    g = jax.jit(lambda x: k(x, outs=f32(3)))
    np.testing.assert_allclose(k(x, outs=f32(3)), 2 * x)
    np.testing.assert_allclose(g(x), 2 * x)
    k.def_kernel("jax", "cpu", lambda **kw: lambda x: 5 * x)
    np.testing.assert_allclose(k(x, outs=f32(3)), 5 * x)
    np.testing.assert_allclose(g(x), 5 * x)
    # The same through the def_*_kernel shorthands (here the Numba one).
    numba = pytest.importorskip("numba")

    def gen(c):
        def g(**kw):
            @numba.njit
            def kern(x, out):
                for i in range(x.size):
                    out[i] = c * x[i]
            return kern
        return g

    n = fresh("rereg_numba")
    n.def_numba_kernel(gen(2.0))
    h = jax.jit(lambda x: n(x, outs=f32(3)))
    np.testing.assert_allclose(h(x), 2 * x)
    n.def_numba_kernel(gen(7.0))
    np.testing.assert_allclose(h(x), 7 * x)
    np.testing.assert_allclose(n(x, outs=f32(3)), 7 * x)


def test_replacing_rules_reaches_already_jitted_functions():
    k = fresh("rules")
    k.def_kernel("jax", "cpu", lambda **kw: lambda x: 2 * x)
    k.def_jvp_rule(lambda p, t, *, outs, **kw: (k(p[0], outs=outs, **kw), [2 * t[0]]))
    x = jnp.arange(3.0)
    g = jax.jit(jax.grad(lambda x: k(x, outs=f32(3)).sum()))
    np.testing.assert_allclose(g(x), jnp.full(3, 2.0))
    k.def_jvp_rule(lambda p, t, *, outs, **kw: (k(p[0], outs=outs, **kw), [4 * t[0]]))
    np.testing.assert_allclose(g(x), jnp.full(3, 4.0))

    k.def_transpose_rule(lambda cts, x, *, outs, **kw: [2 * cts[0]])
    lt = jax.jit(lambda c: jax.linear_transpose(lambda x: k(x, outs=f32(3)), x)(c))
    np.testing.assert_allclose(lt(jnp.ones(3))[0], jnp.full(3, 2.0))
    k.def_transpose_rule(lambda cts, x, *, outs, **kw: [6 * cts[0]])
    np.testing.assert_allclose(lt(jnp.ones(3))[0], jnp.full(3, 6.0))

    v = jax.jit(jax.vmap(lambda x: k(x, outs=f32(3))))
    np.testing.assert_allclose(v(jnp.ones((2, 3))), jnp.full((2, 3), 2.0))
    k.def_batching_rule(lambda args, axes, **kw: ([jnp.moveaxis(args[0], axes[0], 0) * 9], [0]))
    np.testing.assert_allclose(v(jnp.ones((2, 3))), jnp.full((2, 3), 9.0))


# ------------------------------------------------------------ static params
def test_misspelled_static_param_is_an_error_naming_the_accepted_ones():
    k = fresh("params")
    k.def_kernel("jax", "cpu", lambda factor=1.0, **kw: lambda x: factor * x)
    x = jnp.ones(2)
    with pytest.raises(TypeError, match=r"unknown static param\(s\) \['factr'\].*\['factor'\]"):
        k(x, outs=f32(2), factr=10.0)
    np.testing.assert_allclose(k(x, outs=f32(2), factor=10.0), 10 * x)
    # A generator with named parameters and no **kwargs (the usual Numba generator form).
    n = fresh("params_named")
    n.def_kernel("jax", "cpu", lambda ins, outs, factor=1.0: lambda x: factor * x)
    with pytest.raises(TypeError, match="factr"):
        n(x, outs=f32(2), factr=10.0)


def test_params_named_by_rules_are_declared_too():
    # A param only the shape rule reads is not a typo, even when a generator names others.
    k = fresh("params_rules")
    k.def_kernel("jax", "cpu", lambda factor=1.0, **kw: lambda x: factor * x[:2])

    @k.def_abstract_eval
    def _(x, *, n_out, **kw):
        return jax.ShapeDtypeStruct((n_out,), x.dtype)

    np.testing.assert_allclose(k(jnp.ones(3), factor=2.0, n_out=2), [2.0, 2.0])
    with pytest.raises(TypeError, match=r"\['factr'\].*\['factor', 'n_out'\]"):
        k(jnp.ones(3), factr=2.0, n_out=2)


def test_params_pass_when_generators_take_kwargs_and_name_none():
    k = fresh("params_open")
    k.def_kernel("jax", "cpu", lambda **kw: lambda x: kw["factor"] * x)
    np.testing.assert_allclose(k(jnp.ones(2), outs=f32(2), factor=3.0), jnp.full(2, 3.0))


# ------------------------------------------------------------ use_backend names
def test_use_backend_rejects_unknown_backend_and_kernel_names():
    k = fresh("names")
    k.def_kernel("jax", "cpu", lambda **kw: lambda x: x)
    with pytest.raises(ValueError, match=r"unknown backend 'nmuba'.*'numba'"):
        primforge.use_backend("cpu", "nmuba").__enter__()
    with pytest.raises(ValueError, match=r"no kernel named 'no_such_kernel_xyz'"):
        primforge.use_backend("cpu", "jax", kernel="no_such_kernel_xyz").__enter__()
    with pytest.raises(ValueError, match=r"has no backend 'alt'"):
        k.use_backend("cpu", "alt").__enter__()


def test_use_backend_for_a_backend_a_kernel_lacks_keeps_its_choice():
    k = fresh("lacks")
    k.def_kernel("jax", "cpu", lambda **kw: lambda x: x + 1)
    with primforge.use_backend("cpu", "numba"):  # a known backend k does not have
        np.testing.assert_allclose(k(jnp.zeros(1), outs=f32(1)), [1.0])


# ------------------------------------------------------------ platforms at registration
def test_a_backend_is_registered_only_on_its_platforms():
    k = fresh("plat")
    with pytest.raises(ValueError, match=r"'triton' backend serves \['gpu'\], not 'cpu'"):
        k.def_kernel("triton", "cpu", lambda **kw: None)
    with pytest.raises(ValueError, match=r"'numba' backend serves \['cpu'\], not 'gpu'"):
        k.def_kernel("numba", "gpu", lambda **kw: None)
    with pytest.raises(ValueError, match=r"'warp' backend serves .* not 'tpu'"):
        k.def_warp_kernel(lambda **kw: None, platform="tpu")
    assert k.available_backends("cpu") == [] and k.available_backends("gpu") == []
    # Pallas serves the CPU (interpret mode); user-named backends go anywhere.
    k.def_pallas_kernel("cpu", lambda **kw: None)
    k.def_kernel("mine", "tpu", lambda **kw: lambda x: x)
    assert k.available_backends("cpu") == ["pallas"] and k.available_backends("tpu") == ["mine"]


def test_an_unknown_platform_error_names_backend_platform_and_what_the_backend_serves():
    k = fresh("plat_unknown")
    gen = lambda **kw: None
    cases = [
        (lambda: k.def_kernel("numba", "fpga", gen), "'numba'", "['cpu']"),
        (lambda: k.def_pallas_kernel("fpga", gen), "'pallas'", "['cpu', 'gpu', 'tpu']"),
        (lambda: k.def_warp_kernel(gen, platform="fpga"), "'warp'", "['cpu', 'gpu']"),
        (lambda: k.def_cuda_raw_kernel(gen, platform="fpga"), "'cuda_raw'", "['cpu', 'gpu']"),
        # A user-named backend may go on every platform primforge knows, and only there.
        (lambda: k.def_kernel("mine", "fpga", gen), "'mine'", "['cpu', 'gpu', 'tpu']"),
    ]
    for register, backend, served in cases:
        with pytest.raises(ValueError) as info:
            register()
        message = str(info.value)
        assert backend in message and "'fpga'" in message and served in message, message
    # JAX's platform names map to primforge's, and the message says which was given.
    with pytest.raises(ValueError, match=r"'numba' backend serves \['cpu'\], not 'cuda \(gpu\)'"):
        k.def_kernel("numba", "cuda", gen)
    assert k._entries == {}
    k.def_kernel("triton", "cuda", gen)  # 'cuda' is the GPU, which Triton serves
    assert k.available_backends("gpu") == ["triton"]


# ------------------------------------------------------------ general batching rule
def _single_result_primitive():
    from jax.extend.core import Primitive
    from jax.interpreters import batching, mlir

    p = Primitive(f"test_single_{next(_ids)}")
    p.def_impl(lambda x, y: x * 2 + y)
    p.def_abstract_eval(lambda x, y: x)
    mlir.register_lowering(p, mlir.lower_fun(lambda x, y: x * 2 + y, multiple_results=False))
    batching.primitive_batchers[p] = lambda a, ax, **kw: general_batching_rule(p, a, ax, **kw)
    return p


def test_general_batching_rule_on_a_single_result_primitive():
    p = _single_result_primitive()
    xs = jnp.arange(6.0).reshape(3, 2)
    y = jnp.array([10.0, 20.0])
    np.testing.assert_allclose(jax.vmap(p.bind, in_axes=(0, None))(xs, y), xs * 2 + y)
    np.testing.assert_allclose(jax.vmap(p.bind, in_axes=(1, None), out_axes=1)(xs.T, y),
                               (xs * 2 + y).T)
    # Zero-size batch.
    assert jax.vmap(p.bind, in_axes=(0, None))(jnp.ones((0, 2)), y).shape == (0, 2)


def test_batching_rules_with_no_mapped_argument_just_bind():
    p = _single_result_primitive()
    out, axes = general_batching_rule(p, [jnp.ones(2), jnp.ones(2)], [None, None])
    np.testing.assert_allclose(out, jnp.full(2, 3.0))
    assert axes is None
    k = fresh("nomap")
    k.def_kernel("jax", "cpu", lambda **kw: lambda x: x + 1)
    out, axes = native_batching_rule(k.primitive, [jnp.ones(2)], [None], outs=(f32(2),),
                                     backend=None, context=(), debug=False)
    np.testing.assert_allclose(out[0], jnp.full(2, 2.0))
    assert axes == [None]


# ------------------------------------------------------------ outs checks
def test_outs_shapes_must_be_integers():
    k = fresh("intshape")
    k.def_kernel("plain", "cpu", lambda **kw: lambda x: x)
    for bad in [(1.5,), (2.0,), (np.float32(2),)]:
        with pytest.raises(TypeError, match="non-integer shape"):
            k(jnp.ones(2), outs=_Struct(bad, jnp.float32))
    np.testing.assert_allclose(k(jnp.ones(2), outs=_Struct((np.int64(2),), jnp.float32)),
                               jnp.ones(2))


class _Struct:
    """A duck-typed struct (jax.ShapeDtypeStruct itself refuses float dimensions)."""

    def __init__(self, shape, dtype):
        self.shape, self.dtype = shape, dtype


@pytest.mark.parametrize("mode", ["eager", "jit", "vmap", "grad", "debug"])
def test_outs_are_checked_against_the_jax_reference(mode):
    k = fresh("refcheck")
    k.def_kernel("plain", "cpu", lambda **kw: lambda x: (x[:2], x.astype(jnp.int32)))
    k.def_kernel("jax", "cpu", lambda **kw: lambda x: (x[:2], x.astype(jnp.int32)))
    k.def_jvp_rule(lambda p, t, *, outs, **kw: (k(p[0], outs=outs, **kw),
                                                [t[0][:2], jnp.zeros(3, jax.dtypes.float0)]))
    good = [f32(2), jax.ShapeDtypeStruct((3,), jnp.int32)]
    bad_shape = [f32(3), jax.ShapeDtypeStruct((3,), jnp.int32)]
    bad_dtype = [f32(2), jax.ShapeDtypeStruct((3,), jnp.float32)]
    x = jnp.arange(3.0)

    def run(outs):
        f = lambda x: k(x, outs=outs)[0].sum()
        if mode == "eager":
            return f(x)
        if mode == "jit":
            return jax.jit(f)(x)
        if mode == "vmap":
            return jax.vmap(f)(jnp.ones((2, 3)))
        if mode == "grad":
            return jax.grad(f)(x)
        with primforge.debug_mode():
            return f(x)

    run(good)
    with pytest.raises(ValueError, match=r"outs\[0\] is float32\[3\] .* returns float32\[2\]"):
        run(bad_shape)
    with pytest.raises(ValueError, match=r"outs\[1\] is float32\[3\] .* returns int32\[3\]"):
        run(bad_dtype)
    with pytest.raises(ValueError, match=r"describes 1 output\(s\) but .* returns 2"):
        run([f32(2)])


# ------------------------------------------------------------ lowering error hint
def test_lowering_error_hint_never_suggests_the_backend_that_failed():
    k = fresh("hint")
    k.def_kernel("bad", "cpu", lambda **kw: lambda x: x.no_such_attribute)
    k.def_kernel("jax", "cpu", lambda **kw: lambda x: x)
    with pytest.raises(KernelError) as info:
        k(jnp.ones(2), outs=f32(2))
    msg = str(info.value)
    assert "with backend 'bad'" in msg
    assert "backend='jax'" in msg and "backend='bad'" not in msg


@pytest.mark.parametrize("mode", ["native", "general"])
def test_zero_size_batches_and_core_dims_under_vmap(mode):
    numba = pytest.importorskip("numba")
    k = fresh("zero")

    def gen(**kw):
        @numba.njit
        def kernel(x, out):
            for i in range(x.size):
                out.flat[i] = 2 * x.flat[i]
        return kernel

    k.def_numba_kernel(gen)
    k.def_kernel("jax", "cpu", lambda **kw: lambda x: 2 * x)
    if mode == "general":
        k.register_general_batching()
    for backend in ("numba", "jax"):
        for xs, core in [(jnp.ones((0, 3)), (3,)), (jnp.ones((4, 0)), (0,)),
                         (jnp.ones((0, 0)), (0,)), (jnp.arange(6.0).reshape(2, 3), (3,))]:
            f = lambda x, core=core, backend=backend: k(x, outs=f32(*core), backend=backend)
            np.testing.assert_allclose(jax.vmap(f)(xs), 2 * xs)
            np.testing.assert_allclose(jax.vmap(jax.vmap(f))(xs[None]), 2 * xs[None])
