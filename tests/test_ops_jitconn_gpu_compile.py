"""More of the just-in-time products' Pallas kernels compiled by XLA:GPU for sm_90 and sm_80.

test_ops_jitconn.py compiles every variant, ``jax.grad`` and ``jax.vmap`` over the input;
here: ``jax.jvp`` (weight parameters and, for float products, the input), ``jax.vmap`` over
the weight parameters and over both, and binary products with int8 and float32 events,
for every weight distribution. Each compiled program must hold the Pallas kernel itself;
the cases of one test go to XLA:GPU as one program per target, each with its own launch.
Numerics of the same kernels, interpreted on the CPU, are in test_ops_jitconn.py and
test_ops_matrix.py.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gpu_utils import compile_cases_for_targets, requires_gpu_compiler

from primforge import ops

pytestmark = requires_gpu_compiler

FUNCS = {
    (False, False): ops.jitc_matvec,
    (True, False): ops.binary_jitc_matvec,
    (False, True): ops.jitc_matmat,
    (True, True): ops.binary_jitc_matmat,
}
KINDS = {"homo": 0.75, "uniform": (-0.5, 1.5), "normal": (0.25, 1.0)}
M, N, C = 37, 53, 5
sds = jax.ShapeDtypeStruct


def kind_id(kind):
    binary, matrix = kind
    return ("binary_" if binary else "") + ("jitc_matmat" if matrix else "jitc_matvec")


def _kernel_name(transpose, matrix):
    name = "pf_jitc_" + ("scatter_" if transpose else "gather_") + ("mm" if matrix else "mv")
    return lambda n: n.startswith(name)


@pytest.mark.parametrize("transpose", [False, True], ids=["Wx", "xW"])
@pytest.mark.parametrize("kind", list(FUNCS), ids=kind_id)
def test_jvp_vmap_and_events_compile(kind, transpose):
    binary, matrix = kind
    rows = M if transpose else N
    xshape = (rows, C) if matrix else (rows,)
    x = sds(xshape, "bool" if binary else "float32")
    seed = sds((), jnp.int32)
    batched = lambda a: sds((3, *a.shape), a.dtype)
    cases = {}
    for weight_kind, weight in KINDS.items():
        f = functools.partial(FUNCS[kind], shape=(M, N), prob=0.1, transpose=transpose,
                              weight_kind=weight_kind, backend="pallas")
        w = sds(np.shape(weight), jnp.float32)
        if binary:  # bool events have no tangent: the weights'
            jvp = lambda w, s, x, f=f: jax.jvp(lambda w: f(w, s, x), (w,), (w,))
        else:
            jvp = lambda w, s, x, f=f: jax.jvp(lambda w, x: f(w, s, x), (w, x), (w, x))
        cases[f"{weight_kind}-jvp"] = (jvp, (w, seed, x))
        for in_axes, ww, xx in [((0, None, None), batched(w), x),
                                ((0, None, 0), batched(w), batched(x))]:
            cases[f"{weight_kind}-vmap{in_axes}"] = (jax.vmap(f, in_axes=in_axes),
                                                      (ww, seed, xx))
        if binary:
            for events in ("int8", "float32"):
                cases[f"{weight_kind}-{events}"] = (f, (w, seed, sds(xshape, events)))
    compile_cases_for_targets(cases, backend="pallas", expect=dict.fromkeys(
        cases, _kernel_name(transpose, matrix)))
