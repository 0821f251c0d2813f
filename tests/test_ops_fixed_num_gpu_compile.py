"""The fixed-number products' Pallas kernels compiled by XLA:GPU for sm_90 and sm_80 (no GPU needed).

XLA:GPU's whole pipeline (Triton, ptxas) runs on every variant for an H100 and an A100
target description (see ``primforge.testing``): the four products x both directions x one
shared weight or one per synapse x float32/int32 and float64/int64, binary products with
int8 and float32 events, and ``jax.grad`` (weights and input), ``jax.jvp`` and ``jax.vmap``
(input, weights, both) of each product. Each compiled program must hold the Pallas kernel
itself, not a fallback. Numerics of the same kernels, interpreted on the CPU, are in
test_ops_fixed_num.py and test_ops_matrix.py.
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
    (False, False): ops.fixed_num_mv,
    (True, False): ops.binary_fixed_num_mv,
    (False, True): ops.fixed_num_mm,
    (True, True): ops.binary_fixed_num_mm,
}
M, N, K, C = 100, 80, 40, 37  # rows longer than one chunk, more columns than one block
sds = jax.ShapeDtypeStruct


def kind_id(kind):
    binary, matrix = kind
    return ("binary_" if binary else "") + ("fixed_num_mm" if matrix else "fixed_num_mv")


def _args(kind, transpose, shared=False, dtype="float32", index_dtype="int32", events=None):
    binary, matrix = kind
    rows = M if transpose else N
    x = sds((rows, C) if matrix else (rows,), events or ("bool" if binary else dtype))
    return sds((1,) if shared else (M, K), dtype), sds((M, K), index_dtype), x


def _product(kind, transpose):
    return functools.partial(FUNCS[kind], shape=(M, N), transpose=transpose, backend="pallas")


def _check(results, transpose):
    name = "pf_fixed_num_scatter" if transpose else "pf_fixed_num_gather"
    for target, result in results.items():
        assert any(k.name.startswith(name) for k in result.kernels), (target, result.kernels)


@pytest.mark.parametrize("dtype,index_dtype", [("float32", "int32"), ("float64", "int64")],
                         ids=lambda v: v)
@pytest.mark.parametrize("shared", [False, True], ids=["hetero", "homo"])
@pytest.mark.parametrize("transpose", [False, True], ids=["Wx", "xW"])
@pytest.mark.parametrize("kind", list(FUNCS), ids=kind_id)
def test_every_variant_compiles(kind, transpose, shared, dtype, index_dtype):
    with jax.enable_x64(dtype == "float64"):
        args = _args(kind, transpose, shared, dtype, index_dtype)
        _check(compile_for_targets(_product(kind, transpose), *args, backend="pallas"),
               transpose)


@pytest.mark.parametrize("transpose", [False, True], ids=["Wx", "xW"])
@pytest.mark.parametrize("kind", [(True, False), (True, True)], ids=kind_id)
def test_integer_and_float_events_compile(kind, transpose):
    for events in ("int8", "float32"):
        _check(compile_for_targets(_product(kind, transpose),
                                   *_args(kind, transpose, events=events), backend="pallas"),
               transpose)


@pytest.mark.parametrize("shared", [False, True], ids=["hetero", "homo"])
@pytest.mark.parametrize("transpose", [False, True], ids=["Wx", "xW"])
@pytest.mark.parametrize("kind", list(FUNCS), ids=kind_id)
def test_grad_jvp_and_vmap_compile(kind, transpose, shared):
    binary, _ = kind
    f = _product(kind, transpose)
    w, idx, x = _args(kind, transpose, shared)
    argnums = (0,) if binary else (0, 2)
    loss = lambda w, i, x: jnp.sum(jnp.sin(f(w, i, x)))
    _check(compile_for_targets(jax.grad(loss, argnums=argnums), w, idx, x, backend="pallas"),
           transpose)
    if binary:  # bool events have no tangent: the weights'
        jvp = lambda w, i, x: jax.jvp(lambda w: f(w, i, x), (w,), (w,))
    else:
        jvp = lambda w, i, x: jax.jvp(lambda w, x: f(w, i, x), (w, x), (w, x))
    _check(compile_for_targets(jvp, w, idx, x, backend="pallas"), transpose)
    batched = lambda a: sds((3, *a.shape), a.dtype)
    for in_axes, ww, xx in [((None, None, 0), w, batched(x)), ((0, None, None), batched(w), x),
                            ((0, None, 0), batched(w), batched(x))]:
        _check(compile_for_targets(jax.vmap(f, in_axes=in_axes), ww, idx, xx,
                                   backend="pallas"), transpose)
