"""Named rule tables keyed by primitive, and a jaxpr walker that finds their equations.

:func:`rule_table` creates or finds a :class:`RuleTable` by name; :func:`iter_rule_eqns`
yields the equations whose primitive has a rule, in every nested jaxpr.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from primforge._compat import ClosedJaxpr, Jaxpr, JaxprEqn, Primitive

__all__ = [
    "RuleTable",
    "as_primitive",
    "iter_rule_eqns",
    "rule_table",
    "rule_tables",
    "sub_jaxprs",
]

_MISSING = object()


def as_primitive(obj: Any, *, argname: str = "primitive") -> Primitive:
    """Return the JAX primitive behind ``obj``.

    ``obj`` may be a ``jax.extend.core.Primitive`` or any object with a ``primitive``
    attribute holding one (such as an ``XLACustomKernel``).

    Args:
        obj: a primitive, or an object wrapping one in its ``primitive`` attribute.
        argname: the argument name used in the error message.

    Returns:
        The unwrapped primitive.

    Raises:
        TypeError: if no primitive can be found.

    Example:
        >>> import jax.numpy as jnp
        >>> from primforge.rules import as_primitive
        >>> from jax.extend.core import Primitive
        >>> p = Primitive("demo_as_primitive")
        >>> as_primitive(p) is p
        True
        >>> class Kernel:
        ...     primitive = p
        >>> as_primitive(Kernel()) is p
        True
    """
    if isinstance(obj, Primitive):
        return obj
    inner = getattr(obj, "primitive", None)
    if isinstance(inner, Primitive):
        return inner
    raise TypeError(
        f"{argname} must be a jax.extend.core.Primitive or an object with a `primitive` "
        f"attribute holding one (such as an XLACustomKernel); got {type(obj).__name__}: "
        f"{obj!r:.80}"
    )


class RuleTable:
    """A named mapping from primitives to rules of one kind.

    Keys are primitives (objects with a ``primitive`` attribute are unwrapped). Values are
    whatever the table's users agree on, usually callables.

    Args:
        name: a descriptive name, shown in ``repr`` and in error messages.

    Example:
        >>> from jax.extend.core import Primitive
        >>> from primforge.rules import RuleTable
        >>> table = RuleTable("cost")
        >>> p = Primitive("demo_rule_table")
        >>> table.register(p, lambda eqn: 1)
        >>> p in table, len(table)
        (True, 1)
        >>> table.get(p)(None)
        1
        >>> table.get(Primitive("other")) is None
        True
        >>> [q.name for q in table]
        ['demo_rule_table']
    """

    __slots__ = ("_rules", "name")

    def __init__(self, name: str):
        if not isinstance(name, str) or not name:
            raise TypeError(f"RuleTable name must be a non-empty str; got {name!r}")
        self.name = name
        self._rules: dict[Primitive, Any] = {}

    def register(self, primitive: Any, rule: Any) -> None:
        """Set the rule of ``primitive`` in this table, replacing any previous one.

        Args:
            primitive: a primitive, or an object with a ``primitive`` attribute.
            rule: the rule to store.

        Example:
            >>> from jax.extend.core import Primitive
            >>> from primforge.rules import RuleTable
            >>> t = RuleTable("demo_register")
            >>> p = Primitive("demo_register_p")
            >>> t.register(p, "first"); t.register(p, "second"); t[p]
            'second'
        """
        self._rules[as_primitive(primitive)] = rule

    def unregister(self, primitive: Any) -> None:
        """Remove the rule of ``primitive``; does nothing if it has none.

        Example:
            >>> from jax.extend.core import Primitive
            >>> from primforge.rules import RuleTable
            >>> t = RuleTable("demo_unregister")
            >>> p = Primitive("demo_unregister_p")
            >>> t.register(p, 1); t.unregister(p); p in t
            False
        """
        self._rules.pop(as_primitive(primitive), None)

    def get(self, primitive: Any, default: Any = None) -> Any:
        """The rule of ``primitive``, or ``default`` when it has none.

        Example:
            >>> from jax.extend.core import Primitive
            >>> from primforge.rules import RuleTable
            >>> RuleTable("demo_get").get(Primitive("x"), "none")
            'none'
        """
        try:
            prim = as_primitive(primitive)
        except TypeError:
            return default
        return self._rules.get(prim, default)

    def __getitem__(self, primitive: Any) -> Any:
        rule = self.get(primitive, _MISSING)
        if rule is _MISSING:
            raise KeyError(f"rule table {self.name!r} has no rule for primitive {primitive!r}")
        return rule

    def __contains__(self, primitive: Any) -> bool:
        return self.get(primitive, _MISSING) is not _MISSING

    def __iter__(self) -> Iterator[Primitive]:
        return iter(list(self._rules))

    def __len__(self) -> int:
        return len(self._rules)

    def items(self) -> list[tuple[Primitive, Any]]:
        """A list of ``(primitive, rule)`` pairs in registration order.

        Example:
            >>> from jax.extend.core import Primitive
            >>> from primforge.rules import RuleTable
            >>> t = RuleTable("demo_items"); p = Primitive("demo_items_p"); t.register(p, 3)
            >>> [(q.name, r) for q, r in t.items()]
            [('demo_items_p', 3)]
        """
        return list(self._rules.items())

    def __repr__(self) -> str:
        names = ", ".join(p.name for p in self._rules)
        return f"RuleTable({self.name!r}: {names})"


_TABLES: dict[str, RuleTable] = {}


def rule_table(name: str) -> RuleTable:
    """Find the global rule table called ``name``, creating it on first use.

    Two modules that call ``rule_table("cost")`` get the same table, so a library can
    register rules that an interpreter written elsewhere finds.

    Args:
        name: the table's name.

    Returns:
        The shared :class:`RuleTable`.

    Example:
        >>> from primforge.rules import rule_table
        >>> rule_table("demo.shared") is rule_table("demo.shared")
        True
    """
    table = _TABLES.get(name)
    if table is None:
        table = _TABLES[name] = RuleTable(name)
    return table


def rule_tables() -> dict[str, RuleTable]:
    """A snapshot of every named table created with :func:`rule_table`.

    Example:
        >>> from primforge.rules import rule_table, rule_tables
        >>> _ = rule_table("demo.listed")
        >>> "demo.listed" in rule_tables()
        True
    """
    return dict(_TABLES)


def _jaxprs_in(value: Any) -> Iterator[Jaxpr]:
    # Params hold sub-jaxprs directly (jit, scan, remat, shard_map), in tuples (cond
    # branches) or, in some third-party primitives, in lists. Callables such as custom_jvp's
    # jvp_jaxpr_fun are thunks that have not been traced yet, so there is nothing to walk.
    if isinstance(value, ClosedJaxpr):
        yield value.jaxpr
    elif isinstance(value, Jaxpr):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _jaxprs_in(item)


def sub_jaxprs(eqn: JaxprEqn) -> Iterator[Jaxpr]:
    """The jaxprs held directly in an equation's params (not recursively).

    Like ``jax.extend.core.jaxprs_in_params``, and also looks inside lists and nested
    tuples.

    Example:
        >>> import jax
        >>> from primforge.rules import sub_jaxprs
        >>> closed = jax.make_jaxpr(lambda p, x: jax.lax.cond(p, jax.numpy.sin, jax.numpy.cos, x))(
        ...     True, 1.0)
        >>> cond_eqn = [e for e in closed.jaxpr.eqns if e.primitive.name == "cond"][0]
        >>> len(list(sub_jaxprs(cond_eqn)))
        2
    """
    for value in eqn.params.values():
        yield from _jaxprs_in(value)


def iter_rule_eqns(
    jaxpr: Jaxpr | ClosedJaxpr, table: RuleTable | Callable[[Primitive], Any]
) -> Iterator[tuple[JaxprEqn, Any]]:
    """Yield ``(eqn, rule)`` for every equation, at any depth, whose primitive has a rule.

    Equations are visited in program order; an equation that holds sub-jaxprs is offered
    first and its sub-jaxprs are walked right after it. A sub-jaxpr used by two call sites
    is walked twice, once for each.

    Args:
        jaxpr: a ``Jaxpr`` or ``ClosedJaxpr`` (for instance from ``jax.make_jaxpr``).
        table: a :class:`RuleTable`, or any callable ``primitive -> rule or None``.

    Yields:
        Pairs of the equation and the rule found for its primitive.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from primforge.rules import RuleTable, iter_rule_eqns
        >>> from jax import lax
        >>> costs = RuleTable("demo_costs")
        >>> costs.register(lax.sin_p, lambda eqn: 1)
        >>> def f(x):
        ...     y = jax.jit(jnp.sin)(x)
        ...     return lax.scan(lambda c, _: (jnp.sin(c), None), y, None, length=3)[0]
        >>> closed = jax.make_jaxpr(f)(1.0)
        >>> sum(rule(eqn) for eqn, rule in iter_rule_eqns(closed, costs))
        2
    """
    if isinstance(jaxpr, ClosedJaxpr):
        jaxpr = jaxpr.jaxpr
    if not isinstance(jaxpr, Jaxpr):
        raise TypeError(
            f"iter_rule_eqns: jaxpr must be a jax.extend.core.Jaxpr or ClosedJaxpr (e.g. from "
            f"jax.make_jaxpr(f)(*args)); got {type(jaxpr).__name__}"
        )
    lookup = table.get if isinstance(table, RuleTable) else table
    if not callable(lookup):
        raise TypeError(
            f"iter_rule_eqns: table must be a RuleTable or a callable primitive -> rule; "
            f"got {type(table).__name__}"
        )
    stack: list[Iterator[JaxprEqn]] = [iter(jaxpr.eqns)]
    while stack:
        eqn = next(stack[-1], None)
        if eqn is None:
            stack.pop()
            continue
        rule = lookup(eqn.primitive)
        if rule is not None:
            yield eqn, rule
        subs = list(sub_jaxprs(eqn))
        for sub in reversed(subs):
            stack.append(iter(sub.eqns))
