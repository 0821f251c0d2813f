"""Sharding: kernels that run on their own shard instead of gathering everything.

The kernel's sharding-rule field (:class:`ShardingMixin`) and :func:`partition_lowering`,
which wraps a built callable in ``custom_partitioning``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax

from primforge import _compat
from primforge.kernel.sharding_rules import Resolved, RuleSpec, ShardingRule, make_rule, resolve
from primforge.kernel.state import KernelState

__all__ = [
    "ShardingMixin",
    "ShardingRule",
    "def_sharding_rule",
    "get_sharding_rule",
    "partition_lowering",
    "result_avals",
    "result_shardings",
]


class ShardingMixin(KernelState):
    """The kernel's sharding rule: a declared field with a public setter and getter.

    Part of :class:`primforge.XLACustomKernel`; owns ``_sharding_rule``.
    """

    def _init_state(self) -> None:
        super()._init_state()
        self._sharding_rule: ShardingRule | None = None  # set only through def_sharding_rule

    @property
    def sharding_rule(self) -> ShardingRule | None:
        """The kernel's :class:`ShardingRule`, or None when it has none.

        Example:
            >>> import primforge
            >>> primforge.XLACustomKernel('doc_sharding_rule_prop').sharding_rule is None
            True
        """
        return self._sharding_rule

    def def_sharding_rule(
        self,
        rule: RuleSpec | ShardingRule | None,
        *,
        reduction_factors: Sequence[str] = (),
        need_replication_factors: Sequence[str] = (),
    ) -> ShardingRule | None:
        """Partition calls on sharded inputs by ``rule`` instead of gathering them.

        ``rule`` is ``'elementwise'``, an einsum-like string in Shardy's notation (one
        factor per dimension, e.g. ``'i j, j -> i'``), a callable of the call's params
        returning one, a :class:`ShardingRule`, or None to remove the rule. See
        :func:`primforge.kernel.sharding.def_sharding_rule`. Jitted callers re-lower.

        Example:
            >>> import primforge
            >>> k = primforge.XLACustomKernel('doc_sharding_rule_method')
            >>> k.def_kernel('jax', 'cpu', lambda **kw: lambda a, x: a @ x)
            >>> rule = k.def_sharding_rule('i j, j -> i')
            >>> type(rule).__name__, k.sharding_rule is rule
            ('ShardingRule', True)
        """
        spec = make_rule(rule, reduction_factors, need_replication_factors)
        self._sharding_rule = spec
        if spec is not None:
            # custom_partitioning needs the device assignment while lowering.
            _compat.prim_requires_devices_during_lowering.add(self.primitive)
        self._changed()
        return spec


def def_sharding_rule(
    kernel: Any,
    rule: RuleSpec | ShardingRule | None,
    *,
    reduction_factors: Sequence[str] = (),
    need_replication_factors: Sequence[str] = (),
) -> ShardingRule | None:
    """Give ``kernel`` a sharding rule so that sharded calls run shard by shard.

    Under ``jax.jit`` with sharded inputs (``NamedSharding`` on a multi-device mesh) a
    kernel is opaque to XLA's partitioner, which otherwise gathers every operand onto
    every device. With a rule, each device runs the kernel on its own shards. The same as
    ``kernel.def_sharding_rule(rule, ...)``.

    Args:
        kernel: an ``XLACustomKernel``.
        rule: ``'elementwise'`` (every result and every operand share their dimensions,
            aligned from the right as in broadcasting), an einsum-like string in Shardy's
            notation (``"i j, j -> i"``), a callable ``rule(ins, outs, **params)``
            returning one of those, a :class:`ShardingRule`, or None to remove the rule.
        reduction_factors: see :class:`ShardingRule`.
        need_replication_factors: see :class:`ShardingRule`.

    Returns:
        The stored :class:`ShardingRule` (None when removed).

    Example:
        >>> import jax, jax.numpy as jnp, primforge
        >>> from primforge.kernel.sharding import def_sharding_rule
        >>> k = primforge.XLACustomKernel('doc_sharding_rule')
        >>> k.def_kernel('jax', 'cpu', lambda **kw: lambda x: (2 * x,))
        >>> def_sharding_rule(k, 'elementwise').rule
        'elementwise'
        >>> k(jnp.ones(4), outs=jax.ShapeDtypeStruct((4,), jnp.float32))
        Array([2., 2., 2., 2.], dtype=float32)
    """
    if not isinstance(kernel, ShardingMixin):
        raise TypeError(f"def_sharding_rule: 'kernel' must be an XLACustomKernel, got "
                        f"{type(kernel).__name__}")
    return kernel.def_sharding_rule(rule, reduction_factors=reduction_factors,
                                    need_replication_factors=need_replication_factors)


def get_sharding_rule(kernel: Any) -> ShardingRule | None:
    """The :class:`ShardingRule` of ``kernel``, or None when it has none.

    Example:
        >>> import primforge
        >>> get_sharding_rule(primforge.XLACustomKernel('doc_get_sharding_rule')) is None
        True
    """
    return getattr(kernel, "sharding_rule", None)


def _resolve(kernel, ins, outs, batch, params) -> Resolved:
    return resolve(kernel.name, kernel.sharding_rule, tuple(ins), tuple(outs), tuple(batch),
                   tuple(sorted(params.items())))


# --------------------------------------------------------------------------------------
# Partitioning
# --------------------------------------------------------------------------------------


def _axes(entry) -> tuple[str, ...]:
    if entry is None:
        return ()
    if isinstance(entry, str):
        return (entry,)
    return tuple(entry)


def _spec_of(sharding, ndim: int) -> tuple:
    spec = getattr(sharding, "spec", None)
    if spec is None:  # not a NamedSharding: treat as unknown, i.e. keep whole
        return (None,) * ndim
    spec = tuple(spec)
    return spec + (None,) * (ndim - len(spec))


def _assign(res: Resolved, mesh, operand_specs, result_specs) -> dict[str, tuple[str, ...]]:
    """Map factors to mesh axes: operands' shardings first, then results' shardings."""
    assign: dict[str, tuple[str, ...]] = {}
    used: set[str] = set()
    pairs = list(zip(res.operands, operand_specs)) + list(zip(res.results, result_specs))
    for factors, spec in pairs:
        for f, entry in zip(factors, spec):
            axes = _axes(entry)
            if not axes or f in assign or f in res.replicated or used & set(axes):
                continue
            if any(a not in mesh.shape for a in axes):
                continue
            if res.sizes[f] % math.prod(mesh.shape[a] for a in axes):
                continue  # uneven shards would hand the kernel padding
            assign[f] = axes
            used.update(axes)
    return assign


def _named(mesh, factors, assign):
    entries = []
    for f in factors:
        axes = assign.get(f, ())
        entries.append(None if not axes else axes[0] if len(axes) == 1 else axes)
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*entries))


def _local(shape, factors, assign, mesh) -> tuple[int, ...]:
    return tuple(
        n // math.prod(mesh.shape[a] for a in assign.get(f, ())) for n, f in zip(shape, factors)
    )


def partition_lowering(
    kernel: Any,
    fn: Callable[..., Any],
    *,
    platform: str,
    ins: tuple,
    outs: tuple,
    batch: tuple = (),
    backend: str | None = None,
    context: tuple = (),
    params: dict | None = None,
) -> Callable[..., Any]:
    """Wrap a kernel's lowering callable so that it partitions by the kernel's rule.

    Called by ``XLACustomKernel``'s lowering with the callable it built for the call's
    full shapes; returns ``fn`` unchanged when the kernel has no rule. Mostly internal.

    Args:
        kernel: the ``XLACustomKernel``.
        fn: the traceable callable built for the global shapes.
        platform: the platform being lowered for.
        ins: per-example (core) input structs, as the kernel's lowering computed them.
        outs: per-example output structs (the ``outs`` param).
        batch, backend, context, params: the call's native batch levels, backend
            choice, backend context and user params.

    Returns:
        A traceable callable with ``fn``'s signature.

    Example:
        >>> import primforge
        >>> k = primforge.XLACustomKernel('doc_partition_lowering')
        >>> f = lambda x: (x,)
        >>> partition_lowering(k, f, platform='cpu', ins=(), outs=()) is f
        True
    """
    if kernel.sharding_rule is None:
        return fn
    params = dict(params or {})
    res = _resolve(kernel, tuple(ins), tuple(outs), tuple(batch), params)
    n_in = len(ins)

    def call(*arrays):
        if len(arrays) != n_in:
            raise TypeError(
                f"kernel {kernel.name!r}: its partitioned lowering takes {n_in} input "
                f"array(s) ('arrays', one per kernel input), got {len(arrays)}"
            )
        return tuple(fn(*arrays))

    build = {"platform": platform, "backend": backend, "context": context, "params": params}
    # Shardy wants special factors in the order the factors first appear in the rule.
    order = list(dict.fromkeys(f for fs in res.operands + res.results for f in fs))
    cp = _compat.custom_partitioning(call)
    cp.def_partition(
        _partition_callback(kernel, res, tuple(batch), build),
        infer_sharding_from_operands=functools.partial(_infer, res),
        sharding_rule=res.text,
        reduction_factors=tuple(f for f in order if f in res.reduction),
        need_replication_factors=tuple(f for f in order if f in res.replicated),
    )
    return lambda *arrays: tuple(cp(*arrays))


def _infer(res: Resolved, mesh, arg_shapes, result_shape):
    """Result shardings from the operands' (GSPMD propagation; Shardy uses the rule)."""
    specs = [_spec_of(a.sharding, len(f)) for a, f in zip(arg_shapes, res.operands)]
    assign = _assign(res, mesh, specs, [])
    return tuple(_named(mesh, f, assign) for f in res.results)


def _local_structs(res: Resolved, assign, mesh, arg_shapes, result_shape, batch):
    """Per-device batch levels, input structs and output structs under ``assign``."""
    local_batch = tuple(
        (_local((size,), (f,), assign, mesh)[0], mapped)
        for f, (size, mapped) in zip(res.batch_factors, batch)
    )
    local_ins = tuple(
        jax.ShapeDtypeStruct(
            _local(a.shape, f, assign, mesh)[sum(m[i] for _, m in batch):], a.dtype
        )
        for i, (a, f) in enumerate(zip(arg_shapes, res.operands))
    )
    local_outs = tuple(
        jax.ShapeDtypeStruct(_local(r.shape, f, assign, mesh)[len(batch):], r.dtype)
        for r, f in zip(result_shape, res.results)
    )
    return local_batch, local_ins, local_outs


def _partition_callback(kernel, res: Resolved, batch: tuple, build: dict):
    """custom_partitioning's partition callback: shardings, and the per-device kernel."""

    def partition(mesh, arg_shapes, result_shape):
        result_shape = tuple(result_shape)
        assign = _assign(
            res,
            mesh,
            [_spec_of(a.sharding, len(f)) for a, f in zip(arg_shapes, res.operands)],
            [_spec_of(r.sharding, len(f)) for r, f in zip(result_shape, res.results)],
        )
        in_sh = tuple(_named(mesh, f, assign) for f in res.operands)
        out_sh = tuple(_named(mesh, f, assign) for f in res.results)
        reduce_axes = tuple(a for f in sorted(res.reduction) for a in assign.get(f, ()))
        local_batch, local_ins, local_outs = _local_structs(
            res, assign, mesh, arg_shapes, result_shape, batch
        )

        def lower_fn(*arrays):
            local_fn = kernel.build(
                build["platform"], ins=local_ins, outs=local_outs, batch=local_batch,
                backend=build["backend"], context=build["context"], **build["params"],
            )
            results = tuple(local_fn(*arrays))
            if reduce_axes:
                results = tuple(jax.lax.psum(r, reduce_axes) for r in results)
            return results

        return mesh, lower_fn, out_sh, in_sh

    return partition


def result_shardings(kernel: Any, avals: Sequence[Any], *, outs: tuple, batch: tuple = (),
                     params: dict | None = None) -> list | None:
    """Check the kernel's rule at trace time and give its results' shardings in types.

    Called by ``XLACustomKernel``'s abstract evaluation. Resolving the rule here makes a
    rule that does not fit the call fail at trace time. When the inputs carry explicit
    shardings in their types (a mesh with ``AxisType.Explicit`` axes), the results are
    typed as sharded along the same factors; otherwise returns None (types stay as they
    are and the partitioner decides).

    Args:
        kernel: the ``XLACustomKernel``.
        avals: the abstract values of the bind's inputs (physical, batched shapes).
        outs: per-example output structs (the ``outs`` param).
        batch: the bind's native batch levels.
        params: the call's user params.

    Returns:
        One ``NamedSharding`` (on the inputs' abstract mesh) per output, or None.

    Example:
        >>> import jax, jax.numpy as jnp, primforge
        >>> k = primforge.XLACustomKernel('doc_result_shardings')
        >>> _ = def_sharding_rule(k, 'elementwise')
        >>> aval = jax.typeof(jnp.ones(4))
        >>> print(result_shardings(k, [aval], outs=(jax.ShapeDtypeStruct((4,), jnp.float32),)))
        None
    """
    if kernel.sharding_rule is None:
        return None
    n_mapped = [sum(bool(m[i]) for _, m in batch) for i in range(len(avals))]
    ins = tuple(
        jax.ShapeDtypeStruct(tuple(a.shape[n:]), a.dtype) for a, n in zip(avals, n_mapped)
    )
    res = _resolve(kernel, ins, tuple(outs), tuple(batch), dict(params or {}))
    meshes = [getattr(getattr(a, "sharding", None), "mesh", None) for a in avals]
    meshes = [m for m in meshes if m is not None and not getattr(m, "empty", True)]
    if not meshes:
        return None
    mesh = meshes[0]
    specs = [_spec_of(getattr(a, "sharding", None), len(f)) for a, f in zip(avals, res.operands)]
    if not any(_axes(e) for spec in specs for e in spec):
        return None
    assign = _assign(res, mesh, specs, [])
    return [_named(mesh, f, assign) for f in res.results]


def _varying(aval) -> frozenset:
    return _compat.varying_axes(aval)


def result_avals(kernel: Any, avals: Sequence[Any], results: Sequence[Any], *, outs: tuple,
                 batch: tuple = (), params: dict | None = None) -> list:
    """Give a kernel's result avals the mesh context of its inputs (abstract-eval hook).

    Results built from scratch lose what the inputs' types say about the mesh: inside
    ``shard_map`` whether a value varies across manual axes (without it, ``grad`` inside
    ``shard_map`` fails), and under an explicit mesh how it is sharded. Here each result
    is derived from an input aval (``aval.update``): it varies over every manual axis any
    input varies over, and with a sharding rule and explicitly sharded inputs it is typed
    as sharded along the rule's factors (see :func:`result_shardings`). Works for kernels
    without a rule too.

    Args:
        kernel: the ``XLACustomKernel``.
        avals: the bind's input avals.
        results: the result avals computed from ``outs`` (shapes and dtypes are kept).
        outs: per-example output structs (the ``outs`` param).
        batch: the bind's native batch levels.
        params: the call's user params.

    Returns:
        The result avals, one per output.

    Example:
        >>> import jax, jax.numpy as jnp, primforge
        >>> k = primforge.XLACustomKernel('doc_result_avals')
        >>> x = jax.typeof(jnp.ones(3))
        >>> result_avals(k, [x], [x.update(shape=(2,))], outs=())[0].shape
        (2,)
    """
    shardings = result_shardings(kernel, avals, outs=outs, batch=batch, params=params)
    bases = [a for a in avals if hasattr(a, "update") and _compat.varying_kwargs(a)]
    if not bases:
        return list(results)
    varying = frozenset().union(*(_varying(a) for a in bases))
    base = max(bases, key=lambda a: len(_varying(a)))
    mat = _compat.varying_kwargs(base, varying)
    mesh = base.sharding.mesh
    out = []
    for i, r in enumerate(results):
        sh = shardings[i] if shardings else jax.sharding.NamedSharding(
            mesh, jax.sharding.PartitionSpec(*[None] * len(r.shape))
        )
        out.append(base.update(shape=r.shape, dtype=r.dtype, weak_type=False, sharding=sh,
                               **mat))
    return out
