"""CUDA-source ('cuda_raw') kernels for the four CSR products, and their C++ twin for the CPU.

The kernel bodies are in ``csrc/csr_body.h``, shared by the CUDA kernels and the C++ twin;
this module compiles the libraries and wires them as the kernels' ``cuda_raw`` backend.
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
        The :class:`~primforge.backends.cuda.FFIModule`.

    Example:
        >>> m = load_module('cpu')
        >>> list(m.targets)
        ['PfCsrCpu']
    """
    from primforge.backends import cuda as pcuda

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
