"""Numerical helpers: compensated summation, PRNG key streams, fast integer membership.

Each helper is pure ``jax.numpy`` and works under ``jit``, ``vmap`` and ``scan``.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Iterator
from typing import Any, TypeVar

import jax
import jax.numpy as jnp

__all__ = ["isin", "kahan_summation", "key_chain"]

T = TypeVar("T")


def kahan_summation(*summands: T, compensate: T | None = None) -> tuple[T, T]:
    """Add pytrees left to right with Kahan's compensated summation.

    The compensation term holds the low-order bits lost by each addition and is
    subtracted from the next summand, so the error stays at a few ulps instead of
    growing with the number of additions. For a running total in a loop, carry both
    results: ``total, comp = kahan_summation(total, x, compensate=comp)``.

    Args:
        *summands: One or more pytrees of the same structure; the first is the running
            total.
        compensate: Compensation from a previous call (zeros when None).

    Returns:
        ``(total, compensation)``, both with the summands' structure.

    References:
        W. Kahan, "Further remarks on reducing truncation errors", Comm. ACM 8(1), 1965.

    Example:
        >>> import jax.numpy as jnp
        >>> from primforge.utils import kahan_summation
        >>> total, comp = kahan_summation(jnp.float32(1e8), jnp.float32(1.0), jnp.float32(1.0))
        >>> float(total) - float(comp)  # naive float32 addition would give 1e8
        100000002.0
    """
    if not summands:
        raise ValueError("kahan_summation() needs at least one summand; got none.")
    leaves, treedef = jax.tree_util.tree_flatten(summands[0])
    comps = (
        [jnp.zeros_like(s) for s in leaves]
        if compensate is None
        else treedef.flatten_up_to(compensate)
    )
    for x in summands[1:]:
        for i, xi in enumerate(treedef.flatten_up_to(x)):
            y = xi - comps[i]
            t = leaves[i] + y
            comps[i] = (t - leaves[i]) - y
            leaves[i] = t
    total, comp = treedef.unflatten(leaves), treedef.unflatten(comps)
    return total, comp


def key_chain(rng: jax.Array, shape: tuple[int, ...] | int = ()) -> Iterator[jax.Array]:
    """An endless, reproducible stream of PRNG keys derived from ``rng``.

    The n-th item (counting from 0) is ``jax.random.fold_in(rng, n)``, or that key split
    into an array of keys of ``shape`` when ``shape`` is non-empty. The stream depends
    only on ``rng``: two chains from the same key give the same keys. Works with typed
    keys (``jax.random.key``) and raw ``uint32`` keys.

    Args:
        rng: The root key.
        shape: Shape of the key array produced at each step (``()``: one key).

    Yields:
        Keys, or arrays of keys of ``shape``.

    Example:
        >>> import jax
        >>> from primforge.utils import key_chain
        >>> chain = key_chain(jax.random.key(0), shape=(3,))
        >>> next(chain).shape, next(chain).shape
        ((3,), (3,))
    """
    shape = (operator.index(shape),) if not isinstance(shape, tuple) else shape
    for n in itertools.count():
        key = jax.random.fold_in(rng, n)
        yield jax.random.split(key, shape) if shape else key


def isin(a: Any, b: Any, max_item: int) -> jax.Array:
    """Element-wise ``a in b`` for integer arrays with values in ``[0, max_item)``.

    Builds a boolean table of size ``max_item`` from ``b`` and looks ``a`` up in it: O(n +
    m + max_item) work and memory instead of the O(n * m) comparisons of a broadcast
    equality. Values of ``b`` outside the range are ignored and values of ``a`` outside the
    range are reported as absent (no wrap-around for negative values).

    Args:
        a: Integer array of queries, any shape.
        b: Integer array of reference values, any shape.
        max_item: Exclusive upper bound of the values (a Python int: it sets a shape).

    Returns:
        Boolean array of ``a``'s shape.

    Example:
        >>> import jax.numpy as jnp
        >>> from primforge.utils import isin
        >>> isin(jnp.array([0, 3, 5, -1]), jnp.array([3, 4]), max_item=6)
        Array([False,  True, False, False], dtype=bool)
    """
    try:
        max_item = operator.index(max_item)
    except TypeError:
        raise TypeError(
            f"isin: max_item must be a Python int (it sets an array shape), got "
            f"{type(max_item).__name__}."
        ) from None
    if max_item < 1:
        raise ValueError(f"isin: max_item must be positive, got {max_item}.")
    a = jnp.asarray(a)
    b = jnp.asarray(b).ravel()
    for name, arr in (("a", a), ("b", b)):
        if not jnp.issubdtype(arr.dtype, jnp.integer):
            raise TypeError(f"isin: {name} must be an integer array, got dtype {arr.dtype}.")
    b_ok = (b >= 0) & (b < max_item)
    table = jnp.zeros(max_item, dtype=bool).at[jnp.where(b_ok, b, max_item)].set(True, mode="drop")
    a_ok = (a >= 0) & (a < max_item)
    return a_ok & table[jnp.clip(a, 0, max_item - 1)]
