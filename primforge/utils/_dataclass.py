"""Frozen dataclasses that are JAX pytrees, and switchable ``__post_init__`` validation.

Design: :func:`dataclass` applies :func:`dataclasses.dataclass` (frozen by default) and
registers the class as a JAX C++ dataclass node, so flattening (``tree_flatten``, ``jit``
argument handling) reads the fields in C++ without a Python call per node. Fields made with
``field(static=True)`` go into the treedef's auxiliary data; every other field is a child.

JAX rebuilds such a node by calling ``cls(**fields)``, and it does so many times per
transformation, often with placeholder leaves (tracers, ``None``, ``object()``) that user
validation would reject. So no code of the class may run then:

- a class whose ``__init__`` is the generated one and has no ``__post_init__`` (nor
  ``InitVar``, ``init=False`` field, custom ``__setattr__``) runs no user code in it, so
  JAX may call it; it gets an equivalent generated ``__init__`` that is cheaper to call
  with every field by keyword (no per-parameter binding when the class has many fields);
- any other class keeps its ``__init__`` behind a wrapper, and is registered with a marker
  as first static field (a class attribute): JAX passes it back as a keyword on rebuild,
  and the wrapper then stores the fields directly, skipping ``__init__`` and
  ``__post_init__``.

If JAX's registry is unreachable, generated Python flatten/unflatten callbacks are used.
Validation still runs whenever a user constructs an instance or calls :meth:`replace`.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import inspect
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar, dataclass_transform, overload

import jax

from primforge import _compat

__all__ = [
    "dataclass",
    "enable_post_init",
    "field",
    "is_post_init_enabled",
    "lens_field",
    "no_post_init",
    "skip_post_init_if_disabled",
]

T = TypeVar("T")
C = TypeVar("C", bound=type)

# Metadata key marking a field as static (the same key equinox uses, so tools that read
# equinox-style metadata understand ours).
_STATIC = "static"


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
    md[_STATIC] = bool(static or md.get(_STATIC, False))
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
    """
    return dataclasses.replace(self, **changes)  # type: ignore[type-var]


def _compile(src: str, name: str, namespace: dict[str, Any]) -> Callable[..., Any]:
    exec(compile(src, f"<primforge.utils.dataclass {name}>", "exec"), namespace)  # noqa: S102
    return namespace[name]


class _Rebuild:
    """Marker passed by JAX to ``__init__`` when it rebuilds an instance from a treedef."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<rebuild>"

    def __reduce__(self) -> str:
        return "_REBUILD"


_REBUILD = _Rebuild()
# Name of the marker: a class attribute (so JAX's C++ flatten reads it as a static field)
# and the keyword JAX's C++ unflatten passes back to the class.
_MARK = "_primforge_rebuild_"


def _slotted_fields(cls: type, names: list[str]) -> bool:
    slotted: set[str] = set()
    for klass in cls.__mro__:
        slots_decl = klass.__dict__.get("__slots__", ())
        slotted.update((slots_decl,) if isinstance(slots_decl, str) else slots_decl)
    return bool(slotted.intersection(names))


def _register(cls: type, *, generated_init: bool = False) -> None:
    fields = dataclasses.fields(cls)
    data = [f.name for f in fields if not f.metadata.get(_STATIC, False)]
    static = [f.name for f in fields if f.metadata.get(_STATIC, False)]
    if generated_init and _storing_init(cls, fields):
        if _compat.register_dataclass_node(cls, data, static):
            return
    elif _register_marked(cls, data, static):
        return
    # The fallback writes the instance dict where it can (slotted fields need setattr).
    has_dict = not _slotted_fields(cls, data + static)
    _register_python(cls, data, static, has_dict)  # pragma: no cover - JAX without C++ nodes


def _storing_init(cls: type, fields: tuple[dataclasses.Field, ...]) -> bool:
    """Replace a generated ``__init__`` that runs no user code by one that stores faster.

    Applies when ``__init__`` was generated by :mod:`dataclasses`, there is no
    ``__post_init__``, no ``InitVar``, no ``init=False`` field, and (for non-frozen
    classes) no custom ``__setattr__``. Such an
    ``__init__`` only stores its arguments, so JAX's C++ node may call it on unflatten
    without any code of the class running; the replacement takes the same parameters
    (order, keyword-only markers, defaults, default factories), and with many fields
    takes an all-keyword call (JAX's rebuild) without binding each parameter. Returns
    False, changing nothing, when the class does not qualify.
    """
    if hasattr(cls, "__post_init__") or not all(f.init for f in fields):
        return False
    frozen = cls.__dataclass_params__.frozen  # type: ignore[attr-defined]
    if not frozen and cls.__setattr__ is not object.__setattr__:
        return False
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    if sorted(p.name for p in params) != sorted(f.name for f in fields):
        return False  # InitVar parameters, or an __init__ dataclasses did not write
    by_name = {f.name: f for f in fields}
    # Helper names start with "__pf_": a field cannot have such a name (inside a class
    # body it would be mangled), so no parameter shadows a helper.
    ns: dict[str, Any] = {"__pf_FACTORY": _FACTORY, "__pf_set": object.__setattr__}
    sig, body = ["__pf_self"], []
    kw_only_started = False
    for i, p in enumerate(params):
        f = by_name[p.name]
        if p.kind is inspect.Parameter.KEYWORD_ONLY and not kw_only_started:
            sig.append("*")
            kw_only_started = True
        if f.default_factory is not dataclasses.MISSING:
            ns[f"__pf_factory{i}"] = f.default_factory
            sig.append(f"{p.name}=__pf_FACTORY")
            body.append(f"    if {p.name} is __pf_FACTORY:\n        {p.name} = __pf_factory{i}()")
        elif f.default is not dataclasses.MISSING:
            ns[f"__pf_default{i}"] = f.default
            sig.append(f"{p.name}=__pf_default{i}")
        else:
            sig.append(p.name)
    # object.__setattr__, as the generated __init__ of a frozen dataclass does: it keeps
    # the attributes in the instance's inline value array. Writing ``self.__dict__``
    # would be quicker here but materialises a dict per instance, which makes every
    # later flatten (and jit dispatch) of a tree of such nodes measurably slower.
    body.extend(f"    __pf_set(__pf_self, {f.name!r}, {f.name})" for f in fields)
    fill = (
        "        for __pf_k, __pf_v in __pf_kwargs.items():\n"
        "            __pf_set(__pf_self, __pf_k, __pf_v)"
    )
    body.append("    return None")
    store = _compile(
        f"def __init__({', '.join(sig)}):\n" + "\n".join(body) + "\n", "__init__", ns
    )
    original = cls.__init__
    store.__qualname__ = original.__qualname__
    store.__module__ = original.__module__
    store.__doc__ = original.__doc__
    store.__annotations__ = dict(original.__annotations__)
    if len(fields) <= _DIRECT_MAX_FIELDS:
        type.__setattr__(cls, "__init__", store)
        return True
    # With many fields, binding each keyword to its parameter costs a name lookup per
    # field, quadratic in the field count; every field given by keyword (what JAX's
    # unflatten does) instead takes one dict update.
    ns["__pf_store"] = store
    ns["__pf_NAMES"] = frozenset(by_name)
    init = _compile(
        "def __init__(__pf_self, /, *__pf_args, **__pf_kwargs):\n"
        "    if not __pf_args and __pf_kwargs.keys() == __pf_NAMES:\n"
        f"{fill}\n"
        "        return\n"
        "    __pf_store(__pf_self, *__pf_args, **__pf_kwargs)\n",
        "__init__",
        ns,
    )
    functools.update_wrapper(init, original)
    type.__setattr__(cls, "__init__", init)
    return True


# Up to this many fields, the storing __init__ binds its parameters directly (cheapest for
# few fields); above, a keyword-dict fast path takes JAX's rebuild (see benchmarks/pytree.py).
_DIRECT_MAX_FIELDS = 6


class _Factory:
    """Default of a parameter whose field has a ``default_factory`` (as in dataclasses)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<factory>"


_FACTORY = _Factory()


def _register_marked(cls: type, data: list[str], static: list[str]) -> bool:
    """Register with JAX's C++ dataclass node; rebuild without running ``__init__``.

    For classes whose ``__init__`` runs user code. JAX flattens the node in C++ and
    rebuilds it by calling ``cls(**fields)``. A marker is listed as the first static
    field: flattening reads it from the class, and on rebuild it arrives as a keyword,
    which the wrapped ``__init__`` takes as its cue to store the fields directly, skipping
    the original ``__init__`` (and so ``__post_init__``).
    """
    original = cls.__init__
    ns: dict[str, Any] = {"_init": original, "_REBUILD": _REBUILD, "_set": object.__setattr__}
    # object.__setattr__ rather than the instance dict: see _storing_init.
    store = "        for k, v in kwargs.items():\n            _set(self, k, v)"
    init = _compile(
        f"def __init__(self, /, *args, {_MARK}=None, **kwargs):\n"
        f"    if {_MARK} is _REBUILD:\n"
        f"{store}\n"
        "        return\n"
        "    _init(self, *args, **kwargs)\n",
        "__init__",
        ns,
    )
    functools.update_wrapper(init, original)
    type.__setattr__(cls, _MARK, _REBUILD)
    if not _compat.register_dataclass_node(cls, data, [_MARK, *static]):  # pragma: no cover
        type.__delattr__(cls, _MARK)
        return False
    type.__setattr__(cls, "__init__", init)
    return True


def _register_python(cls: type, data: list[str], static: list[str], has_dict: bool) -> None:
    """Fallback: Python flatten/unflatten callbacks (generated straight-line code)."""

    def tup(items: list[str]) -> str:
        return "(" + "".join(f"{x}, " for x in items) + ")"

    ns: dict[str, Any] = {
        "_cls": cls,
        "_new": object.__new__,
        "_set": object.__setattr__,
        "_keys": tuple(jax.tree_util.GetAttrKey(n) for n in data),
    }
    flatten = _compile(
        f"def flatten(o):\n    return {tup([f'o.{n}' for n in data])}, "
        f"{tup([f'o.{n}' for n in static])}\n",
        "flatten",
        ns,
    )
    flatten_with_keys = _compile(
        "def flatten_with_keys(o):\n"
        f"    return {tup([f'(_keys[{i}], o.{n})' for i, n in enumerate(data)])}, "
        f"{tup([f'o.{n}' for n in static])}\n",
        "flatten_with_keys",
        ns,
    )
    lines = ["def unflatten(aux, children):", "    o = _new(_cls)"]
    if has_dict:
        lines.append("    d = o.__dict__")
    if data:
        lines.append(f"    [{', '.join(f'c{i}' for i in range(len(data)))}] = children")
    if static:
        lines.append(f"    [{', '.join(f'a{i}' for i in range(len(static)))}] = aux")
    for prefix, names in (("c", data), ("a", static)):
        for i, n in enumerate(names):
            if has_dict:
                lines.append(f"    d[{n!r}] = {prefix}{i}")
            else:
                lines.append(f"    _set(o, {n!r}, {prefix}{i})")
    lines.append("    return o\n")
    unflatten = _compile("\n".join(lines), "unflatten", ns)
    jax.tree_util.register_pytree_with_keys(cls, flatten_with_keys, unflatten, flatten)


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

    Subclasses must be decorated again to become pytrees of their own.

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
        _register(dc, generated_init=generated_init)
        return dc  # type: ignore[return-value]

    if cls is None:
        return wrap
    return wrap(cls)


# --------------------------------------------------------------------------------------
# Switchable __post_init__ validation
# --------------------------------------------------------------------------------------

_POST_INIT_ENABLED: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "primforge_post_init_enabled", default=True
)


def is_post_init_enabled() -> bool:
    """Whether ``__post_init__`` methods decorated with
    :func:`skip_post_init_if_disabled` currently run.

    Returns:
        True outside any :func:`no_post_init` block (or inside :func:`enable_post_init`).

    Example:
        >>> from primforge.utils import is_post_init_enabled, no_post_init
        >>> with no_post_init():
        ...     is_post_init_enabled()
        False
    """
    return _POST_INIT_ENABLED.get()


@contextlib.contextmanager
def _post_init_state(enabled: bool) -> Iterator[None]:
    token = _POST_INIT_ENABLED.set(enabled)
    try:
        yield
    finally:
        _POST_INIT_ENABLED.reset(token)


def no_post_init() -> contextlib.AbstractContextManager[None]:
    """Context manager that switches off opted-in ``__post_init__`` validation.

    Inside the block, ``__post_init__`` methods decorated with
    :func:`skip_post_init_if_disabled` return immediately. The state is a context variable:
    it is per thread and per asyncio task, and nests (the previous state is restored on
    exit). Use it while building intermediate objects that break invariants on purpose.

    Returns:
        A context manager.

    Example:
        >>> from primforge.utils import dataclass, no_post_init, skip_post_init_if_disabled
        >>> @dataclass
        ... class Positive:
        ...     x: float
        ...     @skip_post_init_if_disabled
        ...     def __post_init__(self):
        ...         if self.x <= 0:
        ...             raise ValueError("x must be positive")
        >>> with no_post_init():
        ...     Positive(-1.0)
        Positive(x=-1.0)
    """
    return _post_init_state(False)


def enable_post_init() -> contextlib.AbstractContextManager[None]:
    """Context manager that switches opted-in ``__post_init__`` validation back on.

    The counterpart of :func:`no_post_init`, for a region inside one that must validate.

    Returns:
        A context manager.

    Example:
        >>> from primforge.utils import enable_post_init, is_post_init_enabled, no_post_init
        >>> with no_post_init(), enable_post_init():
        ...     is_post_init_enabled()
        True
    """
    return _post_init_state(True)


def skip_post_init_if_disabled(post_init: Callable[..., None]) -> Callable[..., None]:
    """Decorate a ``__post_init__`` so that it is skipped inside :func:`no_post_init`.

    Args:
        post_init: The ``__post_init__`` method (``InitVar`` arguments are forwarded).

    Returns:
        The wrapped method; outside :func:`no_post_init` it behaves exactly as before.

    Example:
        >>> from primforge.utils import dataclass, no_post_init, skip_post_init_if_disabled
        >>> @dataclass
        ... class Sorted:
        ...     keys: tuple
        ...     @skip_post_init_if_disabled
        ...     def __post_init__(self):
        ...         if list(self.keys) != sorted(self.keys):
        ...             raise ValueError("keys must be sorted")
        >>> Sorted((2, 1))
        Traceback (most recent call last):
            ...
        ValueError: keys must be sorted
        >>> with no_post_init():
        ...     Sorted((2, 1)).keys
        (2, 1)
    """

    @functools.wraps(post_init)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> None:
        if _POST_INIT_ENABLED.get():
            post_init(self, *args, **kwargs)

    return wrapper
