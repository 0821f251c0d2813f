"""``evaluate_once``: the same values as calling the function, computed once for all readers
in XLA's CPU program, and a plain call in a GPU lowering."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import primforge
from primforge.sim import evaluate_once

MARK = 1.2345  # a constant that appears in the compiled program once per copy of `update`


def update(v, i, *, gain=0.5):
    v = v * MARK + i * gain
    return v, v > 1.0


def readers(v, spike):
    """Five elementwise operations that read the update's two results (a reduction would
    make XLA write its input to memory anyway)."""
    return (jnp.where(spike, 0.0, v), spike[:500], spike[500:], spike.astype(jnp.int32) * 3,
            v * 2.0)


def program(once):
    def step(v, i):
        out = evaluate_once(update, v, i) if once else update(v, i)
        return readers(*out)
    return jax.jit(step)


def args(n=1000, seed=0):
    rng = np.random.default_rng(seed)
    return (jnp.asarray(rng.uniform(0, 2, n), jnp.float32),
            jnp.asarray(rng.uniform(-1, 1, n), jnp.float32))


def test_values_are_the_functions():
    v, i = args()
    got = program(True)(v, i)
    vn, iv = np.asarray(v, np.float64), np.asarray(i, np.float64)
    v1 = vn * MARK + iv * 0.5
    spike = v1 > 1.0
    want = (np.where(spike, 0.0, v1), spike[:500], spike[500:], spike.astype(np.int32) * 3,
            v1 * 2.0)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g), w, rtol=1e-5, atol=1e-6)
    # and exactly what the same program computes without it
    for g, w in zip(got, program(False)(v, i), strict=True):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def test_the_cpu_program_computes_the_update_once():
    v, i = args()
    recomputed = program(False).lower(v, i).compile().as_text()
    once = program(True).lower(v, i).compile().as_text()
    # Without it, XLA fuses the update into each reader: one copy a reader of `v`. With it,
    # the copies are the two (identical) branches of one conditional, one of which runs.
    assert recomputed.count(str(MARK)) >= 4
    assert once.count(str(MARK)) == 2
    assert once.count("conditional(") == 1


def test_a_gpu_lowering_calls_the_function_as_it_is():
    v, i = args()
    traced = jax.jit(lambda v, i: evaluate_once(update, v, i)).trace(v, i)
    gpu = traced.lower(lowering_platforms=("cuda",)).as_text()
    cpu = traced.lower(lowering_platforms=("cpu",)).as_text()
    assert gpu.count("1.234500e+00") == 1  # the default branch only, no runtime conditional
    assert cpu.count("1.234500e+00") == 2


def test_pytrees_keyword_arguments_and_static_values():
    def fn(state, scale, *, offset, name):
        assert name == "cell"  # a static keyword argument arrives as it is
        return {"a": state["x"] * scale + offset, "b": (state["y"].sum(),)}

    state = {"x": jnp.arange(4.0), "y": jnp.ones((2, 3))}
    got = jax.jit(lambda s, c: evaluate_once(fn, s, c, offset=1.5, name="cell"))(
        state, jnp.float32(2.0))
    np.testing.assert_array_equal(np.asarray(got["a"]), np.arange(4.0) * 2.0 + 1.5)
    assert float(got["b"][0]) == 6.0


@pytest.mark.parametrize("first", [
    jnp.array([np.nan, 1.0]),           # a NaN predicate element
    jnp.zeros((0,)),                    # an empty array: the next one is read
    jnp.array([0, 0], jnp.int32),       # zero: the other branch, the same function
    jnp.array([False, True]),
    jax.random.key(0),                  # a key array is not read
], ids=["nan", "empty", "zero", "bool", "key"])
def test_whichever_argument_comes_first_the_result_is_the_functions(first):
    def fn(a, x):
        del a
        return jnp.sin(x) * 3.0

    x = jnp.linspace(-1.0, 1.0, 7)
    got = jax.jit(lambda a, x: evaluate_once(fn, a, x))(first, x)
    np.testing.assert_allclose(np.asarray(got), np.sin(np.asarray(x)) * 3.0, rtol=1e-6)


def test_no_array_to_read_calls_the_function():
    assert evaluate_once(lambda a, b: a * b, 3, 4) == 12
    assert float(jax.jit(lambda: evaluate_once(lambda: jnp.float32(2.0) * 3))()) == 6


def test_gradients_match_finite_differences():
    v, i = args(16, seed=1)

    def loss(v, i):
        out, _ = evaluate_once(update, v, i, gain=0.25)
        return jnp.sum(jnp.sin(out) * out)

    check_grads(loss, (v, i), order=2, modes=("fwd", "rev"), atol=2e-2, rtol=2e-2)
    def plain(v, i):
        out, _ = update(v, i, gain=0.25)
        return jnp.sum(jnp.sin(out) * out)

    np.testing.assert_allclose(np.asarray(jax.grad(loss)(v, i)),
                               np.asarray(jax.grad(plain)(v, i)), rtol=1e-5, atol=1e-6)


def test_vmap_gives_each_batch_members_values():
    v, i = args(50, seed=2)
    vb, ib = jnp.stack([v, v * 0.5, v + 1.0]), jnp.stack([i, -i, i])
    got = jax.vmap(program(True))(vb, ib)
    for b in range(3):
        want = program(False)(vb[b], ib[b])
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(np.asarray(g)[b], np.asarray(w))
    # gradients of batched and unbatched calls agree
    def loss(v, i):
        return jnp.sum(evaluate_once(update, v, i)[0] ** 2)

    grads = jax.vmap(jax.grad(loss))(vb, ib)
    for b in range(3):
        np.testing.assert_allclose(np.asarray(grads[b]), np.asarray(jax.grad(loss)(vb[b], ib[b])),
                                   rtol=1e-6)


@pytest.mark.parametrize("levels", [1, 2])
def test_under_vmap_the_update_is_still_computed_once(levels):
    v, i = args()
    batched = [(v, i)]
    for n in (3, 2)[:levels]:
        batched = [tuple(jnp.stack([x] * n) for x in batched[0])]
    (vb, ib), = batched

    def compiled(once):
        f = program(once)
        for _ in range(levels):
            f = jax.vmap(f)
        return jax.jit(f).lower(vb, ib).compile().as_text()

    assert compiled(False).count(str(MARK)) >= 4
    once = compiled(True)
    assert once.count(str(MARK)) == 2 and once.count("conditional(") == 1


def test_fn_must_be_callable():
    with pytest.raises(TypeError, match="evaluate_once: fn must be callable, got int 3"):
        evaluate_once(3, jnp.ones(2))


def test_is_public_here_and_at_the_top():
    assert primforge.evaluate_once is evaluate_once and "evaluate_once" in primforge.__all__
