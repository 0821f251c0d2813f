"""Sharding rules: their definition, parsing, and resolution against a call's shapes.

:class:`ShardingRule` holds what the user declared; :func:`resolve` turns it and a call's
shapes into a :class:`Resolved` rule (cached per signature). Nothing here knows kernels.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["Resolved", "RuleSpec", "ShardingRule", "make_rule", "resolve"]

# Factor names made up here start with this prefix; user rules may not use it.
PREFIX = "pf_"
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*\Z")
_ELLIPSIS = "..."

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


def make_rule(
    rule: RuleSpec | ShardingRule | None,
    reduction_factors: Sequence[str] = (),
    need_replication_factors: Sequence[str] = (),
) -> ShardingRule | None:
    """The :class:`ShardingRule` that ``def_sharding_rule``'s arguments describe.

    Example:
        >>> make_rule('i, i -> i', reduction_factors=()).rule
        'i, i -> i'
        >>> make_rule(None) is None
        True
    """
    if rule is None:
        return None
    if isinstance(rule, ShardingRule):
        if reduction_factors or need_replication_factors:
            raise TypeError("def_sharding_rule: give factor kinds inside the ShardingRule "
                            "or as keywords, not both")
        return rule
    return ShardingRule(rule, tuple(reduction_factors), tuple(need_replication_factors))


def _check_token(text: str, i: int, tok: str) -> None:
    if tok == _ELLIPSIS:
        if i:
            raise ValueError(f"sharding rule {text!r}: '...' may only lead a tensor's factors")
    elif "(" in tok or ")" in tok:
        raise ValueError(f"sharding rule {text!r}: compound factors such as '(a b)' are not "
                         f"supported; give each dimension one factor")
    elif not _NAME.match(tok):
        raise ValueError(f"sharding rule {text!r}: {tok!r} is not a factor name (a letter, "
                         f"then letters, digits or '_')")
    elif tok.startswith(PREFIX):
        raise ValueError(f"sharding rule {text!r}: factor names starting with {PREFIX!r} are "
                         f"reserved")


def _parse(text: str) -> tuple[list[list[str]], list[list[str]]]:
    """Split ``"a b, b -> a"`` into factor lists; ``...`` is kept as a leading token."""
    if text.count("->") != 1:
        raise ValueError(f"sharding rule {text!r} needs exactly one '->' between operands "
                         f"and results")
    sides = []
    for side in text.split("->"):
        tensors = []
        for piece in side.split(","):
            tokens = piece.replace(_ELLIPSIS, f" {_ELLIPSIS} ").split()
            for i, tok in enumerate(tokens):
                _check_token(text, i, tok)
            named = [t for t in tokens if t != _ELLIPSIS]
            if len(set(named)) != len(named):
                raise ValueError(f"sharding rule {text!r}: a factor repeats within one tensor")
            tensors.append(tokens)
        sides.append(tensors)
    return sides[0], sides[1]


@dataclasses.dataclass(frozen=True)
class Resolved:
    """A rule resolved for one call: one factor per physical dimension of every tensor."""

    operands: tuple[tuple[str, ...], ...]
    results: tuple[tuple[str, ...], ...]
    sizes: dict[str, int]
    reduction: frozenset[str]
    replicated: frozenset[str]  # never sharded (declared, or not computable per shard)
    batch_factors: tuple[str, ...]

    @property
    def text(self) -> str:
        """The rule in Shardy's notation."""
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
    for tokens, n in zip(tensors, n_ell):
        explicit = [t for t in tokens if t != _ELLIPSIS]
        out.append([f"{PREFIX}e{width - n + k}" for k in range(n)] + explicit)
    return out


def _rule_text(name, spec: ShardingRule, ins, outs, params) -> tuple[str, ShardingRule]:
    """The rule string for this call (a callable rule is asked), with the factor kinds."""
    rule = spec.rule
    if not callable(rule):
        return rule, spec
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
    return rule, spec


def _core_factors(name, rule: str, ins, outs):
    """Per-example factor lists of the operands and results, ``...`` expanded."""
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
    shapes = [tuple(s.shape) for s in ins] + [tuple(s.shape) for s in outs]
    both = _expand(operands + results, shapes, "tensor", name)
    return both[: len(ins)], both[len(ins):]


def _singletons(tensors, shapes) -> set[str]:
    """Give a size-1 dimension broadcast under ``...`` a factor of its own (kept whole).

    Rewrites ``tensors`` in place and returns the new factors.
    """
    seen: dict[str, set[int]] = {}
    for fs, shape in zip(tensors, shapes):
        for f, n in zip(fs, shape):
            seen.setdefault(f, set()).add(n)
    fresh: set[str] = set()
    for fs, shape in zip(tensors, shapes):
        for d, (f, n) in enumerate(zip(fs, shape)):
            if n == 1 and f.startswith(PREFIX + "e") and len(seen[f]) == 2 and 1 in seen[f]:
                fs[d] = f"{PREFIX}u{len(fresh)}"
                fresh.add(fs[d])
    return fresh


def _sizes(name, rule, tensors, shapes) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for fs, shape in zip(tensors, shapes):
        for f, n in zip(fs, shape):
            if sizes.setdefault(f, n) != n:
                raise ValueError(
                    f"kernel {name!r}: sharding rule {rule!r} gives factor {f!r} sizes "
                    f"{sizes[f]} and {n}"
                )
    return sizes


def _check_kinds(name, rule, spec: ShardingRule, in_ops: set, in_res: set) -> None:
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


@functools.lru_cache(maxsize=512)
def resolve(name: str, spec: ShardingRule, ins: tuple, outs: tuple, batch: tuple,
            param_items: tuple) -> Resolved:
    """Resolve ``spec`` for one call of kernel ``name`` (cached per signature).

    ``ins`` and ``outs`` hold per-example structs, ``batch`` the call's native batch
    levels and ``param_items`` its sorted static params.

    Example:
        >>> import jax
        >>> s = jax.ShapeDtypeStruct((4, 3), 'float32')
        >>> v = jax.ShapeDtypeStruct((3,), 'float32')
        >>> out = jax.ShapeDtypeStruct((4,), 'float32')
        >>> r = resolve('k', ShardingRule('i j, j -> i'), (s, v), (out,), (), ())
        >>> r.text, sorted(r.replicated)
        ('i j, j -> i', ['j'])
    """
    rule, spec = _rule_text(name, spec, ins, outs, dict(param_items))
    operands, results = _core_factors(name, rule, ins, outs)
    # Native batch levels become leading factors: results carry all of them.
    batch_factors = tuple(f"{PREFIX}b{level}" for level in range(len(batch)))
    operands = [
        [f for f, (_, mapped) in zip(batch_factors, batch) if mapped[i]] + fs
        for i, fs in enumerate(operands)
    ]
    results = [list(batch_factors) + fs for fs in results]
    shapes = [tuple(s for s, m in batch if m[i]) + tuple(a.shape) for i, a in enumerate(ins)]
    shapes += [tuple(s for s, _ in batch) + tuple(o.shape) for o in outs]

    replicated = set(spec.need_replication_factors) | _singletons(operands + results, shapes)
    sizes = _sizes(name, rule, operands + results, shapes)
    in_ops = {f for fs in operands for f in fs}
    in_res = {f for fs in results for f in fs}
    _check_kinds(name, rule, spec, in_ops, in_res)
    reduction = frozenset(spec.reduction_factors)
    replicated |= (in_ops - in_res - reduction) | (in_res - in_ops)
    return Resolved(
        operands=tuple(tuple(fs) for fs in operands),
        results=tuple(tuple(fs) for fs in results),
        sizes=sizes,
        reduction=reduction,
        replicated=frozenset(replicated - reduction),
        batch_factors=batch_factors,
    )
