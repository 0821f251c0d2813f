"""The dense event products' Pallas kernels compiled by XLA:GPU for sm_90 and sm_80 (no GPU needed).

XLA:GPU's whole pipeline (Triton, ptxas) runs on every variant for an H100 and an A100
target description (see ``primforge.testing``): the four products x both directions x
float32 / float64 weights, binary products with bool, int8 and float32 events, and
``jax.jit``, ``jax.grad`` (weights and input), ``jax.jvp`` and ``jax.vmap`` (input, weights,
both) of each product. Each compiled program must hold the Pallas kernel itself, not a
fallback. Numerics of the same kernels, interpreted on the CPU, are in
test_ops_dense_pallas.py and test_ops_matrix.py.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest
from gpu_utils import compile_for_targets, requires_gpu_compiler

from primforge import ops

pytestmark = requires_gpu_compiler

FUNCS = {
    (False, False): ops.densemv,
    (True, False): ops.binary_densemv,
    (False, True): ops.densemm,
    (True, True): ops.binary_densemm,
}
M, N, C = 70, 300, 37  # more than one block of rows, of output columns and of input columns
sds = jax.ShapeDtypeStruct


def kind_id(kind):
    binary, matrix = kind
    return ("binary_" if binary else "") + ("densemm" if matrix else "densemv")


def _args(kind, transpose, dtype="float32", events=None):
    binary, matrix = kind
    rows = M if transpose else N
    x = sds((rows, C) if matrix else (rows,), events or ("bool" if binary else dtype))
    return sds((M, N), dtype), x


def _product(kind, transpose):
    return functools.partial(FUNCS[kind], transpose=transpose, backend="pallas")


def _check(results, transpose):
    name = "pf_dense_columns" if transpose else "pf_dense_gather"
    for target, result in results.items():
        assert any(k.name.startswith(name) for k in result.kernels), (target, result.kernels)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("transpose", [False, True], ids=["Wx", "xW"])
@pytest.mark.parametrize("kind", list(FUNCS), ids=kind_id)
def test_every_variant_compiles(kind, transpose, dtype):
    with jax.enable_x64(dtype == "float64"):
        results = compile_for_targets(_product(kind, transpose), *_args(kind, transpose, dtype),
                                      backend="pallas")
    _check(results, transpose)


@pytest.mark.parametrize("transpose", [False, True], ids=["Wx", "xW"])
@pytest.mark.parametrize("kind", [(True, False), (True, True)], ids=kind_id)
def test_integer_and_float_events_compile(kind, transpose):
    for events in ("int8", "float32"):
        _check(compile_for_targets(_product(kind, transpose),
                                   *_args(kind, transpose, events=events), backend="pallas"),
               transpose)


@pytest.mark.parametrize("transpose", [False, True], ids=["Wx", "xW"])
@pytest.mark.parametrize("kind", list(FUNCS), ids=kind_id)
def test_grad_jvp_and_vmap_compile(kind, transpose):
    binary, _ = kind
    f = _product(kind, transpose)
    w, x = _args(kind, transpose)
    argnums = (0,) if binary else (0, 1)
    loss = lambda w, x: jnp.sum(jnp.sin(f(w, x)))
    _check(compile_for_targets(jax.grad(loss, argnums=argnums), w, x, backend="pallas"),
           transpose)
    if binary:  # bool events have no tangent: the weights'
        jvp = lambda w, x: jax.jvp(lambda w: f(w, x), (w,), (w,))
    else:
        jvp = lambda w, x: jax.jvp(f, (w, x), (w, x))
    _check(compile_for_targets(jvp, w, x, backend="pallas"), transpose)
    batched = lambda a: sds((3, *a.shape), a.dtype)
    for in_axes, ww, xx in [((None, 0), w, batched(x)), ((0, None), batched(w), x),
                            ((0, 0), batched(w), batched(x))]:
        _check(compile_for_targets(jax.vmap(f, in_axes=in_axes), ww, xx, backend="pallas"),
               transpose)
