"""Sharding rules: kernels that run on their own shard instead of gathering everything.

Design:
    * ``def_sharding_rule(kernel, rule)`` stores a :class:`ShardingRule` on the kernel
      (attribute ``_sharding_rule``). Calls are unchanged: the kernel still binds its one
      primitive, so its JVP, transpose and batching rules keep working as they are.
    * The kernel's lowering hands its traceable callable to :func:`partition_lowering`,
      which wraps it in ``jax.experimental.custom_partitioning``. The rule is resolved
      against the call's shapes (``...`` expanded, native batch levels prepended as extra
      factors) into a Shardy rule; Shardy propagates shardings through the call with it,
      and the partition callback maps every factor to mesh axes, keeps the operands as they
      arrive wherever the rule allows, and builds the same kernel for the per-device
      shapes. Factors declared as reductions are summed across devices with ``psum``.
    * Autodiff needs no wrapper: partitioning happens in the lowering of every bind, so the
      tangent and transposed binds made by the kernel's own rules are partitioned too (a
      callable rule sees the call's params and can give a transposed call its own rule).
      Inside ``shard_map`` and on one device, custom_partitioning lowers the kernel as is.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections.abc import Callable, Sequence
from typing import Any

import jax

from primforge import _compat

__all__ = [
    "ShardingRule",
    "def_sharding_rule",
    "get_sharding_rule",
    "partition_lowering",
    "result_avals",
    "result_shardings",
]

#: Attribute of an ``XLACustomKernel`` that holds its :class:`ShardingRule` (or None).
ATTR = "_sharding_rule"

# Factor names made up here start with this prefix; user rules may not use it.
_PREFIX = "pf_"
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*\Z")

RuleSpec = str | Callable[..., Any]


@dataclasses.dataclass(frozen=True)
class ShardingRule:
    """How a kernel's operands and results are partitioned: an einsum-like factor rule.

    Each operand and result lists one factor name per dimension, as in Shardy's
    notation: ``"i j, j -> i"`` says dimension 0 of operand 0 and of the result is the same
    factor ``i`` (shard it and each device computes its rows), while ``j`` appears only in
    operands. A leading ``...`` stands for any number of leading dimensions shared between
    the tensors that carry it (aligned from the right, like broadcasting).

    Attributes:
        rule: the rule string, ``'elementwise'``, or a callable
            ``rule(ins, outs, **params)`` returning either of those (or a
            ``ShardingRule``); ``ins``/``outs`` are tuples of ``jax.ShapeDtypeStruct``
            with per-example shapes and ``params`` are the call's static params.
        reduction_factors: operand-only factors whose partial results are summed: when
            one is sharded, every device runs the kernel on its slice and the outputs are
            added with ``psum`` (right only for kernels that sum over that factor).
        need_replication_factors: factors that must never be sharded.

    Factors that appear only in operands and are not reductions, or only in results, are
    kept whole on every device: a kernel cannot compute a slice of a dimension it does
    not see.

    Example:
        >>> ShardingRule('i j, j -> i').rule
        'i j, j -> i'
    """

    rule: RuleSpec
    reduction_factors: tuple[str, ...] = ()
    need_replication_factors: tuple[str, ...] = ()

    def __post_init__(self):
        if not (isinstance(self.rule, str) or callable(self.rule)):
            raise TypeError(
                f"sharding rule must be a str (e.g. 'i j, j -> i' or 'elementwise') or a "
                f"callable(ins, outs, **params) returning one, got {type(self.rule).__name__}"
            )
        for what in ("reduction_factors", "need_replication_factors"):
            value = getattr(self, what)
            if isinstance(value, str):
                value = (value,)
            value = tuple(value)
            for f in value:
                if not isinstance(f, str) or not _NAME.match(f):
                    raise ValueError(f"{what}: {f!r} is not a factor name (a letter, then "
                                     f"letters, digits or '_')")
            object.__setattr__(self, what, value)
        both = set(self.reduction_factors) & set(self.need_replication_factors)
        if both:
            raise ValueError(
                f"factor(s) {sorted(both)} are both reduction_factors and "
                f"need_replication_factors; a factor has one kind"
            )
        if isinstance(self.rule, str) and self.rule.strip() != "elementwise":
            _parse(self.rule)  # syntax errors surface at definition time


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
    every device. With a rule, each device runs the kernel on its own shards.

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
    if rule is None:
        setattr(kernel, ATTR, None)
        return None
    if isinstance(rule, ShardingRule):
        if reduction_factors or need_replication_factors:
            raise TypeError("def_sharding_rule: give factor kinds inside the ShardingRule "
                            "or as keywords, not both")
        spec = rule
    else:
        spec = ShardingRule(rule, tuple(reduction_factors), tuple(need_replication_factors))
    setattr(kernel, ATTR, spec)
    primitive = getattr(kernel, "primitive", None)
    if primitive is not None:
        # custom_partitioning needs the device assignment while lowering.
        _compat.prim_requires_devices_during_lowering.add(primitive)
    return spec


def get_sharding_rule(kernel: Any) -> ShardingRule | None:
    """The :class:`ShardingRule` of ``kernel``, or None when it has none.

    Example:
        >>> import primforge
        >>> get_sharding_rule(primforge.XLACustomKernel('doc_get_sharding_rule')) is None
        True
    """
    return getattr(kernel, ATTR, None)


# --------------------------------------------------------------------------------------
# Parsing and resolving rules
# --------------------------------------------------------------------------------------

_ELLIPSIS = "..."


def _parse(text: str) -> tuple[list[list[str]], list[list[str]]]:
    """Split ``"a b, b -> a"`` into factor lists; ``...`` is kept as a leading token."""
    if text.count("->") != 1:
        raise ValueError(f"sharding rule {text!r} needs exactly one '->' between operands "
                         f"and results")
    sides = []
    for side in text.split("->"):
        tensors = []
        for piece in side.split(","):
            piece = piece.replace(_ELLIPSIS, f" {_ELLIPSIS} ")
            tokens = piece.split()
            for i, tok in enumerate(tokens):
                if tok == _ELLIPSIS:
                    if i:
                        raise ValueError(f"sharding rule {text!r}: '...' may only lead a "
                                         f"tensor's factors")
                elif "(" in tok or ")" in tok:
                    raise ValueError(f"sharding rule {text!r}: compound factors such as "
                                     f"'(a b)' are not supported; give each dimension one "
                                     f"factor")
                elif not _NAME.match(tok):
                    raise ValueError(f"sharding rule {text!r}: {tok!r} is not a factor name "
                                     f"(a letter, then letters, digits or '_')")
                elif tok.startswith(_PREFIX):
                    raise ValueError(f"sharding rule {text!r}: factor names starting with "
                                     f"{_PREFIX!r} are reserved")
            named = [t for t in tokens if t != _ELLIPSIS]
            if len(set(named)) != len(named):
                raise ValueError(f"sharding rule {text!r}: a factor repeats within one tensor")
            tensors.append(tokens)
        sides.append(tensors)
    return sides[0], sides[1]


@dataclasses.dataclass(frozen=True)
class _Resolved:
    operands: tuple[tuple[str, ...], ...]  # one factor per physical dimension of each input
    results: tuple[tuple[str, ...], ...]
    sizes: dict[str, int]
    reduction: frozenset[str]
    replicated: frozenset[str]  # never sharded (declared, or not computable per shard)
    batch_factors: tuple[str, ...]

    @property
    def text(self) -> str:
        side = lambda ts: ", ".join(" ".join(t) for t in ts)
        return f"{side(self.operands)} -> {side(self.results)}"


def _expand(tensors, shapes, where: str, name: str) -> list[list[str]]:
    """Replace each leading ``...`` by made-up factors, aligned from the right."""
    n_ell = []
    for i, (tokens, shape) in enumerate(zip(tensors, shapes)):
        explicit = [t for t in tokens if t != _ELLIPSIS]
        has = bool(tokens) and tokens[0] == _ELLIPSIS
        extra = len(shape) - len(explicit)
        if extra < 0 or (extra > 0 and not has):
            raise ValueError(
                f"kernel {name!r}: sharding rule names {len(explicit)} dimension(s) for "
                f"{where} {i}, which has shape {tuple(shape)}"
            )
        n_ell.append(extra if has else 0)
    width = max(n_ell, default=0)
    out = []
    for tokens, shape, n in zip(tensors, shapes, n_ell):
        explicit = [t for t in tokens if t != _ELLIPSIS]
        out.append([f"{_PREFIX}e{width - n + k}" for k in range(n)] + explicit)
    return out


def _resolve(kernel, ins, outs, batch, params) -> _Resolved:
    return _resolve_cached(
        kernel.name, getattr(kernel, ATTR), tuple(ins), tuple(outs), tuple(batch),
        tuple(sorted(params.items())),
    )


@functools.lru_cache(maxsize=512)
def _resolve_cached(name, spec, ins, outs, batch, param_items) -> _Resolved:
    params = dict(param_items)
    rule = spec.rule
    if callable(rule):
        rule = rule(ins, outs, **params)
        if isinstance(rule, ShardingRule):
            spec = dataclasses.replace(
                rule,
                reduction_factors=rule.reduction_factors + spec.reduction_factors,
                need_replication_factors=rule.need_replication_factors
                + spec.need_replication_factors,
            )
            rule = rule.rule
        if not isinstance(rule, str):
            raise TypeError(f"kernel {name!r}: the sharding rule callable returned "
                            f"{type(rule).__name__}; it must return a rule string or a "
                            f"ShardingRule")
    if rule.strip() == "elementwise":
        operands, results = [[_ELLIPSIS]] * len(ins), [[_ELLIPSIS]] * len(outs)
    else:
        operands, results = _parse(rule)
    if len(operands) != len(ins) or len(results) != len(outs):
        raise ValueError(
            f"kernel {name!r}: sharding rule {rule!r} describes {len(operands)} operand(s) and "
            f"{len(results)} result(s), but the call has {len(ins)} input(s) and "
            f"{len(outs)} output(s)"
        )
    in_shapes = [tuple(s.shape) for s in ins]
    out_shapes = [tuple(s.shape) for s in outs]
    both = _expand(operands + results, in_shapes + out_shapes, "tensor", name)
    operands, results = both[: len(ins)], both[len(ins):]

    # Native batch levels become leading factors: results carry all of them.
    batch_factors = tuple(f"{_PREFIX}b{level}" for level in range(len(batch)))
    operands = [
        [f for f, (_, mapped) in zip(batch_factors, batch) if mapped[i]] + fs
        for i, fs in enumerate(operands)
    ]
    results = [list(batch_factors) + fs for fs in results]
    in_shapes = [tuple(s for s, m in batch if m[i]) + sh for i, sh in enumerate(in_shapes)]
    out_shapes = [tuple(s for s, _ in batch) + sh for sh in out_shapes]

    replicated = set(spec.need_replication_factors)
    # A size-1 dimension broadcast against a larger one under '...' gets a factor of its
    # own (never sharded).
    seen: dict[str, set[int]] = {}
    for fs, shape in zip(operands + results, in_shapes + out_shapes):
        for f, n in zip(fs, shape):
            seen.setdefault(f, set()).add(n)
    fresh = 0
    for fs, shape in zip(operands + results, in_shapes + out_shapes):
        for d, (f, n) in enumerate(zip(fs, shape)):
            if n == 1 and f.startswith(_PREFIX + "e") and len(seen[f]) == 2 and 1 in seen[f]:
                fs[d] = f"{_PREFIX}u{fresh}"
                fresh += 1
                replicated.add(fs[d])
    sizes: dict[str, int] = {}
    for fs, shape in zip(operands + results, in_shapes + out_shapes):
        for f, n in zip(fs, shape):
            if sizes.setdefault(f, n) != n:
                raise ValueError(
                    f"kernel {name!r}: sharding rule {rule!r} gives factor {f!r} sizes "
                    f"{sizes[f]} and {n}"
                )
    in_ops = {f for fs in operands for f in fs}
    in_res = {f for fs in results for f in fs}
    for kind in ("reduction_factors", "need_replication_factors"):
        unknown = set(getattr(spec, kind)) - in_ops - in_res
        if unknown:
            raise ValueError(f"kernel {name!r}: {kind} {sorted(unknown)} do not appear in "
                             f"sharding rule {rule!r}")
    bad = set(spec.reduction_factors) & in_res
    if bad:
        raise ValueError(f"kernel {name!r}: reduction factor(s) {sorted(bad)} appear in a "
                         f"result of sharding rule {rule!r}; a reduction factor is summed "
                         f"away, so it may appear only in operands")
    reduction = frozenset(spec.reduction_factors)
    replicated |= (in_ops - in_res - reduction) | (in_res - in_ops)
    return _Resolved(
        operands=tuple(tuple(fs) for fs in operands),
        results=tuple(tuple(fs) for fs in results),
        sizes=sizes,
        reduction=reduction,
        replicated=frozenset(replicated - reduction),
        batch_factors=batch_factors,
    )


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


def _assign(res: _Resolved, mesh, operand_specs, result_specs) -> dict[str, tuple[str, ...]]:
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
        batch: the call's native batch levels.
        backend: the call's backend choice.
        context: the call's backend context.
        params: the call's user params.

    Returns:
        A traceable callable with ``fn``'s signature.

    Example:
        >>> import primforge
        >>> k = primforge.XLACustomKernel('doc_partition_lowering')
        >>> f = lambda x: (x,)
        >>> partition_lowering(k, f, platform='cpu', ins=(), outs=()) is f
        True
    """
    if getattr(kernel, ATTR, None) is None:
        return fn
    params = dict(params or {})
    res = _resolve(kernel, tuple(ins), tuple(outs), tuple(batch), params)
    n_in, n_lead = len(ins), len(batch)

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
            jax.ShapeDtypeStruct(_local(r.shape, f, assign, mesh)[n_lead:], r.dtype)
            for r, f in zip(result_shape, res.results)
        )

        def lower_fn(*arrays):
            local_fn = kernel.build(
                platform, ins=local_ins, outs=local_outs, batch=local_batch,
                backend=backend, context=context, **params,
            )
            results = tuple(local_fn(*arrays))
            if reduce_axes:
                results = tuple(jax.lax.psum(r, reduce_axes) for r in results)
            return results

        return mesh, lower_fn, out_sh, in_sh

    def infer(mesh, arg_shapes, result_shape):  # GSPMD propagation (Shardy uses the rule)
        specs = [_spec_of(a.sharding, len(f)) for a, f in zip(arg_shapes, res.operands)]
        assign = _assign(res, mesh, specs, [])
        return tuple(_named(mesh, f, assign) for f in res.results)

    def call(*arrays):
        assert len(arrays) == n_in
        return tuple(fn(*arrays))

    # Shardy wants special factors in the order the factors first appear in the rule.
    order = list(dict.fromkeys(f for fs in res.operands + res.results for f in fs))
    cp = _compat.custom_partitioning(call)
    cp.def_partition(
        partition,
        infer_sharding_from_operands=infer,
        sharding_rule=res.text,
        reduction_factors=tuple(f for f in order if f in res.reduction),
        need_replication_factors=tuple(f for f in order if f in res.replicated),
    )
    return lambda *arrays: tuple(cp(*arrays))


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
    if getattr(kernel, ATTR, None) is None:
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
