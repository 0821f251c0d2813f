"""Debug mode: output coverage and comparison with the 'jax' reference, eager, jit, vmap, grad.

Kernels here are deliberately broken in one way each; the checks must name the kernel,
the output and the first bad index. Correct kernels must pass unchanged (values compared
with plain jax.numpy).
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import primforge
from primforge import KernelError, XLACustomKernel

numba = pytest.importorskip("numba")

_ids = itertools.count()


def fresh(prefix="dbg"):
    return XLACustomKernel(f"test_{prefix}_{next(_ids)}")


def spec(shape, dtype=jnp.float32):
    return jax.ShapeDtypeStruct(shape, dtype)


def half_writer():
    """Writes only the first half of its output (the rest is whatever the buffer held)."""
    k = fresh("half")

    def gen(**kw):
        @numba.njit
        def kernel(x, out):
            flat_x, flat_o = x.reshape(-1), out.reshape(-1)
            for i in range(flat_x.size // 2):
                flat_o[i] = 2 * flat_x[i]
        return kernel

    k.def_numba_kernel(gen)
    return k


def test_untouched_output_elements_are_reported_eagerly():
    k = half_writer()
    pattern = (r"kernel 'test_half_\d+' \(backend 'numba'\).*output 0 \(float32\[6\]\) "
               r"element \(3,\) was never written")
    with primforge.debug_mode(), pytest.raises(KernelError, match=pattern):
        k(jnp.ones(6), outs=spec((6,)))


def test_untouched_output_elements_are_reported_under_jit_and_vmap():
    k = half_writer()
    with primforge.debug_mode():
        f = jax.jit(lambda x: k(x, outs=spec((2, 3))))
        with pytest.raises(jax.errors.JaxRuntimeError, match=r"output 0 .* element \(1, 0\) "
                                                             r"was never written"):
            jax.block_until_ready(f(jnp.ones((2, 3))))
        g = jax.vmap(lambda x: k(x, outs=spec((4,))))
        # Batched: each example's second half is unwritten; the first bad element is (0, 2).
        with pytest.raises(KernelError, match=r"float32\[3, 4\]\) element \(0, 2\)"):
            g(jnp.ones((3, 4)))


def test_a_kernel_that_reads_its_output_buffer_is_reported():
    k = fresh("accumulate")

    def gen(**kw):
        @numba.njit
        def kernel(x, out):
            for i in range(x.size):
                out[i] += x[i]  # assumes a zeroed buffer
        return kernel

    k.def_numba_kernel(gen)
    with primforge.debug_mode(), pytest.raises(KernelError, match=r"element \(0,\)"):
        k(jnp.ones(3), outs=spec((3,)))


def test_second_output_untouched_is_named():
    k = fresh("two_outs")

    def gen(**kw):
        @numba.njit
        def kernel(x, a, b):
            for i in range(x.size):
                a[i] = x[i]
            b[0] = 1
        return kernel

    k.def_numba_kernel(gen)
    with primforge.debug_mode(), pytest.raises(KernelError, match=r"output 1 \(int32\[3\]\) "
                                                                   r"element \(1,\)"):
        k(jnp.ones(3), outs=[spec((3,)), spec((3,), jnp.int32)])


def off_by_one():
    k = fresh("wrong")

    def gen(**kw):
        @numba.njit
        def kernel(x, out):
            flat_x, flat_o = x.reshape(-1), out.reshape(-1)
            for i in range(flat_x.size):
                flat_o[i] = 2 * flat_x[i] + (1.0 if i == 4 else 0.0)
        return kernel

    k.def_numba_kernel(gen)
    k.def_kernel("jax", "cpu", lambda **kw: lambda x: 2 * x)
    k.def_jvp_rule2(lambda t, x, **kw: [2 * t])
    return k


@pytest.mark.parametrize("mode", ["eager", "vmap", "grad"])
def test_differences_from_the_jax_reference_name_the_first_index(mode):
    k = off_by_one()
    x = jnp.ones((2, 3))
    # Under vmap the index is into the batched output (batch dimensions first).
    index = r"\(0, 1, 1\)" if mode == "vmap" else r"\(1, 1\)"
    pattern = (r"output 0 .* differs from the 'jax' reference backend; first differing index "
               + index + r": got 3\.0, reference 2\.0")
    with primforge.debug_mode(), pytest.raises(KernelError, match=pattern):
        if mode == "eager":
            k(x, outs=spec((2, 3)))
        elif mode == "vmap":
            jax.vmap(lambda r: k(r, outs=spec((2, 3))))(jnp.ones((2, 2, 3)))
        else:
            jax.grad(lambda x: k(x, outs=spec((2, 3))).sum())(x)
    # Outside debug mode, the same kernel runs unchecked (the wrong value comes back).
    assert float(k(x, outs=spec((2, 3)))[1, 1]) == 3.0


def test_environment_variable_turns_debug_mode_on(monkeypatch):
    k = off_by_one()
    monkeypatch.setenv("PRIMFORGE_DEBUG", "1")
    with pytest.raises(KernelError, match="differs from the 'jax' reference"):
        k(jnp.ones((2, 3)), outs=spec((2, 3)))


def test_non_numba_backends_are_compared_with_the_reference():
    k = fresh("plain")
    k.def_kernel("plain", "cpu", lambda **kw: lambda x: x.at[0].add(1e-3))
    k.def_kernel("jax", "cpu", lambda **kw: lambda x: x)
    with primforge.debug_mode(), pytest.raises(KernelError, match=r"index \(0,\)"):
        k(jnp.ones(3), outs=spec((3,)))


@pytest.mark.parametrize("dtype, shape", [
    (jnp.float32, (2, 3)), (jnp.float32, (0,)), (jnp.float32, ()), (jnp.float16, (5,)),
    (jnp.int32, (5,)), (jnp.bool_, (2, 3)), (jnp.complex64, (4,)),
])
def test_correct_kernels_pass_in_debug_mode(dtype, shape):
    k = fresh("good")

    def gen(**kw):
        @numba.njit
        def kernel(x, out):
            flat_x, flat_o = x.reshape(-1), out.reshape(-1)
            for i in range(flat_x.size):
                flat_o[i] = flat_x[i]
        return kernel

    k.def_numba_kernel(gen)
    k.def_kernel("jax", "cpu", lambda **kw: lambda x: x)
    x = (jnp.arange(int(np.prod(shape))) % 3).reshape(shape).astype(dtype)
    with primforge.debug_mode():
        np.testing.assert_array_equal(k(x, outs=spec(shape, dtype)), x)
        np.testing.assert_array_equal(jax.jit(lambda x: k(x, outs=spec(shape, dtype)))(x), x)
        if shape:
            xs = jnp.stack([x, x])
            np.testing.assert_array_equal(
                jax.vmap(lambda r: k(r, outs=spec(shape, dtype)))(xs), xs)


def test_float32_rounding_differences_are_within_tolerance():
    k = fresh("sum_order")

    def gen(**kw):
        @numba.njit
        def kernel(x, out):
            acc = np.float32(0)
            for i in range(x.size - 1, -1, -1):  # reverse order: different rounding
                acc += x[i]
            out[0] = acc
        return kernel

    k.def_numba_kernel(gen)
    k.def_kernel("jax", "cpu", lambda **kw: lambda x: jnp.sum(x, keepdims=True))
    x = jax.random.uniform(jax.random.key(0), (1000,), jnp.float32)
    with primforge.debug_mode():
        np.testing.assert_allclose(k(x, outs=spec((1,))), [np.sum(np.asarray(x, np.float64))],
                                   rtol=1e-5)


def test_debug_mode_is_read_when_the_call_is_traced():
    k = off_by_one()
    f = jax.jit(lambda x: k(x, outs=spec((2, 3))))
    f(jnp.ones((2, 3)))  # traced without debug mode
    with primforge.debug_mode():
        f(jnp.ones((2, 3)))  # the compiled function is reused: no checks
        with pytest.raises(KernelError):
            k(jnp.ones((2, 3)), outs=spec((2, 3)))  # a new trace is checked
