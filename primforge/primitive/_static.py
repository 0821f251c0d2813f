"""Static params: keyword params of a primitive turned into equivalent hashable values.

:func:`static_param` is idempotent; arrays are refused with a message saying to pass them
as operands.
"""

from __future__ import annotations

import types
from collections.abc import Iterator, Mapping
from typing import Any

import jax
import numpy as np

from primforge import _compat

__all__ = ["FrozenDict", "HashableCallable", "static_param"]


class FrozenDict(Mapping):
    """An immutable, hashable mapping: what an impl receives for a ``dict`` param.

    Equality and hash ignore insertion order, like ``dict`` equality.

    Example:
        >>> from primforge.primitive import FrozenDict
        >>> d = FrozenDict({"b": 2, "a": 1})
        >>> d["a"], len(d), d == FrozenDict(a=1, b=2), hash(d) == hash(FrozenDict(a=1, b=2))
        (1, 2, True, True)
    """

    __slots__ = ("_data", "_hash")

    def __init__(self, *args: Any, **kwargs: Any):
        self._data = dict(*args, **kwargs)
        self._hash: int | None = None

    def __getitem__(self, key: Any) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(frozenset(self._data.items()))
        return self._hash

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FrozenDict):
            return self._data == other._data
        return NotImplemented

    def __repr__(self) -> str:
        return f"FrozenDict({self._data!r})"


class _ById:
    """Hashes and compares by identity: a safe key for values that cannot be hashed."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def __hash__(self) -> int:
        return id(self.value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _ById) and other.value is self.value


class HashableCallable:
    """A function param made hashable by what it computes rather than by identity.

    Two wrappers are equal when their functions share the code object, the closure
    contents, the defaults and the globals namespace, so re-creating an identical lambda
    (or closure over equal values) gives an equal key and hits the jit caches. Closure
    values that cannot be hashed (arrays) are compared by identity. Calling the wrapper
    calls the function; the function itself is ``.fn``.

    Example:
        >>> from primforge.primitive import HashableCallable
        >>> def make(k):
        ...     return lambda x: x * k
        >>> HashableCallable(make(2)) == HashableCallable(make(2))
        True
        >>> HashableCallable(make(2)) == HashableCallable(make(3))
        False
        >>> HashableCallable(make(2))(5)
        10
    """

    __slots__ = ("__weakref__", "_hash", "_key", "fn")

    def __init__(self, fn: types.FunctionType, _seen: frozenset[int] = frozenset()):
        if isinstance(fn, HashableCallable):
            fn = fn.fn
        self.fn = fn
        seen = _seen | {id(fn)}
        cells = []
        for cell in fn.__closure__ or ():
            try:
                value = cell.cell_contents
            except ValueError:  # an empty cell (variable not yet assigned)
                cells.append(_ById(cell))
                continue
            cells.append(_closure_key(value, seen))
        self._key = (
            fn.__code__,
            id(fn.__globals__),
            tuple(cells),
            _closure_key(fn.__defaults__, seen),
            _closure_key(fn.__kwdefaults__, seen),
        )
        self._hash = hash(self._key)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, HashableCallable):
            return NotImplemented
        return self._hash == other._hash and self._key == other._key

    def __repr__(self) -> str:
        return f"HashableCallable({getattr(self.fn, '__qualname__', self.fn)!r})"


_RECURSIVE = "<recursive reference>"


def _closure_key(value: Any, seen: frozenset[int]) -> Any:
    # Keys carry the type so that 1, 1.0 and True captured by a closure stay distinct.
    if isinstance(value, types.FunctionType):
        if id(value) in seen:  # a recursive closure refers to itself (or to an enclosing one)
            return (_RECURSIVE, value.__code__)
        return HashableCallable(value, seen)
    if isinstance(value, (list, tuple)):
        return (type(value), tuple(_closure_key(v, seen) for v in value))
    if isinstance(value, dict):
        return (dict, frozenset((k, _closure_key(v, seen)) for k, v in value.items()))
    try:
        hash(value)
    except TypeError:
        return _ById(value)
    return (type(value), value)


_ARRAY_PARAM_MSG = (
    "{where}: static param {name!r} is {what} ({desc}). Static params are fixed when the "
    "call is traced (they key the compiled program), so they must be hashable Python "
    "values. If the value varies or should be differentiated, pass it as an array input "
    "instead (a positional argument of the kernel call, an operand of a primitive's "
    "`bind`) and read it in the kernel as an input. If it is a constant, pass a hashable "
    "Python value: float(x) or int(x) for a scalar, tuple(np.asarray(x).tolist()) for a "
    "small array{static_hint}."
)
_TRACED_HINT = (
    ", or mark the argument it comes from static in the enclosing transformation "
    "(jax.jit(..., static_argnums=...))"
)


# Long only for its docstring (arguments, conversions, runnable examples); the code is short.
def static_param(value: Any, *, name: str = "param", where: str = "static_param") -> Any:
    """Convert a keyword param of ``bind`` to an equivalent hashable value.

    * lists and tuples become tuples (converted element by element);
    * dicts become :class:`FrozenDict`, sets become frozensets;
    * plain Python functions (including lambdas and closures) become
      :class:`HashableCallable`, keyed by code, closure contents and defaults;
    * NumPy and JAX arrays are rejected with a ``TypeError`` (pass them as operands);
    * anything else must already be hashable.

    The conversion is idempotent, so converting converted params is cheap and harmless.

    Args:
        value: the param value.
        name: the param name, used in error messages.
        where: who is asking, used in error messages (e.g. the primitive name).

    Returns:
        A hashable value equivalent to ``value``.

    Raises:
        TypeError: for arrays and for values that cannot be made hashable.

    Example:
        >>> from primforge.primitive import static_param
        >>> static_param([1, [2, 3]])
        (1, (2, 3))
        >>> static_param({"axis": [0, 1]})
        FrozenDict({'axis': (0, 1)})
        >>> static_param(lambda x: x) == static_param(lambda x: x)
        False
        >>> f = lambda x: x + 1
        >>> static_param(f) == static_param(lambda x: x + 1)  # different code objects
        False
        >>> make = lambda: (lambda x: x + 1)
        >>> static_param(make()) == static_param(make())  # same code, re-created
        True
    """
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
        return value
    if isinstance(value, (HashableCallable, FrozenDict)):
        return value
    if isinstance(value, (np.ndarray, jax.Array)):
        traced = isinstance(value, _compat.Tracer)
        desc = f"{type(value).__name__} of shape {getattr(value, 'shape', '?')}"
        raise TypeError(_ARRAY_PARAM_MSG.format(
            where=where, name=name, desc=desc,
            what="a traced value" if traced else "an array",
            static_hint=_TRACED_HINT if traced else "",
        ))
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return tuple(static_param(v, name=f"{name}[{i}]", where=where) for i, v in enumerate(value))
    if isinstance(value, dict):
        return FrozenDict(
            {k: static_param(v, name=f"{name}[{k!r}]", where=where) for k, v in value.items()}
        )
    if isinstance(value, set):
        return frozenset(static_param(v, name=name, where=where) for v in value)
    if isinstance(value, types.FunctionType):
        return HashableCallable(value)
    try:
        hash(value)
    except TypeError:
        raise TypeError(
            f"{where}: keyword param {name!r} of type {type(value).__name__} is not "
            f"hashable. Keyword params of a primitive are static and must be hashable "
            f"(lists, tuples, dicts, sets and plain functions are converted for you). Make "
            f"the value hashable, or pass arrays as positional operands."
        ) from None
    return value
