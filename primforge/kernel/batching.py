"""Batching for XLACustomKernel: native (one call for the whole batch) and general (a scan).

Native batching records ``batch`` levels ``(size, mapped)`` in the params;
:func:`general_batching_rule` scans over the batch; :class:`BatchingMixin` chooses between
them and a user's rule.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from primforge.kernel.autodiff import call_rule
from primforge.kernel.errors import KernelError
from primforge.kernel.state import KernelState

__all__ = [
    "BatchingMixin",
    "broadcast_levels",
    "core_struct",
    "general_batching_rule",
    "n_mapped",
    "native_batching_rule",
    "vmap_levels",
]

BatchLevels = tuple[tuple[int, tuple[bool, ...]], ...]


def n_mapped(batch: BatchLevels, i: int) -> int:
    """How many of the batch levels map input ``i`` (its leading batch dimensions).

    Example:
        >>> n_mapped(((3, (True, False)), (4, (True, True))), 1)
        1
    """
    return sum(1 for _, mapped in batch if mapped[i])


def core_struct(aval: Any, n_lead: int) -> jax.ShapeDtypeStruct:
    """The per-example struct of ``aval``: its shape without ``n_lead`` batch dimensions.

    Example:
        >>> import jax
        >>> core_struct(jax.ShapeDtypeStruct((3, 2), 'float32'), 1)
        ShapeDtypeStruct(shape=(2,), dtype=float32)
    """
    return jax.ShapeDtypeStruct(tuple(aval.shape[n_lead:]), aval.dtype)


def _is_mapped(axis) -> bool:
    # JAX marks an unmapped argument with ``None`` (older releases used a sentinel object).
    return axis is not None and isinstance(axis, int)


def general_batching_rule(prim, args: Sequence[Any], axes: Sequence[Any], **params):
    """Batch ``prim`` by scanning over the batch: correct for any kernel, one call per element.

    Every mapped argument has its batch axis moved to the front; unmapped ones are closed
    over. The primitive is bound once per batch element inside ``lax.scan``.

    Args:
        prim: a primitive (single or multiple results).
        args: the batched arguments.
        axes: batch axis per argument (``None`` when not mapped).
        **params: the primitive's parameters, passed through unchanged.

    Returns:
        ``(outputs, out_axes)`` with every output batched along axis 0, in the form the
        primitive returns them (a list for multiple results, one array otherwise); with no
        mapped argument, the plain bind and ``None`` axes.

    Example:
        >>> import jax, jax.numpy as jnp, primforge
        >>> k = primforge.XLACustomKernel('doc_general_batching')
        >>> k.def_kernel('jax', 'cpu', lambda **kw: lambda x: x * 3)
        >>> k.register_general_batching()
        >>> f = lambda x: k(x, outs=jax.ShapeDtypeStruct((2,), jnp.float32))
        >>> jax.vmap(f)(jnp.ones((4, 2))).shape
        (4, 2)
    """
    mapped = [_is_mapped(ax) for ax in axes]
    multiple = bool(getattr(prim, "multiple_results", False))
    if not any(mapped):
        out = prim.bind(*args, **params)
        return (list(out), [None] * len(out)) if multiple else (out, None)
    size = next(a.shape[ax] for a, ax in zip(args, axes) if _is_mapped(ax))
    xs = [jnp.moveaxis(a, ax, 0) for a, ax, m in zip(args, axes, mapped) if m]
    consts = [a for a, m in zip(args, mapped) if not m]

    def body(carry, sliced):
        it_x, it_c = iter(sliced), iter(consts)
        full = [next(it_x) if m else next(it_c) for m in mapped]
        out = prim.bind(*full, **params)
        return carry, (tuple(out) if multiple else out)

    _, outs = jax.lax.scan(body, None, tuple(xs), length=size)
    if not multiple:
        return outs, 0
    return list(outs), [0] * len(outs)


def native_batching_rule(prim, args, axes, *, batch: BatchLevels = (), **params):
    """Add one batch level in front and rebind ``prim``: the batch becomes one kernel call.

    Example:
        >>> import jax, jax.numpy as jnp, primforge
        >>> k = primforge.XLACustomKernel('doc_native_batching')
        >>> k.def_kernel('jax', 'cpu', lambda **kw: lambda x, y: x * y)
        >>> f = lambda x, y: k(x, y, outs=jax.ShapeDtypeStruct((2,), jnp.float32))
        >>> jaxpr = jax.make_jaxpr(jax.vmap(f, in_axes=(0, None)))(jnp.ones((4, 2)), jnp.ones(2))
        >>> jaxpr.eqns[0].params['batch']
        ((4, (True, False)),)
    """
    mapped = tuple(_is_mapped(ax) for ax in axes)
    if not any(mapped):
        outs = prim.bind(*args, batch=tuple(batch), **params)
        return list(outs), [None] * len(outs)
    size = next(a.shape[ax] for a, ax in zip(args, axes) if _is_mapped(ax))
    moved = [jnp.moveaxis(a, ax, 0) if m else a for a, ax, m in zip(args, axes, mapped)]
    outs = prim.bind(*moved, batch=((size, mapped),) + tuple(batch), **params)
    return list(outs), [0] * len(outs)


def vmap_levels(fn: Callable, batch: BatchLevels) -> Callable:
    """Wrap a core (unbatched) callable in one ``jax.vmap`` per batch level.

    The innermost level is applied first, so the result takes physical (batched) arrays.

    Example:
        >>> import jax.numpy as jnp
        >>> f = vmap_levels(lambda x, y: (x + y,), ((3, (True, False)),))
        >>> f(jnp.zeros((3, 2)), jnp.ones(2))[0].shape
        (3, 2)
    """
    for size, mapped in reversed(batch):
        fn = jax.vmap(fn, in_axes=tuple(0 if m else None for m in mapped), axis_size=size)
    return fn


def broadcast_levels(arrays: Sequence[jax.Array], batch: BatchLevels) -> list[jax.Array]:
    """Give every input all batch levels (unmapped inputs are broadcast, not copied per call).

    Example:
        >>> import jax.numpy as jnp
        >>> [a.shape for a in broadcast_levels([jnp.ones((3, 2)), jnp.ones(2)],
        ...                                     ((3, (True, False)),))]
        [(3, 2), (3, 2)]
    """
    sizes = tuple(size for size, _ in batch)
    result = []
    for i, a in enumerate(arrays):
        n_mapped = sum(mapped[i] for _, mapped in batch)
        core = a.shape[n_mapped:]
        # Insert a length-1 axis for every level where this input is not mapped.
        shape, it = [], iter(a.shape[:n_mapped])
        for size, mapped in batch:
            shape.append(next(it) if mapped[i] else 1)
        a = jnp.reshape(a, tuple(shape) + core)
        result.append(jnp.broadcast_to(a, sizes + core))
    return result


class BatchingMixin(KernelState):
    """How ``jax.vmap`` batches the kernel: native (default), general (a scan) or custom.

    Part of :class:`primforge.XLACustomKernel`; owns ``_batching_mode`` and
    ``_custom_batching``.
    """

    def _init_state(self) -> None:
        super()._init_state()
        self._batching_mode = "native"  # 'native', 'general' or 'custom'
        self._custom_batching: Callable | None = None

    def _declared_rules(self) -> tuple[Callable | None, ...]:
        return (*super()._declared_rules(), self._custom_batching)

    def def_batching_rule(self, fun: Callable[..., Any]) -> Callable[..., Any]:
        """Use a custom batching rule ``fun(args, axes, **params) -> (outs, out_axes)``.

        ``params`` holds the call's static params plus ``outs`` and ``backend``.

        Example:
            >>> import jax, jax.numpy as jnp, primforge
            >>> k = primforge.XLACustomKernel('doc_custom_batching')
            >>> k.def_kernel('jax', 'cpu', lambda **kw: lambda x: x * 2)
            >>> def rule(args, axes, *, outs, **params):
            ...     (x,), (ax,) = args, axes
            ...     x = jnp.moveaxis(x, ax, 0)
            ...     big = jax.ShapeDtypeStruct(x.shape, outs[0].dtype)
            ...     return [k(x, outs=big, **params)], [0]
            >>> _ = k.def_batching_rule(rule)
            >>> f = lambda x: k(x, outs=jax.ShapeDtypeStruct((2,), jnp.float32))
            >>> jax.vmap(f)(jnp.ones((3, 2)))[0]
            Array([2., 2.], dtype=float32)
        """
        if not callable(fun):
            raise TypeError("def_batching_rule: fun must be callable")
        self._batching_mode = "custom"
        self._custom_batching = fun
        self._changed()
        return fun

    def register_general_batching(self) -> None:
        """Batch with :func:`general_batching_rule` (a ``lax.scan``, one call per element).

        Example:
            >>> import primforge
            >>> k = primforge.XLACustomKernel('doc_register_general')
            >>> k.register_general_batching()
        """
        self._batching_mode = "general"
        self._changed()

    def register_native_batching(self) -> None:
        """Batch natively (the default): ``vmap`` makes one kernel call for the whole batch.

        Numba kernels loop over the batch inside the compiled handler; other backends hand
        the batch to their own vectorisation; a generator that declares ``batch_shape``
        receives the batch and handles it itself.

        Example:
            >>> import primforge
            >>> k = primforge.XLACustomKernel('doc_register_native')
            >>> k.register_native_batching()
        """
        self._batching_mode = "native"
        self._changed()

    def _batch(self, args, axes, **params):
        if not any(_is_mapped(ax) for ax in axes):
            return self.primitive.bind(*args, **params), [None] * len(params["outs"])
        if self._batching_mode == "native":
            return native_batching_rule(self.primitive, args, axes, **params)
        if self._batching_mode == "general":
            return general_batching_rule(self.primitive, args, axes, **params)
        if params.get("batch"):
            raise KernelError(f"kernel {self.name!r}: custom batching met a native batch level")
        return call_rule(self._custom_batching, params, args, axes)
