"""CUDA-source ('cuda_raw') kernels for the four CSR products, and their C++ twin for the CPU.

Design:
    * One header, ``csrc/csr_body.h``, holds the work of one GPU thread as plain functions
      of ``(row, lane, lanes per column group, ...)``, templated on the value type (float,
      double), the index type (int32, int64) and binary/float events. ``PF_HD`` makes them
      ``__host__ __device__`` under nvcc, ``PF_ATOMIC_ADD`` is ``atomicAdd`` there and a plain
      ``+=`` on the host. ``csrc/csr_cuda.cu`` runs them in CUDA kernels, ``csrc/csr_cpu.cc``
      runs the very same functions sequentially over ``(row, lane)``, so the device logic is
      exercised on machines without a GPU.
    * Work layout: a warp (32 lanes) owns one row of ``W`` at a time (grid-stride over rows,
      bounded grid). Its lanes form column groups of ``L = min(32, next_pow2(k))`` lanes
      over ``L`` consecutive columns of ``x`` (coalesced), and the ``32 / L`` groups stride
      over the row's stored entries. A vector is ``k = 1``: every lane walks the row, which
      is the classic warp-per-row kernel, so matvec and matmat share one code path (and
      half the template instances) instead of two near-copies.
    * ``W @ x`` gathers: lane partials, summed over the lanes of a column with
      ``__shfl_down_sync`` (host: a loop). ``W.T @ x`` is event-driven: the warp votes
      (``__any_sync``) whether any ``x[i, :]`` is non-zero and skips the row otherwise; active
      rows scatter ``w * x[i, c]`` (``w`` for binary events) into ``out[indices[e], c]`` with
      atomics, after ``out`` was zeroed with ``cudaMemsetAsync`` on XLA's stream.
    * Malformed structure never causes an out-of-bounds access: each row clamps its range to
      ``[0, nnz]``, lane 0 flags a decreasing ``indptr`` step, one thread checks ``indptr[0]
      == 0`` and ``indptr[m] == nnz``, every visited column index is range-checked. A raised
      flag (a second, int32 FFI output, zeroed first) makes a final small kernel fill the
      whole output with NaN, still on the stream: no extra XLA op and no host sync.
    * One FFI handler per platform (``PfCsrGpu`` / ``PfCsrCpu``) binds ``ffi::AnyBuffer``
      arguments and dispatches on the run-time dtypes; ``homo``, ``transpose`` and ``binary``
      are FFI attributes. Here, at trace time, unsupported value dtypes raise a clear error;
      binary events that are not bool become ``x != 0``; float input is cast to the weights'
      dtype only when it differs; matching int32/int64 ``indices``/``indptr`` pass through
      untouched (other or mixed integer dtypes are cast to a common int32/int64).
    * Each platform's library is compiled once per process (nvcc for 'gpu', the host C++
      compiler for 'cpu') and cached on disk by the backend, whose key covers the local
      headers the source includes, so editing ``csr_body.h`` rebuilds the library. On a
      machine without a GPU the CUDA library still compiles and its targets register, so
      the GPU lowering can be inspected (``lowering_platforms=('cuda',)``); should
      registration fail there, the module is used unregistered, which lowering does not need.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from primforge.ops.csr import structure as _common

__all__ = ["CSRC_DIR", "generator", "load_module"]

CSRC_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc")
_HANDLERS = {"gpu": "PfCsrGpu", "cpu": "PfCsrCpu"}
_NAMES = {"gpu": "pf_csr_cuda", "cpu": "pf_csr_cpu"}


def _visible_gpu() -> bool:
    try:
        return bool(jax.devices("gpu"))
    except RuntimeError:
        return False


def load_module(platform: str, *, register: bool = True, arch: str | None = None):
    """Compile (or fetch from the disk cache) and load the CSR library for ``platform``.

    Args:
        platform: 'gpu' (``csr_cuda.cu`` with nvcc) or 'cpu' (``csr_cpu.cc``, the C++ twin).
        register: register the handler as an XLA FFI target ('gpu' only; False compiles
            only, e.g. to check the CUDA source builds).
        arch: GPU architecture for nvcc (default: the visible GPU, else sm_80 with PTX).

    Returns:
        The :class:`~primforge.kernel.backends.cuda.FFIModule`.

    Example:
        >>> m = load_module('cpu')
        >>> list(m.targets)
        ['PfCsrCpu']
    """
    from primforge.kernel.backends import cuda as pcuda

    if platform == "cpu":
        with open(os.path.join(CSRC_DIR, "csr_cpu.cc"), encoding="utf-8") as f:
            source = f.read()
        return pcuda.load_cpp_inline(source, name=_NAMES["cpu"], handlers=[_HANDLERS["cpu"]],
                                     include_dirs=[CSRC_DIR])
    if platform != "gpu":
        raise ValueError(f"load_module: platform must be 'gpu' or 'cpu', got {platform!r}")
    kwargs = {"name": _NAMES["gpu"], "handlers": [_HANDLERS["gpu"]], "arch": arch}
    path = os.path.join(CSRC_DIR, "csr_cuda.cu")
    if not register:
        return pcuda.load_cuda_file(path, register=False, **kwargs)
    try:
        return pcuda.load_cuda_file(path, **kwargs)
    except (pcuda.CompileError, FileNotFoundError):
        raise
    except (OSError, RuntimeError, ValueError):
        if _visible_gpu():
            raise
        # No GPU: registration is only needed to run, and lowering only needs the name.
        return pcuda.load_cuda_file(path, register=False, **kwargs)


@functools.cache
def _module(platform: str):
    return load_module(platform)


def _index_dtype(a, b) -> np.dtype:
    """int64 when either array needs it (int64, uint32, uint64), else int32."""
    wide = {np.dtype(np.int64), np.dtype(np.uint64), np.dtype(np.uint32)}
    return np.dtype(np.int64) if {np.dtype(a), np.dtype(b)} & wide else np.dtype(np.int32)


def generator(binary: bool, matrix: bool, platform: str) -> Callable[..., Any]:
    """The 'cuda_raw' kernel generator of one CSR product on ``platform`` ('gpu' or 'cpu').

    The returned function takes the kernel's static params (``ins``, ``outs``,
    ``transpose``) and returns the traceable product ``(data, indices, indptr, x) -> y``.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> gen = generator(binary=False, matrix=False, platform='cpu')
        >>> f32, i32 = jnp.float32, jnp.int32
        >>> ins = (jax.ShapeDtypeStruct((3,), f32), jax.ShapeDtypeStruct((3,), i32),
        ...        jax.ShapeDtypeStruct((3,), i32), jax.ShapeDtypeStruct((3,), f32))
        >>> product = gen(ins=ins, outs=(jax.ShapeDtypeStruct((2,), f32),), transpose=False)
        >>> # W = [[1, 0, 2], [0, 3, 0]]
        >>> product(jnp.array([1., 2., 3.]), jnp.array([0, 2, 1]), jnp.array([0, 2, 3]),
        ...         jnp.ones(3))
        Array([3., 3.], dtype=float32)
    """
    kind = ("binary_" if binary else "") + ("csrmm" if matrix else "csrmv")
    if platform not in _HANDLERS:
        raise ValueError(f"{kind}: the 'cuda_raw' backend runs on 'gpu' or 'cpu', not "
                         f"{platform!r}")

    def generate(*, ins, outs, transpose, **_):
        data_s, indices_s, indptr_s, _ = ins
        vdtype = np.dtype(data_s.dtype)
        _common.check_float_weights(kind, "cuda_raw", vdtype)
        # (integer indices are guaranteed by the kernels' shape rule, run before lowering)
        idtype = _index_dtype(indices_s.dtype, indptr_s.dtype)
        homo = _common.is_homogeneous(data_s, indices_s)
        module = _module(platform)
        handler = _HANDLERS[platform]
        flag = jax.ShapeDtypeStruct((1,), jnp.int32)
        out = jax.ShapeDtypeStruct(outs[0].shape, outs[0].dtype)
        attrs = {"homo": bool(homo), "transpose": bool(transpose), "binary": bool(binary)}

        def product(data, indices, indptr, x):
            if indices.dtype != idtype:
                indices = indices.astype(idtype)
            if indptr.dtype != idtype:
                indptr = indptr.astype(idtype)
            if binary:
                if x.dtype != jnp.bool_:
                    x = x != 0
            elif x.dtype != vdtype:
                x = x.astype(vdtype)
            y, _flag = module.call(handler, data, indices, indptr, x, outs=(out, flag), **attrs)
            return y

        return product

    return generate
