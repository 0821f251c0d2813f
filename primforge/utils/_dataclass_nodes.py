"""Registration of :func:`primforge.utils.dataclass` classes as JAX pytree nodes.

Runs once per class, at decoration time, and generates straight-line code:
:func:`_storing_init`, :func:`_register_marked` and :func:`register_python`.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from typing import Any

import jax

from primforge import _compat
from primforge.utils._dataclass_fields import has_slotted_field, split_fields, storing_init_params


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

# Up to this many fields, the storing __init__ binds its parameters directly (cheapest for
# few fields); above, a keyword-dict fast path takes JAX's rebuild (see benchmarks/pytree.py).
_DIRECT_MAX_FIELDS = 6


class _Factory:
    """Default of a parameter whose field has a ``default_factory`` (as in dataclasses)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<factory>"


_FACTORY = _Factory()


def register(cls: type, *, generated_init: bool = False) -> None:
    """Register the dataclass ``cls`` as a pytree node (see docs/architecture.md)."""
    fields = dataclasses.fields(cls)
    data, static = split_fields(fields)
    if generated_init and _storing_init(cls, fields):
        if _compat.register_dataclass_node(cls, data, static):
            return
    elif _register_marked(cls, data, static):
        return
    # The fallback writes the instance dict where it can (slotted fields need setattr).
    has_dict = not has_slotted_field(cls, data + static)
    register_python(cls, data, static, has_dict)  # pragma: no cover - JAX without C++ nodes


def _storing_init(cls: type, fields: tuple[dataclasses.Field, ...]) -> bool:
    """Replace a generated ``__init__`` that runs no user code by one that stores faster.

    Applies when :func:`storing_init_params` finds the class qualifies. Such an
    ``__init__`` only stores its arguments, so JAX's C++ node may call it on unflatten
    without any code of the class running; the replacement takes the same parameters
    (order, keyword-only markers, defaults, default factories), and with many fields
    takes an all-keyword call (JAX's rebuild) without binding each parameter. Returns
    False, changing nothing, when the class does not qualify.
    """
    params = storing_init_params(cls, fields)
    if params is None:
        return False
    # Helper names start with "__pf_": a field cannot have such a name (inside a class
    # body it would be mangled), so no parameter shadows a helper.
    ns: dict[str, Any] = {"__pf_FACTORY": _FACTORY, "__pf_set": object.__setattr__}
    store = _compile(_direct_init_source(params, fields, ns), "__init__", ns)
    original = cls.__init__
    store.__qualname__ = original.__qualname__
    store.__module__ = original.__module__
    store.__doc__ = original.__doc__
    store.__annotations__ = dict(original.__annotations__)
    if len(fields) <= _DIRECT_MAX_FIELDS:
        type.__setattr__(cls, "__init__", store)
        return True
    init = _keyword_fast_init(store, frozenset(f.name for f in fields), ns)
    functools.update_wrapper(init, original)
    type.__setattr__(cls, "__init__", init)
    return True


def _direct_init_source(
    params: list[inspect.Parameter], fields: tuple[dataclasses.Field, ...], ns: dict[str, Any]
) -> str:
    """Source of an ``__init__`` with the generated one's parameters that stores each field.

    Defaults and default factories are put into ``ns`` under ``__pf_`` names.
    """
    by_name = {f.name: f for f in fields}
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
    body.append("    return None")
    return f"def __init__({', '.join(sig)}):\n" + "\n".join(body) + "\n"


def _keyword_fast_init(
    store: Callable[..., None], names: frozenset[str], ns: dict[str, Any]
) -> Callable[..., None]:
    """An ``__init__`` that stores an every-field keyword call in one loop, else calls ``store``.

    With many fields, binding each keyword to its parameter costs a name lookup per
    field, quadratic in the field count; every field given by keyword (what JAX's
    unflatten does) instead takes one pass over the keywords.
    """
    ns["__pf_store"] = store
    ns["__pf_NAMES"] = names
    fill = (
        "        for __pf_k, __pf_v in __pf_kwargs.items():\n"
        "            __pf_set(__pf_self, __pf_k, __pf_v)"
    )
    return _compile(
        "def __init__(__pf_self, /, *__pf_args, **__pf_kwargs):\n"
        "    if not __pf_args and __pf_kwargs.keys() == __pf_NAMES:\n"
        f"{fill}\n"
        "        return\n"
        "    __pf_store(__pf_self, *__pf_args, **__pf_kwargs)\n",
        "__init__",
        ns,
    )


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
    # object.__setattr__ rather than the instance dict: see _direct_init_source.
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


def register_python(cls: type, data: list[str], static: list[str], has_dict: bool) -> None:
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
