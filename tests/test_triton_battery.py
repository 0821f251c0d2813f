"""A battery of real Triton kernels through the Triton backend, proven without a GPU.

Each case is a ``@triton.jit`` kernel registered as a primforge 'triton' kernel. It is
(1) compiled end to end by XLA:GPU for sm_90 (H100) and sm_80 (A100) on compile-only
targets, and (2) run on the CPU by Triton's interpreter (``ptriton.interpret``) and
compared with a NumPy reference. Kernels XLA's Triton custom call cannot take must be
refused by name while the call is lowered.

The kernels live at module level: the interpreter imports them by name in its worker.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import ml_dtypes
import numpy as np
import pytest

triton = pytest.importorskip("triton", reason="optional backend: pip install 'primforge[triton]'")
import triton.language as tl
from gpu_utils import compile_for_targets, lower_for_cuda, requires_gpu_compiler

import primforge
from primforge import testing
from primforge.backends import triton as ptriton

S = jax.ShapeDtypeStruct


# ----------------------------------------------------------------------------- kernels
@triton.jit
def matmul(a_ptr, b_ptr, c_ptr, K: tl.constexpr, N: tl.constexpr,
           BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K, BK):
        a = tl.load(a_ptr + rm[:, None] * K + (k + rk)[None, :])
        b = tl.load(b_ptr + (k + rk)[:, None] * N + rn[None, :])
        acc += tl.dot(a, b)
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc.to(c_ptr.dtype.element_ty))


@triton.jit
def matmul_tl_range(a_ptr, b_ptr, c_ptr, K: tl.constexpr, N: tl.constexpr,
                    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in tl.range(0, K, BK, num_stages=2):
        a = tl.load(a_ptr + rm[:, None] * K + (k + rk)[None, :])
        b = tl.load(b_ptr + (k + rk)[:, None] * N + rn[None, :])
        acc = tl.dot(a, b, acc)
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc)


# Atomics: XLA's outputs start uninitialised, so one program clears its output, waits at a
# barrier, then updates it atomically.
@triton.jit
def histogram(x_ptr, o_ptr, N: tl.constexpr, BINS: tl.constexpr):
    tl.store(o_ptr + tl.arange(0, BINS), tl.zeros((BINS,), tl.int32))
    tl.debug_barrier()
    x = tl.load(x_ptr + tl.arange(0, N))
    tl.atomic_add(o_ptr + x, tl.full((N,), 1, tl.int32))


@triton.jit
def segment_max(x_ptr, seg_ptr, o_ptr, N: tl.constexpr, SEGS: tl.constexpr):
    tl.store(o_ptr + tl.arange(0, SEGS), tl.full((SEGS,), float("-inf"), tl.float32))
    tl.debug_barrier()
    offs = tl.arange(0, N)
    tl.atomic_max(o_ptr + tl.load(seg_ptr + offs), tl.load(x_ptr + offs))


@triton.jit
def compare_and_swap(cur_ptr, cmp_ptr, val_ptr, new_ptr, old_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(new_ptr + offs, tl.load(cur_ptr + offs))
    tl.debug_barrier()
    old = tl.atomic_cas(new_ptr + offs, tl.load(cmp_ptr + offs), tl.load(val_ptr + offs))
    tl.store(old_ptr + offs, old)


@triton.jit
def row_sum_max(x_ptr, sum_ptr, max_ptr, C: tl.constexpr):
    r = tl.program_id(0)
    x = tl.load(x_ptr + r * C + tl.arange(0, C))
    tl.store(sum_ptr + r, tl.sum(x, axis=0))
    tl.store(max_ptr + r, tl.max(x, axis=0))


@triton.jit
def _times(a, b):
    return a * b


@triton.jit
def row_scans(x_ptr, cumsum_ptr, cumprod_ptr, C: tl.constexpr):
    offs = tl.program_id(0) * C + tl.arange(0, C)
    x = tl.load(x_ptr + offs)
    tl.store(cumsum_ptr + offs, tl.cumsum(x, axis=0))
    tl.store(cumprod_ptr + offs, tl.associative_scan(x, 0, _times))


@triton.jit
def bf16_arithmetic(x_ptr, y_ptr, mix_ptr, relu_ptr, cumsum_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    x = tl.load(x_ptr + offs)
    y = tl.load(y_ptr + offs)
    tl.store(mix_ptr + offs, x * y + x - y / 2 + tl.sum(x, axis=0))
    tl.store(relu_ptr + offs, tl.where(x > 0, tl.maximum(x, 0.5), -x))
    tl.store(cumsum_ptr + offs, tl.cumsum(x, axis=0))


@triton.jit
def libdevice_math(x_ptr, o_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    y = tl.extra.cuda.libdevice.erf(x) + tl.extra.cuda.libdevice.atan2(x, 2.0)
    tl.store(o_ptr + offs, y + tl.math.exp(-x * x) + tl.math.rsqrt(x * x + 1.0))


@triton.jit
def bool_int64(mask_ptr, v_ptr, out_ptr, flag_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    m = tl.load(mask_ptr + offs)
    v = tl.load(v_ptr + offs)
    out = tl.where(m, v * 3 + 4_000_000_000, -v)
    tl.store(out_ptr + offs, out)
    tl.store(flag_ptr + offs, (out > 0) ^ m)


@triton.jit
def checked_sqrt(x_ptr, o_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    x = tl.load(x_ptr + offs)
    tl.device_assert(x >= 0, "checked_sqrt: negative input")
    tl.store(o_ptr + offs, tl.sqrt(x))


@triton.jit
def descriptor_scale(x_ptr, o_ptr, M: tl.constexpr, N: tl.constexpr,
                     BM: tl.constexpr, BN: tl.constexpr):
    xd = tl.make_tensor_descriptor(x_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
    od = tl.make_tensor_descriptor(o_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
    m0 = tl.program_id(0) * BM
    n0 = tl.program_id(1) * BN
    od.store([m0, n0], xd.load([m0, n0]) * 2.0)


@triton.jit
def matmul_warp_specialized(a_ptr, b_ptr, c_ptr, K: tl.constexpr, N: tl.constexpr,
                            BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in tl.range(0, K, BK, warp_specialize=True):
        a = tl.load(a_ptr + rm[:, None] * K + (k + rk)[None, :])
        b = tl.load(b_ptr + (k + rk)[:, None] * N + rn[None, :])
        acc = tl.dot(a, b, acc)
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc)


@triton.jit(noinline=True)
def _affine(a, b):
    return a * b + 1


@triton.jit
def scalar_helper_call(x_ptr, o_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    s = _affine(tl.program_id(0) + 2, 3)  # a helper kept out of line, scalar result
    tl.store(o_ptr + offs, tl.load(x_ptr + offs) + s)


@triton.jit(noinline=True)
def _tile(a, BM: tl.constexpr, BN: tl.constexpr):
    return tl.zeros((BM, BN), tl.float32) + a


@triton.jit
def tensor_helper_matmul(a_ptr, b_ptr, c_ptr, K: tl.constexpr, N: tl.constexpr,
                         BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rm = tl.arange(0, BM)
    rn = tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = _tile(0.0, BM, BN)  # a helper kept out of line, tensor result
    for k in range(0, K, BK):
        a = tl.load(a_ptr + rm[:, None] * K + (k + rk)[None, :])
        b = tl.load(b_ptr + (k + rk)[:, None] * N + rn[None, :])
        acc += tl.dot(a, b)
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc)


# ----------------------------------------------------------------------------- cases
@dataclasses.dataclass(frozen=True)
class Case:
    """One battery entry: a launch, its inputs, its outputs and a NumPy reference."""

    name: str
    launch: ptriton.TritonKernel
    inputs: Callable[[np.random.Generator], tuple[np.ndarray, ...]]
    outs: tuple[Any, ...]
    reference: Callable[..., tuple[np.ndarray, ...]]
    rtol: float = 1e-6
    atol: float = 0.0
    debug: bool = False
    #: target -> message fragment: refused at lowering for that target.
    refused: dict = dataclasses.field(default_factory=dict)


def _matmul_case(name, fn, dtype, out_dtype, rtol, atol, m=64, n=64, k=64, refused=None):
    dt = np.dtype(dtype)
    launch = ptriton.triton_kernel(fn, grid=(m // 32, n // 32), num_warps=4, num_stages=2,
                                   K=k, N=n, BM=32, BN=32, BK=16)

    def inputs(rng):
        return (rng.standard_normal((m, k)).astype(dt), rng.standard_normal((k, n)).astype(dt))

    def reference(a, b):
        return ((a.astype(np.float64) @ b.astype(np.float64)).astype(out_dtype),)

    return Case(name, launch, inputs, (S((m, n), out_dtype),), reference, rtol, atol,
                refused=refused or {})


def _bf16_arithmetic(x, y):
    return (x * y + x - y / 2 + x.sum(), np.where(x > 0, np.maximum(x, 0.5), -x), np.cumsum(x))


def _ints(rng, n, hi):
    return rng.integers(0, hi, n).astype(np.int32)


BF16 = np.dtype(ml_dtypes.bfloat16)
CASES = [
    _matmul_case("matmul_f16", matmul, np.float16, np.float16, 2e-2, 5e-2),
    _matmul_case("matmul_bf16", matmul, BF16, BF16, 2e-2, 2e-1),
    # tf32 on the GPU: the tolerance covers its 10-bit mantissa.
    _matmul_case("matmul_f32", matmul, np.float32, np.float32, 1e-2, 5e-2),
    _matmul_case("matmul_tl_range", matmul_tl_range, np.float16, np.float32, 1e-3, 1e-3),
    # XLA:GPU's compiler aborts the process on it for sm_90: refused before it gets there.
    _matmul_case("matmul_warp_specialize", matmul_warp_specialized, np.float16, np.float32,
                 1e-3, 1e-3, refused={"h100": "warp_specialize=True"}),
    Case("atomic_add", ptriton.triton_kernel(histogram, grid=(1,), N=256, BINS=16),
         lambda rng: (_ints(rng, 256, 16),), (S((16,), np.int32),),
         lambda x: (np.bincount(x, minlength=16).astype(np.int32),)),
    Case("atomic_max", ptriton.triton_kernel(segment_max, grid=(1,), N=128, SEGS=8),
         lambda rng: (rng.standard_normal(128).astype(np.float32), _ints(rng, 128, 8)),
         (S((8,), np.float32),),
         lambda x, seg: (np.array([x[seg == s].max(initial=-np.inf) for s in range(8)],
                                  np.float32),)),
    Case("atomic_cas", ptriton.triton_kernel(compare_and_swap, grid=(1,), N=64),
         lambda rng: (_ints(rng, 64, 3), _ints(rng, 64, 3), _ints(rng, 64, 100)),
         (S((64,), np.int32), S((64,), np.int32)),
         lambda cur, cmp, val: (np.where(cur == cmp, val, cur), cur)),
    Case("sum_max", ptriton.triton_kernel(row_sum_max, grid=(8,), C=128),
         lambda rng: (rng.standard_normal((8, 128)).astype(np.float32),),
         (S((8,), np.float32), S((8,), np.float32)),
         lambda x: (x.sum(1), x.max(1)), rtol=1e-5, atol=1e-5),
    Case("cumsum_associative_scan", ptriton.triton_kernel(row_scans, grid=(4,), C=64),
         lambda rng: (rng.uniform(0.5, 1.5, (4, 64)).astype(np.float32),),
         (S((4, 64), np.float32), S((4, 64), np.float32)),
         lambda x: (np.cumsum(x, 1, dtype=np.float64), np.cumprod(x, 1, dtype=np.float64)),
         rtol=1e-5),
    Case("bf16_arithmetic", ptriton.triton_kernel(bf16_arithmetic, grid=(1,), N=64),
         lambda rng: (rng.uniform(-2, 2, 64).astype(BF16), rng.uniform(-2, 2, 64).astype(BF16)),
         (S((64,), BF16),) * 3,
         lambda x, y: _bf16_arithmetic(x.astype(np.float64), y.astype(np.float64)),
         rtol=2e-2, atol=0.25),
    Case("libdevice", ptriton.triton_kernel(libdevice_math, grid=(4,), BLOCK=128),
         lambda rng: (rng.standard_normal(512).astype(np.float32),), (S((512,), np.float32),),
         lambda x: (np.vectorize(__import__("math").erf)(x.astype(np.float64))
                    + np.arctan2(x, 2.0) + np.exp(-x.astype(np.float64) ** 2)
                    + 1 / np.sqrt(x.astype(np.float64) ** 2 + 1),), rtol=1e-5, atol=1e-6),
    Case("bool_int64", ptriton.triton_kernel(bool_int64, grid=(1,), N=64),
         lambda rng: (rng.random(64) < 0.5, rng.integers(-10**12, 10**12, 64)),
         (S((64,), np.int64), S((64,), np.bool_)),
         lambda m, v: (np.where(m, v * 3 + 4_000_000_000, -v),
                       (np.where(m, v * 3 + 4_000_000_000, -v) > 0) ^ m)),
    Case("device_assert", ptriton.triton_kernel(checked_sqrt, grid=(1,), N=64),
         lambda rng: (rng.random(64).astype(np.float32),), (S((64,), np.float32),),
         lambda x: (np.sqrt(x),), debug=True),
    Case("tensor_descriptor",
         ptriton.triton_kernel(descriptor_scale, grid=(2, 2), M=64, N=64, BM=32, BN=32),
         lambda rng: (rng.standard_normal((64, 64)).astype(np.float32),),
         (S((64, 64), np.float32),), lambda x: (2 * x,),
         refused={"h100": "tensor descriptor built on the device"}),
    Case("noinline_scalar_helper", ptriton.triton_kernel(scalar_helper_call, grid=(1,), N=64),
         lambda rng: (rng.standard_normal(64).astype(np.float32),), (S((64,), np.float32),),
         lambda x: (x + 7,)),
    Case("noinline_tensor_helper",
         ptriton.triton_kernel(tensor_helper_matmul, grid=(1,), K=64, N=32, BM=32, BN=32,
                               BK=16),
         lambda rng: (rng.standard_normal((32, 64)).astype(np.float16),
                      rng.standard_normal((64, 32)).astype(np.float16)),
         (S((32, 32), np.float32),), lambda a, b: (a.astype(np.float64) @ b,),
         rtol=1e-3, atol=1e-3,
         refused={"h100": "noinline=True", "a100": "noinline=True"}),
]
IDS = [c.name for c in CASES]


def _kernel(case: Case) -> primforge.XLACustomKernel:
    k = primforge.XLACustomKernel(f"battery_{case.name}", replace=True)
    k.def_triton_kernel(lambda **_: case.launch)
    return k


def _call(case: Case):
    k = _kernel(case)
    outs = case.outs if len(case.outs) > 1 else case.outs[0]
    return lambda *xs: k(*xs, outs=outs)


def _structs(arrays) -> list[S]:
    return [S(a.shape, a.dtype) for a in arrays]


def _mode(case: Case):
    stack = contextlib.ExitStack()
    stack.enter_context(jax.enable_x64(True))  # int64 stays int64 through jax.jit
    if case.debug:
        stack.enter_context(primforge.debug_mode())
    return stack


# ----------------------------------------------------------------------------- tests
@requires_gpu_compiler
@pytest.mark.parametrize("case", [c for c in CASES if len(c.refused) < 2], ids=lambda c: c.name)
def test_battery_compiles_with_xla_gpu(case):
    """XLA:GPU compiles the kernel for every target that does not refuse it."""
    targets = tuple(t for t in ("h100", "a100") if t not in case.refused)
    args = _structs(case.inputs(np.random.default_rng(0)))
    with _mode(case):
        results = compile_for_targets(_call(case), *args, backend="triton", targets=targets)
    for result in results.values():
        assert any(k.name.startswith(case.launch.fn.__name__) for k in result.kernels), (
            result.describe())


@requires_gpu_compiler
@pytest.mark.parametrize("case", [c for c in CASES if c.refused], ids=lambda c: c.name)
def test_battery_refusals_name_the_feature(case):
    """What XLA's Triton pipeline cannot take is refused by name at lowering."""
    args = _structs(case.inputs(np.random.default_rng(0)))
    for target, fragment in case.refused.items():
        with _mode(case), pytest.raises(primforge.KernelError, match="UnsupportedTritonFeature"
                                        ) as info:
            testing.compile_for_gpu(_call(case), *args, target=target)
        assert fragment in str(info.value)
        assert case.launch.fn.__name__ in str(info.value)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_battery_numerics_in_triton_interpreter(case):
    """Triton's interpreter runs the same kernel on the CPU; NumPy says what it must give."""
    inputs = case.inputs(np.random.default_rng(1))
    got = ptriton.interpret(case.launch, *inputs, outs=case.outs)
    want = case.reference(*inputs)
    assert len(got) == len(want) == len(case.outs)
    for g, w, o in zip(got, want, case.outs):
        assert g.shape == tuple(o.shape) and g.dtype == np.dtype(o.dtype)
        np.testing.assert_allclose(np.asarray(g, np.float64), np.asarray(w, np.float64),
                                   rtol=case.rtol, atol=case.atol)


def test_refusals_happen_at_lowering_without_a_gpu_compiler():
    """A device-less CUDA lowering (sm_90 by default) already refuses, before XLA:GPU runs."""
    case = next(c for c in CASES if c.name == "tensor_descriptor")
    args = case.inputs(np.random.default_rng(0))
    with pytest.raises(primforge.KernelError, match="tl.make_tensor_descriptor"):
        lower_for_cuda(_call(case), *args)


def test_device_assert_is_kept_only_in_debug_mode():
    case = next(c for c in CASES if c.name == "device_assert")
    spec = case.launch
    quiet = ptriton.to_ttir(spec.fn, ["float32", "float32"], spec.constexprs)
    checked = ptriton.to_ttir(spec.fn, ["float32", "float32"], spec.constexprs, debug=True)
    assert "tt.assert" not in quiet
    assert "tt.assert" in checked and "checked_sqrt: negative input" in checked


def test_interpreter_catches_an_unwritten_output():
    """Outputs start as NaN, so a kernel that skips elements cannot pass by luck."""
    case = next(c for c in CASES if c.name == "sum_max")
    x = case.inputs(np.random.default_rng(2))[0]
    short = ptriton.triton_kernel(row_sum_max, grid=(7,), C=128)  # one row short
    row_sum, _ = ptriton.interpret(short, x, outs=case.outs)
    np.testing.assert_allclose(row_sum[:7], x[:7].sum(1), rtol=1e-5)
    assert np.isnan(row_sum[7])
