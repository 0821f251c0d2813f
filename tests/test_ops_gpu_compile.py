"""Every GPU variant of the CSR operators, compiled by XLA:GPU for sm_90 and sm_80.

Lowering (``lowering_platforms=('cuda',)``) only proves JAX can emit the program; here
XLA:GPU's compiler runs on it for an H100 and an A100 target description (see
``primforge.testing``): the Pallas kernels go through Triton and ptxas, the cuda_raw calls
must resolve to a handler registered for CUDA. Covered: both GPU backends x the four
products x plain/transposed x one shared weight or one per entry x the weight and index
dtypes, then ``jax.grad`` and ``jax.vmap`` of each product.

Every variant compiles for both targets (the full f32/f64 x i32/i64 sweep: each pair is
its own kernel). The variants of one test go to XLA:GPU as one program (one compile per
target), and each must launch its own kernel (``compile_cases_for_targets``). Numerics of
the same kernels on the CPU (Pallas interpret mode, the C++ twin) live in test_ops_csr_pallas.py and
test_ops_csr_cuda.py.
"""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
import pytest
from gpu_utils import compile_cases_for_targets, requires_gpu_compiler

from primforge import ops
from primforge.backends import cuda as pcuda

FUNCS = {
    (False, False): ops.csrmv,
    (True, False): ops.binary_csrmv,
    (False, True): ops.csrmm,
    (True, True): ops.binary_csrmm,
}
M, N, K, NNZ = 37, 45, 5, 60
BACKENDS = ["pallas", pytest.param("cuda_raw", marks=pytest.mark.skipif(
    pcuda.find_nvcc() is None, reason="nvcc not found (CUDA toolkit or primforge[cuda])"))]
DTYPES = [("float32", "int32"), ("float64", "int64"), ("float32", "int64"),
          ("float64", "int32")]

pytestmark = requires_gpu_compiler


def kind_id(kind):
    binary, matrix = kind
    return ("binary_" if binary else "") + ("csrmm" if matrix else "csrmv")


def _args(kind, transpose, homo, dtype, index_dtype, event_dtype=None):
    binary, matrix = kind
    rows_in = M if transpose else N
    xshape = (rows_in, K) if matrix else (rows_in,)
    sds = jax.ShapeDtypeStruct
    return (sds((1,) if homo else (NNZ,), dtype), sds((NNZ,), index_dtype),
            sds((M + 1,), index_dtype),
            sds(xshape, event_dtype or ("bool" if binary else dtype)))


def _product(kind, transpose, backend):
    return functools.partial(FUNCS[kind], shape=(M, N), transpose=transpose, backend=backend)


def _kernel_name(backend):
    """The GPU kernel itself is in the compiled program (not a fallback to jax.numpy)."""
    if backend == "pallas":
        return lambda n: n.startswith(("pf_csr_gather", "pf_csr_scatter"))
    return lambda n: "PfCsrGpu" in n


def _compile(cases, backend, check_kernels=True):
    expect = {label: _kernel_name(backend) for label in cases} if check_kernels else None
    return compile_cases_for_targets(cases, backend=backend, expect=expect)


def _label(kind, transpose, *more):
    return "-".join([kind_id(kind), "WT" if transpose else "W", *more])


VARIANTS = list(itertools.product(FUNCS, [False, True], [False, True]))  # kind, transpose, homo


@pytest.mark.parametrize("dtype,index_dtype", DTYPES, ids=lambda v: v)
@pytest.mark.parametrize("backend", BACKENDS)
def test_every_variant_compiles(backend, dtype, index_dtype):
    """Each product x plain/transposed x one shared weight or one per entry."""
    x64 = "64" in dtype + index_dtype
    with jax.enable_x64(x64):
        _compile({_label(kind, transpose, "homo" if homo else "hetero"): (
            _product(kind, transpose, backend), _args(kind, transpose, homo, dtype, index_dtype))
            for kind, transpose, homo in VARIANTS}, backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_float_and_integer_events_compile(backend):
    """Binary products with events that are not bool (cast to ``x != 0`` in the program)."""
    _compile({_label(kind, transpose, event_dtype): (
        _product(kind, transpose, backend),
        _args(kind, transpose, False, "float32", "int32", event_dtype))
        for kind in [(True, False), (True, True)] for transpose in (False, True)
        for event_dtype in ("float32", "int8")}, backend, check_kernels=False)


@pytest.mark.parametrize("dtype,index_dtype", DTYPES[:2], ids=lambda v: v)
@pytest.mark.parametrize("backend", BACKENDS)
def test_grad_compiles(backend, dtype, index_dtype):
    """Reverse mode w.r.t. the weights (and the input, for float products): the transposed
    product runs as a kernel too."""

    def grad(kind, transpose):
        binary, _ = kind
        f = _product(kind, transpose, backend)

        def loss(data, indices, indptr, x):
            return jnp.sum(jnp.sin(f(data, indices, indptr, x)))

        return jax.grad(loss, argnums=(0,) if binary else (0, 3))

    with jax.enable_x64(dtype == "float64"):
        _compile({_label(kind, transpose, "homo" if homo else "hetero"): (
            grad(kind, transpose), _args(kind, transpose, homo, dtype, index_dtype))
            for kind, transpose, homo in VARIANTS}, backend)


@pytest.mark.parametrize("dtype,index_dtype", DTYPES[:2], ids=lambda v: v)
@pytest.mark.parametrize("backend", BACKENDS)
def test_vmap_compiles(backend, dtype, index_dtype):
    """Batched over the input, over the weights, and over both."""
    cases = {}
    with jax.enable_x64(dtype == "float64"):
        for kind, transpose in itertools.product(FUNCS, [False, True]):
            f = _product(kind, transpose, backend)
            data, indices, indptr, x = _args(kind, transpose, False, dtype, index_dtype)
            batched = lambda a: jax.ShapeDtypeStruct((3, *a.shape), a.dtype)
            for in_axes, d, xx in [((None, None, None, 0), data, batched(x)),
                                   ((0, None, None, None), batched(data), x),
                                   ((0, None, None, 0), batched(data), batched(x))]:
                cases[_label(kind, transpose, str(in_axes))] = (
                    jax.vmap(f, in_axes=in_axes), (d, indices, indptr, xx))
        _compile(cases, backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_real_gpu_tests_shapes_compile(backend):
    """The largest shapes the real-GPU tests use: more rows than 65535 blocks x 8 warps, and
    more columns than one column block."""
    m, n, nnz, k = 600_000, 64, 1_200_000, 128
    sds = jax.ShapeDtypeStruct
    cases = {}
    for kind, transpose in itertools.product(FUNCS, [False, True]):
        binary, matrix = kind
        rows_in = m if transpose else n
        x = sds((rows_in, k) if matrix else (rows_in,), "bool" if binary else "float32")
        args = (sds((nnz,), "float32"), sds((nnz,), "int32"), sds((m + 1,), "int32"), x)
        f = functools.partial(FUNCS[kind], shape=(m, n), transpose=transpose, backend=backend)
        cases[_label(kind, transpose)] = (f, args)
    _compile(cases, backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_jvp_compiles(backend):
    """Forward mode in the weights and (float products) the input: both tangents run as
    kernel calls too."""

    def jvp(kind, transpose):
        binary, _ = kind
        f = _product(kind, transpose, backend)
        if binary:  # bool events have no tangent: the weights'
            return lambda d, i, p, x: jax.jvp(lambda d: f(d, i, p, x), (d,), (d,))
        return lambda d, i, p, x: jax.jvp(lambda d, x: f(d, i, p, x), (d, x), (d, x))

    _compile({_label(kind, transpose, "homo" if homo else "hetero"): (
        jvp(kind, transpose), _args(kind, transpose, homo, "float32", "int32"))
        for kind, transpose, homo in VARIANTS}, backend)
