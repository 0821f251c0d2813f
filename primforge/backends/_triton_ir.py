"""Triton IR for XLA: the ``triton`` front end plus Triton's first stage, checked for XLA.

Cached per kernel, pointer dtypes, constexprs, launch options, target and debug; what
XLA's Triton custom call cannot take raises :class:`UnsupportedTritonFeature`.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["DEFAULT_CC", "UnsupportedTritonFeature", "to_ttir"]

_TRITON_DTYPES = {
    "float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64",
    "int8": "i8", "int16": "i16", "int32": "i32", "int64": "i64",
    "uint8": "u8", "uint16": "u16", "uint32": "u32", "uint64": "u64", "bool": "i1",
}


#: Compute capability used when neither the lowering nor this machine names a GPU (a
#: device-less ``lower(lowering_platforms=('cuda',))``): Hopper. The IR depends on it only
#: through tensor descriptors (rewritten to plain pointers below sm_90, which XLA:GPU also
#: does itself when it compiles for such a target) and fp8 conversions.
DEFAULT_CC = 90


def to_ttir(fn, pointer_dtypes: Sequence[Any], constexprs: Mapping[str, Any], *,
            num_warps: int = 4, num_stages: int = 3, cc: int = DEFAULT_CC,
            debug: bool = False) -> str:
    """Triton IR (text) of ``fn`` as XLA receives it, for pointers of ``pointer_dtypes``.

    The installed ``triton`` front end builds the IR for a CUDA target of compute
    capability ``cc`` (no GPU needed) and Triton's own first stage (the one
    ``triton.compile`` runs before any GPU-specific lowering) prepares it: helper
    functions inlined, canonicalised, dead code removed. ``debug=True`` keeps
    ``tl.device_assert`` checks. Raises :class:`UnsupportedTritonFeature` for what XLA's
    Triton pipeline cannot take.

    Example:
        >>> import triton, triton.language as tl
        >>> @triton.jit
        ... def fill(o_ptr, N: tl.constexpr):
        ...     tl.store(o_ptr + tl.arange(0, N), tl.zeros((N,), tl.float32))
        >>> ir = to_ttir(fill, ['float32'], {'N': 8})
        >>> 'tt.call' in ir, 'tt.func public @fill' in ir
        (False, True)
    """
    return _prepared_ir(fn, tuple(np.dtype(d).name for d in pointer_dtypes),
                        tuple(constexprs.items()), num_warps, num_stages, cc, debug)


def _signature(fn, dtype_names: Sequence[str], constexprs: Mapping[str, Any]):
    names = list(fn.arg_names)
    unknown = set(constexprs) - set(names)
    if unknown:
        raise ValueError(
            f"constexprs {sorted(unknown)} are not parameters of {fn.__name__}: {names}")
    ptr_names = [n for n in names if n not in constexprs]
    if len(ptr_names) != len(dtype_names):
        raise ValueError(
            f"the Triton kernel {fn.__name__} has parameters {names}; without the constexprs "
            f"{sorted(constexprs)} it takes {len(ptr_names)} pointer(s) {ptr_names}, but the "
            f"call has {len(dtype_names)} inputs + outputs. Pass every other parameter as "
            f"a constexpr in triton_kernel(..., NAME=value)."
        )
    signature, attrs = {}, {}
    for i, n in enumerate(names):
        if n in constexprs:
            signature[n] = "constexpr"
        else:
            dt = dtype_names[ptr_names.index(n)]
            if dt not in _TRITON_DTYPES:
                raise TypeError(
                    f"the Triton kernel {fn.__name__}: parameter {n!r} would be a pointer to "
                    f"{dt}, which has no Triton pointer type (supported: "
                    f"{sorted(_TRITON_DTYPES)})"
                )
            signature[n] = "*" + _TRITON_DTYPES[dt]
            attrs[(i,)] = [["tt.divisibility", 16]]  # XLA buffers are at least 16-byte aligned
    return signature, attrs


def _prepared_ir(*key) -> str:
    """Front end + Triton's first stage, once per (kernel, dtypes, constexprs, target)."""
    try:
        hash(key)
    except TypeError:  # an unhashable constexpr value: build without the cache
        return _build_ir(*key)
    return _cached_ir(*key)


def _build_ir(fn, dtype_names, constexpr_items, num_warps, num_stages, cc, debug) -> str:
    import triton  # noqa: F401
    from triton._C import libtriton
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import CUDABackend
    from triton.compiler import ASTSource

    constexprs = dict(constexpr_items)
    signature, attrs = _signature(fn, dtype_names, constexprs)
    target = GPUTarget("cuda", cc, 32)
    backend = CUDABackend(target)
    options = backend.parse_options({"num_warps": num_warps, "num_stages": num_stages,
                                     "enable_fp_fusion": True, "debug": debug})
    src = ASTSource(fn, signature=signature, constexprs=constexprs, attrs=attrs)
    context = libtriton.ir.context()
    libtriton.ir.load_dialects(context)
    backend.load_dialects(context)
    module = src.make_ir(target, options, backend.get_codegen_implementation(options),
                         backend.get_module_map(), context)
    # Triton's own first stage, exactly as triton.compile runs it. XLA:GPU runs an
    # equivalent list too, but only after passes of its own: for sm_90 one puts a launch
    # control instruction (griddepcontrol) into every function, which its inliner cannot
    # move, so a helper call such as tl.zeros' survives, gets a result layout its callee
    # does not have, and the compile fails. Handed over inlined, nothing is left to break.
    stages: dict[str, Any] = {}
    backend.add_stages(stages, options, src.language)
    text = str(stages["ttir"](module, {}))
    _check_for_xla(text, fn.__name__, cc)
    return text


_cached_ir = functools.lru_cache(maxsize=256)(_build_ir)


class UnsupportedTritonFeature(ValueError):
    """A ``@triton.jit`` kernel uses something XLA's Triton pipeline cannot compile.

    Raised while the call is lowered, naming the feature, instead of a failure deep in
    XLA:GPU's compiler (or a kernel that silently misbehaves).

    Example:
        >>> issubclass(UnsupportedTritonFeature, ValueError)
        True
    """


def _check_for_xla(ir_text: str, kernel: str, cc: int) -> None:
    """Reject, by name, what XLA's Triton custom call cannot take (each rule measured)."""
    for pattern, min_cc, feature, why in _UNSUPPORTED:
        if cc >= min_cc and re.search(pattern, ir_text):
            raise UnsupportedTritonFeature(
                f"the Triton kernel {kernel!r} uses {feature}, which XLA:GPU's Triton custom "
                f"call cannot take for sm_{cc}: {why}"
            )


#: (regex on the prepared IR, lowest compute capability it applies to, feature, why).
_UNSUPPORTED: tuple[tuple[str, int, str, str], ...] = (
    (r"tt\.call @[^\n]*->[^\n]*tensor<", 0,
     "a helper kept out of line (@triton.jit(noinline=True)) that returns a tensor",
     ("the call's result and the helper's return type get different layouts, and the "
     "compile fails ('tt.call' op result type mismatch). Drop noinline=True (helpers "
     "returning scalars are fine).")),
    (r"tt\.make_tensor_descriptor", 90,
     "a tensor descriptor built on the device (tl.make_tensor_descriptor)",
     ("from sm_90 on, Triton writes the TMA descriptor to a global scratch buffer, and "
     "XLA:GPU's Triton custom call passes a null pointer for it, so the kernel would fault "
     "at run time. Use pointer arithmetic with tl.load/tl.store (below sm_90 Triton "
     "rewrites descriptors to exactly that, and they compile).")),
    (r"\btt\.warp_specialize\b", 90,
     "a warp-specialised loop (tl.range(..., warp_specialize=True))",
     ("from sm_90 on XLA:GPU's warp-specialisation pass stops the whole process with an "
     "LLVM fatal error on it (Triton's own compile refuses it too without device-side "
     "tensor descriptors, which XLA cannot give). Drop warp_specialize=True (below sm_90 "
     "it is ignored).")),
)
