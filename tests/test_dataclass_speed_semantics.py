"""primforge.utils.dataclass on JAX's C++ dataclass node: what flattens in C++, and what
must still hold (no class code on unflatten, static fields in the treedef, the same
constructor as a stdlib dataclass).

References are independent of the code under test: a stdlib frozen dataclass with the
same definition, hand-written expected leaves / key paths, and counters kept by the
classes themselves.
"""

from __future__ import annotations

import dataclasses
import inspect
import pickle
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from primforge.utils import _dataclass as impl
from primforge.utils import dataclass, field, no_post_init, skip_post_init_if_disabled


def python_calls_outside_jax(fn):
    """Python functions entered while ``fn()`` runs, other than JAX's own and this file's."""
    seen = []
    jax_dir = str(__import__("pathlib").Path(jax.__file__).parent)

    def hook(frame, event, arg):
        name = frame.f_code.co_filename
        if event == "call" and not name.startswith(jax_dir) and name != __file__:
            seen.append(f"{name}:{frame.f_code.co_name}")

    sys.setprofile(hook)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return seen


@dataclass
class Plain:
    a: jax.Array
    b: jax.Array = 0.0
    tag: str = field(default="t", static=True)


COUNTS = {"init": 0, "post_init": 0, "setattr": 0}


@dataclass
class Validated:
    x: jax.Array
    scale: float = field(default=1.0, static=True)

    def __post_init__(self):
        COUNTS["post_init"] += 1
        if not isinstance(self.x, (jax.Array, np.ndarray, float)):
            raise TypeError(f"x must be an array, got {type(self.x).__name__}")


@dataclass(init=False)
class HandInit:
    x: jax.Array
    y: jax.Array

    def __init__(self, x, y=None):
        COUNTS["init"] += 1
        object.__setattr__(self, "x", x)
        object.__setattr__(self, "y", x if y is None else y)


@dataclass(frozen=False)
class Watched:
    x: jax.Array

    def __setattr__(self, name, value):
        COUNTS["setattr"] += 1
        object.__setattr__(self, name, value)


@dataclass
class WithInitVar:
    x: jax.Array
    factor: dataclasses.InitVar[float] = 2.0
    doubled: jax.Array = field(init=False)

    def __post_init__(self, factor):
        COUNTS["post_init"] += 1
        object.__setattr__(self, "doubled", self.x * factor)


@dataclass(slots=True)
class SlottedPlain:
    a: jax.Array
    b: jax.Array


@dataclass(slots=True)
class SlottedValidated:
    a: jax.Array

    def __post_init__(self):
        COUNTS["post_init"] += 1


def round_trips(obj):
    """Every way JAX rebuilds a pytree: unflatten, tree_map, jit in/out, vmap, grad."""
    leaves, treedef = jax.tree_util.tree_flatten(obj)
    yield treedef.unflatten(leaves)
    yield jax.tree_util.tree_map(lambda v: v, obj)
    yield jax.tree_util.tree_map(lambda v: object(), obj)  # placeholders validation rejects
    yield jax.jit(lambda o: o)(obj)
    yield jax.vmap(lambda o: o)(jax.tree_util.tree_map(lambda v: jnp.stack([v, v]), obj))
    yield jax.grad(lambda o: sum(jnp.sum(v) for v in jax.tree_util.tree_leaves(o)))(obj)


@pytest.mark.parametrize(
    "make",
    [
        lambda: Plain(jnp.ones(2), jnp.zeros(2)),
        lambda: Validated(jnp.ones(2)),
        lambda: HandInit(jnp.ones(2)),
        lambda: Watched(jnp.ones(2)),
        lambda: WithInitVar(jnp.ones(2)),
        lambda: SlottedPlain(jnp.ones(2), jnp.zeros(2)),
        lambda: SlottedValidated(jnp.ones(2)),
    ],
    ids=["plain", "post_init", "hand_init", "setattr", "initvar", "slots", "slots_post_init"],
)
def test_flatten_runs_no_python_and_rebuild_runs_no_class_code(make):
    obj = make()
    # Flattening is JAX's C++ dataclass node: no Python function is entered.
    assert python_calls_outside_jax(lambda: jax.tree_util.tree_flatten(obj)) == []
    before = dict(COUNTS)
    for rebuilt in round_trips(obj):
        assert type(rebuilt) is type(obj)
    assert COUNTS == before, "an __init__, __post_init__ or __setattr__ ran on unflatten"
    # Constructing still runs the class's code (the counters move for those that count).
    make()
    counted = {Validated: "post_init", HandInit: "init", Watched: "setattr",
               WithInitVar: "post_init", SlottedValidated: "post_init"}
    if type(obj) in counted:
        assert COUNTS[counted[type(obj)]] > before[counted[type(obj)]]


def test_unflatten_keeps_leaf_identity_and_equality():
    a, b = np.arange(3.0), np.ones(2)
    for obj in (Plain(a, b, tag="u"), Validated(a, scale=3.0), HandInit(a, b)):
        leaves, treedef = jax.tree_util.tree_flatten(obj)
        rebuilt = treedef.unflatten(leaves)
        for name in [f.name for f in dataclasses.fields(obj)]:
            assert getattr(rebuilt, name) is getattr(obj, name)
        # No marker or other extra attribute lands on the instance.
        assert set(vars(rebuilt)) == {f.name for f in dataclasses.fields(obj)}
        assert rebuilt == obj if not isinstance(a, np.ndarray) else True
    assert Plain(1.0, 2.0, tag="x") == jax.tree_util.tree_map(lambda v: v, Plain(1.0, 2.0, tag="x"))
    assert hash(Plain(1.0, 2.0)) == hash(jax.tree_util.tree_map(lambda v: v, Plain(1.0, 2.0)))


def test_static_fields_live_in_the_treedef_and_leaves_and_paths_are_the_data_fields():
    x, y = jnp.ones(2), jnp.zeros(3)
    p = Plain(x, y, tag="first")
    leaves = jax.tree_util.tree_leaves(p)
    assert len(leaves) == 2 and leaves[0] is x and leaves[1] is y
    paths = [jax.tree_util.keystr(k) for k, _ in jax.tree_util.tree_flatten_with_path(p)[0]]
    assert paths == [".a", ".b"]
    same = jax.tree_util.tree_structure(Plain(y, x, tag="first"))
    other = jax.tree_util.tree_structure(Plain(x, y, tag="second"))
    assert jax.tree_util.tree_structure(p) == same
    assert jax.tree_util.tree_structure(p) != other
    assert "first" in str(jax.tree_util.tree_structure(p))
    # jit treats the static field as a compile-time constant: one trace per value.
    traces = []

    @jax.jit
    def f(o):
        traces.append(o.tag)
        return o.a * 2

    f(p), f(Plain(x + 1, y, tag="first")), f(Plain(x, y, tag="second"))
    assert traces == ["first", "second"]
    # A class with a marker keeps static fields in the treedef just the same.
    v1, v2 = Validated(x, scale=2.0), Validated(x, scale=3.0)
    assert jax.tree_util.tree_structure(v1) != jax.tree_util.tree_structure(v2)
    assert jax.tree_util.tree_leaves(v1) == [x]
    assert jax.tree_util.tree_map(lambda v: v, v2).scale == 3.0


@dataclass
class Signature:
    a: int
    b: list = field(default_factory=list)
    c: str = "c"
    d: int = field(default=4, kw_only=True)
    e: tuple = field(default=(), static=True)


@dataclasses.dataclass(frozen=True)
class SignatureRef:
    a: int
    b: list = dataclasses.field(default_factory=list)
    c: str = "c"
    d: int = dataclasses.field(default=4, kw_only=True)
    e: tuple = ()


# The same with more fields (a storing __init__ that takes JAX's rebuild through a keyword
# dict rather than binding each parameter).
@dataclass
class SignatureWide(Signature):
    g: int = 7
    h: list = field(default_factory=lambda: [8])
    i: str = field(default="i", kw_only=True)


@dataclasses.dataclass(frozen=True)
class SignatureWideRef(SignatureRef):
    g: int = 7
    h: list = dataclasses.field(default_factory=lambda: [8])
    i: str = dataclasses.field(default="i", kw_only=True)


PAIRS = [(Signature, SignatureRef), (SignatureWide, SignatureWideRef)]


def fields_of(obj):
    return tuple(getattr(obj, f.name) for f in dataclasses.fields(obj))


@pytest.mark.parametrize(
    "args, kwargs",
    [
        ((1,), {}),
        ((1, [2]), {}),
        ((1, [2], "x"), {"d": 9}),
        ((), {"a": 1, "b": [2], "c": "x", "d": 5, "e": (1,)}),  # every field by keyword
        ((), {"a": 1, "e": (2,)}),
        ((1, [2], "x", 4), {}),  # too many positional (d is keyword-only)
        ((), {}),  # missing a
        ((1,), {"a": 2}),  # a twice
        ((1,), {"z": 2}),  # unknown keyword
        ((), {"a": 1, "b": [2], "c": "x", "d": 5, "e": (1,), "z": 0}),
    ],
)
@pytest.mark.parametrize("ours, ref", PAIRS, ids=["5_fields", "8_fields"])
def test_constructor_behaves_like_the_stdlib_dataclass(args, kwargs, ours, ref):
    try:
        want = fields_of(ref(*args, **kwargs))
    except TypeError:
        with pytest.raises(TypeError):
            ours(*args, **kwargs)
        return
    assert fields_of(ours(*args, **kwargs)) == want
    everything = {f.name: getattr(ref(*args, **kwargs), f.name) for f in dataclasses.fields(ref)}
    assert fields_of(ours(**everything)) == fields_of(ref(**everything))
    rebuilt = jax.tree_util.tree_map(lambda v: v, ours(*args, **kwargs))
    assert fields_of(rebuilt) == want


@pytest.mark.parametrize("ours, ref", PAIRS, ids=["5_fields", "8_fields"])
def test_signature_defaults_and_factories_match_the_stdlib_dataclass(ours, ref):
    got = inspect.signature(ours)
    want = inspect.signature(ref)
    assert [(p.name, p.kind, repr(p.default)) for p in got.parameters.values()] == [
        (p.name, p.kind, repr(p.default)) for p in want.parameters.values()
    ]
    # A default factory gives a fresh object per instance, as in dataclasses.
    s1, s2 = ours(1), ours(1)
    assert s1.b == [] and s1.b is not s2.b
    with pytest.raises(dataclasses.FrozenInstanceError):
        s1.a = 2  # type: ignore[misc]
    assert ours(1).replace(c="z").c == "z"
    assert pickle.loads(pickle.dumps(ours(1, [3]))) == ours(1, [3])


def test_post_init_validation_runs_on_construction_and_replace_but_not_on_rebuild():
    with pytest.raises(TypeError, match="x must be an array"):
        Validated("nope")  # type: ignore[arg-type]
    v = Validated(jnp.ones(2))
    with pytest.raises(TypeError, match="x must be an array"):
        v.replace(x="nope")
    rebuilt = jax.tree_util.tree_map(lambda _: "placeholder", v)
    assert rebuilt.x == "placeholder"  # stored as given, not validated


def test_skip_post_init_if_disabled_still_switches_validation():
    @dataclass
    class Checked:
        n: int

        @skip_post_init_if_disabled
        def __post_init__(self):
            if self.n < 0:
                raise ValueError("n must be non-negative")

    with pytest.raises(ValueError):
        Checked(-1)
    with no_post_init():
        assert Checked(-1).n == -1
    assert jax.tree_util.tree_map(lambda v: -v, Checked(1)).n == -1


def test_hand_written_init_and_initvar_classes_rebuild_their_fields():
    h = HandInit(jnp.ones(2))
    assert np.array_equal(h.y, np.ones(2))  # the hand-written default ran on construction
    h2 = jax.tree_util.tree_map(lambda v: v + 1, h)
    np.testing.assert_array_equal(h2.x, [2.0, 2.0])
    np.testing.assert_array_equal(h2.y, [2.0, 2.0])
    w = WithInitVar(jnp.ones(2), factor=3.0)
    w2 = jax.jit(lambda o: o)(w)
    np.testing.assert_array_equal(w2.doubled, [3.0, 3.0])  # init=False field carried


def test_decorated_subclass_rebuilds_as_itself_without_running_init():
    @dataclass
    class Base:
        a: jax.Array

    calls = []

    @dataclass
    class Child(Base):
        b: jax.Array = 0.0

        def __post_init__(self):
            calls.append(1)

    c = Child(jnp.ones(1), jnp.zeros(1))
    assert calls == [1]
    out = jax.jit(lambda o: o)(c)
    assert type(out) is Child and calls == [1]
    assert [jax.tree_util.keystr(k) for k, _ in jax.tree_util.tree_flatten_with_path(c)[0]] == [
        ".a",
        ".b",
    ]


def test_python_callback_fallback_keeps_the_same_semantics():
    # The path used when JAX's C++ registry cannot be reached.
    calls = []

    @dataclasses.dataclass(frozen=True)
    class Fallback:
        x: object
        tag: str = dataclasses.field(default="f", metadata={"static": True})

        def __post_init__(self):
            calls.append(1)

    impl._register_python(Fallback, ["x"], ["tag"], has_dict=True)
    f = Fallback(np.ones(2), tag="g")
    leaves, treedef = jax.tree_util.tree_flatten(f)
    assert leaves[0] is f.x and "'g'" in str(treedef)
    out = treedef.unflatten([5])
    assert out == Fallback(5, tag="g") and calls == [1, 1]  # only the two constructions


@pytest.mark.parametrize("slots", [False, True])
def test_field_names_that_look_like_helper_names(slots):
    names = ["self", "d", "args", "kwargs", "k", "v", "_set", "_init", "_store"]
    ann = {n: object for n in names}
    ours = dataclass(slots=slots)(type("Odd", (), {"__annotations__": dict(ann)}))
    ref = dataclasses.dataclass(frozen=True)(type("OddRef", (), {"__annotations__": dict(ann)}))
    values = {n: i for i, n in enumerate(names)}
    positional = list(values.values())
    for build in (lambda c: c(**values), lambda c: c(*positional)):
        assert fields_of(build(ours)) == fields_of(build(ref))
    obj = ours(**values)
    rebuilt = jax.tree_util.tree_map(lambda x: x * 10, obj)
    assert fields_of(rebuilt) == tuple(10 * i for i in range(len(names)))
