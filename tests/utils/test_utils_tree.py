"""primforge.utils tree helpers, checked against NumPy and jax.tree.map."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from primforge.utils import (
    HasScatterArgs,
    SupportsTreeMatch,
    dataclass,
    field,
    tree_concat,
    tree_map,
    tree_scatter_set,
    tree_stack,
    tree_structure,
    tree_where_broadcast_last,
    tree_zeros_like,
)


@dataclass
class Labels:
    """Integer codes into a label vocabulary; aligning merges the vocabularies."""

    codes: jax.Array
    vocab: tuple[str, ...] = field(static=True)

    def __tree_match__(self, *others):
        merged = tuple(sorted(set(self.vocab).union(*(o.vocab for o in others))))
        aligned = []
        for node in (self, *others):
            remap = jnp.asarray([merged.index(v) for v in node.vocab], dtype=jnp.int32)
            aligned.append(Labels(remap[node.codes], merged))
        return tuple(aligned)

    def decode(self):
        return np.asarray(self.vocab)[np.asarray(self.codes)]


@dataclass
class Pair:
    """A matchable node whose children include another matchable node."""

    left: Labels
    right: jax.Array
    matched: int = field(default=0, static=True)

    def __tree_match__(self, *others):
        return tuple(p.replace(matched=len(others)) for p in (self, *others))


class Opaque:
    """A matchable node that is not a registered pytree (a JAX leaf)."""

    def __init__(self, v, scale=1):
        self.v, self.scale = v, scale

    def __tree_match__(self, *others):
        return tuple(Opaque(o.v, scale=10) for o in (self, *others))


@dataclass
class DropBuffer:
    data: jax.Array
    mode: str = field(default="drop", static=True)

    @property
    def scatter_args(self):
        return {"mode": self.mode}


def _labels(codes, vocab):
    return Labels(jnp.asarray(codes, dtype=jnp.int32), tuple(vocab))


def test_protocols_are_runtime_checkable():
    assert isinstance(_labels([0], "a"), SupportsTreeMatch)
    assert not isinstance(jnp.ones(1), SupportsTreeMatch)
    assert isinstance(DropBuffer(jnp.ones(1)), HasScatterArgs)


def test_tree_map_matches_jax_tree_map_without_matchable_nodes():
    a = {"x": jnp.arange(3.0), "y": (jnp.ones(2), None, [jnp.full(1, 4.0)])}
    b = jax.tree.map(lambda v: v * 3, a)
    got = tree_map(lambda u, v: u - v, a, b)
    want = jax.tree.map(lambda u, v: u - v, a, b)
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_array_equal(g, w)
    # is_leaf is honoured just as in jax.tree.map.
    counted = tree_map(lambda t: len(t), {"t": (1, 2, 3)}, is_leaf=lambda t: isinstance(t, tuple))
    assert counted == {"t": 3}


def test_tree_map_merges_label_vocabularies_before_comparing():
    a = _labels([0, 1, 2, 0], ["a", "b", "c"])
    b = _labels([1, 0, 1, 2], ["c", "a", "d"])
    # Comparing raw codes would be meaningless: the vocabularies differ.
    out = tree_map(jnp.equal, {"lab": a, "w": jnp.ones(2)}, {"lab": b, "w": jnp.ones(2)})
    np.testing.assert_array_equal(out["lab"].codes, a.decode() == b.decode())
    assert out["lab"].vocab == ("a", "b", "c", "d")
    np.testing.assert_array_equal(out["w"], [True, True])


def test_tree_map_alignment_reaches_every_tree_and_works_under_jit():
    a = _labels([0, 1], ["x", "y"])
    b = _labels([0, 0], ["y"])
    c = _labels([1, 0], ["z", "x"])

    @jax.jit
    def same_as_any(a, b, c):
        return tree_map(lambda u, v, w: (u == v) | (u == w), a, b, c)

    got = same_as_any(a, b, c)
    want = (a.decode() == b.decode()) | (a.decode() == c.decode())
    np.testing.assert_array_equal(got.codes, want)


def test_tree_map_aligns_nested_matchable_nodes():
    p = Pair(_labels([0, 1], ["a", "b"]), jnp.array([1.0, 2.0]))
    q = Pair(_labels([0, 0], ["b"]), jnp.array([1.0, 5.0]))
    out = tree_map(jnp.equal, p, q)
    assert out.matched == 1  # outer node aligned
    np.testing.assert_array_equal(out.left.codes, p.left.decode() == q.left.decode())
    np.testing.assert_array_equal(out.right, [True, False])


def test_tree_map_applies_fn_to_aligned_leaf_nodes():
    out = tree_map(lambda u, v: u.v * u.scale + v.v, [Opaque(1)], [Opaque(2)])
    assert out == [12]
    # A matchable pytree flagged by is_leaf is aligned, then handed to fn whole.
    a, b = _labels([1], ["a", "b"]), _labels([0], ["b"])
    decoded = tree_map(
        lambda u, v: (u.vocab, v.vocab), a, b, is_leaf=lambda n: isinstance(n, Labels)
    )
    assert decoded == (("a", "b"), ("a", "b"))


def test_tree_match_must_return_one_node_per_tree():
    class Bad:
        def __tree_match__(self, *others):
            return (self,)

    with pytest.raises(ValueError, match="one aligned node per input tree"):
        tree_map(lambda *x: x, Bad(), Bad())


def test_tree_scatter_set_matches_numpy_assignment():
    rng = np.random.default_rng(0)
    item = {"a": rng.normal(size=(6, 2)), "b": (rng.normal(size=6), None)}
    idx = np.array([4, 0, 2])
    value = {"a": rng.normal(size=(3, 2)), "b": (rng.normal(size=3), None)}
    got = tree_scatter_set(item, value, jnp.asarray(idx), {})
    want_a, want_b = item["a"].copy(), item["b"][0].copy()
    want_a[idx], want_b[idx] = value["a"], value["b"][0]
    np.testing.assert_allclose(got["a"], want_a, rtol=1e-6)
    np.testing.assert_allclose(got["b"][0], want_b, rtol=1e-6)
    assert got["b"][1] is None


def test_tree_scatter_set_node_scatter_args_are_defaults_the_caller_overrides():
    idx = jnp.array([1, 7])  # 7 is out of bounds for length 4
    item = {"plain": jnp.zeros(4), "buf": DropBuffer(jnp.zeros(4))}
    value = {"plain": jnp.array([1.0, 2.0]), "buf": DropBuffer(jnp.array([1.0, 2.0]))}
    # No caller args: the buffer's mode="drop" applies to its subtree only.
    got = tree_scatter_set(item, value, idx, {})
    np.testing.assert_array_equal(got["buf"].data, [0.0, 1.0, 0.0, 0.0])
    assert type(got["buf"]) is DropBuffer
    # The caller's mode="clip" wins over the buffer's own: index 7 is clipped to 3
    # everywhere (NumPy: clip, then assign).
    got = tree_scatter_set(item, value, idx, {"mode": "clip"})
    want = np.zeros(4)
    want[np.clip([1, 7], 0, 3)] = [1.0, 2.0]
    np.testing.assert_array_equal(got["plain"], want)
    np.testing.assert_array_equal(got["buf"].data, want)


def test_tree_stack_and_concat_match_numpy():
    trees = [{"a": np.full((2,), i, np.float32), "b": [np.eye(2) * i]} for i in range(3)]
    stacked = tree_stack(*trees)
    np.testing.assert_array_equal(stacked["a"], np.stack([t["a"] for t in trees]))
    np.testing.assert_array_equal(stacked["b"][0], np.stack([t["b"][0] for t in trees]))
    cat = tree_concat(*trees)
    np.testing.assert_array_equal(cat["a"], np.concatenate([t["a"] for t in trees]))
    np.testing.assert_array_equal(cat["b"][0], np.concatenate([t["b"][0] for t in trees]))
    with pytest.raises(ValueError, match="at least one"):
        tree_stack()
    with pytest.raises(ValueError, match="at least one"):
        tree_concat()


def test_tree_zeros_like_keeps_shape_dtype_and_structure():
    tree = {"f": jnp.ones((2, 3), jnp.float16), "i": (jnp.arange(4),)}
    z = tree_zeros_like(tree)
    assert z["f"].dtype == jnp.float16 and z["i"][0].dtype == jnp.arange(4).dtype
    np.testing.assert_array_equal(z["f"], np.zeros((2, 3)))
    np.testing.assert_array_equal(z["i"][0], np.zeros(4))


def test_tree_where_broadcast_last_aligns_leading_axes():
    rng = np.random.default_rng(1)
    accept = np.array([True, False, True])
    t1 = {"v": rng.normal(size=(3, 4, 2)), "s": rng.normal(size=3)}
    t2 = {"v": rng.normal(size=(3, 4, 2)), "s": rng.normal(size=3)}
    got = tree_where_broadcast_last(jnp.asarray(accept), t1, t2)
    want_v = np.where(accept[:, None, None], t1["v"], t2["v"])
    np.testing.assert_allclose(got["v"], want_v, rtol=1e-6)
    np.testing.assert_allclose(got["s"], np.where(accept, t1["s"], t2["s"]), rtol=1e-6)
    # NumPy-style trailing broadcast would fail on (3,) vs (3, 4): prefix alignment works.
    mixed = tree_where_broadcast_last(jnp.asarray(accept), jnp.ones((3, 4)), jnp.zeros((3, 4)))
    np.testing.assert_array_equal(mixed, np.where(accept[:, None], 1.0, 0.0) * np.ones((3, 4)))
    with pytest.raises(ValueError, match="prefix"):
        tree_where_broadcast_last(jnp.ones((3, 4), bool), jnp.ones(3), jnp.ones(3))


def test_tree_structure_is_jax_treedef():
    tree = {"a": [1, 2], "b": (3,)}
    assert tree_structure(tree) == jax.tree_util.tree_structure(tree)
    leafy = tree_structure(tree, is_leaf=lambda x: isinstance(x, list))
    assert leafy.num_leaves == 2
    assert leafy.unflatten(["L", "T"]) == {"a": "L", "b": ("T",)}
