"""Bounds-checked copies of Numba kernels, helpers included (what debug mode runs).

Design: ``numba.njit(boundscheck=True)`` on a kernel's ``py_func`` checks that function's
own indexing only; every other ``@njit`` function it calls keeps the options it was
compiled with. :func:`bounds_checked` therefore rebuilds the whole call graph: a copy of
the kernel's Python function whose globals and closure cells have each dispatcher they
hold replaced by its own bounds-checked copy (recursively, and through a module global
the code reads an attribute of, ``helpers.f``), compiled with the kernel's other options
and ``boundscheck=True``. Copies are made once per dispatcher and kept while it lives.

A copy runs serially (``parallel=True`` is dropped, ``prange`` is ``range``): Numba drops
an exception raised on a worker thread, so a threaded copy would stop at a bad index
without saying so.

``NUMBA_BOUNDSCHECK=0`` turns Numba's bounds checking off everywhere, these copies
included: :func:`bounds_checked` then warns once.
"""

from __future__ import annotations

import threading
import types as _pytypes
import warnings
import weakref
from typing import Any

__all__ = ["bounds_checked", "forget"]

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
