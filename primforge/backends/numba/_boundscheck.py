"""Bounds-checked copies of Numba kernels, helpers included (what debug mode runs).

:func:`bounds_checked` rebuilds a kernel's whole call graph with ``boundscheck=True`` (the
dispatchers its globals, closure cells and tuples hold; ``@overload`` and
``register_jitable`` implementations it reaches), run serially; a failed check raises
:class:`BoundsCheckIndexError` naming the index, the axis, its size and the array indexed.
"""

from __future__ import annotations

import contextlib
import threading
import types as _pytypes
import warnings
import weakref
from typing import Any

__all__ = ["BoundsCheckIndexError", "bounds_checked", "forget", "index_messages"]

# dispatcher -> its bounds-checked copy.
_COPIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_LOCK = threading.RLock()
# njit sets nopython itself (and warns); "parallel": see the module docstring.
_SKIP_OPTIONS = ("boundscheck", "cache", "nopython", "parallel")
_warned_env = False


def bounds_checked(kernel: Any) -> Any:
    """A copy of dispatcher ``kernel`` compiled with ``boundscheck=True``, and every njit
    function it reaches through its globals and closure cells likewise.

    Example:
        >>> import numba, numpy as np
        >>> @numba.njit
        ... def get(a, i):
        ...     return a[i]
        >>> @numba.njit
        ... def first_past_end(a):
        ...     return get(a, a.size)
        >>> checked = bounds_checked(first_past_end)
        >>> checked(np.zeros(3))
        Traceback (most recent call last):
        ...
        IndexError: index is out of bounds
        >>> bounds_checked(first_past_end) is checked
        True
    """
    _warn_if_disabled()
    with _LOCK:
        return _copy(kernel, {})


class BoundsCheckIndexError(IndexError):
    """An out-of-bounds index found by a debug-mode kernel: ``(index, axis, size)``, then
    optionally the array's variable name and where it lives (``argument of f``, ``in f``).

    Example:
        >>> str(BoundsCheckIndexError(9, 0, 8))
        'index 9 is out of bounds for axis 0 with size 8'
        >>> str(BoundsCheckIndexError(9, 0, 8, "out", "argument of kernel"))
        "index 9 is out of bounds for axis 0 with size 8 of array 'out' (argument of kernel)"
    """

    def __str__(self) -> str:
        if len(self.args) not in (3, 5):
            return super().__str__()
        index, axis, size = self.args[:3]
        text = f"index {index} is out of bounds for axis {axis} with size {size}"
        if len(self.args) == 5:
            array, where = self.args[3:]
            text += f" of array {array!r} ({where})"
        return text


@contextlib.contextmanager
def index_messages():
    """Within: Numba's bounds checks raise :class:`BoundsCheckIndexError` with the index's values.

    Use it around compiling bounds-checked code (Numba's compiler lock is held within).

    Example:
        >>> with index_messages():
        ...     pass
    """
    from numba.core import cgutils, lowering
    from numba.core.compiler_lock import global_compiler_lock
    from numba.core.typing import templates

    overloads = templates._OverloadFunctionTemplate
    with global_compiler_lock:
        original = cgutils.do_boundscheck
        original_inst = lowering.Lower.lower_inst
        original_impl = overloads._get_impl
        original_jitter = overloads._get_jit_decorator
        cgutils.do_boundscheck = _do_boundscheck
        lowering.Lower.lower_inst = _naming_lower_inst(original_inst)
        overloads._get_impl = _checked_get_impl(original_impl)
        overloads._get_jit_decorator = _checked_jit_decorator(original_jitter)
        try:
            yield
        finally:
            cgutils.do_boundscheck = original
            lowering.Lower.lower_inst = original_inst
            overloads._get_impl = original_impl
            overloads._get_jit_decorator = original_jitter


def _checking_caller() -> bool:
    """Whether the function being compiled now is compiled with bounds checking."""
    from numba.core import targetconfig

    flags = targetconfig.ConfigStack.top_or_none()
    return bool(flags is not None and getattr(flags, "boundscheck", False))


def _checked_get_impl(original):
    """``_OverloadFunctionTemplate._get_impl`` giving a bounds-checked caller its own
    implementation (``@overload``, ``register_jitable``), compiled with bounds checking and
    cached apart from the implementations built for callers outside debug mode."""
    from numba.core import targetconfig

    def _get_impl(self, args, kws):
        if not _checking_caller():
            return original(self, args, kws)
        flags = targetconfig.ConfigStack.top_or_none()
        key = (self.context, tuple(args), tuple(kws.items()), flags, "primforge-boundscheck")
        found = self._impl_cache.get(key)
        if found is not None:
            return found
        return self._build_impl(key, args, kws)

    return _get_impl


def _checked_jit_decorator(original):
    """``_get_jit_decorator`` adding ``boundscheck=True`` for a bounds-checked caller."""

    def _get_jit_decorator(self):
        jitter = original(self)
        if not _checking_caller():
            return jitter

        def checked(*args, **options):
            options["boundscheck"] = True
            return jitter(*args, **options)

        return checked

    return _get_jit_decorator


# (array variable, function) of the indexing statement being lowered, or None.
_SITE: list = [None]


def _naming_lower_inst(original):
    """``Lower.lower_inst`` recording which array the statement indexes (see _do_boundscheck)."""

    def lower_inst(self, inst):
        outer = _SITE[0]
        _SITE[0] = _indexed_array(inst, self.fndesc, getattr(self, "func_ir", None))
        try:
            return original(self, inst)
        finally:
            _SITE[0] = outer

    return lower_inst


def _indexed_array(inst, fndesc, func_ir) -> tuple[str, str] | None:
    from numba.core import ir

    var = None
    if isinstance(inst, (ir.SetItem, ir.StaticSetItem)):
        var = inst.target
    elif isinstance(inst, ir.Assign) and isinstance(inst.value, ir.Expr) and \
            inst.value.op in ("getitem", "static_getitem"):
        var = inst.value.value
    if var is None:
        return None
    name = _source_name(var.name, func_ir)
    function = getattr(fndesc, "qualname", None) or "?"
    if name is None:  # the array is the value of an expression
        return "<expression>", f"in {function}"
    if name in tuple(getattr(fndesc, "args", ())):
        return name, f"argument of {function}"
    return name, f"in {function}"


def _source_name(name: str, func_ir) -> str | None:
    """The source variable behind IR variable ``name`` (through temporaries that only copy
    one variable, e.g. a value kept across a branch), or None."""
    from numba.core import ir

    for _ in range(16):
        if not name.startswith("$"):
            return name.split(".")[0]  # SSA versions of a variable: x.1, x.2
        try:
            defs = func_ir._definitions[name]
        except (AttributeError, KeyError, TypeError):
            return None
        sources = {d.name for d in defs if isinstance(d, ir.Var)}
        sources |= {d.name for d in defs if isinstance(d, ir.Arg)}
        if len(sources) != 1 or len(defs) == 0 or not all(
                isinstance(d, (ir.Var, ir.Arg)) for d in defs):
            return None
        (name,) = sources
    return None


def _do_boundscheck(context, builder, ind, dimlen, axis=None):
    """Numba's bounds check, raising :class:`BoundsCheckIndexError` with the run-time values."""
    from llvmlite import ir
    from numba.core import cgutils, types

    i64 = ir.IntType(64)

    def wide(v):
        if isinstance(v, int):
            return i64(v)
        return builder.sext(v, i64) if v.type.width < 64 else v

    axis_v = wide(-1 if axis is None else axis)
    bad = builder.or_(builder.icmp_signed(">=", ind, dimlen),
                      builder.icmp_signed("<", ind, ind.type(0)))
    site = _SITE[0]
    with cgutils.if_unlikely(builder, bad):
        # The array and function names are constants of the exception (static arguments).
        context.call_conv.return_dynamic_user_exc(
            builder, BoundsCheckIndexError,
            (wide(ind), axis_v, wide(dimlen), *(site or ())), (types.int64,) * 3)


def forget(kernel: Any = None) -> None:
    """Drop the bounds-checked copy made for ``kernel`` (every copy when ``None``).

    Example:
        >>> forget()
    """
    with _LOCK:
        if kernel is None:
            _COPIES.clear()
        else:
            try:
                _COPIES.pop(kernel, None)
            except TypeError:  # not weakly referenceable: never stored
                pass


def _warn_if_disabled() -> None:
    global _warned_env
    from numba.core import config

    if config.BOUNDSCHECK == 0 and not _warned_env:
        _warned_env = True
        warnings.warn(
            "NUMBA_BOUNDSCHECK=0 turns Numba's bounds checking off everywhere: primforge's "
            "debug mode cannot check the indices of Numba kernels (unset it, or set it to 1)",
            RuntimeWarning,
            stacklevel=3,
        )


def _is_dispatcher(value: Any) -> bool:
    from numba.core.registry import CPUDispatcher

    return isinstance(value, CPUDispatcher)


def _copy(kernel: Any, memo: dict[int, Any]) -> Any:
    done = memo.get(id(kernel))
    if done is not None:
        return done
    try:
        cached = _COPIES.get(kernel)
    except TypeError:
        cached = None
    if cached is not None:
        return cached
    import numba

    py = kernel.py_func
    new_globals = dict(py.__globals__)
    cells = None
    if py.__closure__ is not None:
        cells = tuple(_pytypes.CellType() for _ in py.__closure__)
    fn = _pytypes.FunctionType(py.__code__, new_globals, py.__name__, py.__defaults__, cells)
    fn.__kwdefaults__ = py.__kwdefaults__
    fn.__qualname__ = py.__qualname__
    fn.__module__ = py.__module__
    fn.__doc__ = py.__doc__
    opts = {k: v for k, v in kernel.targetoptions.items() if k not in _SKIP_OPTIONS}
    checked = numba.njit(boundscheck=True, **opts)(fn)
    memo[id(kernel)] = checked  # before the helpers: a recursive call finds it
    names = _global_names(py.__code__)
    for name in names:
        if name in py.__globals__:
            value = py.__globals__[name]
            new = _replacement(value, names, memo)
            if new is not value:
                new_globals[name] = new
    for old, new_cell in zip(py.__closure__ or (), cells or ()):
        try:
            value = old.cell_contents
        except ValueError:  # an empty cell stays empty
            continue
        new_cell.cell_contents = _replacement(value, names, memo)
    try:
        _COPIES[kernel] = checked
    except TypeError:  # pragma: no cover - dispatchers support weak references
        pass
    return checked


def _replacement(value: Any, names: set[str], memo: dict[int, Any]) -> Any:
    """``value`` with the dispatchers it stands for replaced by bounds-checked copies."""
    if _is_dispatcher(value):
        return _copy(value, memo)
    if isinstance(value, tuple):  # dispatchers held in a (named) tuple, nested too
        items = [_replacement(v, names, memo) for v in value]
        if all(a is b for a, b in zip(items, value)):
            return value
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    if isinstance(value, _pytypes.ModuleType):
        hits = {a: getattr(value, a) for a in names
                if _is_dispatcher(getattr(value, a, None))}
        if hits:
            proxy = _pytypes.ModuleType(value.__name__, getattr(value, "__doc__", None))
            proxy.__dict__.update(vars(value))
            for attr, disp in hits.items():
                setattr(proxy, attr, _copy(disp, memo))
            return proxy
    return value


def _global_names(code: _pytypes.CodeType) -> set[str]:
    names = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, _pytypes.CodeType):
            names |= _global_names(c)
    return names
