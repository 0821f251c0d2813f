"""Frozen dataclasses that are JAX pytrees, and switchable ``__post_init__`` validation.

The public decorator and field specifiers; field analysis is in ``_dataclass_fields``,
pytree registration in ``_dataclass_nodes``, the switchable validation in ``_post_init``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, dataclass_transform, overload

from primforge.utils._dataclass_fields import STATIC
from primforge.utils._dataclass_nodes import register as _register

# The Python-callback registration, reachable here for the tests and benchmarks/pytree.py,
# which compare it with the C++ node path.
from primforge.utils._dataclass_nodes import register_python as _register_python  # noqa: F401

__all__ = ["dataclass", "field", "lens_field"]

T = TypeVar("T")
C = TypeVar("C", bound=type)


def field(
    *,
    default: Any = dataclasses.MISSING,
    default_factory: Callable[[], Any] | Any = dataclasses.MISSING,
    init: bool = True,
    repr: bool = True,
    hash: bool | None = None,
    compare: bool = True,
    metadata: Mapping[Any, Any] | None = None,
    kw_only: bool | Any = dataclasses.MISSING,
    static: bool = False,
) -> Any:
    """A :func:`dataclasses.field` that also says whether the field is a pytree child.

    Args:
        default: Default value. Exclusive with ``default_factory``.
        default_factory: Zero-argument callable producing the default.
        init: Whether the field is a parameter of ``__init__``.
        repr: Whether the field appears in ``__repr__``.
        hash: Whether the field takes part in ``__hash__`` (``None``: follow ``compare``).
        compare: Whether the field takes part in ``__eq__`` and ordering.
        metadata: Extra metadata, copied; ``metadata={"static": True}`` also marks the
            field static.
        kw_only: Whether the field is keyword-only in ``__init__``.
        static: If True the field is not a pytree leaf: it is stored in the treedef, so
            JAX transformations pass it through untouched (``jit`` treats it as a
            compile-time constant, so it must be hashable and comparable).

    Returns:
        A :class:`dataclasses.Field` placeholder, typed as the field's value for checkers.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from primforge.utils import dataclass, field
        >>> @dataclass
        ... class Layer:
        ...     weight: jax.Array
        ...     name: str = field(default="dense", static=True)
        >>> jax.tree_util.tree_leaves(Layer(jnp.ones(2)))
        [Array([1., 1.], dtype=float32)]
    """
    md = dict(metadata or {})
    md[STATIC] = bool(static or md.get(STATIC, False))
    return dataclasses.field(
        default=default,
        default_factory=default_factory,
        init=init,
        repr=repr,
        hash=hash,
        compare=compare,
        metadata=md,
        kw_only=kw_only,
    )


def lens_field(
    *,
    default: Any = dataclasses.MISSING,
    default_factory: Callable[[], Any] | Any = dataclasses.MISSING,
    init: bool = True,
    repr: bool = True,
    hash: bool | None = None,
    compare: bool = True,
    metadata: Mapping[Any, Any] | None = None,
    kw_only: bool | Any = dataclasses.MISSING,
    static: bool = False,
) -> Any:
    """A :func:`field` for attributes annotated as lens fields.

    At run time this is exactly :func:`field`; it exists so that a field annotated with a
    lens type (``x: LensField[float] = lens_field(...)``) type-checks, because the return
    type is ``Any`` rather than the default's type.

    Args:
        default: Default value.
        default_factory: Zero-argument callable producing the default.
        init: Whether the field is a parameter of ``__init__``.
        repr: Whether the field appears in ``__repr__``.
        hash: Whether the field takes part in ``__hash__``.
        compare: Whether the field takes part in comparisons.
        metadata: Extra metadata.
        kw_only: Whether the field is keyword-only.
        static: Whether the field is static (kept in the treedef, not a leaf).

    Returns:
        A :class:`dataclasses.Field` placeholder.

    Example:
        >>> from primforge.utils import dataclass, lens_field
        >>> @dataclass
        ... class Point:
        ...     x: float = lens_field(default=0.0)
        ...     tag: str = lens_field(default="p", static=True)
        >>> Point(1.0)
        Point(x=1.0, tag='p')
    """
    return field(
        default=default,
        default_factory=default_factory,
        init=init,
        repr=repr,
        hash=hash,
        compare=compare,
        metadata=metadata,
        kw_only=kw_only,
        static=static,
    )


def _replace(self: T, **changes: Any) -> T:
    """Return a copy with ``changes`` applied.

    Goes through ``__init__`` (and so ``__post_init__`` validation), like
    :func:`dataclasses.replace`; fields declared with ``init=False`` cannot be changed.

    Args:
        **changes: New values by field name.

    Returns:
        A new instance of the same class.

    Example:
        >>> from primforge.utils import dataclass
        >>> @dataclass
        ... class Point:
        ...     x: float
        ...     y: float
        >>> Point(1.0, 2.0).replace(y=5.0)
        Point(x=1.0, y=5.0)
    """
    return dataclasses.replace(self, **changes)  # type: ignore[type-var]


@overload
def dataclass(
    cls: C,
    /,
    *,
    init: bool = ...,
    repr: bool = ...,
    eq: bool = ...,
    order: bool = ...,
    unsafe_hash: bool = ...,
    frozen: bool = ...,
    match_args: bool = ...,
    kw_only: bool = ...,
    slots: bool = ...,
    weakref_slot: bool = ...,
) -> C: ...
@overload
def dataclass(
    cls: None = None,
    /,
    *,
    init: bool = ...,
    repr: bool = ...,
    eq: bool = ...,
    order: bool = ...,
    unsafe_hash: bool = ...,
    frozen: bool = ...,
    match_args: bool = ...,
    kw_only: bool = ...,
    slots: bool = ...,
    weakref_slot: bool = ...,
) -> Callable[[C], C]: ...


# Long only for its docstring and the flags it forwards to dataclasses.dataclass.
@dataclass_transform(frozen_default=True, field_specifiers=(field, lens_field, dataclasses.field))
def dataclass(
    cls: C | None = None,
    /,
    *,
    init: bool = True,
    repr: bool = True,
    eq: bool = True,
    order: bool = False,
    unsafe_hash: bool = False,
    frozen: bool = True,
    match_args: bool = True,
    kw_only: bool = False,
    slots: bool = False,
    weakref_slot: bool = False,
) -> C | Callable[[C], C]:
    """Make a class a dataclass and a JAX pytree (frozen unless ``frozen=False``).

    Every flag has the meaning it has in :func:`dataclasses.dataclass`; only the default of
    ``frozen`` differs. Fields made with ``field(static=True)`` are stored in the treedef;
    all others are pytree children, so instances pass through ``jit``, ``vmap``, ``grad``
    and ``lax.scan`` and keep their fields' key paths (``GetAttrKey``).

    The class is registered as a JAX C++ dataclass node: flattening (also ``jit``'s
    argument handling) runs in C++. Unflattening (what JAX does after every transformation)
    stores the fields directly: the class's own ``__init__`` and ``__post_init__`` do not
    run, so validation never sees JAX's placeholder leaves, and attributes that
    ``__post_init__`` stores outside the declared fields are not carried through pytree
    operations (declare them as ``field(init=False)`` instead). Constructing an instance,
    or calling the added ``replace(**changes)`` method, runs ``__init__`` and validation
    as usual. Equality, hashing and pickling are those of a standard frozen dataclass.
    The treedef of a class with a ``__post_init__`` or a hand-written ``__init__`` holds a
    marker before its static values (shown as ``<rebuild>``): the cue on which JAX's
    rebuild skips that code.

    Subclasses must be decorated again to become pytrees of their own. Decorated classes
    carry the class attribute ``_jax_dataclass = True``, by which code written for other
    JAX dataclass libraries recognises them.

    Args:
        cls: The class; omitted when the decorator is called with arguments.
        init: Generate ``__init__``.
        repr: Generate ``__repr__``.
        eq: Generate ``__eq__``.
        order: Generate ordering methods.
        unsafe_hash: Force a ``__hash__``.
        frozen: Forbid attribute assignment after construction (default True).
        match_args: Generate ``__match_args__``.
        kw_only: Make every field keyword-only.
        slots: Generate ``__slots__`` (a new class is created and registered).
        weakref_slot: Add a ``__weakref__`` slot (requires ``slots=True``).

    Returns:
        The registered class, or a decorator when ``cls`` is None.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from primforge.utils import dataclass, field
        >>> @dataclass
        ... class Particle:
        ...     position: jax.Array
        ...     mass: float = field(default=1.0, static=True)
        >>> p = Particle(jnp.zeros(3))
        >>> moved = jax.jit(lambda p: p.replace(position=p.position + 1.0))(p)
        >>> moved.position, moved.mass
        (Array([1., 1., 1.], dtype=float32), 1.0)
    """

    def wrap(c: C) -> C:
        names = {f for f in getattr(c, "__annotations__", {})}
        generated_init = init and "__init__" not in c.__dict__
        dc = dataclasses.dataclass(
            c,
            init=init,
            repr=repr,
            eq=eq,
            order=order,
            unsafe_hash=unsafe_hash,
            frozen=frozen,
            match_args=match_args,
            kw_only=kw_only,
            slots=slots,
            weakref_slot=weakref_slot,
        )
        if "replace" not in names and not hasattr(dc, "replace"):
            dc.replace = _replace  # type: ignore[attr-defined]
        dc._jax_dataclass = True  # type: ignore[attr-defined]  # the marker peers check
        _register(dc, generated_init=generated_init)
        return dc  # type: ignore[return-value]

    if cls is None:
        return wrap
    return wrap(cls)
