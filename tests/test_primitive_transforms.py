"""Every JAX transformation of primitives built by register_primitive, against jax.numpy.

Each case pairs a primitive with a reference written separately in plain jax.numpy; the
reference never goes through primforge. Batched results are compared with a Python loop
over the batch, gradients also with jax.test_util.check_grads.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from primforge.primitive import register_primitive

RTOL = 2e-5
ATOL = 2e-5


def _tup(out):
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def assert_tree_close(actual, expected, rtol=RTOL, atol=ATOL):
    a_leaves, a_tree = jax.tree.flatten(actual)
    e_leaves, e_tree = jax.tree.flatten(expected)
    assert len(a_leaves) == len(e_leaves), (a_tree, e_tree)
    for a, e in zip(a_leaves, e_leaves):
        assert np.shape(a) == np.shape(e)
        if getattr(e, "dtype", None) == jax.dtypes.float0:
            assert a.dtype == jax.dtypes.float0
            continue
        np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=rtol, atol=atol)


# -- the primitives under test ---------------------------------------------------------


def _elementwise_impl(x, y):
    return x * jnp.sin(y) + x**2


elementwise_p = register_primitive("test_elementwise", _elementwise_impl)


def _matmul_impl(x, w):
    return jnp.matmul(x, w)


matmul_p = register_primitive("test_matmul", _matmul_impl, batched=True)


def _two_out_impl(x, y):
    return jnp.sin(x) * y, x + y**2


two_out_p = register_primitive("test_two_out", _two_out_impl, multiple_results=True)


def _gather_scale_impl(x, idx):
    return jnp.take(x, idx, axis=0) * 3.0


gather_p = register_primitive("test_gather_scale", _gather_scale_impl)


def _static_impl(x, *, scale, axes, act):
    # The lists passed to bind arrive here as tuples; the lambda is wrapped but callable.
    assert isinstance(axes, tuple) and isinstance(scale, tuple)
    return act(jnp.sum(x * jnp.asarray(scale), axis=axes))


static_p = register_primitive("test_static_params", _static_impl)


@dataclasses.dataclass
class Case:
    name: str
    prim_fn: Callable  # arrays -> output(s), through the primitive
    ref_fn: Callable  # arrays -> output(s), plain jax.numpy
    args: tuple
    diff: tuple  # positions of the float (differentiable) args
    linear: tuple = ()  # positions in which the op is linear (for linear_transpose)
    vary: Callable = lambda i, a, b: a * (1.0 + 0.25 * b) + 0.1 * b  # batch element b of arg i


_rng = np.random.default_rng(0)


def _f32(*shape):
    return jnp.asarray(_rng.normal(size=shape), dtype=jnp.float32)


def _vary_int(i, a, b):
    if a.dtype == jnp.int32:
        return (a + b) % 4
    return a * (1.0 + 0.25 * b) + 0.1 * b


CASES = [
    Case(
        "elementwise",
        lambda x, y: elementwise_p.bind(x, y),
        lambda x, y: x * jnp.sin(y) + x * x,
        (_f32(3, 2), _f32(3, 2)),
        diff=(0, 1),
    ),
    Case(
        "matmul",
        lambda x, w: matmul_p.bind(x, w),
        lambda x, w: jnp.einsum("ij,jk->ik", x, w),
        (_f32(2, 3), _f32(3, 2)),
        diff=(0, 1),
        linear=(1,),
    ),
    Case(
        "two_outputs",
        lambda x, y: two_out_p.bind(x, y),
        lambda x, y: (jnp.sin(x) * y, x + y * y),
        (_f32(2, 3), _f32(2, 3)),
        diff=(0, 1),
    ),
    Case(
        "integer_input",
        lambda x, idx: gather_p.bind(x, idx),
        lambda x, idx: 3.0 * x[idx],
        (_f32(4, 2), jnp.array([3, 0, 2], dtype=jnp.int32)),
        diff=(0,),
        linear=(0,),
        vary=_vary_int,
    ),
    Case(
        "static_params",
        lambda x: static_p.bind(x, scale=[2.0, -1.0], axes=[1], act=lambda v: v * jnp.tanh(v)),
        lambda x: jnp.tanh(2.0 * x[:, 0] - x[:, 1]) * (2.0 * x[:, 0] - x[:, 1]),
        (_f32(3, 2),),
        diff=(0,),
    ),
]

CASE_IDS = [c.name for c in CASES]


def _loss(fn):
    def loss(*args):
        return sum(jnp.sum(jnp.sin(o) * (k + 1.0)) for k, o in enumerate(_tup(fn(*args))))

    return loss


def _float_fn(case, fn):
    """fn as a function of the differentiable args only (the others held fixed)."""

    def f(*xs):
        full = list(case.args)
        for i, x in zip(case.diff, xs):
            full[i] = x
        return _tup(fn(*full))

    return f


def _diff_args(case):
    return tuple(case.args[i] for i in case.diff)


@pytest.fixture(params=CASES, ids=CASE_IDS)
def case(request):
    return request.param


def test_eager(case):
    assert_tree_close(_tup(case.prim_fn(*case.args)), _tup(case.ref_fn(*case.args)))


def test_jit(case):
    assert_tree_close(_tup(jax.jit(case.prim_fn)(*case.args)), _tup(case.ref_fn(*case.args)))


def test_grad(case):
    got = jax.jit(jax.grad(_loss(case.prim_fn), argnums=case.diff))(*case.args)
    want = jax.jit(jax.grad(_loss(case.ref_fn), argnums=case.diff))(*case.args)
    assert_tree_close(got, want)


def test_jvp(case):
    tangents = tuple(jnp.ones_like(a) * 0.5 for a in _diff_args(case))
    got = jax.jit(lambda p, t: jax.jvp(_float_fn(case, case.prim_fn), p, t))(
        _diff_args(case), tangents
    )
    want = jax.jvp(_float_fn(case, case.ref_fn), _diff_args(case), tangents)
    assert_tree_close(got, want)


def test_vjp(case):
    def vjp_of(fn):
        def run(args, cts):
            out, pullback = jax.vjp(_float_fn(case, fn), *args)
            return out, pullback(cts)

        return jax.jit(run)

    cts = tuple(jnp.cos(o) for o in _tup(case.ref_fn(*case.args)))
    assert_tree_close(
        vjp_of(case.prim_fn)(_diff_args(case), cts), vjp_of(case.ref_fn)(_diff_args(case), cts)
    )


def _batched_args(case, axes, size=3):
    out = []
    for i, (a, ax) in enumerate(zip(case.args, axes)):
        if ax is None:
            out.append(a)
        else:
            out.append(jnp.stack([case.vary(i, a, b) for b in range(size)], axis=ax))
    return tuple(out)


def _loop_reference(fn, args, axes, size=3):
    """vmap semantics by a Python loop (output batch axis 0)."""
    outs = []
    for b in range(size):
        sliced = [a if ax is None else jnp.take(a, b, axis=ax) for a, ax in zip(args, axes)]
        outs.append(_tup(fn(*sliced)))
    return tuple(jnp.stack(parts) for parts in zip(*outs))


def _axes_options(case):
    n = len(case.args)
    options = {"0": (0,) * n, "1": (1,) * n, "-1": (-1,) * n}
    if n > 1:
        options["0_None"] = (0,) + (None,) * (n - 1)
        options["None_1"] = (None,) * (n - 1) + (1,)
    return options


@pytest.mark.parametrize("axes_name", ["0", "1", "-1", "0_None", "None_1"])
def test_vmap(case, axes_name):
    axes = _axes_options(case).get(axes_name)
    if axes is None:  # single-operand cases have no mixed in_axes; "0" covers them
        axes = (0,)
    bargs = _batched_args(case, axes)
    got = _tup(jax.jit(jax.vmap(case.prim_fn, in_axes=axes))(*bargs))
    assert_tree_close(got, _loop_reference(case.ref_fn, bargs, axes))


def test_nested_vmap(case):
    n = len(case.args)
    inner_axes = (0,) + (None,) * (n - 1)
    outer_axes = (1,) * n
    inner = _batched_args(case, inner_axes, size=2)
    bargs = tuple(
        jnp.stack([case.vary(i, a, b) for b in range(3)], axis=1) for i, a in enumerate(inner)
    )
    got = _tup(
        jax.jit(jax.vmap(jax.vmap(case.prim_fn, in_axes=inner_axes), in_axes=outer_axes))(*bargs)
    )

    def inner_ref(*a):
        return _loop_reference(case.ref_fn, a, inner_axes, size=2)

    assert_tree_close(got, _loop_reference(inner_ref, bargs, outer_axes))


def test_vmap_of_grad(case):
    axes = (0,) * len(case.args)
    bargs = _batched_args(case, axes)
    got = jax.jit(jax.vmap(jax.grad(_loss(case.prim_fn), argnums=case.diff), in_axes=axes))(*bargs)
    ref_grad = jax.jit(jax.grad(_loss(case.ref_fn), argnums=case.diff))
    want = _loop_reference(ref_grad, bargs, axes)
    assert_tree_close(_tup(got), want)


def test_grad_of_grad(case):
    def outer(fn):
        g = jax.grad(_loss(fn), argnums=case.diff)
        return lambda *a: sum(jnp.sum(gi**2) for gi in g(*a))

    got = jax.jit(jax.grad(outer(case.prim_fn), argnums=case.diff))(*case.args)
    want = jax.jit(jax.grad(outer(case.ref_fn), argnums=case.diff))(*case.args)
    assert_tree_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("jac", [jax.jacfwd, jax.jacrev], ids=["jacfwd", "jacrev"])
def test_jacobians(case, jac):
    argnums = tuple(range(len(case.diff)))
    got = jax.jit(jac(_float_fn(case, case.prim_fn), argnums=argnums))(*_diff_args(case))
    want = jax.jit(jac(_float_fn(case, case.ref_fn), argnums=argnums))(*_diff_args(case))
    assert_tree_close(got, want)


def test_check_grads(case):
    # jit keeps the many evaluations check_grads makes cheap. Reverse mode to second order
    # (grad of grad), forward mode to first order.
    f = jax.jit(_float_fn(case, case.prim_fn))
    tol = {"eps": 1e-2, "atol": 5e-2, "rtol": 5e-2}
    check_grads(f, _diff_args(case), order=2, modes=("rev",), **tol)
    check_grads(f, _diff_args(case), order=1, modes=("fwd",), **tol)


@pytest.mark.parametrize("case", [c for c in CASES if c.linear], ids=lambda c: c.name)
def test_linear_transpose(case):
    for i in case.linear:

        def with_arg(fn, i=i):
            def f(v):
                full = list(case.args)
                full[i] = v
                return fn(*full)

            return f

        spec = jax.ShapeDtypeStruct(case.args[i].shape, case.args[i].dtype)
        out = case.ref_fn(*case.args)
        ct = jnp.cos(out)
        (got,) = jax.linear_transpose(with_arg(case.prim_fn), spec)(ct)
        # Independent reference: the VJP of the plain function.
        _, pullback = jax.vjp(with_arg(case.ref_fn), case.args[i])
        assert_tree_close(got, pullback(ct)[0])
        # Also under jit.
        (got_jit,) = jax.jit(jax.linear_transpose(with_arg(case.prim_fn), spec))(ct)
        assert_tree_close(got_jit, pullback(ct)[0])


# -- integer outputs -------------------------------------------------------------------


def _max_argmax_impl(x):
    return jnp.max(x, axis=-1), jnp.argmax(x, axis=-1).astype(jnp.int32)


max_argmax_p = register_primitive("test_max_argmax", _max_argmax_impl, multiple_results=True)


def test_integer_output_gets_zero_tangent():
    x = jnp.array([[1.0, 3.0, 2.0], [0.5, -1.0, 4.0]])
    (m, i), (tm, ti) = jax.jit(lambda x, t: jax.jvp(max_argmax_p.bind, (x,), (t,)))(
        x, jnp.ones_like(x) * 2.0
    )
    np.testing.assert_allclose(m, [3.0, 4.0])
    np.testing.assert_array_equal(i, [1, 2])
    np.testing.assert_allclose(tm, [2.0, 2.0])
    assert ti.dtype == jax.dtypes.float0

    def loss(x):
        m, i = max_argmax_p.bind(x)
        return jnp.sum(m * i.astype(jnp.float32))

    got = jax.jit(jax.grad(loss))(x)
    want = jax.grad(lambda x: jnp.sum(jnp.max(x, -1) * jnp.argmax(x, -1).astype(jnp.float32)))(x)
    assert_tree_close(got, want)
    assert_tree_close(
        jax.jacrev(lambda x: max_argmax_p.bind(x)[0])(x), jax.jacrev(lambda x: jnp.max(x, -1))(x)
    )
    assert_tree_close(
        tuple(jax.vmap(max_argmax_p.bind, in_axes=1)(x)),
        (jnp.max(x, 0), jnp.argmax(x, 0).astype(jnp.int32)),
    )


def test_integer_input_jvp_with_float0_tangent():
    x = _f32(4, 2)
    idx = jnp.array([1, 1, 3], dtype=jnp.int32)
    t_idx = np.zeros(idx.shape, dtype=jax.dtypes.float0)
    out, t_out = jax.jvp(gather_p.bind, (x, idx), (jnp.ones_like(x), t_idx))
    assert_tree_close(out, 3.0 * x[idx])
    assert_tree_close(t_out, jnp.full((3, 2), 3.0))
    # grad w.r.t. the integer input with allow_int gives a float0 zero
    g = jax.grad(lambda x, i: jnp.sum(gather_p.bind(x, i)), argnums=(0, 1), allow_int=True)(x, idx)
    assert g[1].dtype == jax.dtypes.float0
    np.testing.assert_allclose(g[0], np.array([[0, 0], [6, 6], [0, 0], [3, 3]], np.float32))


# -- linear transpose of a multiple-results primitive ------------------------------------

split_scale_p = register_primitive(
    "test_split_scale", lambda x, s: (x[:2] * s, x[2:] * s), multiple_results=True
)


def test_linear_transpose_multiple_results():
    x, s = _f32(5), jnp.float32(3.0)
    cts = (jnp.array([1.0, -2.0]), jnp.array([0.5, 4.0, 1.0]))
    spec = jax.ShapeDtypeStruct(x.shape, x.dtype)
    (got,) = jax.linear_transpose(lambda v: tuple(split_scale_p.bind(v, s)), spec)(cts)
    _, pullback = jax.vjp(lambda v: (v[:2] * s, v[2:] * s), x)
    assert_tree_close(got, pullback(cts)[0])
    # a symbolic-zero cotangent for one output
    (got0,) = jax.linear_transpose(lambda v: split_scale_p.bind(v, s)[1], spec)(cts[1])
    assert_tree_close(got0, jnp.concatenate([jnp.zeros(2), cts[1] * s]))
