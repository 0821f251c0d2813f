"""The fixed-number products' Pallas kernels compiled by XLA:GPU for sm_90 and sm_80.

No GPU is needed.

XLA:GPU's whole pipeline (Triton, ptxas) runs on every variant for an H100 and an A100
target description (see ``primforge.testing``): the four products x both directions x one
shared weight or one per synapse x float32/int32 and float64/int64, binary products with
int8 and float32 events, and ``jax.grad`` (weights and input), ``jax.jvp`` and ``jax.vmap``
(input, weights, both) of each product. Each compiled program must hold the Pallas kernel
itself, not a fallback; the variants of one test go to XLA:GPU as one program per target,
each with its own kernel launch (``compile_cases_for_targets``). Numerics of the same
kernels, interpreted on the CPU, are in test_ops_fixed_num.py and test_ops_matrix.py.
"""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
import pytest
from gpu_utils import compile_cases_for_targets, requires_gpu_compiler

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


def _kernel_name(transpose):
    name = "pf_fixed_num_scatter" if transpose else "pf_fixed_num_gather"
    return lambda n: n.startswith(name)


def _compile(cases):
    """``cases``: label -> (fn, args, transpose); each must launch its own Pallas kernel."""
    compile_cases_for_targets({label: case[:2] for label, case in cases.items()},
                              backend="pallas",
                              expect={label: _kernel_name(case[2])
                                      for label, case in cases.items()})


def _label(kind, transpose, *more):
    return "-".join([kind_id(kind), "xW" if transpose else "Wx", *more])


VARIANTS = list(itertools.product(FUNCS, [False, True], [False, True]))  # kind, transpose, shared


@pytest.mark.parametrize("dtype,index_dtype", [("float32", "int32"), ("float64", "int64")],
                         ids=lambda v: v)
def test_every_variant_compiles(dtype, index_dtype):
    with jax.enable_x64(dtype == "float64"):
        _compile({_label(kind, transpose, "homo" if shared else "hetero"): (
            _product(kind, transpose), _args(kind, transpose, shared, dtype, index_dtype),
            transpose) for kind, transpose, shared in VARIANTS})


def test_integer_and_float_events_compile():
    _compile({_label(kind, transpose, events): (
        _product(kind, transpose), _args(kind, transpose, events=events), transpose)
        for kind in [(True, False), (True, True)] for transpose in (False, True)
        for events in ("int8", "float32")})


def _grad(kind, transpose):
    binary, _ = kind
    f = _product(kind, transpose)
    loss = lambda w, i, x: jnp.sum(jnp.sin(f(w, i, x)))
    return jax.grad(loss, argnums=(0,) if binary else (0, 2))


def _jvp(kind, transpose):
    binary, _ = kind
    f = _product(kind, transpose)
    if binary:  # bool events have no tangent: the weights'
        return lambda w, i, x: jax.jvp(lambda w: f(w, i, x), (w,), (w,))
    return lambda w, i, x: jax.jvp(lambda w, x: f(w, i, x), (w, x), (w, x))


@pytest.mark.parametrize("transform", ["grad", "jvp", "vmap"])
def test_grad_jvp_and_vmap_compile(transform):
    cases = {}
    for kind, transpose, shared in VARIANTS:
        label = _label(kind, transpose, "homo" if shared else "hetero")
        w, idx, x = _args(kind, transpose, shared)
        if transform != "vmap":
            make = _grad if transform == "grad" else _jvp
            cases[label] = (make(kind, transpose), (w, idx, x), transpose)
            continue
        f = _product(kind, transpose)
        batched = lambda a: sds((3, *a.shape), a.dtype)
        for in_axes, ww, xx in [((None, None, 0), w, batched(x)),
                                ((0, None, None), batched(w), x),
                                ((0, None, 0), batched(w), batched(x))]:
            cases[f"{label}-{in_axes}"] = (jax.vmap(f, in_axes=in_axes), (ww, idx, xx),
                                           transpose)
    _compile(cases)
