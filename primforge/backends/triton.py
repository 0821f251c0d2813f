"""Triton backend: a real ``@triton.jit`` kernel, compiled and launched by XLA:GPU.

Needs ``triton`` (extra ``primforge[triton]``); platform 'gpu'. The product is a
:class:`TritonKernel` from :func:`triton_kernel` (or a bare ``@triton.jit`` function):
its non-constexpr parameters are the input then the output pointers. :func:`interpret`
runs the same kernel on NumPy arrays with Triton's interpreter.
"""

from __future__ import annotations

import dataclasses
import functools
import io
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from primforge import _compat
from primforge.backends import _common, _contract
from primforge.backends._triton_ir import (  # noqa: F401 - also this module's names
    _UNSUPPORTED,
    DEFAULT_CC,
    UnsupportedTritonFeature,
    _build_ir,
    _cached_ir,
    _check_for_xla,
    _prepared_ir,
    _signature,
    to_ttir,
)

NAME = "triton"
PLATFORMS = ("gpu",)
EXTRA = "triton"

__all__ = [
    "DEFAULT_CC", "TritonKernel", "UnsupportedTritonFeature", "interpret", "is_available",
    "make_callable", "product_form", "to_ttir", "triton_kernel",
]

@functools.cache
def is_available(platform: str | None = None) -> bool:
    """Whether ``triton`` is installed and jaxlib ships the Triton dialect (cached).

    The package is found without importing it.

    Example:
        >>> isinstance(is_available(), bool), is_available('cpu')
        (True, False)
    """
    if platform is not None and platform not in PLATFORMS:
        return False
    return _common.package_installed("triton") and _compat.triton_dialect() is not None


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
    spec = TritonKernel(fn, grid, num_warps, num_stages, dict(constexprs))
    _check_launch(spec, "triton_kernel")
    return spec


#: CUDA's limits on a launch, the same on every GPU Triton targets.
_MAX_THREADS_PER_BLOCK = 1024
_MAX_GRID = (2**31 - 1, 65535, 65535)


def _check_launch(spec: TritonKernel, who: str) -> None:
    nw, ns = spec.num_warps, spec.num_stages
    if not isinstance(nw, int) or nw <= 0 or nw & (nw - 1):
        raise ValueError(f"{who}: num_warps must be a power of two, got {nw!r}")
    if nw * 32 > _MAX_THREADS_PER_BLOCK:
        raise ValueError(
            f"{who}: num_warps={nw} makes {nw * 32} threads per program, more than the "
            f"{_MAX_THREADS_PER_BLOCK} a CUDA block may have (XLA:GPU compiles it, the "
            f"launch would fail): use at most {_MAX_THREADS_PER_BLOCK // 32}")
    if not isinstance(ns, int) or ns <= 0:
        raise ValueError(f"{who}: num_stages must be a positive int, got {ns!r}")


def _grid3(grid, constexprs) -> tuple[int, int, int]:
    g = grid(dict(constexprs)) if callable(grid) else grid
    dims = (g,) if isinstance(g, (int, np.integer)) else tuple(g)
    if not 1 <= len(dims) <= 3 or not all(int(d) >= 1 for d in dims):
        raise ValueError(f"Triton grid must be 1 to 3 positive ints, got {g!r}")
    dims = tuple(int(d) for d in dims) + (1,) * (3 - len(dims))
    if any(d > m for d, m in zip(dims, _MAX_GRID)):
        raise ValueError(f"Triton grid {g!r} exceeds CUDA's limits of {_MAX_GRID} programs "
                         f"per axis (x, y, z): put the large count on the first axis")
    return dims


#: Dialects XLA:GPU's Triton reads that jaxlib's Python bindings do not register (the front
#: end emits e.g. ``ttg.barrier`` for ``tl.debug_barrier()``).
_XLA_ONLY_DIALECTS = ("ttg",)


def _to_xla_ir(ttir: str) -> bytes:
    """The IR as the custom call carries it: MLIR bytecode re-read with jaxlib's dialect.

    Re-reading with the Triton dialect of the jaxlib that will compile it reports a
    version mismatch here. IR using a dialect only XLA:GPU itself loads goes as text.
    """
    from primforge._compat import mlir

    dialect = _compat.triton_dialect()
    ctx = mlir.make_ir_context()
    dialect.register_dialect(ctx)
    with ctx:
        try:
            module = mlir.ir.Module.parse(ttir)
        except mlir.ir.MLIRError as e:
            if any(f"Dialect `{d}' not found" in str(e) for d in _XLA_ONLY_DIALECTS):
                return ttir.encode()
            raise
        buf = io.BytesIO()
        module.operation.write_bytecode(buf)
    return buf.getvalue()


@dataclasses.dataclass(frozen=True, eq=False)
class _Launch:
    """What the lowering needs to build the IR once the target GPU is known."""

    fn: Any
    name: str
    dtype_names: tuple[str, ...]
    constexpr_items: tuple[tuple[str, Any], ...]
    num_warps: int
    num_stages: int

    def ir_bytes(self, cc: int, debug: bool) -> bytes:
        text = _prepared_ir(self.fn, self.dtype_names, self.constexpr_items, self.num_warps,
                            self.num_stages, cc, debug)
        try:
            return _to_xla_ir(text)
        except Exception as e:
            import triton

            raise RuntimeError(
                f"kernel {self.name!r}: jaxlib's Triton dialect could not read the IR produced "
                f"by triton {triton.__version__} ({type(e).__name__}: {e}). Install a triton "
                f"release matching jaxlib {_common.jaxlib_version()}."
            ) from e


# -- the primitive that carries a kernel to XLA's Triton custom call ------------------------
@functools.cache
def _primitive():
    from primforge import debug as _debug
    from primforge._compat import mlir

    prim = _compat.Primitive("primforge_triton_call")
    prim.multiple_results = True

    def abstract(*avals, outs, **_):
        return [_compat.ShapedArray(o.shape, o.dtype) for o in outs]

    def lowering(ctx, *args, launch, grid, outs):
        # The IR is built here, not at trace time, because only the lowering knows the
        # GPU it is compiled for (a real device or a compile-only target).
        debug = _debug.enabled()
        ir_bytes = launch.ir_bytes(_default_cc(ctx), debug)
        i32 = mlir.ir.IntegerType.get_signless(32)
        config = {
            "name": mlir.ir.StringAttr.get(launch.fn.__name__),
            "ir": mlir.ir.StringAttr.get(ir_bytes),
            "num_stages": mlir.ir.IntegerAttr.get(i32, launch.num_stages),
            "num_warps": mlir.ir.IntegerAttr.get(i32, launch.num_warps),
            "grid_x": mlir.ir.IntegerAttr.get(i32, grid[0]),
            "grid_y": mlir.ir.IntegerAttr.get(i32, grid[1]),
            "grid_z": mlir.ir.IntegerAttr.get(i32, grid[2]),
            "debug": mlir.ir.BoolAttr.get(debug),
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


def _default_cc(ctx: Any = None) -> int:
    """The compute capability to build for, as Triton writes it (90 for sm_90).

    In order: the GPU the lowering targets (a real device or a compile-only topology's),
    the first local GPU, :data:`DEFAULT_CC` (Triton's own fallback, not the sm_80 other
    backends build PTX for: the lowering names its target, so only a device-less
    cross-lowering gets here, and the IR depends on the target only slightly).
    """
    cc = _common.compute_capability_of(_compat.lowering_devices(ctx)) if ctx is not None else None
    cc = cc or _common.local_compute_capability()
    return DEFAULT_CC if cc is None else cc[0] * 10 + cc[1]


product_form = _contract.launcher_product_form(
    NAME, "a ``@triton.jit`` function or a :class:`TritonKernel`",
    lambda p: isinstance(p, TritonKernel) or hasattr(p, "arg_names"))


def make_callable(
    product: Any,
    *,
    ins: Sequence[jax.ShapeDtypeStruct],
    outs: Sequence[jax.ShapeDtypeStruct],
    platform: str,
    name: str,
    **options: Any,
) -> Callable[..., tuple[jax.Array, ...]]:
    """Check a :class:`TritonKernel` against the call and return a call of XLA's Triton custom call.

    The kernel's parameters are checked here; its IR is built when the call is lowered,
    for the GPU the lowering targets. It takes no options (``batch=()`` only: the call
    loops over a batch).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> make_callable('nope', ins=[], outs=[jax.ShapeDtypeStruct((1,), jnp.float32)],
        ...               platform='gpu', name='k')
        Traceback (most recent call last):
        ...
        TypeError: kernel 'k': the 'triton' kernel generator must return
        primforge.triton_kernel(fn, grid=...), a @triton.jit function or a traceable JAX
        callable of the inputs, got str
    """
    _common.check_request(NAME, PLATFORMS, EXTRA, is_available, platform=platform,
                          kernel=name, options=options,
                          needs="the triton package and a jaxlib with the Triton dialect")
    spec = product if isinstance(product, TritonKernel) else TritonKernel(product)
    if not hasattr(spec.fn, "arg_names"):
        raise TypeError(
            f"kernel {name!r}: the 'triton' kernel generator must return "
            f"primforge.triton_kernel(fn, grid=...), a @triton.jit function or a traceable "
            f"JAX callable of the inputs, got "
            f"{type(product).__name__}"
        )
    _check_launch(spec, f"kernel {name!r}")
    dtype_names = tuple(np.dtype(s.dtype).name for s in (*ins, *outs))
    _signature(spec.fn, dtype_names, spec.constexprs)  # parameter errors at trace time
    launch = _Launch(spec.fn, name, dtype_names, tuple(spec.constexprs.items()),
                     spec.num_warps, spec.num_stages)
    params = {
        "launch": launch,
        "grid": _grid3(spec.grid, spec.constexprs),
        "outs": tuple(jax.ShapeDtypeStruct(tuple(o.shape), o.dtype) for o in outs),
    }
    prim = _primitive()

    def call(*arrays):
        return tuple(prim.bind(*arrays, **params))

    return call


def interpret(
    product: Any,
    *inputs: Any,
    outs: jax.ShapeDtypeStruct | Sequence[jax.ShapeDtypeStruct],
) -> tuple[np.ndarray, ...]:
    """Run a Triton kernel on the CPU with Triton's interpreter; returns NumPy outputs.

    The numbers a GPU would give, without one (no torch needed): each program instance
    of the grid runs in turn on the host with NumPy. ``product`` is what a ``'triton'``
    kernel generator returns (:func:`triton_kernel`, or a bare ``@triton.jit`` function
    with one program). Outputs start as garbage (NaN for floats), as XLA's fresh buffers
    do, so a kernel that skips an element does not pass by luck.

    The interpreter must be switched on before ``triton`` is imported, so unless this
    process runs with ``TRITON_INTERPRET=1``, the kernel runs in a worker process that
    imports it by name: define it at module level in an importable module.

    Args:
        product: a :class:`TritonKernel` or ``@triton.jit`` function.
        *inputs: the input arrays (anything ``np.asarray`` takes).
        outs: the output shape and dtype, or a sequence of them.

    Example (a kernel of an importable module: ``out = x + 1``)::

        >>> from my_kernels import add_one  # doctest: +SKIP
        >>> interpret(triton_kernel(add_one, grid=(1,), N=4), np.zeros(4, np.float32),
        ...           outs=jax.ShapeDtypeStruct((4,), np.float32))  # doctest: +SKIP
        (array([1., 1., 1., 1.], dtype=float32),)

    The call is checked against the kernel before anything runs:

        >>> import triton, triton.language as tl
        >>> @triton.jit
        ... def add_one(x_ptr, o_ptr, N: tl.constexpr):
        ...     offs = tl.arange(0, N)
        ...     tl.store(o_ptr + offs, tl.load(x_ptr + offs) + 1)
        >>> interpret(triton_kernel(add_one, grid=(1,), N=4), np.zeros(4), np.zeros(4),
        ...           outs=jax.ShapeDtypeStruct((4,), np.float32))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: the Triton kernel add_one ... takes 2 pointer(s) ['x_ptr', 'o_ptr'],
        but the call has 3 inputs + outputs...
    """
    from primforge.backends import _triton_interpret as runner

    spec = product if isinstance(product, TritonKernel) else TritonKernel(product)
    out_list = [outs] if hasattr(outs, "shape") else list(outs)
    arrays = [np.asarray(a) for a in inputs]
    names = tuple(np.dtype(a.dtype).name for a in (*arrays, *out_list))
    if hasattr(spec.fn, "arg_names"):
        _signature(spec.fn, names, spec.constexprs)
    grid = _grid3(spec.grid, spec.constexprs)
    out_specs = [(tuple(o.shape), np.dtype(o.dtype).name) for o in out_list]
    if runner.interpreting_here():
        return tuple(runner.run_here(spec.fn, grid, spec.constexprs, arrays, out_specs))
    return tuple(runner.run_in_worker(spec.fn, grid, spec.constexprs, arrays, out_specs))


class TritonBackend(_contract.BackendBase):
    """The Triton backend as the registry holds it: this module's hooks, bound once."""

    NAME, PLATFORMS, EXTRA = NAME, PLATFORMS, EXTRA
    is_available = staticmethod(is_available)
    make_callable = staticmethod(make_callable)
    product_form = staticmethod(product_form)


#: This module's backend: :func:`primforge.backends.get_backend` registers it on first use.
BACKEND = TritonBackend()
