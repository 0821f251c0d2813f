"""The plasticity updates compiled by XLA:GPU for sm_90 and sm_80 (no GPU needed).

Both GPU paths of the compressed update (the opt-in Pallas kernel through Triton and ptxas,
and the jax reference, the GPU default), on rows and on columns, with and without bounds,
float32 and float64 weights, int32 and int64 indices; the dense update's jax path;
``jax.grad`` and ``jax.vmap`` of the Pallas path; and, through the public updates, every
compressed format (CSR, CSC, fixed number per pre and per post) x both sides x bool, int8,
float32 and bit-packed events, with ``jax.jit``, ``jax.grad`` (weights and trace),
``jax.jvp`` and ``jax.vmap`` (events, weights). Numerics of the same kernels are checked on
the CPU in test_ops_plasticity.py and test_ops_matrix.py (the Pallas body interpreted).
"""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
import pytest
from gpu_utils import compile_cases_for_targets, compile_for_targets, requires_gpu_compiler

from primforge import ops
from primforge.ops.plasticity import api as plasticity

pytestmark = requires_gpu_compiler

M, N, NNZ = 37, 45, 300
sds = jax.ShapeDtypeStruct


def _args(on_rows, dtype, index_dtype):
    spikes, trace = (M, N) if on_rows else (N, M)
    return (sds((NNZ,), dtype), sds((NNZ,), index_dtype), sds((M + 1,), index_dtype),
            sds((spikes,), "bool"), sds((trace,), dtype))


def _update(backend, on_rows, bounds):
    lo, hi = bounds
    return functools.partial(plasticity._compressed_call, shape=(M, N), on_rows=on_rows,
                             w_min=lo, w_max=hi, backend=backend)


def _pallas_kernel_present_name(kernel_name, on_rows):
    return kernel_name.startswith("pf_plasticity_rows" if on_rows else "pf_plasticity_cols")


def _pallas_kernel_present(result, on_rows):
    return any(_pallas_kernel_present_name(k.name, on_rows) for k in result.kernels)


@pytest.mark.parametrize("backend", ["pallas", "jax"])
def test_compressed_update_compiles(backend):
    """Rows and columns x free and bounded x two dtype pairs: one XLA:GPU program per target,
    each Pallas case with its own kernel launch."""
    cases, expect = {}, {}
    for on_rows, bounds, (dtype, index_dtype) in itertools.product(
            [True, False], [(None, None), (0.0, 1.0)], [("float32", "int32"),
                                                        ("float64", "int64")]):
        label = "-".join(["rows" if on_rows else "cols",
                          "free" if bounds[0] is None else "bounded", dtype, index_dtype])
        cases[label] = (_update(backend, on_rows, bounds), _args(on_rows, dtype, index_dtype))
        if backend == "pallas":
            name = "pf_plasticity_rows" if on_rows else "pf_plasticity_cols"
            expect[label] = lambda n, name=name: n.startswith(name)
    with jax.enable_x64(True):  # the float64 cases as float64 (JAX 0.11 warns otherwise)
        compile_cases_for_targets(cases, backend=backend, expect=expect)


@pytest.mark.parametrize("on_rows", [True, False], ids=["rows", "cols"])
def test_grad_and_vmap_of_pallas_update_compile(on_rows):
    f = _update("pallas", on_rows, (0.0, 1.0))
    data, idx, ptr, spikes, trace = _args(on_rows, "float32", "int32")

    def loss(d, t, i, p, s):
        return f(d, i, p, s, t).sum()

    compile_for_targets(jax.grad(loss, argnums=(0, 1)), data, trace, idx, ptr, spikes,
                        backend="pallas")
    batched = jax.vmap(f, in_axes=(None, None, None, 0, 0))
    compile_for_targets(batched, data, idx, ptr, sds((4,) + spikes.shape, "bool"),
                        sds((4,) + trace.shape, "float32"), backend="pallas")


def test_dense_update_jax_path_compiles():
    f = functools.partial(plasticity._dense_call, on_rows=True, w_min=0.0, w_max=1.0,
                          backend="jax")
    compile_for_targets(f, sds((M, N), "float32"), sds((M,), "bool"), sds((N,), "float32"),
                        backend="jax")


# ----------------------------------------------------------------------------- public updates
K = 7  # entries per fixed-number row
FORMATS = ("csr", "csc", "fixed_pre", "fixed_post")


def _format(fmt):
    """(weights, structure) shapes and ``wrap(w, *structure)`` -> the matrix, for one format."""
    if fmt in ("csr", "csc"):
        rows = N if fmt == "csc" else M
        cls = ops.CSC if fmt == "csc" else ops.CSR
        return ((sds((NNZ,), "float32"), sds((NNZ,), "int32"), sds((rows + 1,), "int32")),
                lambda w, i, p: cls._unchecked(w, i, p, (M, N)), lambda W: W.data)
    per = fmt.split("_")[1]
    rows = M if per == "pre" else N
    return ((sds((rows, K), "float32"), sds((rows, K), "int32")),
            lambda w, i: ops.FixedNum(w, i, shape=(M, N), per=per), lambda W: W.weights)


def _on_rows(fmt, side):
    if fmt in ("csr", "csc"):
        return (side == "pre") != (fmt == "csc")
    return (side == "pre") == fmt.endswith("pre")


def _spikes(side, events, batch=()):
    n = M if side == "pre" else N
    if events == "packed":
        return sds(batch + (-(-n // 32),), "uint32")
    return sds(batch + (n,), events)


@pytest.mark.parametrize("side", ["pre", "post"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_side_and_transformation_compiles(fmt, side):
    (w, *structure), wrap, unwrap = _format(fmt)
    fn = ops.update_on_pre if side == "pre" else ops.update_on_post
    trace = sds((N if side == "pre" else M,), "float32")

    def update(events):
        def f(w, structure, spikes, trace):
            if events == "packed":
                spikes = ops.PackedEvents(spikes, M if side == "pre" else N)
            return unwrap(fn(wrap(w, *structure), spikes, trace, w_min=0.0, w_max=1.0,
                             backend="pallas"))
        return f

    on_rows = _on_rows(fmt, side)
    cases = {}
    for events in ("bool", "int8", "float32", "packed"):
        cases[events] = (update(events), (w, structure, _spikes(side, events), trace))
    f = update("bool")
    spikes = _spikes(side, "bool")
    loss = lambda w, t, st, s: jnp.sum(jnp.sin(f(w, st, s, t)))
    cases["grad"] = (jax.grad(loss, argnums=(0, 1)), (w, trace, structure, spikes))
    jvp = lambda w, t, st, s: jax.jvp(lambda w, t: f(w, st, s, t), (w, t), (w, t))
    cases["jvp"] = (jvp, (w, trace, structure, spikes))
    batched = lambda a: sds((3,) + a.shape, a.dtype)
    cases["vmap-events-trace"] = (jax.vmap(f, in_axes=(None, None, 0, 0)),
                                  (w, structure, batched(spikes), batched(trace)))
    cases["vmap-weights"] = (jax.vmap(f, in_axes=(0, None, None, None)),
                             (batched(w), structure, spikes, trace))
    # One XLA:GPU program per target; each case must launch its own Pallas kernel.
    compile_cases_for_targets(cases, backend="pallas", expect=dict.fromkeys(
        cases, lambda n: _pallas_kernel_present_name(n, on_rows)))


@pytest.mark.parametrize("backend", ["pallas", "jax"])
def test_column_indexed_update_compiles(backend):
    """A call with a column index (three more int32 operands) on the GPU backends."""
    index = (sds((N + 1,), "int32"), sds((NNZ,), "int32"), sds((NNZ,), "int32"))
    results = compile_for_targets(_update(backend, False, (0.0, 1.0)),
                                  *_args(False, "float32", "int32"), *index, backend=backend)
    if backend == "pallas":
        for target, result in results.items():
            assert _pallas_kernel_present(result, False), (target, result.kernels)
