"""Kernel identity: what names a Numba kernel's FFI target, the same in every process.

:func:`identity` hashes what decides the code that runs; :func:`target_name` adds the
primitive, the signature and debug mode; :func:`as_dispatcher` makes one ``numba.njit``
dispatcher per plain function.
"""

from __future__ import annotations

import hashlib
import pickle
import re
import types as _pytypes
import weakref
from typing import Any

import numpy as np

__all__ = ["as_dispatcher", "forget_jitted", "identity", "jitted", "target_name"]

# plain Python function (held weakly) -> the numba.njit dispatcher made here for a copy of
# it. The copy (same code, globals, closure, defaults and names) is what the dispatcher
# holds, so the dispatcher does not keep the function alive: both go once the function
# is no longer used (a dispatcher can't be freed by the cycle collector).
_JITTED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _copy(fn: _pytypes.FunctionType) -> _pytypes.FunctionType:
    twin = _pytypes.FunctionType(
        fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__
    )
    twin.__kwdefaults__ = fn.__kwdefaults__
    twin.__qualname__, twin.__module__, twin.__doc__ = fn.__qualname__, fn.__module__, fn.__doc__
    twin.__annotations__ = dict(fn.__annotations__)
    twin.__dict__.update(fn.__dict__)  # e.g. __wrapped__, which signatures follow
    return twin


def as_dispatcher(fn: Any) -> Any:
    """``fn`` as a Numba CPU dispatcher: itself, or (a plain function) jitted once here.

    The dispatcher made for a plain function lives as long as the function does.

    Raises:
        TypeError: for anything else, naming the forms a numba kernel may take.

    Example:
        >>> def double(x, out):
        ...     out[0] = 2 * x[0]
        >>> as_dispatcher(double) is as_dispatcher(double)
        True
    """
    import numba
    from numba.core.registry import CPUDispatcher

    if isinstance(fn, CPUDispatcher):
        return fn
    if isinstance(fn, _pytypes.FunctionType):
        dispatcher = _JITTED.get(fn)
        if dispatcher is None:
            dispatcher = _JITTED[fn] = numba.njit(_copy(fn))
        return dispatcher
    raise TypeError(
        "the numba backend expects a numba.njit function (or a plain Python function, or a "
        "NumbaKernel from numba_kernel), or a kernel generator may return a traceable JAX "
        f"callable of the inputs; got {type(fn).__name__}: {fn!r}"
    )


def jitted(fn: Any) -> Any:
    """The dispatcher :func:`as_dispatcher` made for ``fn``, else ``fn`` itself.

    Example:
        >>> jitted(len) is len
        True
    """
    if isinstance(fn, _pytypes.FunctionType):
        return _JITTED.get(fn, fn)
    return fn


def forget_jitted() -> None:
    """Drop every dispatcher :func:`as_dispatcher` made (they are made again on use).

    Example:
        >>> forget_jitted()
    """
    _JITTED.clear()


def _safe(text: str) -> str:
    return re.sub(r"[^0-9A-Za-z_]+", "_", text).strip("_")[:48]


def target_name(kernel: Any, name: str, in_sig, out_sig, n_levels: int, debug: bool):
    """``(base target name, label)`` for ``kernel`` serving primitive ``name``.

    The base name depends on the primitive name, :func:`identity` and the signature only;
    the label names the kernel in error messages.

    Example:
        >>> import numba
        >>> @numba.njit
        ... def neg(x, out):
        ...     out[0] = -x[0]
        >>> base, label = target_name(neg, "neg", (), (), 0, False)
        >>> base.startswith("primforge_numba_neg_neg_"), label
        (True, "primforge numba kernel 'neg' (primforge.backends.numba._identity.neg)")
    """
    ident = identity(kernel)
    qual = ident.split("@")[0].rsplit(".", 1)[-1]
    sig_text = repr((ident, name, in_sig, out_sig, n_levels, bool(debug)))
    digest = hashlib.sha256(sig_text.encode()).hexdigest()[:16]
    base = f"primforge_numba_{_safe(name)}_{_safe(qual)}_{digest}" + ("_dbg" if debug else "")
    label = f"primforge numba kernel {name!r} ({ident.split('@')[0]})"
    return base, label


def _digest_of(value, seen) -> bytes:
    h = hashlib.sha256()
    _feed(h, value, seen)
    return h.digest()


def _feed(h, value, seen):
    """Feed ``value`` to ``h`` the same way in every process (no ``hash()``, no ``id()``
    where avoidable, sets in a sorted order)."""
    from numba.core.registry import CPUDispatcher

    if isinstance(value, CPUDispatcher):
        h.update(b"D")
        h.update(identity(value, seen).encode())
    elif isinstance(value, _pytypes.FunctionType):
        h.update(b"F" + value.__qualname__.encode())
        _feed_code(h, value.__code__, seen)
    elif isinstance(value, _pytypes.CodeType):
        _feed_code(h, value, seen)
    elif isinstance(value, _pytypes.ModuleType):
        h.update(b"M" + value.__name__.encode())
    elif isinstance(value, np.ndarray):
        h.update(b"A" + str((value.dtype.str, value.shape)).encode() + value.tobytes())
    elif isinstance(value, (set, frozenset)):
        # Iteration order of a set depends on the hash seed: feed the members' digests sorted.
        h.update(b"S" + type(value).__name__.encode() + str(len(value)).encode())
        for d in sorted(_digest_of(v, seen) for v in value):
            h.update(d)
    elif isinstance(value, dict):
        h.update(b"K" + str(len(value)).encode())
        for d in sorted(_digest_of(v, seen) for v in value.items()):
            h.update(d)
    elif isinstance(value, (tuple, list)):
        h.update(b"T" + type(value).__name__.encode() + str(len(value)).encode())
        for v in value:
            _feed(h, v, seen)
    elif value is None or isinstance(value, (bool, int, float, complex, str, bytes, np.generic)):
        h.update(b"V" + type(value).__name__.encode() + repr(value).encode())
    else:
        _feed_object(h, value)


def _feed_object(h, value):
    # Anything else (an enum, a jitclass instance, ...): its pickle when it has one, which
    # is stable across processes; else its identity, which keeps two different objects
    # from sharing a target at the price of a process-specific target name.
    h.update(b"O" + type(value).__module__.encode() + type(value).__qualname__.encode())
    try:
        h.update(pickle.dumps(value, protocol=4))
    except Exception:  # noqa: BLE001  (unpicklable: fall back to identity)
        h.update(f"id{id(value)}".encode())


def _feed_code(h, code, seen):
    h.update(code.co_code)
    h.update(repr((code.co_names, code.co_varnames, code.co_freevars)).encode())
    for c in code.co_consts:
        _feed(h, c, seen)


def _global_names(code):
    names = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, _pytypes.CodeType):
            names |= _global_names(c)
    return names


def _feed_globals(h, py, seen):
    """The globals ``py``'s code names (for a module global, the module's attributes the
    code names too)."""
    g = py.__globals__
    names = sorted(_global_names(py.__code__))
    for gname in names:
        if gname in g:
            h.update(b"G" + gname.encode())
            value = g[gname]
            _feed(h, value, seen)
            if isinstance(value, _pytypes.ModuleType):
                # `cfg.C`: the attribute's value decides the code, not just the module's name.
                for attr in names:
                    sub = getattr(value, attr, None)
                    if sub is not None and not isinstance(sub, _pytypes.ModuleType):
                        h.update(b"." + attr.encode())
                        _feed(h, sub, seen)


def identity(kernel: Any, seen: set[int] | None = None) -> str:
    """``module.qualname@hash`` of a dispatcher: code, constants, closure, globals it reads
    (for a module global, the module's attributes the code names), options.

    Example:
        >>> import numba
        >>> def make(c):
        ...     @numba.njit
        ...     def k(x, out):
        ...         out[0] = c * x[0]
        ...     return k
        >>> identity(make(2.0)) == identity(make(2.0)), identity(make(2.0)) == identity(make(3.0))
        (True, False)
    """
    seen = set() if seen is None else seen
    py = kernel.py_func
    if id(py) in seen:
        return py.__qualname__
    seen.add(id(py))
    h = hashlib.sha256()
    _feed_code(h, py.__code__, seen)
    _feed(h, py.__defaults__, seen)
    for cell in py.__closure__ or ():
        try:
            _feed(h, cell.cell_contents, seen)
        except ValueError:  # an empty cell
            h.update(b"E")
    _feed_globals(h, py, seen)
    opts = {k: v for k, v in kernel.targetoptions.items() if k != "cache"}
    _feed(h, sorted((k, repr(v)) for k, v in opts.items()), seen)
    return f"{py.__module__}.{py.__qualname__}@{h.hexdigest()[:16]}"
