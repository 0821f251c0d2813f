"""RuleTable, named tables, and iter_rule_eqns over every kind of nested jaxpr."""

from __future__ import annotations

import runpy
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from jax import lax
from jax.extend.core import Primitive
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from primforge.primitive import register_primitive
from primforge.rules import RuleTable, as_primitive, iter_rule_eqns, rule_table, rule_tables

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "custom_interpreter.py"

# A marker primitive: every use of it is recorded by a table, with a tag param to tell
# the uses apart.
mark_p = register_primitive("test_rules_mark", lambda x, *, tag: x + 0.0)


def mark(x, tag):
    return mark_p.bind(x, tag=tag)


MARKS = RuleTable("test_marks")
MARKS.register(mark_p, "found")


def tags(fn, *args):
    closed = jax.make_jaxpr(fn)(*args)
    found = [(eqn.params["tag"], rule) for eqn, rule in iter_rule_eqns(closed, MARKS)]
    assert all(rule == "found" for _, rule in found)
    return [t for t, _ in found]


def test_rule_table_basics():
    t = RuleTable("basics")
    p, q = Primitive("p_basics"), Primitive("q_basics")
    assert p not in t and t.get(p) is None and t.get(p, 7) == 7 and len(t) == 0
    t.register(p, "rp")
    t.register(q, "rq")
    assert p in t and t[p] == "rp" and list(t) == [p, q] and len(t) == 2
    assert t.items() == [(p, "rp"), (q, "rq")]
    t.unregister(p)
    assert p not in t and list(t) == [q]
    with pytest.raises(KeyError, match="'basics' has no rule for primitive p_basics"):
        t[p]
    assert "q_basics" in repr(t)
    assert t.get("not a primitive", 3) == 3 and "not a primitive" not in t
    with pytest.raises(TypeError, match="primitive must be a jax.extend.core.Primitive"):
        t.register("nope", 1)
    with pytest.raises(TypeError, match="non-empty str"):
        RuleTable("")


def test_rule_table_unwraps_kernels():
    p = Primitive("p_kernel_table")

    class Kernel:
        primitive = p

    t = RuleTable("kernels")
    t.register(Kernel(), 1)
    assert t[p] == 1 and Kernel() in t and as_primitive(Kernel()) is p


def test_named_tables_are_shared():
    a = rule_table("test.shared.table")
    assert rule_table("test.shared.table") is a and rule_tables()["test.shared.table"] is a
    assert rule_table("test.other.table") is not a


def test_walks_top_level_in_order():
    assert tags(lambda x: mark(mark(x, "a") * 2, "b"), 1.0) == ["a", "b"]


def test_walks_jit_and_nested_jit():
    inner = jax.jit(lambda x: mark(x, "inner"))
    outer = jax.jit(lambda x: inner(mark(x, "outer")))
    assert tags(lambda x: outer(x) + mark(x, "top"), 1.0) == ["outer", "inner", "top"]


def test_walks_scan_cond_while():
    def f(x):
        x = lax.scan(lambda c, _: (mark(c, "scan"), None), x, None, length=2)[0]
        x = lax.cond(x > 0, lambda v: mark(v, "true"), lambda v: mark(v, "false"), x)
        x = lax.switch(1, [lambda v: mark(v, "s0"), lambda v: v, lambda v: mark(v, "s2")], x)
        return lax.while_loop(lambda v: mark(v, "cond") < 3, lambda v: mark(v, "body") + 1, x)

    found = tags(f, 1.0)
    assert found[0] == "scan"
    assert sorted(found[1:3]) == ["false", "true"]
    assert sorted(found[3:5]) == ["s0", "s2"]
    assert found[5:] == ["cond", "body"]


def test_walks_custom_jvp_custom_vjp_and_remat():
    @jax.custom_jvp
    def cj(x):
        return mark(x, "custom_jvp")

    cj.defjvp(lambda p, t: (cj(p[0]), t[0]))

    @jax.custom_vjp
    def cv(x):
        return mark(x, "custom_vjp")

    cv.defvjp(lambda x: (cv(x), None), lambda _, g: (g,))

    remat = jax.checkpoint(lambda x: mark(x, "remat"))
    assert tags(lambda x: remat(cv(cj(x))), 1.0) == ["custom_jvp", "custom_vjp", "remat"]


def test_walks_shard_map():
    mesh = jax.make_mesh((1,), ("i",))
    f = jax.shard_map(lambda x: mark(x, "shard"), mesh=mesh, in_specs=P("i"), out_specs=P("i"))
    x = jax.device_put(jnp.ones(4), NamedSharding(mesh, P("i")))
    assert tags(f, x) == ["shard"]


def test_accepts_jaxpr_and_callable_tables():
    closed = jax.make_jaxpr(lambda x: jnp.sin(mark(x, "m")))(1.0)
    assert len(list(iter_rule_eqns(closed.jaxpr, MARKS))) == 1
    names = [e.primitive.name for e, _ in iter_rule_eqns(closed, lambda p: p.name == "sin" or None)]
    assert names == ["sin"]
    with pytest.raises(TypeError, match="jaxpr must be a jax.extend.core.Jaxpr or ClosedJaxpr"):
        list(iter_rule_eqns(lambda x: x, MARKS))
    with pytest.raises(TypeError, match="table must be a RuleTable or a callable"):
        list(iter_rule_eqns(closed, 3))


def test_custom_interpreter_example_runs():
    result = runpy.run_path(str(EXAMPLE), run_name="example")["main"]()

    # Reference by hand: layers of widths 4->8 then twice 8->8, batch 2; a dense layer
    # costs 2*b*k*n multiply-adds plus b*n bias adds, the activation 2 per output.
    def layer(k, n, b=2):
        return 2 * b * k * n + b * n + 2 * b * n

    assert result["flops"] == layer(4, 8) + 2 * layer(8, 8)
    assert [shapes["weight"] for _, shapes in result["rows"]] == [(4, 8), (8, 8), (8, 8)]
    assert result["rows"][0][1]["x"] == (2, 4)
