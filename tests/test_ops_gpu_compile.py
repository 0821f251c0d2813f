"""Every GPU variant of the CSR operators, compiled by XLA:GPU for sm_90 and sm_80.

Lowering (``lowering_platforms=('cuda',)``) only proves JAX can emit the program; here
XLA:GPU's compiler runs on it for an H100 and an A100 target description (see
``primforge.testing``): the Pallas kernels go through Triton and ptxas, the cuda_raw calls
must resolve to a handler registered for CUDA. Covered: both GPU backends x the four
products x plain/transposed x one shared weight or one per entry x the weight and index
dtypes, then ``jax.grad`` and ``jax.vmap`` of each product.

Every variant compiles for both targets (the full f32/f64 x i32/i64 sweep: each pair is
its own kernel). Numerics of the same
kernels on the CPU (Pallas interpret mode, the C++ twin) live in test_ops_csr_pallas.py and
test_ops_csr_cuda.py.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest
from gpu_utils import compile_for_targets, requires_gpu_compiler

from primforge import ops
from primforge.kernel.backends import cuda as pcuda

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


def _targets(dtype, index_dtype):
    return ("h100", "a100")


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


def _kernel_present(result, backend):
    """The GPU kernel itself is in the compiled program (not a fallback to jax.numpy)."""
    names = [k.name for k in result.kernels]
    if backend == "pallas":
        return any(n.startswith(("pf_csr_gather", "pf_csr_scatter")) for n in names)
    return any("PfCsrGpu" in n for n in names)


@pytest.mark.parametrize("dtype,index_dtype", DTYPES, ids=lambda v: v)
@pytest.mark.parametrize("homo", [False, True], ids=["hetero", "homo"])
@pytest.mark.parametrize("transpose", [False, True], ids=["W", "WT"])
@pytest.mark.parametrize("kind", list(FUNCS), ids=kind_id)
@pytest.mark.parametrize("backend", BACKENDS)
def test_every_variant_compiles(backend, kind, transpose, homo, dtype, index_dtype):
    x64 = "64" in dtype + index_dtype
    with jax.enable_x64(x64):
        args = _args(kind, transpose, homo, dtype, index_dtype)
        results = compile_for_targets(_product(kind, transpose, backend), *args,
                                      backend=backend, targets=_targets(dtype, index_dtype))
    for result in results.values():
        assert _kernel_present(result, backend), result.describe()


@pytest.mark.parametrize("transpose", [False, True], ids=["W", "WT"])
@pytest.mark.parametrize("kind", [(True, False), (True, True)], ids=kind_id)
@pytest.mark.parametrize("backend", BACKENDS)
def test_float_and_integer_events_compile(backend, kind, transpose):
    """Binary products with events that are not bool (cast to ``x != 0`` in the program)."""
    for event_dtype in ("float32", "int8"):
        args = _args(kind, transpose, False, "float32", "int32", event_dtype)
        compile_for_targets(_product(kind, transpose, backend), *args, backend=backend)


@pytest.mark.parametrize("dtype,index_dtype", DTYPES[:2], ids=lambda v: v)
@pytest.mark.parametrize("homo", [False, True], ids=["hetero", "homo"])
@pytest.mark.parametrize("transpose", [False, True], ids=["W", "WT"])
@pytest.mark.parametrize("kind", list(FUNCS), ids=kind_id)
@pytest.mark.parametrize("backend", BACKENDS)
def test_grad_compiles(backend, kind, transpose, homo, dtype, index_dtype):
    """Reverse mode w.r.t. the weights (and the input, for float products): the transposed
    product runs as a kernel too."""
    binary, _ = kind
    f = _product(kind, transpose, backend)
    argnums = (0,) if binary else (0, 3)

    def loss(data, indices, indptr, x):
        return jnp.sum(jnp.sin(f(data, indices, indptr, x)))

    with jax.enable_x64(dtype == "float64"):
        args = _args(kind, transpose, homo, dtype, index_dtype)
        results = compile_for_targets(jax.grad(loss, argnums=argnums), *args,
                                      backend=backend)
    for result in results.values():
        assert _kernel_present(result, backend), result.describe()


@pytest.mark.parametrize("dtype,index_dtype", DTYPES[:2], ids=lambda v: v)
@pytest.mark.parametrize("transpose", [False, True], ids=["W", "WT"])
@pytest.mark.parametrize("kind", list(FUNCS), ids=kind_id)
@pytest.mark.parametrize("backend", BACKENDS)
def test_vmap_compiles(backend, kind, transpose, dtype, index_dtype):
    """Batched over the input, over the weights, and over both."""
    f = _product(kind, transpose, backend)
    with jax.enable_x64(dtype == "float64"):
        data, indices, indptr, x = _args(kind, transpose, False, dtype, index_dtype)
        batched = lambda a: jax.ShapeDtypeStruct((3, *a.shape), a.dtype)
        for in_axes, d, xx in [((None, None, None, 0), data, batched(x)),
                               ((0, None, None, None), batched(data), x),
                               ((0, None, None, 0), batched(data), batched(x))]:
            results = compile_for_targets(jax.vmap(f, in_axes=in_axes), d, indices, indptr,
                                          xx, backend=backend)
            for result in results.values():
                assert _kernel_present(result, backend), (in_axes, result.describe())


@pytest.mark.parametrize("transpose", [False, True], ids=["W", "WT"])
@pytest.mark.parametrize("kind", list(FUNCS), ids=kind_id)
@pytest.mark.parametrize("backend", BACKENDS)
def test_the_real_gpu_tests_shapes_compile(backend, kind, transpose):
    """The largest shapes the real-GPU tests use: more rows than 65535 blocks x 8 warps, and
    more columns than one column block."""
    binary, matrix = kind
    m, n, nnz, k = 600_000, 64, 1_200_000, 128
    rows_in = m if transpose else n
    sds = jax.ShapeDtypeStruct
    x = sds((rows_in, k) if matrix else (rows_in,), "bool" if binary else "float32")
    args = (sds((nnz,), "float32"), sds((nnz,), "int32"), sds((m + 1,), "int32"), x)
    f = functools.partial(FUNCS[kind], shape=(m, n), transpose=transpose, backend=backend)
    for result in compile_for_targets(f, *args, backend=backend).values():
        assert _kernel_present(result, backend), result.describe()


@pytest.mark.parametrize("homo", [False, True], ids=["hetero", "homo"])
@pytest.mark.parametrize("transpose", [False, True], ids=["W", "WT"])
@pytest.mark.parametrize("kind", list(FUNCS), ids=kind_id)
@pytest.mark.parametrize("backend", BACKENDS)
def test_jvp_compiles(backend, kind, transpose, homo):
    """Forward mode in the weights and (float products) the input: both tangents run as
    kernel calls too."""
    binary, _ = kind
    f = _product(kind, transpose, backend)
    data, indices, indptr, x = _args(kind, transpose, homo, "float32", "int32")
    if binary:  # bool events have no tangent: the weights'
        jvp = lambda d, i, p, x: jax.jvp(lambda d: f(d, i, p, x), (d,), (d,))
    else:
        jvp = lambda d, i, p, x: jax.jvp(lambda d, x: f(d, i, p, x), (d, x), (d, x))
    results = compile_for_targets(jvp, data, indices, indptr, x, backend=backend)
    for result in results.values():
        assert _kernel_present(result, backend), result.describe()
