"""Pytree helpers: structure-aware ``tree_map``, scatter, stack, concat, select.

A thin layer over :mod:`jax.tree_util`; :class:`SupportsTreeMatch` and
:class:`HasScatterArgs` nodes take part in :func:`tree_map` and :func:`tree_scatter_set`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol, TypedDict, TypeVar, cast, runtime_checkable

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "HasScatterArgs",
    "PyTreeDef",
    "ScatterArgs",
    "SupportsTreeMatch",
    "tree_concat",
    "tree_map",
    "tree_scatter_set",
    "tree_stack",
    "tree_structure",
    "tree_where_broadcast_last",
    "tree_zeros_like",
]

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class PyTreeDef(Protocol[T_co]):
    """Typed view of a JAX treedef: the structure of a pytree whose type is ``T_co``.

    :func:`tree_structure` returns JAX's own treedef object; this protocol only lets type
    checkers know what ``unflatten`` gives back.

    Example:
        >>> from primforge.utils import tree_structure
        >>> treedef = tree_structure({"a": 1, "b": (2, 3)})
        >>> treedef.num_leaves, treedef.unflatten([10, 20, 30])
        (3, {'a': 10, 'b': (20, 30)})
    """

    @property
    def num_leaves(self) -> int:
        """Number of leaves.

        Example:
            >>> from primforge.utils import tree_structure
            >>> treedef = tree_structure({'a': 1, 'b': (2, 3)})
            >>> treedef.num_leaves
            3
        """
        ...

    @property
    def num_nodes(self) -> int:
        """Number of nodes, leaves included.

        Example:
            >>> from primforge.utils import tree_structure
            >>> treedef = tree_structure({'a': 1, 'b': (2, 3)})
            >>> treedef.num_nodes
            5
        """
        ...

    def unflatten(self, leaves: Iterable[Any], /) -> T_co:
        """Rebuild a pytree of this structure from its leaves.

        Example:
            >>> from primforge.utils import tree_structure
            >>> treedef = tree_structure({'a': 1, 'b': (2, 3)})
            >>> treedef.unflatten([10, 20, 30])
            {'a': 10, 'b': (20, 30)}
        """
        ...

    def flatten_up_to(self, xs: Any, /) -> list[Any]:
        """Flatten ``xs`` only as deep as this structure goes.

        Example:
            >>> from primforge.utils import tree_structure
            >>> treedef = tree_structure({'a': 1, 'b': (2, 3)})
            >>> treedef.flatten_up_to({'a': [0, 1], 'b': (2, 3)})
            [[0, 1], 2, 3]
        """
        ...


@runtime_checkable
class SupportsTreeMatch(Protocol):
    """A pytree node that reconciles itself with its counterparts before mapping.

    ``node.__tree_match__(*others)`` receives the nodes at the same position in the other
    trees given to :func:`tree_map` and returns a tuple of ``1 + len(others)`` nodes (self's
    replacement first) that are mutually compatible, for example sharing one label
    vocabulary so that their integer codes can be compared. :func:`tree_map` then continues
    with the returned nodes.

    Example:
        >>> from primforge.utils import SupportsTreeMatch
        >>> class Tag:
        ...     def __init__(self, v): self.v = v
        ...     def __tree_match__(self, *others): return (self, *others)
        >>> isinstance(Tag(1), SupportsTreeMatch)
        True
    """

    def __tree_match__(self, *others: Any) -> tuple[Any, ...]:
        """Return ``(self, *others)`` made compatible with one another."""
        ...


class ScatterArgs(TypedDict, total=False):
    """Keyword arguments accepted by ``x.at[idx].set(value, **args)``.

    Example:
        >>> from primforge.utils import ScatterArgs
        >>> ScatterArgs(mode="drop")
        {'mode': 'drop'}
    """

    mode: Any
    indices_are_sorted: bool
    unique_indices: bool


@runtime_checkable
class HasScatterArgs(Protocol):
    """A pytree node whose subtree is scattered with extra keyword arguments.

    :func:`tree_scatter_set` uses ``node.scatter_args`` as defaults for its subtree: the
    arguments the caller passes (and those coming from enclosing nodes) take precedence,
    and the node fills in only the keys they leave out.

    Example:
        >>> from primforge.utils import HasScatterArgs
        >>> class Buffer:
        ...     scatter_args = {"mode": "drop"}
        >>> isinstance(Buffer(), HasScatterArgs)
        True
    """

    @property
    def scatter_args(self) -> ScatterArgs:
        """Scatter keyword arguments for this node's subtree.

        Example:
            >>> class Buffer:
            ...     scatter_args = {'mode': 'drop'}
            >>> Buffer.scatter_args
            {'mode': 'drop'}
        """
        ...


def _is_match(x: Any) -> bool:
    return hasattr(type(x), "__tree_match__")


def tree_structure(x: T, is_leaf: Callable[[Any], bool] | None = None) -> PyTreeDef[T]:
    """The pytree structure (treedef) of ``x``.

    Args:
        x: A pytree.
        is_leaf: Optional predicate; subtrees for which it is True are leaves.

    Returns:
        JAX's treedef for ``x``, typed as :class:`PyTreeDef` of ``x``'s type.

    Example:
        >>> from primforge.utils import tree_structure
        >>> tree_structure((1, [2, 3])).num_leaves
        3
    """
    return cast(PyTreeDef[T], jax.tree_util.tree_structure(x, is_leaf=is_leaf))


def tree_map(
    fn: Callable[..., Any],
    tree: T,
    *trees: Any,
    is_leaf: Callable[[Any], bool] | None = None,
) -> T:
    """Map ``fn`` over the leaves of one or more pytrees, aligning matchable nodes first.

    Like :func:`jax.tree.map`, the structure comes from ``tree`` and the other trees must
    have that structure at least down to its leaves. The difference is
    :class:`SupportsTreeMatch`: when a node of ``tree`` implements ``__tree_match__``, it
    is called with the nodes at the same position in ``trees`` and the aligned nodes it
    returns take their place. If the aligned node is a leaf (not a registered pytree, or
    ``is_leaf`` says so), ``fn`` is applied to the aligned nodes; otherwise the mapping
    continues into their children, where nested matchable nodes are aligned in turn. The
    result is built from the aligned structure, so a node whose static data changed in
    alignment (for example a merged vocabulary) comes back changed.

    Args:
        fn: Function of ``1 + len(trees)`` leaves.
        tree: The pytree that determines the output structure.
        *trees: Further pytrees with the same structure.
        is_leaf: Optional predicate marking extra leaves.

    Returns:
        A pytree of ``fn``'s results.

    Example:
        >>> import jax.numpy as jnp
        >>> from primforge.utils import tree_map
        >>> tree_map(lambda a, b: a + b, {"x": jnp.ones(2)}, {"x": jnp.arange(2.0)})
        {'x': Array([1., 2.], dtype=float32)}
    """

    def stop(x: Any) -> bool:
        return _is_match(x) or (is_leaf is not None and is_leaf(x))

    leaves, treedef = jax.tree_util.tree_flatten(tree, is_leaf=stop)
    others = [treedef.flatten_up_to(t) for t in trees]
    out = [_map_leaf(fn, is_leaf, *group) for group in zip(leaves, *others, strict=True)]
    return treedef.unflatten(out)


def _map_leaf(fn: Callable[..., Any], is_leaf: Callable[[Any], bool] | None, *xs: Any) -> Any:
    node = xs[0]
    if not _is_match(node):
        return fn(*xs)
    aligned = tuple(node.__tree_match__(*xs[1:]))
    if len(aligned) != len(xs):
        raise ValueError(
            f"{type(node).__name__}.__tree_match__ returned {len(aligned)} nodes for "
            f"{len(xs)} inputs; it must return one aligned node per input tree, self first."
        )
    head = aligned[0]
    if is_leaf is not None and is_leaf(head):
        return fn(*aligned)
    # Open exactly one level of the aligned node, then map each child as a tree of its own.
    children, node_def = jax.tree_util.tree_flatten(head, is_leaf=lambda x: x is not head)
    if jax.tree_util.treedef_is_leaf(node_def) and node_def.num_leaves == 1:
        return fn(*aligned)
    rest = [node_def.flatten_up_to(a) for a in aligned[1:]]
    mapped = [tree_map(fn, *group, is_leaf=is_leaf) for group in zip(children, *rest, strict=True)]
    return node_def.unflatten(mapped)


def _scatter_args_of(x: Any) -> ScatterArgs | None:
    if isinstance(x, (jax.Array, np.ndarray, np.generic, int, float, complex, bool)):
        return None
    args = getattr(x, "scatter_args", None)
    return None if args is None else cast(ScatterArgs, dict(args))


def tree_scatter_set(item: T, value: T, idxs: Any, args: ScatterArgs | None = None) -> T:
    """``leaf.at[idxs].set(value_leaf, **args)`` for every array leaf of ``item``.

    Nodes implementing :class:`HasScatterArgs` add keyword arguments for their own
    subtree (for example a buffer whose padding slots use ``mode="drop"``): their
    ``scatter_args`` fill in the keys not already given, so ``args`` from the caller, and
    those of enclosing nodes, win over a node's own. ``None`` leaves stay ``None``.

    Args:
        item: Pytree of arrays to update.
        value: Pytree of new values with ``item``'s structure; each leaf must broadcast to
            ``leaf[idxs]``.
        idxs: Index (integer array, slice, tuple...) applied to the leading axes.
        args: Base scatter keyword arguments (``mode``, ``indices_are_sorted``,
            ``unique_indices``).

    Returns:
        A pytree like ``item`` with the selected entries replaced.

    Example:
        >>> import jax.numpy as jnp
        >>> from primforge.utils import tree_scatter_set
        >>> tree_scatter_set({"a": jnp.zeros(4)}, {"a": jnp.ones(2)}, jnp.array([1, 3]), {})
        {'a': Array([0., 1., 0., 1.], dtype=float32)}

        The caller's arguments override a node's ``scatter_args``:

        >>> import jax
        >>> @jax.tree_util.register_pytree_node_class
        ... class Padded:
        ...     scatter_args = {"mode": "drop"}
        ...     def __init__(self, x):
        ...         self.x = x
        ...     def tree_flatten(self):
        ...         return (self.x,), None
        ...     @classmethod
        ...     def tree_unflatten(cls, aux, children):
        ...         return cls(*children)
        >>> idx = jnp.array([1, 7])  # 7 is out of bounds
        >>> tree_scatter_set(Padded(jnp.zeros(3)), Padded(jnp.ones(2)), idx, {}).x
        Array([0., 1., 0.], dtype=float32)
        >>> tree_scatter_set(Padded(jnp.zeros(3)), Padded(jnp.ones(2)), idx,
        ...                  {"mode": "clip"}).x
        Array([0., 1., 1.], dtype=float32)
    """
    return _scatter(item, value, idxs, dict(args or {}))


def _scatter(item: Any, value: Any, idxs: Any, args: dict[str, Any]) -> Any:
    own = _scatter_args_of(item)
    if own is not None:
        args = {**own, **args}  # a node's own arguments are defaults: the caller's win

    def stop(x: Any) -> bool:
        return x is not item and _scatter_args_of(x) is not None

    leaves, treedef = jax.tree_util.tree_flatten(item, is_leaf=stop)
    if jax.tree_util.treedef_is_leaf(treedef) and leaves and leaves[0] is item:
        return jnp.asarray(item).at[idxs].set(value, **args)
    values = treedef.flatten_up_to(value)
    out = [
        _scatter(leaf, val, idxs, args)
        if _scatter_args_of(leaf) is not None
        else jnp.asarray(leaf).at[idxs].set(val, **args)
        for leaf, val in zip(leaves, values, strict=True)
    ]
    return treedef.unflatten(out)


def _need_trees(name: str, trees: tuple[Any, ...]) -> None:
    if not trees:
        raise ValueError(f"{name}() needs at least one pytree; got none.")


def tree_stack(*trees: T) -> T:
    """Stack pytrees of equal structure leaf by leaf along a new leading axis.

    Args:
        *trees: One or more pytrees with the same structure and leaf shapes.

    Returns:
        A pytree whose leaves have a new leading axis of size ``len(trees)``.

    Example:
        >>> import jax.numpy as jnp
        >>> from primforge.utils import tree_stack
        >>> tree_stack({"a": jnp.zeros(2)}, {"a": jnp.ones(2)})["a"].shape
        (2, 2)
    """
    _need_trees("tree_stack", trees)
    return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def tree_concat(*trees: T) -> T:
    """Concatenate pytrees of equal structure leaf by leaf along axis 0.

    Args:
        *trees: One or more pytrees with the same structure; leaves agree beyond axis 0.

    Returns:
        A pytree whose leaves are the concatenations.

    Example:
        >>> import jax.numpy as jnp
        >>> from primforge.utils import tree_concat
        >>> tree_concat((jnp.zeros(2),), (jnp.ones(3),))[0].shape
        (5,)
    """
    _need_trees("tree_concat", trees)
    return jax.tree.map(lambda *xs: jnp.concatenate(xs, axis=0), *trees)


def tree_zeros_like(tree: T) -> T:
    """Zeros with the shape and dtype of every leaf.

    Args:
        tree: A pytree of arrays or scalars.

    Returns:
        A pytree of the same structure filled with zeros.

    Example:
        >>> import jax.numpy as jnp
        >>> from primforge.utils import tree_zeros_like
        >>> tree_zeros_like({"a": jnp.ones((2,), jnp.int32)})
        {'a': Array([0, 0], dtype=int32)}
    """
    return jax.tree.map(jnp.zeros_like, tree)


def tree_where_broadcast_last(accept: Any, tree1: T, tree2: T) -> T:
    """``jnp.where(accept, leaf1, leaf2)`` with ``accept`` aligned to the leading axes.

    ``accept`` of shape ``S`` is reshaped to ``S + (1,) * (leaf.ndim - len(S))`` for each
    leaf, so a per-row (or per-batch) decision selects whole trailing blocks, unlike NumPy
    broadcasting which aligns trailing axes.

    Args:
        accept: Boolean array whose shape is a prefix of every leaf's shape.
        tree1: Pytree chosen where ``accept`` is True.
        tree2: Pytree chosen where ``accept`` is False (same structure).

    Returns:
        The element-wise selection.

    Raises:
        ValueError: If a leaf has fewer dimensions than ``accept``.

    Example:
        >>> import jax.numpy as jnp
        >>> from primforge.utils import tree_where_broadcast_last
        >>> tree_where_broadcast_last(jnp.array([True, False]), jnp.ones((2, 2)), jnp.zeros((2, 2)))
        Array([[1., 1.],
               [0., 0.]], dtype=float32)
    """
    accept = jnp.asarray(accept)

    def select(a: Any, b: Any) -> Any:
        a = jnp.asarray(a)
        if a.ndim < accept.ndim:
            raise ValueError(
                f"tree_where_broadcast_last: accept has shape {accept.shape} but a leaf has "
                f"shape {a.shape}; accept's shape must be a prefix of every leaf's shape."
            )
        cond = accept.reshape(accept.shape + (1,) * (a.ndim - accept.ndim))
        return jnp.where(cond, a, b)

    return jax.tree.map(select, tree1, tree2)
