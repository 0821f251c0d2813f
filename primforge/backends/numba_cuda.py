"""Numba-CUDA backend: ``@cuda.jit`` kernels launched on XLA's CUDA stream.

Needs ``numba-cuda`` (extra ``primforge[numba-cuda]``). Platforms: 'gpu', and 'cpu' under
Numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``, through ``jax.pure_callback``). The
product is a ``@cuda.jit`` kernel ``kernel(*inputs, *outputs)`` or a
:class:`NumbaCudaKernel` from :func:`numba_cuda_kernel`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import re
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from primforge.backends import _common, _contract
from primforge.backends._ptx_launcher import HANDLER, launcher

NAME = "numba_cuda"
PLATFORMS = ("gpu", "cpu")
EXTRA = "numba-cuda"

__all__ = [
    "NumbaCudaKernel",
    "is_available",
    "launcher",
    "make_callable",
    "numba_cuda_kernel",
    "product_form",
    "simulator_enabled",
]


@functools.cache
def is_available(platform: str | None = None) -> bool:
    """Whether ``numba-cuda`` is installed (checked without importing it), cached.

    'cpu' is served only under Numba's CUDA simulator, which :func:`make_callable` checks.

    Example:
        >>> isinstance(is_available(), bool), is_available('tpu')
        (True, False)
    """
    if platform is not None and platform not in PLATFORMS:
        return False
    return _common.package_installed("numba_cuda")


def simulator_enabled() -> bool:
    """Whether Numba's CUDA simulator is on (``NUMBA_ENABLE_CUDASIM=1``).

    Example:
        >>> isinstance(simulator_enabled(), bool)
        True
    """
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")


@dataclasses.dataclass(frozen=True)
class NumbaCudaKernel:
    """A ``@cuda.jit`` kernel plus its launch configuration (and, optionally, its outputs).

    Made by :func:`numba_cuda_kernel`. Returned from a kernel generator, the kernel's call
    supplies the outputs; with ``outs`` set it is also a traceable JAX callable of its own:
    calling it with the input arrays launches the kernel (on the GPU, or on the CPU under
    Numba's CUDA simulator) and returns one array when ``outs`` was one struct, else a
    tuple. It works under ``jax.jit`` and ``jax.vmap`` (one launch per batch element).

    Attributes:
        kernel: the Numba CUDA kernel, parameters ``(*inputs, *outputs)``.
        grid: blocks per grid (int or up to 3 ints); None covers the first output's size
            with one thread per element.
        block: threads per block (int or up to 3 ints).
        shared_mem: bytes of dynamic shared memory.
        cc: compute capability to compile for, e.g. (9, 0); None: the visible GPU, else
            (8, 0) (the PTX is JIT-compiled by the driver on newer GPUs).
        outs: None, one ``jax.ShapeDtypeStruct`` or a tuple of them.

    Example:
        >>> NumbaCudaKernel(kernel=None, block=128).block
        128
    """

    kernel: Any
    grid: int | tuple[int, ...] | None = None
    block: int | tuple[int, ...] = 256
    shared_mem: int = 0
    cc: tuple[int, int] | None = None
    outs: Any = None

    def out_structs(self) -> tuple[jax.ShapeDtypeStruct, ...] | None:
        """``outs`` as a tuple of structs (None when unset).

        Example:
            >>> import jax, jax.numpy as jnp
            >>> s = jax.ShapeDtypeStruct((2,), jnp.float32)
            >>> NumbaCudaKernel(None, outs=s).out_structs() == (s,)
            True
        """
        if self.outs is None:
            return None
        return self.outs if isinstance(self.outs, tuple) else (self.outs,)

    def __call__(self, *arrays: Any) -> Any:
        outs = self.out_structs()
        if outs is None:
            raise TypeError(
                "a NumbaCudaKernel is called directly only when it knows its outputs: make it "
                "with numba_cuda_kernel(kernel, outs=..., ...) (returned from a kernel "
                "generator, the kernel's call supplies them instead)"
            )
        arrays = tuple(jnp.asarray(a) for a in arrays)
        ins = tuple(jax.ShapeDtypeStruct(tuple(a.shape), a.dtype) for a in arrays)
        platform = "gpu" if jax.default_backend() in ("gpu", "cuda", "rocm") else "cpu"
        try:
            call = _bound_call(self, ins, platform)
        except TypeError as e:  # an unhashable kernel object: build without the cache
            if "unhashable" not in str(e):
                raise
            call = _bound_call.__wrapped__(self, ins, platform)
        results = call(*arrays)
        return results if isinstance(self.outs, tuple) else results[0]


@functools.lru_cache(maxsize=64)
def _bound_call(spec: NumbaCudaKernel, ins: tuple, platform: str) -> Callable:
    py = getattr(spec.kernel, "py_func", spec.kernel)
    return make_callable(spec, ins=ins, outs=spec.out_structs(), platform=platform,
                         name=getattr(py, "__name__", "numba_cuda_kernel"))


def _as_structs(outs) -> Any:
    """``outs`` normalised: one struct stays one, a sequence becomes a tuple of structs."""
    single = not isinstance(outs, Sequence)
    items = (outs,) if single else tuple(outs)
    if not items:
        raise ValueError("numba_cuda_kernel: outs is empty; give at least one output struct")
    structs = []
    for i, o in enumerate(items):
        if not (hasattr(o, "shape") and hasattr(o, "dtype")):
            raise TypeError(
                f"numba_cuda_kernel: outs[{i}] must be a jax.ShapeDtypeStruct (or have .shape "
                f"and .dtype), got {o!r}; e.g. outs=jax.ShapeDtypeStruct(x.shape, x.dtype)"
            )
        structs.append(jax.ShapeDtypeStruct(tuple(o.shape), o.dtype))
    return structs[0] if single else tuple(structs)


# Block shapes used with ``launch_dims``, by number of launch axes (threads_per_block
# decides the 1-D one).
_BLOCK_2D = (16, 16)
_BLOCK_3D = (8, 8, 4)


def _grid_for(launch_dims, threads_per_block, grid, block) -> tuple[tuple, tuple]:
    """``(grid, block)`` covering ``launch_dims`` threads (see :func:`numba_cuda_kernel`)."""
    if grid is not None or block is not None:
        raise ValueError(
            "numba_cuda_kernel: give either launch_dims or grid/block, not both "
            f"(got launch_dims={launch_dims!r}, grid={grid!r}, block={block!r})"
        )
    dims = (launch_dims,) if isinstance(launch_dims, int) else tuple(launch_dims)
    if not 1 <= len(dims) <= 3 or not all(isinstance(d, int) and d > 0 for d in dims):
        raise ValueError(
            f"numba_cuda_kernel: launch_dims must be 1 to 3 positive ints, got {launch_dims!r}"
        )
    if not isinstance(threads_per_block, int) or threads_per_block < 1:
        raise ValueError(
            "numba_cuda_kernel: threads_per_block must be a positive int, got "
            f"{threads_per_block!r}"
        )
    block = {1: (threads_per_block,), 2: _BLOCK_2D, 3: _BLOCK_3D}[len(dims)]
    return tuple(math.ceil(d / b) for d, b in zip(dims, block)), block


def numba_cuda_kernel(
    kernel: Any,
    outs: Any = None,
    *,
    grid: int | tuple[int, ...] | None = None,
    block: int | tuple[int, ...] | None = None,
    launch_dims: int | tuple[int, ...] | None = None,
    threads_per_block: int = 256,
    shared_mem: int = 0,
    cc: tuple[int, int] | None = None,
    vmap_method: str | None = None,
) -> NumbaCudaKernel:
    """Wrap a ``numba.cuda`` kernel with its launch configuration (and outputs).

    The launch is given either as ``grid`` and ``block`` together or as ``launch_dims``;
    the configuration is checked here, before numba-cuda is needed. (A bare ``@cuda.jit``
    kernel returned from a kernel generator is launched with one thread per element of
    the first output, 256 per block.)

    Args:
        kernel: a ``@cuda.jit`` function taking the inputs then the outputs.
        outs: optional ``jax.ShapeDtypeStruct`` (or a sequence of them). With it the result
            can be called directly with the input arrays; without it, return the result
            from a kernel generator, whose call supplies the outputs.
        grid: blocks per grid (with ``block``).
        block: threads per block (with ``grid``).
        launch_dims: instead of ``grid``/``block``: the number of threads wanted along each
            of 1 to 3 axes; blocks of ``threads_per_block`` (1-D), 16x16 (2-D) or 8x8x4
            (3-D) threads, and enough of them to cover ``launch_dims``.
        threads_per_block: block size of a 1-D ``launch_dims`` launch.
        shared_mem: dynamic shared memory in bytes.
        cc: compute capability to compile the PTX for.
        vmap_method: one of ``jax.ffi.ffi_call``'s batching methods, accepted with
            ``launch_dims`` only: under ``jax.vmap`` the kernel is launched once per
            example whichever is named.

    Returns:
        A :class:`NumbaCudaKernel`.

    Raises:
        ValueError: only one of ``grid``/``block``; neither they nor ``launch_dims``;
            both they and ``launch_dims``; ``vmap_method`` with ``grid``/``block``; a
            ``bfloat16`` output (numba-cuda has no bfloat16 type).

    Example:
        >>> numba_cuda_kernel(None, grid=(4, 2), block=(32, 8)).grid
        (4, 2)
        >>> k = numba_cuda_kernel(None, launch_dims=1000, threads_per_block=128)
        >>> k.grid, k.block
        ((8,), (128,))
    """
    _check_launch(grid, block, launch_dims, vmap_method)
    if launch_dims is not None:
        grid, block = _grid_for(launch_dims, threads_per_block, grid, block)
    for what, v in (("grid", grid), ("block", block)):
        if v is None:
            continue
        dims = (v,) if isinstance(v, int) else tuple(v)
        if not 1 <= len(dims) <= 3 or not all(isinstance(d, int) and d > 0 for d in dims):
            raise ValueError(f"numba_cuda_kernel: {what} must be 1 to 3 positive ints, got {v!r}")
    if not isinstance(shared_mem, int) or shared_mem < 0:
        raise ValueError("numba_cuda_kernel: shared_mem must be a non-negative int")
    if outs is not None:
        outs = _as_structs(outs)
        _reject_bfloat16(outs if isinstance(outs, tuple) else (outs,), "numba_cuda_kernel")
    return NumbaCudaKernel(kernel, grid, block, shared_mem, cc, outs)


def _check_launch(grid, block, launch_dims, vmap_method) -> None:
    """The launch-configuration rules of :func:`numba_cuda_kernel` (no numba needed)."""
    _common.check_vmap_method("numba_cuda_kernel", vmap_method)
    explicit = grid is not None or block is not None
    if explicit and launch_dims is not None:
        raise ValueError(
            "numba_cuda_kernel: give either launch_dims or grid/block, not both "
            f"(got launch_dims={launch_dims!r}, grid={grid!r}, block={block!r})"
        )
    if explicit and (grid is None or block is None):
        raise ValueError(
            f"numba_cuda_kernel: 'grid' and 'block' go together, got grid={grid!r}, "
            f"block={block!r}; or give launch_dims (threads wanted per axis) instead"
        )
    if not explicit and launch_dims is None:
        raise ValueError(
            "numba_cuda_kernel: no launch configuration: give 'grid' and 'block', or "
            "'launch_dims' (threads wanted per axis)"
        )
    if explicit and vmap_method is not None:
        raise ValueError(
            f"numba_cuda_kernel: vmap_method={vmap_method!r} goes with launch_dims, not with "
            "an explicit grid/block: give launch_dims to batch this kernel under jax.vmap"
        )


def _reject_bfloat16(structs, where: str, what: str = "outs") -> None:
    for i, o in enumerate(structs):
        if np.dtype(o.dtype) == jnp.bfloat16:
            raise ValueError(
                f"{where}: {what}[{i}] is bfloat16, which numba-cuda kernels cannot take; "
                f"use float16 or float32 (and cast)"
            )


def _dim3(v) -> tuple[int, int, int]:
    dims = (v,) if isinstance(v, int) else tuple(v)
    return tuple(dims) + (1,) * (3 - len(dims))


def _launch_dims(spec: NumbaCudaKernel, outs) -> tuple[tuple[int, ...], tuple[int, ...]]:
    block = _dim3(spec.block)
    if spec.grid is None:
        n = max(1, int(np.prod(outs[0].shape)))
        grid = (math.ceil(n / int(np.prod(block))), 1, 1)
    else:
        grid = _dim3(spec.grid)
    return grid, block


def _numpy_names_numba_cuda_reads() -> None:
    """Give NumPy 2.5+ back ``numpy.row_stack``, the alias of ``numpy.vstack`` it removed.

    numba-cuda up to 0.30 registers an overload for ``numpy.row_stack`` when it first
    compiles, without checking that NumPy still has it, and then fails every compile with
    an ``AttributeError``. The alias is only added where NumPy lacks the name.
    """
    if not hasattr(np, "row_stack"):
        np.row_stack = np.vstack


def compile_ptx(kernel, ins, outs, cc=None) -> tuple[str, str]:
    """PTX and entry name of ``kernel`` for C-contiguous arrays shaped like ``ins + outs``.

    Needs ``numba-cuda`` with NVVM and NVRTC, but no GPU. ``cc`` defaults to the visible
    GPU, else :data:`._common.FALLBACK_COMPUTE_CAPABILITY` (the driver JIT-compiles the PTX
    for newer GPUs).
    """
    import numba
    from numba import cuda

    _numpy_names_numba_cuda_reads()
    py_func = getattr(kernel, "py_func", kernel)
    sig = tuple(
        numba.types.Array(numba.from_dtype(np.dtype(s.dtype)), len(s.shape), "C")
        for s in (*ins, *outs)
    )
    ptx, _ = cuda.compile_ptx(py_func, sig, cc=cc or _common.default_compute_capability())
    m = re.search(r"\.entry\s+([\w$]+)\s*\(", ptx)
    if m is None:
        raise RuntimeError("numba-cuda produced PTX without a kernel entry")
    return ptx, m.group(1)


def _simulated(spec: NumbaCudaKernel, outs, name: str):
    grid, block = _launch_dims(spec, outs)
    grid = tuple(g for g in grid)
    kernel = spec.kernel

    def host(*arrays):
        results = [np.zeros(o.shape, o.dtype) for o in outs]
        # Copies: the simulator writes every argument back, and JAX buffers are read-only.
        kernel[grid, block, 0, spec.shared_mem](*[np.array(a) for a in arrays], *results)
        return tuple(results)

    def call(*arrays):
        return tuple(jax.pure_callback(host, tuple(outs), *arrays, vmap_method="sequential"))

    return call


product_form = _contract.launcher_product_form(
    NAME, "a ``@cuda.jit`` kernel or a :class:`NumbaCudaKernel`",
    lambda p: (isinstance(p, NumbaCudaKernel) or hasattr(p, "py_func")
               or callable(getattr(p, "__getitem__", None))))


def _check_bound_outs(spec: NumbaCudaKernel, outs, name: str) -> None:
    """The outputs a :class:`NumbaCudaKernel` was made with must be the call's."""
    bound = spec.out_structs()
    if bound is not None and [(tuple(o.shape), np.dtype(o.dtype)) for o in bound] != [
        (tuple(o.shape), np.dtype(o.dtype)) for o in outs
    ]:
        raise ValueError(
            f"kernel {name!r}: the generator's numba_cuda_kernel(..., outs=...) declares "
            f"outputs {[(tuple(o.shape), np.dtype(o.dtype).name) for o in bound]} but the "
            f"call's outs are {[(tuple(o.shape), np.dtype(o.dtype).name) for o in outs]}"
        )


def make_callable(
    product: Any,
    *,
    ins: Sequence[jax.ShapeDtypeStruct],
    outs: Sequence[jax.ShapeDtypeStruct],
    platform: str,
    name: str,
    **options: Any,
) -> Callable[..., tuple[jax.Array, ...]]:
    """Turn a ``@cuda.jit`` kernel or :class:`NumbaCudaKernel` into a traceable call.

    On 'gpu' the kernel is compiled to PTX and launched by :func:`launcher` on XLA's
    stream; on 'cpu' (simulator only) it runs through ``jax.pure_callback``. It takes no
    options (``batch=()`` only: the call loops over a batch).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> make_callable(3, ins=[], outs=[jax.ShapeDtypeStruct((1,), jnp.float32)],
        ...               platform='gpu', name='k')
        Traceback (most recent call last):
        ...
        TypeError: kernel 'k': the 'numba_cuda' kernel generator must return a @cuda.jit
        kernel, primforge.numba_cuda_kernel(...) or a traceable JAX callable of the inputs,
        got int
    """
    _common.check_request(NAME, PLATFORMS, EXTRA, is_available, platform=platform,
                          kernel=name, options=options, needs="the numba-cuda package")
    spec = product if isinstance(product, NumbaCudaKernel) else NumbaCudaKernel(product)
    launchable = callable(getattr(spec.kernel, "__getitem__", None))
    if not hasattr(spec.kernel, "py_func") and not launchable:
        raise TypeError(
            f"kernel {name!r}: the 'numba_cuda' kernel generator must return a @cuda.jit kernel, "
            f"primforge.numba_cuda_kernel(...) or a traceable JAX callable of the inputs, got "
            f"{type(product).__name__}"
        )
    _check_bound_outs(spec, outs, name)
    _reject_bfloat16(ins, f"kernel {name!r}", "input")
    _reject_bfloat16(outs, f"kernel {name!r}")
    if platform == "cpu":
        if not simulator_enabled():
            raise ValueError(
                f"kernel {name!r}: numba_cuda kernels run on 'gpu'; on 'cpu' only under Numba's "
                f"CUDA simulator (set NUMBA_ENABLE_CUDASIM=1 before importing numba)"
            )
        return _simulated(spec, outs, name)
    ptx, entry = compile_ptx(spec.kernel, ins, outs, spec.cc)
    grid, block = _launch_dims(spec, outs)
    target = launcher().target(HANDLER)
    attrs = {
        "ptx": ptx, "kernel": entry, "abi": "numba",
        "grid": np.asarray(grid, np.int64), "block": np.asarray(block, np.int64),
        "shared_mem": np.int64(spec.shared_mem),
    }
    ffi = jax.ffi.ffi_call(target, tuple(outs), vmap_method="sequential")

    def call(*arrays):
        return tuple(ffi(*arrays, **attrs))

    return call


class NumbaCudaBackend(_contract.BackendBase):
    """The Numba-CUDA backend as the registry holds it: this module's hooks, bound once."""

    NAME, PLATFORMS, EXTRA = NAME, PLATFORMS, EXTRA
    is_available = staticmethod(is_available)
    make_callable = staticmethod(make_callable)
    product_form = staticmethod(product_form)


#: This module's backend: :func:`primforge.backends.get_backend` registers it on first use.
BACKEND = NumbaCudaBackend()
