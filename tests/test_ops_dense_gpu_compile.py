"""The dense event products' Pallas kernels compiled by XLA:GPU for sm_90 and sm_80 (no GPU needed).

XLA:GPU's whole pipeline (Triton, ptxas) runs on every variant for an H100 and an A100
target description (see ``primforge.testing``): the four products x both directions x
float32 / float64 weights, binary products with bool, int8 and float32 events, and
``jax.jit``, ``jax.grad`` (weights and input), ``jax.jvp`` and ``jax.vmap`` (input, weights,
both) of each product. Each compiled program must hold the Pallas kernel itself, not a
fallback; the variants of one test go to XLA:GPU as one program per target, each with its
own kernel launch (``compile_cases_for_targets``). Numerics of the same kernels,
interpreted on the CPU, are in test_ops_dense_pallas.py and test_ops_matrix.py.
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


def _kernel_name(transpose):
    name = "pf_dense_columns" if transpose else "pf_dense_gather"
    return lambda n: n.startswith(name)


def _compile(cases):
    """``cases``: label -> (fn, args, transpose); each must launch its own Pallas kernel."""
    compile_cases_for_targets({label: case[:2] for label, case in cases.items()},
                              backend="pallas",
                              expect={label: _kernel_name(case[2])
                                      for label, case in cases.items()})


def _label(kind, transpose, *more):
    return "-".join([kind_id(kind), "xW" if transpose else "Wx", *more])


VARIANTS = list(itertools.product(FUNCS, [False, True]))  # kind, transpose


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_every_variant_compiles(dtype):
    with jax.enable_x64(dtype == "float64"):
        _compile({_label(kind, transpose): (
            _product(kind, transpose), _args(kind, transpose, dtype), transpose)
            for kind, transpose in VARIANTS})


def test_integer_and_float_events_compile():
    _compile({_label(kind, transpose, events): (
        _product(kind, transpose), _args(kind, transpose, events=events), transpose)
        for kind in [(True, False), (True, True)] for transpose in (False, True)
        for events in ("int8", "float32")})


def _grad(kind, transpose):
    binary, _ = kind
    f = _product(kind, transpose)
    loss = lambda w, x: jnp.sum(jnp.sin(f(w, x)))
    return jax.grad(loss, argnums=(0,) if binary else (0, 1))


def _jvp(kind, transpose):
    binary, _ = kind
    f = _product(kind, transpose)
    if binary:  # bool events have no tangent: the weights'
        return lambda w, x: jax.jvp(lambda w: f(w, x), (w,), (w,))
    return lambda w, x: jax.jvp(f, (w, x), (w, x))


@pytest.mark.parametrize("transform", ["grad", "jvp", "vmap"])
def test_grad_jvp_and_vmap_compile(transform):
    cases = {}
    for kind, transpose in VARIANTS:
        label = _label(kind, transpose)
        w, x = _args(kind, transpose)
        if transform != "vmap":
            make = _grad if transform == "grad" else _jvp
            cases[label] = (make(kind, transpose), (w, x), transpose)
            continue
        f = _product(kind, transpose)
        batched = lambda a: sds((3, *a.shape), a.dtype)
        for in_axes, ww, xx in [((None, 0), w, batched(x)), ((0, None), batched(w), x),
                                ((0, 0), batched(w), batched(x))]:
            cases[f"{label}-{in_axes}"] = (jax.vmap(f, in_axes=in_axes), (ww, xx), transpose)
    _compile(cases)
