"""Warp backend: ``@wp.kernel`` functions launched through Warp's own JAX interop.

Needs ``warp-lang`` (extra ``primforge[warp]``); platforms 'gpu' and 'cpu'. The product is
a ``wp.Kernel`` (inputs then outputs) or a :class:`WarpKernel` from :func:`warp_kernel`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax

from primforge.backends import _common, _contract

NAME = "warp"
PLATFORMS = ("cpu", "gpu")
EXTRA = "warp"

__all__ = ["WarpKernel", "is_available", "make_callable", "product_form", "warp_kernel"]


@functools.cache
def is_available(platform: str | None = None) -> bool:
    """Whether ``warp`` (warp-lang) is installed here (and serves ``platform``).

    Looks for the package without importing it; that its JAX interop (``wp.jax_kernel``)
    is there is checked when a kernel is built.

    Example:
        >>> isinstance(is_available(), bool), is_available('tpu')
        (True, False)
    """
    if platform is not None and platform not in PLATFORMS:
        return False
    return _common.package_installed("warp")


_NEEDS = "NVIDIA Warp with JAX interop (wp.jax_kernel, package warp-lang)"


def _require_warp():
    """Import warp (once ``is_available`` said it is there) and check its JAX interop."""
    if not is_available():
        raise _common.missing_package(NAME, _NEEDS, EXTRA)
    import warp

    if not hasattr(warp, "jax_kernel"):
        raise _common.missing_package(
            NAME, _NEEDS, EXTRA, f"(warp {getattr(warp, '__version__', '?')} has no jax_kernel)")
    return warp


@dataclasses.dataclass(frozen=True)
class WarpKernel:
    """A Warp kernel plus how to launch it from JAX.

    Attributes:
        kernel: the ``@wp.kernel`` function; its parameters are the inputs (arrays and
            scalars, in order) then the outputs.
        dim: launch dimensions (an int or tuple); None launches over the shape of the first
            output.
        block_dim: threads per block on the GPU (None: Warp's default).
        scalars: values for the kernel's scalar parameters, by name (they are static).
        vmap_method: how the FFI call is batched under ``jax.vmap``.

    Example:
        >>> spec = WarpKernel(kernel=None, dim=8)
        >>> spec.dim, spec.vmap_method
        (8, 'sequential')
    """

    kernel: Any
    dim: int | tuple[int, ...] | None = None
    block_dim: int | None = None
    scalars: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    vmap_method: str = "sequential"


def warp_kernel(
    kernel: Any,
    *,
    dim: int | tuple[int, ...] | None = None,
    block_dim: int | None = None,
    scalars: Mapping[str, Any] | None = None,
    vmap_method: str = "sequential",
) -> WarpKernel:
    """Describe how to launch a ``@wp.kernel`` from a primforge kernel generator.

    Args:
        kernel: the Warp kernel (inputs first, then outputs).
        dim: launch dimensions; default: the shape of the first output.
        block_dim: GPU threads per block.
        scalars: static values for the kernel's scalar parameters, by parameter name.
        vmap_method: batching of the FFI call ('sequential', 'broadcast_all', ...).

    Returns:
        A :class:`WarpKernel` to return from the generator.

    Example:
        >>> warp_kernel(None, dim=(4, 4), scalars={'alpha': 2.0}).scalars
        {'alpha': 2.0}
    """
    if dim is not None:
        dims = (dim,) if isinstance(dim, int) else tuple(dim)
        if not dims or not all(isinstance(d, int) and d >= 0 for d in dims):
            raise ValueError(f"warp_kernel: dim must be a non-negative int or tuple, got {dim!r}")
        dim = dims
    return WarpKernel(kernel, dim, block_dim, dict(scalars or {}), vmap_method)


product_form = _contract.launcher_product_form(
    NAME, "a ``@wp.kernel`` or a :class:`WarpKernel`",
    lambda p: isinstance(p, WarpKernel) or hasattr(p, "adj"))


def _parameter_names(kernel, spec: WarpKernel, n_ins: int, n_out: int,
                     name: str) -> tuple[list[str], list[str]]:
    """The kernel's input and output parameter names, checked against the call."""
    arg_names = [a.label for a in kernel.adj.args]
    in_names = arg_names[: len(arg_names) - n_out]
    out_names = arg_names[len(arg_names) - n_out :]
    array_names = [n for n in in_names if n not in spec.scalars]
    unknown = set(spec.scalars) - set(in_names)
    if unknown:
        raise ValueError(
            f"kernel {name!r}: scalars {sorted(unknown)} are not input parameters of the Warp "
            f"kernel {kernel.key!r} (its inputs: {in_names})"
        )
    if len(array_names) != n_ins:
        raise ValueError(
            f"kernel {name!r}: the Warp kernel {kernel.key!r} has parameters {arg_names}; with "
            f"{n_out} output(s) and scalars {sorted(spec.scalars)} it expects "
            f"{len(array_names)} input array(s) ({array_names}) but the call has {n_ins}"
        )
    return in_names, out_names


def make_callable(
    product: Any,
    *,
    ins: Sequence[jax.ShapeDtypeStruct],
    outs: Sequence[jax.ShapeDtypeStruct],
    platform: str,
    name: str,
    **options: Any,
) -> Callable[..., tuple[jax.Array, ...]]:
    """Turn a ``wp.Kernel`` or :class:`WarpKernel` into a traceable call of ``wp.jax_kernel``.

    It takes no options (``batch=()`` only: the FFI call batches as the
    :class:`WarpKernel`'s ``vmap_method`` says).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> make_callable(42, ins=[], outs=[jax.ShapeDtypeStruct((1,), jnp.float32)],
        ...               platform='cpu', name='k')
        Traceback (most recent call last):
        ...
        TypeError: kernel 'k': the 'warp' kernel generator must return a @wp.kernel,
        primforge.warp_kernel(...) or a traceable JAX callable of the inputs, got int
    """
    _common.check_request(NAME, PLATFORMS, EXTRA, is_available, platform=platform,
                          kernel=name, options=options, needs=_NEEDS)
    spec = product if isinstance(product, WarpKernel) else WarpKernel(product)
    kernel = spec.kernel
    if not hasattr(kernel, "adj") or not hasattr(kernel, "key"):
        raise TypeError(
            f"kernel {name!r}: the 'warp' kernel generator must return a @wp.kernel, "
            f"primforge.warp_kernel(...) or a traceable JAX callable of the inputs, got "
            f"{type(product).__name__}"
        )
    in_names, out_names = _parameter_names(kernel, spec, len(ins), len(outs), name)
    wp = _require_warp()
    dim = spec.dim if spec.dim is not None else tuple(outs[0].shape)
    kwargs: dict[str, Any] = {"num_outputs": len(outs), "vmap_method": spec.vmap_method}
    if spec.block_dim is not None:
        kwargs["block_dim"] = spec.block_dim
    jk = wp.jax_kernel(kernel, **kwargs)
    output_dims = {n: tuple(o.shape) for n, o in zip(out_names, outs)}

    def call(*arrays):
        it = iter(arrays)
        args = [spec.scalars[n] if n in spec.scalars else next(it) for n in in_names]
        result = jk(*args, launch_dims=dim, output_dims=output_dims)
        return tuple(result)

    return call


class WarpBackend(_contract.BackendBase):
    """The Warp backend as the registry holds it: this module's hooks, bound once."""

    NAME, PLATFORMS, EXTRA = NAME, PLATFORMS, EXTRA
    is_available = staticmethod(is_available)
    make_callable = staticmethod(make_callable)
    product_form = staticmethod(product_form)


#: This module's backend: :func:`primforge.backends.get_backend` registers it on first use.
BACKEND = WarpBackend()
