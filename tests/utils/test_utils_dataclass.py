"""primforge.utils.dataclass / field / lens_field and switchable __post_init__ validation."""

from __future__ import annotations

import dataclasses
import pickle
import threading
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from primforge.utils import (
    dataclass,
    enable_post_init,
    field,
    is_post_init_enabled,
    lens_field,
    no_post_init,
    skip_post_init_if_disabled,
)


@dataclass
class Point:
    x: jax.Array
    y: jax.Array
    label: str = field(default="p", static=True)


@dataclass
class Positive:
    value: jax.Array
    inits: int = field(default=0, static=True, compare=False)

    def __post_init__(self):
        if not np.all(np.asarray(self.value) > 0):
            raise ValueError("value must be positive")


@dataclass(slots=True)
class Slotted:
    a: jax.Array
    b: jax.Array
    name: str = field(default="s", static=True)


@dataclass
class Derived:
    base: jax.Array
    doubled: jax.Array = field(init=False)

    def __post_init__(self):
        object.__setattr__(self, "doubled", self.base * 2)


@dataclass
class Nested:
    inner: Point
    extra: dict


@dataclass
class Checked:
    n: int

    @skip_post_init_if_disabled
    def __post_init__(self):
        if self.n < 0:
            raise ValueError("n must be non-negative")


def test_frozen_by_default_and_opt_out():
    p = Point(jnp.ones(2), jnp.zeros(2))
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.x = jnp.zeros(2)

    @dataclass(frozen=False)
    class Mutable:
        x: jax.Array

    m = Mutable(jnp.ones(1))
    m.x = jnp.zeros(1)
    np.testing.assert_array_equal(jax.tree_util.tree_leaves(m)[0], np.zeros(1))


def test_static_fields_are_aux_data_and_children_keep_order_and_paths():
    p = Point(jnp.array(1.0), jnp.array(2.0), label="q")
    leaves, treedef = jax.tree_util.tree_flatten(p)
    assert [float(v) for v in leaves] == [1.0, 2.0]
    assert treedef != jax.tree_util.tree_structure(Point(jnp.array(1.0), jnp.array(2.0)))
    paths = [jax.tree_util.keystr(k) for k, _ in jax.tree_util.tree_flatten_with_path(p)[0]]
    assert paths == [".x", ".y"]
    rebuilt = jax.tree_util.tree_unflatten(treedef, leaves)
    assert type(rebuilt) is Point and rebuilt.label == "q"


def test_field_metadata_is_kept_and_static_metadata_is_honoured():
    @dataclass
    class M:
        a: int = field(default=1, metadata={"unit": "m"})
        b: int = field(default=2, metadata={"static": True})

    fa, fb = dataclasses.fields(M)
    assert fa.metadata["unit"] == "m" and not fa.metadata["static"]
    assert fb.metadata["static"]
    assert jax.tree_util.tree_leaves(M()) == [1]


def test_unflatten_skips_init_and_post_init():
    p = Positive(jnp.array([1.0, 2.0]))
    # Negation breaks the invariant; jax.tree.map must not run validation.
    neg = jax.tree.map(lambda v: -v, p)
    np.testing.assert_array_equal(neg.value, [-1.0, -2.0])
    # Placeholder leaves that validation could not even inspect.
    sentinel = object()
    odd = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(p), [sentinel])
    assert odd.value is sentinel
    # Construction still validates.
    with pytest.raises(ValueError, match="positive"):
        Positive(jnp.array([-1.0]))


def test_init_false_fields_survive_pytree_round_trip():
    d = Derived(jnp.arange(3.0))
    assert len(jax.tree_util.tree_leaves(d)) == 2
    out = jax.jit(lambda d: jax.tree.map(lambda v: v + 1, d))(d)
    np.testing.assert_array_equal(out.base, np.arange(3.0) + 1)
    np.testing.assert_array_equal(out.doubled, np.arange(3.0) * 2 + 1)


def test_replace_method_validates_and_copies():
    p = Positive(jnp.array([1.0]))
    q = p.replace(value=jnp.array([5.0]))
    np.testing.assert_array_equal(q.value, [5.0])
    np.testing.assert_array_equal(p.value, [1.0])
    with pytest.raises(ValueError, match="positive"):
        p.replace(value=jnp.array([-5.0]))


def test_jit_vmap_grad_scan_match_plain_jax():
    x, y = jnp.arange(4.0), jnp.arange(4.0) + 10

    def energy(p):
        return jnp.sum(p.x**2 + 3 * p.y)

    p = Point(x, y)
    np.testing.assert_allclose(jax.jit(energy)(p), jnp.sum(x**2 + 3 * y))
    g = jax.grad(energy)(p)
    assert isinstance(g, Point) and g.label == "p"
    np.testing.assert_allclose(g.x, 2 * np.asarray(x))
    np.testing.assert_allclose(g.y, np.full(4, 3.0))
    batched = jax.vmap(energy)(Point(x[:, None] * jnp.ones(3), y[:, None] * jnp.ones(3)))
    np.testing.assert_allclose(batched, 3 * (np.asarray(x) ** 2 + 3 * np.asarray(y)))

    def step(carry, _):
        return carry.replace(x=carry.x + 1.0), carry.x.sum()

    final, sums = jax.lax.scan(step, p, None, length=3)
    np.testing.assert_allclose(final.x, np.asarray(x) + 3)
    np.testing.assert_allclose(sums, [6.0, 10.0, 14.0])


def test_nested_dataclasses_and_containers():
    n = Nested(Point(jnp.ones(1), jnp.zeros(1)), {"k": jnp.full(1, 2.0)})
    doubled = jax.tree.map(lambda v: 2 * v, n)
    np.testing.assert_array_equal(doubled.extra["k"], [4.0])
    np.testing.assert_array_equal(doubled.inner.x, [2.0])
    assert len(jax.tree_util.tree_leaves(n)) == 3


def test_pickle_round_trip_plain_and_slots():
    for obj in (Point(np.arange(2.0), np.ones(2), label="z"), Slotted(np.ones(1), np.zeros(1))):
        back = pickle.loads(pickle.dumps(obj))
        assert type(back) is type(obj)
        for a, b in zip(jax.tree_util.tree_leaves(obj), jax.tree_util.tree_leaves(back)):
            np.testing.assert_array_equal(a, b)
        assert jax.tree_util.tree_structure(back) == jax.tree_util.tree_structure(obj)


def test_equality_and_hash_follow_frozen_dataclasses():
    @dataclass
    class Config:
        lr: float
        name: str = field(default="adam", static=True)

    a, b, c = Config(0.1), Config(0.1), Config(0.2)
    assert a == b and a != c
    assert hash(a) == hash(b) == hash((0.1, "adam"))
    assert {a, b, c} == {a, c}

    @dataclass(eq=False)
    class Identity:
        lr: float

    i, j = Identity(0.1), Identity(0.1)
    assert i != j and hash(i) != hash(j)
    assert hash(i) == object.__hash__(i)


def test_slots_weakref_order_kw_only_match_args_flags():
    s = Slotted(jnp.ones(1), jnp.zeros(1))
    assert not hasattr(s, "__dict__") and "a" in Slotted.__slots__
    out = jax.jit(lambda s: jax.tree.map(lambda v: v + 1, s))(s)
    assert type(out) is Slotted and out.name == "s"
    np.testing.assert_array_equal(out.b, [1.0])

    @dataclass(slots=True, weakref_slot=True)
    class Weak:
        a: int

    w = Weak(1)
    assert weakref.ref(w)() is w

    @dataclass(order=True)
    class Ordered:
        a: int

    assert Ordered(1) < Ordered(2)

    @dataclass(kw_only=True)
    class KW:
        a: int

    with pytest.raises(TypeError):
        KW(1)
    assert KW(a=1).a == 1

    @dataclass(match_args=False, repr=False, init=True)
    class NoMatch:
        a: int

    assert not hasattr(NoMatch, "__match_args__")
    assert Point.__match_args__ == ("x", "y", "label")


def test_lens_field_is_a_field():
    @dataclass
    class L:
        x: float = lens_field(default=0.0)
        tag: str = lens_field(default="t", static=True)

    assert jax.tree_util.tree_leaves(L(3.0)) == [3.0]
    assert dataclasses.fields(L)[1].metadata["static"]


def test_no_post_init_context_switches_validation_off_and_back_on():
    with pytest.raises(ValueError):
        Checked(-1)
    assert is_post_init_enabled()
    with no_post_init():
        assert Checked(-1).n == -1
        with enable_post_init(), pytest.raises(ValueError):
            Checked(-1)
        assert Checked(-2).n == -2
    assert is_post_init_enabled()
    with pytest.raises(ValueError):
        Checked(-1)


def test_no_post_init_is_restored_after_an_exception_and_is_per_thread():
    with pytest.raises(KeyError), no_post_init():
        raise KeyError("boom")
    assert is_post_init_enabled()

    seen = []
    with no_post_init():
        t = threading.Thread(target=lambda: seen.append(is_post_init_enabled()))
        t.start()
        t.join()
    assert seen == [True]


def test_skip_post_init_forwards_initvars():
    @dataclass
    class WithInitVar:
        a: int
        scale: dataclasses.InitVar[int] = 1
        scaled: int = field(init=False, default=0)

        @skip_post_init_if_disabled
        def __post_init__(self, scale):
            object.__setattr__(self, "scaled", self.a * scale)

    assert WithInitVar(2, 3).scaled == 6
    with no_post_init():
        assert WithInitVar(2, 3).scaled == 0


def test_user_defined_replace_is_not_overwritten():
    @dataclass
    class Custom:
        a: int

        def replace(self, **kw):
            return "mine"

    assert Custom(1).replace(a=2) == "mine"


def test_decorated_subclass_is_its_own_pytree_with_inherited_fields():
    @dataclass
    class Point3(Point):
        z: jax.Array = field(default=None)

    p = Point3(jnp.ones(1), jnp.zeros(1), "k", jnp.full(1, 2.0))
    leaves, treedef = jax.tree_util.tree_flatten(p)
    np.testing.assert_array_equal(np.concatenate(leaves), [1.0, 0.0, 2.0])
    back = jax.tree_util.tree_unflatten(treedef, leaves)
    assert type(back) is Point3 and back.label == "k"
