"""Triton backend: a real ``@triton.jit`` kernel, compiled and launched by XLA:GPU.

* Available when ``triton`` (extra ``primforge[triton]``) is installed and jaxlib bundles
  the Triton dialect; both are probed lazily.
* Platform: 'gpu' (CUDA).
* Product: a :class:`TritonKernel` made by :func:`triton_kernel` (or a bare
  ``@triton.jit`` function plus ``grid=`` left to default), with the grid (a tuple or a
  function of the constexprs), ``num_warps``, ``num_stages`` and the kernel's
  ``tl.constexpr`` values. The kernel's non-constexpr parameters are the input pointers then
  the output pointers, in order; scalars are passed as constexprs.
* Route (primforge's own launcher, no jax-triton needed): at trace time the pip ``triton``
  front end turns the kernel into Triton IR (TTIR) for the call's dtypes — no GPU needed.
  The IR is re-read with jaxlib's own Triton dialect (so a version mismatch is reported
  here, not at run time) and emitted as XLA's Triton custom call
  (``__gpu$xla.gpu.triton``), the route Pallas uses: XLA:GPU compiles it with its Triton and
  launches it on its stream. Outputs are fresh buffers: the kernel must write every element.
* Testing without a GPU: the full lowering runs on a CPU machine with
  ``jax.jit(f).trace(...).lower(lowering_platforms=('cuda',))``.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import io
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from primforge import _compat

NAME = "triton"
PLATFORMS = ("gpu",)
EXTRA = "triton"

__all__ = [
    "TritonKernel", "is_available", "make_callable", "product_form", "to_ttir", "triton_kernel",
]

_TRITON_DTYPES = {
    "float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64",
    "int8": "i8", "int16": "i16", "int32": "i32", "int64": "i64",
    "uint8": "u8", "uint16": "u16", "uint32": "u32", "uint64": "u64", "bool": "i1",
}


def is_available() -> bool:
    """Whether ``triton`` is installed and jaxlib ships the Triton dialect.

    Example:
        >>> isinstance(is_available(), bool)
        True
    """
    try:
        found = importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):
        found = False
    return found and _compat.triton_dialect() is not None


@dataclasses.dataclass(frozen=True)
class TritonKernel:
    """A ``@triton.jit`` kernel with its launch configuration.

    Attributes:
        fn: the Triton kernel (parameters: input pointers, output pointers, constexprs).
        grid: programs per axis, an int, a tuple of up to 3 ints, or a function of the
            constexpr dict returning one.
        num_warps: warps per program. num_stages: software-pipelining stages.
        constexprs: values of the kernel's ``tl.constexpr`` parameters.

    Example:
        >>> TritonKernel(fn=None, grid=(4,), constexprs={'BLOCK': 128}).num_warps
        4
    """

    fn: Any
    grid: Any = (1,)
    num_warps: int = 4
    num_stages: int = 3
    constexprs: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def triton_kernel(
    fn: Any,
    *,
    grid: int | tuple[int, ...] | Callable[[dict], Any],
    num_warps: int = 4,
    num_stages: int = 3,
    **constexprs: Any,
) -> TritonKernel:
    """Describe a Triton launch for a primforge kernel generator.

    Args:
        fn: a ``@triton.jit`` function whose non-constexpr parameters are the input
            pointers followed by the output pointers.
        grid: number of programs per axis, or ``lambda meta: (...)`` of the constexprs.
        num_warps: warps per program (a power of two).
        num_stages: pipelining stages.
        **constexprs: values for the kernel's ``tl.constexpr`` parameters.

    Example:
        >>> tk = triton_kernel(None, grid=lambda m: (1000 // m['BLOCK'],), BLOCK=250)
        >>> tk.constexprs
        {'BLOCK': 250}
    """
    if not isinstance(num_warps, int) or num_warps <= 0 or num_warps & (num_warps - 1):
        raise ValueError(f"triton_kernel: num_warps must be a power of two, got {num_warps!r}")
    if not isinstance(num_stages, int) or num_stages <= 0:
        raise ValueError(f"triton_kernel: num_stages must be a positive int, got {num_stages!r}")
    return TritonKernel(fn, grid, num_warps, num_stages, dict(constexprs))


def _grid3(grid, constexprs) -> tuple[int, int, int]:
    g = grid(dict(constexprs)) if callable(grid) else grid
    dims = (g,) if isinstance(g, (int, np.integer)) else tuple(g)
    if not 1 <= len(dims) <= 3 or not all(int(d) >= 1 for d in dims):
        raise ValueError(f"Triton grid must be 1 to 3 positive ints, got {g!r}")
    return tuple(int(d) for d in dims) + (1,) * (3 - len(dims))


def to_ttir(fn, pointer_dtypes: Sequence[Any], constexprs: Mapping[str, Any], *,
            num_warps: int = 4, num_stages: int = 3, cc: int = 90) -> str:
    """Triton IR (text) of ``fn`` for pointer arguments of ``pointer_dtypes`` (no GPU needed).

    Uses the installed ``triton`` front end for a CUDA target of compute capability ``cc``.
    """
    import triton  # noqa: F401
    from triton._C import libtriton
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import CUDABackend
    from triton.compiler import ASTSource

    names = list(fn.arg_names)
    unknown = set(constexprs) - set(names)
    if unknown:
        raise ValueError(f"constexprs {sorted(unknown)} are not parameters of {fn.__name__}: {names}")
    ptr_names = [n for n in names if n not in constexprs]
    if len(ptr_names) != len(pointer_dtypes):
        raise ValueError(
            f"the Triton kernel {fn.__name__} has parameters {names}; without the constexprs "
            f"{sorted(constexprs)} it takes {len(ptr_names)} pointer(s) {ptr_names}, but the "
            f"call has {len(pointer_dtypes)} inputs + outputs. Pass every other parameter as "
            f"a constexpr in triton_kernel(..., NAME=value)."
        )
    signature, attrs = {}, {}
    for i, n in enumerate(names):
        if n in constexprs:
            signature[n] = "constexpr"
        else:
            dt = np.dtype(pointer_dtypes[ptr_names.index(n)]).name
            if dt not in _TRITON_DTYPES:
                raise TypeError(f"dtype {dt} has no Triton pointer type")
            signature[n] = "*" + _TRITON_DTYPES[dt]
            attrs[(i,)] = [["tt.divisibility", 16]]  # XLA buffers are at least 16-byte aligned
    target = GPUTarget("cuda", cc, 32)
    backend = CUDABackend(target)
    options = backend.parse_options(
        {"num_warps": num_warps, "num_stages": num_stages, "enable_fp_fusion": True}
    )
    src = ASTSource(fn, signature=signature, constexprs=dict(constexprs), attrs=attrs)
    context = libtriton.ir.context()
    libtriton.ir.load_dialects(context)
    backend.load_dialects(context)
    module = src.make_ir(target, options, backend.get_codegen_implementation(options),
                         backend.get_module_map(), context)
    return str(module)


def _to_xla_bytecode(ttir: str) -> bytes:
    """Re-read TTIR with jaxlib's Triton dialect and serialise it as MLIR bytecode."""
    from jax.interpreters import mlir

    dialect = _compat.triton_dialect()
    ctx = mlir.make_ir_context()
    dialect.register_dialect(ctx)
    with ctx:
        module = mlir.ir.Module.parse(ttir)
        buf = io.BytesIO()
        module.operation.write_bytecode(buf)
    return buf.getvalue()


# -- the primitive that carries a compiled-to-TTIR kernel to XLA's Triton custom call -------
@functools.cache
def _primitive():
    from jax.interpreters import mlir

    prim = _compat.Primitive("primforge_triton_call")
    prim.multiple_results = True

    def abstract(*avals, outs, **_):
        return [_compat.ShapedArray(o.shape, o.dtype) for o in outs]

    def lowering(ctx, *args, ir_bytes, kernel_name, grid, num_warps, num_stages, outs):
        i32 = mlir.ir.IntegerType.get_signless(32)
        config = {
            "name": mlir.ir.StringAttr.get(kernel_name),
            "ir": mlir.ir.StringAttr.get(ir_bytes),
            "num_stages": mlir.ir.IntegerAttr.get(i32, num_stages),
            "num_warps": mlir.ir.IntegerAttr.get(i32, num_warps),
            "grid_x": mlir.ir.IntegerAttr.get(i32, grid[0]),
            "grid_y": mlir.ir.IntegerAttr.get(i32, grid[1]),
            "grid_z": mlir.ir.IntegerAttr.get(i32, grid[2]),
            "debug": mlir.ir.BoolAttr.get(False),
        }
        layouts = lambda avals: [tuple(range(len(a.shape) - 1, -1, -1)) for a in avals]
        return _compat.mlir_custom_call(
            call_target_name="__gpu$xla.gpu.triton",
            result_types=[mlir.ir.RankedTensorType.get(a.shape, mlir.dtype_to_ir_type(a.dtype))
                          for a in ctx.avals_out],
            operands=list(args),
            backend_config=config,
            api_version=4,
            operand_layouts=layouts(ctx.avals_in),
            result_layouts=layouts(ctx.avals_out),
        ).results

    def batch(args, axes, **params):
        size = next(a.shape[ax] for a, ax in zip(args, axes) if ax is not None)
        moved = [jax.numpy.moveaxis(a, ax, 0) if ax is not None else
                 jax.numpy.broadcast_to(a, (size, *a.shape)) for a, ax in zip(args, axes)]
        out = jax.lax.map(lambda xs: tuple(prim.bind(*xs, **params)), tuple(moved))
        return list(out), [0] * len(out)

    prim.def_abstract_eval(abstract)
    mlir.register_lowering(prim, lowering, platform="cuda")
    _compat.batching.primitive_batchers[prim] = batch
    return prim


def _default_cc() -> int:
    try:
        gpus = jax.devices("gpu")
    except RuntimeError:
        gpus = []
    if gpus and getattr(gpus[0], "compute_capability", None):
        return int(str(gpus[0].compute_capability).replace(".", ""))
    return 90


def product_form(product: Any, *, n_ins: int, n_outs: int, name: str) -> str:
    """What a 'triton' kernel generator returned: ``"kernel"`` or ``"callable"``.

    ``"kernel"``: a ``@triton.jit`` function or a :class:`TritonKernel`, which this backend launches (anything else that is not callable
    is reported by :func:`make_callable`). ``"callable"``: any other callable, taken to be
    a traceable JAX function of the inputs (e.g. one that launches the kernel itself); the
    kernel then uses it as it is.

    Example:
        >>> product_form(lambda x: x, n_ins=1, n_outs=1, name='k')
        'callable'
        >>> product_form(42, n_ins=1, n_outs=1, name='k')
        'kernel'
    """
    if isinstance(product, TritonKernel) or hasattr(product, "arg_names") or not callable(product):
        return "kernel"
    return "callable"


def make_callable(
    product: Any,
    *,
    ins: Sequence[jax.ShapeDtypeStruct],
    outs: Sequence[jax.ShapeDtypeStruct],
    platform: str,
    name: str,
) -> Callable[..., tuple[jax.Array, ...]]:
    """Compile a :class:`TritonKernel` to TTIR and return a call of XLA's Triton custom call.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> make_callable('nope', ins=[], outs=[jax.ShapeDtypeStruct((1,), jnp.float32)],
        ...               platform='gpu', name='k')
        Traceback (most recent call last):
        ...
        TypeError: kernel 'k': the 'triton' kernel generator must return primforge.triton_kernel(fn, grid=...), a @triton.jit function or a traceable JAX callable of the inputs, got str
    """
    spec = product if isinstance(product, TritonKernel) else TritonKernel(product)
    if not hasattr(spec.fn, "arg_names"):
        raise TypeError(
            f"kernel {name!r}: the 'triton' kernel generator must return "
            f"primforge.triton_kernel(fn, grid=...), a @triton.jit function or a traceable "
            f"JAX callable of the inputs, got "
            f"{type(product).__name__}"
        )
    if platform != "gpu":
        raise ValueError(f"kernel {name!r}: Triton serves 'gpu' only, not {platform!r}")
    if not is_available():
        raise ImportError(
            "the 'triton' backend needs the triton package and a jaxlib with the Triton "
            "dialect: pip install 'primforge[triton]'"
        )
    dtypes = [s.dtype for s in (*ins, *outs)]
    ttir = to_ttir(spec.fn, dtypes, spec.constexprs, num_warps=spec.num_warps,
                   num_stages=spec.num_stages, cc=_default_cc())
    try:
        ir_bytes = _to_xla_bytecode(ttir)
    except Exception as e:
        import triton

        raise RuntimeError(
            f"kernel {name!r}: jaxlib's Triton dialect could not read the IR produced by "
            f"triton {triton.__version__} ({type(e).__name__}: {e}). Install a triton release "
            f"matching jaxlib {'.'.join(map(str, _compat.jaxlib_version()))}."
        ) from e
    params = {
        "ir_bytes": ir_bytes,
        "kernel_name": spec.fn.__name__,
        "grid": _grid3(spec.grid, spec.constexprs),
        "num_warps": spec.num_warps,
        "num_stages": spec.num_stages,
        "outs": tuple(jax.ShapeDtypeStruct(tuple(o.shape), o.dtype) for o in outs),
    }
    prim = _primitive()

    def call(*arrays):
        return tuple(prim.bind(*arrays, **params))

    return call
