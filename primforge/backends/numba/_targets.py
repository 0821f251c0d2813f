"""Registered FFI targets of Numba kernels, their compiled entries, and the in-memory bound.

:func:`ensure_registered` gives each kernel and signature a target served by an entry
(:mod:`._entry`) and a handler (:mod:`._handler`); at most :func:`max_kernels`
entries are held, and a dropped one is rebuilt on demand. Everything runs under one lock.
"""

from __future__ import annotations

import collections
import ctypes
import functools
import os
import re
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from primforge import debug as _debug
from primforge._compat import ffi as _ffi
from primforge.backends import _xla_ffi
from primforge.backends.numba import _entry, _handler, _identity

__all__ = [
    "ENV_MAX_KERNELS",
    "LOCK",
    "disabled_checks",
    "drop",
    "ensure_registered",
    "exportable_targets",
    "held_kernels",
    "max_kernels",
    "prepare",
    "registered_targets",
]

ENV_MAX_KERNELS = "PRIMFORGE_NUMBA_MAX_KERNELS"
_DEFAULT_MAX_KERNELS = 256

#: Guards every table below (re-entrant: a revive callback may build an entry).
LOCK = threading.RLock()


class _Target:
    """One registered FFI target: its handler (kept for the whole process, since XLA can't
    forget a target) and the slot the handler reads the entry's address from."""

    def __init__(self, name, token, label, views, debug, kernel):
        self.name = name
        self.token = token
        self.label = label
        self.views = views
        self.debug = debug
        self.slot = ctypes.c_int64(0)
        self.handler_address = 0
        self.entry = None  # the compiled entry (a numba CFunc) while it is held
        self.set_owner(kernel)

    def set_owner(self, kernel):
        try:
            self.owner = weakref.ref(kernel)
        except TypeError:  # pragma: no cover - dispatchers support weak references
            self.owner = lambda k=kernel: k

    def owner_alive(self):
        return self.owner() is not None


_BY_NAME: dict[str, _Target] = {}
_BY_TOKEN: list[_Target] = []
# kernel dispatcher -> {signature key -> target name}
_BY_KERNEL: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# target name -> target, for targets whose entry is held; least recently used first.
_HELD: collections.OrderedDict[str, _Target] = collections.OrderedDict()


def max_kernels() -> int:
    """How many kernel entries are held (``PRIMFORGE_NUMBA_MAX_KERNELS``; default 256).

    A held entry keeps its kernel's Numba compile result alive. Beyond the bound, the least
    recently used entry is dropped (see :func:`primforge.backends.numba.clear`) and
    rebuilt from the same machine code when it is called again.

    Example:
        >>> max_kernels() >= 1
        True
    """
    raw = os.environ.get(ENV_MAX_KERNELS, "")
    try:
        value = int(raw) if raw.strip() else _DEFAULT_MAX_KERNELS
    except ValueError:
        raise ValueError(f"{ENV_MAX_KERNELS} must be a positive integer, got {raw!r}") from None
    if value < 1:
        raise ValueError(f"{ENV_MAX_KERNELS} must be a positive integer, got {raw!r}")
    return value


def registered_targets() -> dict[str, int]:
    """FFI targets this process registered: target name -> the handler's address.

    A target stays registered for the whole process (XLA has no way to remove one); its
    compiled kernel may have been dropped (see :func:`primforge.backends.numba.clear`)
    and is then rebuilt on use.

    Example:
        >>> isinstance(registered_targets(), dict)
        True
    """
    with LOCK:
        return {t.name: t.handler_address for t in _BY_NAME.values()}


def exportable_targets() -> tuple[str, ...]:
    """Names of every numba FFI target registered in this process, sorted.

    Example:
        >>> isinstance(exportable_targets(), tuple)
        True
    """
    with LOCK:
        return tuple(sorted(_BY_NAME))


def held_kernels() -> list[str]:
    """Targets whose compiled kernel is currently held in memory, least recently used first.

    Example:
        >>> isinstance(held_kernels(), list)
        True
    """
    with LOCK:
        return list(_HELD)


def drop(kernel: Any = None) -> int:
    """Drop the held entries of dispatcher ``kernel`` (every held entry when ``None``).

    Returns:
        How many entries were dropped.

    Example:
        >>> drop(object())
        0
    """
    with LOCK:
        if kernel is None:
            names = list(_HELD)
        else:
            try:
                names = list(_BY_KERNEL.get(kernel, {}).values())
            except TypeError:
                names = []
        n = 0
        for name in names:
            target = _BY_NAME.get(name)
            if target is not None and target.entry is not None:
                _drop(target)
                n += 1
        return n


def _drop(target: _Target) -> None:
    target.slot.value = 0
    target.entry = None
    _HELD.pop(target.name, None)


def ensure_registered(kernel, name, in_sig, out_sig, n_levels, debug=False) -> str:
    """The FFI target serving dispatcher ``kernel`` as primitive ``name`` for this
    signature, registered (handler) and held (entry); returns its name.

    The entry is compiled before anything is registered, so a kernel that does not compile
    registers nothing.
    """
    key = (name, in_sig, out_sig, n_levels, bool(debug))
    with LOCK:
        per_kernel = _BY_KERNEL.get(kernel)
        target = _BY_NAME.get(per_kernel.get(key)) if per_kernel else None
        if target is not None and target.owner() is kernel:
            if target.entry is None:
                _build_entry(target, kernel)
            else:
                _HELD.move_to_end(target.name)
            return target.name
        base, label = _identity.target_name(kernel, name, in_sig, out_sig, n_levels, debug)
        target_name = _free_name(base, kernel)
        target = _BY_NAME.get(target_name)
        if target is None:
            views = tuple((view, rank) for _ffi_dt, view, rank, *_ in in_sig + out_sig)
            target = _Target(target_name, len(_BY_TOKEN), label, views, bool(debug), kernel)
            _build_entry(target, kernel)  # first: a kernel that does not compile registers nothing
            _register_handler(target, in_sig, out_sig, n_levels)
            _BY_TOKEN.append(target)
            _BY_NAME[target_name] = target
        else:
            if target.owner() is not kernel:
                _drop(target)
                target.set_owner(kernel)
            if target.entry is None:
                _build_entry(target, kernel)
        _BY_KERNEL.setdefault(kernel, {})[key] = target_name
        return target_name


def _free_name(base: str, kernel) -> str:
    """``base``, or ``base_2``, ``base_3``...: the first name not taken by another live
    kernel (a target whose kernel is gone, or that is ``kernel``'s, may be reused)."""
    target_name, n = base, 1
    while True:
        target = _BY_NAME.get(target_name)
        if target is None or not target.owner_alive() or target.owner() is kernel:
            return target_name
        n += 1
        target_name = f"{base}_{n}"


def _kernel_to_compile(kernel, debug: bool):
    if not debug:
        return kernel
    from primforge.backends.numba._boundscheck import bounds_checked

    return bounds_checked(kernel)  # the helpers it calls are checked too


def _build_entry(target: _Target, kernel) -> None:
    limit = max_kernels()  # a bad setting fails before anything is built or held
    compiled = _kernel_to_compile(kernel, target.debug)
    if target.debug:
        from primforge.backends.numba._boundscheck import index_messages

        with index_messages():  # debug: the error names the index, axis and size
            entry = _entry.compile_entry(compiled, target.views, target.label)
    else:
        entry = _entry.compile_entry(compiled, target.views, target.label)
    target.entry = entry
    target.slot.value = entry.address
    _HELD[target.name] = target
    _HELD.move_to_end(target.name)
    while len(_HELD) > limit:
        _drop(next(iter(_HELD.values())))


def _register_handler(target: _Target, in_sig, out_sig, n_levels) -> None:
    codes = _xla_ffi.data_type_codes()
    specs = [
        _handler.BufferSpec(codes[fd], np.dtype(vd).itemsize, rank, tuple(mapped), f"input {i}")
        for i, (fd, vd, rank, mapped) in enumerate(in_sig)
    ]
    specs += [
        _handler.BufferSpec(
            codes[fd], np.dtype(vd).itemsize, rank, (True,) * n_levels, f"output {j}"
        )
        for j, (fd, vd, rank) in enumerate(out_sig)
    ]
    revive, report = _callbacks()
    symbol = _handler.unique_symbol("primforge_handler_" + target.name)
    text = _handler.build_handler(
        symbol,
        target.label,
        specs[: len(in_sig)],
        specs[len(in_sig) :],
        n_levels=n_levels,
        slot_addr=ctypes.addressof(target.slot),
        revive_addr=ctypes.cast(revive, ctypes.c_void_p).value,
        report_addr=ctypes.cast(report, ctypes.c_void_p).value,
        token=target.token,
    )
    address = _handler.jit_module(text, symbol)
    jax.devices("cpu")  # XLA:CPU must be initialised before registering a target
    _ffi.register_ffi_target(target.name, _ffi.pycapsule(address), platform="cpu")
    target.handler_address = address


_REVIVE_T = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64)
_REPORT_T = ctypes.CFUNCTYPE(
    None, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64
)


@functools.cache
def _callbacks():
    # Kept alive for the process by functools.cache: handlers hold their addresses.
    return _REVIVE_T(_revive), _REPORT_T(_report)


def _revive(token: int) -> int:
    """Called by a handler (with the GIL, through ctypes) whose entry was dropped."""
    try:
        with LOCK:
            target = _BY_TOKEN[token]
            if target.slot.value:
                return target.slot.value
            kernel = target.owner()
            if kernel is None:
                return 0
            _build_entry(target, kernel)
            return target.slot.value
    except BaseException as e:  # noqa: BLE001  (never raise into XLA; the handler reports it)
        _REVIVE_FAILURES[token] = e
        return 0


# token -> why the last rebuild of that target's entry failed (read by _report).
_REVIVE_FAILURES: dict[int, BaseException] = {}


def _report(token: int, kind: int, info: int, buf: int, size: int) -> None:
    """Called by a handler (with the GIL, through ctypes) to word a failure."""
    try:
        label = _BY_TOKEN[token].label
    except Exception:  # noqa: BLE001
        label = "primforge numba kernel"
    try:
        failure = _REVIVE_FAILURES.pop(token, None)
        if kind == _handler.KIND_DROPPED and failure is not None:
            text = (f"{label}: its compiled code was dropped and rebuilding it failed: "
                    f"{type(failure).__name__}: {failure}")
        else:
            text = _entry.describe_failure(label, kind, info)
    except BaseException as e:  # noqa: BLE001  (never raise into XLA)
        text = f"{label} failed ({type(e).__name__} while describing the failure)"
    data = text.encode("utf-8", "replace")[: size - 1] + b"\0"
    ctypes.memmove(buf, data, len(data))


# --------------------------------------------------------------------------------------
# Export: which targets to allow, and registering them in a fresh process
# --------------------------------------------------------------------------------------

_TARGET_WORD = re.compile(r"primforge_numba_\w+")


def prepare(fn: Callable, *args: Any) -> tuple[str, ...]:
    """Trace and lower ``fn`` for ``args`` so that every Numba kernel it calls is compiled
    and its FFI target registered here; return the names of those targets.

    Use it before ``jax.export.export`` (to list the targets to allow, see
    :func:`disabled_checks`) and in a fresh process before calling a deserialized
    artifact: lowering the same function with the same kernels registers the same target
    names (they depend only on the kernels' code, constants and signatures), so the
    artifact finds its handlers. Nothing runs. In debug mode the targets of both modes are
    registered (the debug ones are returned): an artifact runs as it was exported, checked
    or not.

    Args:
        fn: a function of arrays (it may call :class:`primforge.NumbaKernel` objects and
            ``XLACustomKernel`` kernels with a Numba backend).
        *args: arrays or ``jax.ShapeDtypeStruct`` in the place of ``fn``'s arguments.

    Returns:
        The sorted names of the numba FFI targets in ``fn``'s lowering.

    Example:
        >>> import jax, jax.numpy as jnp, numba
        >>> from primforge.backends.numba import numba_kernel
        >>> @numba.njit
        ... def twice(x, out):
        ...     for i in range(x.size):
        ...         out[i] = 2 * x[i]
        >>> spec = jax.ShapeDtypeStruct((3,), jnp.float32)
        >>> k = numba_kernel(twice, spec)
        >>> (target,) = prepare(k, spec)
        >>> target.startswith("primforge_numba_twice")
        True
    """
    # A fresh wrapper each time: JAX must not reuse a trace made in another debug mode.
    text = jax.jit(lambda *a: fn(*a)).lower(*args).as_text()
    if _debug.enabled():
        # Debug mode names its targets apart; an artifact exported outside debug mode names
        # the others, and runs as it was traced: register those too.
        with _debug.debug_mode(False):
            jax.jit(lambda *a: fn(*a)).lower(*args)
    known = set(exportable_targets())
    return tuple(sorted({w for w in _TARGET_WORD.findall(text) if w in known}))


def disabled_checks(targets: Sequence[str] | None = None) -> list[Any]:
    """The ``jax.export`` safety-check exemptions for numba targets.

    ``jax.export`` refuses custom calls it does not know to be stable; a primforge numba
    target is stable in the sense it asks for as long as the importing process registers
    it (see :func:`prepare`). Pass the result as ``disabled_checks=``.

    Args:
        targets: target names (default: :func:`exportable_targets`).

    Example:
        >>> import jax, jax.numpy as jnp, numba
        >>> from jax import export
        >>> from primforge.backends.numba import numba_kernel
        >>> @numba.njit
        ... def inc(x, out):
        ...     for i in range(x.size):
        ...         out[i] = x[i] + 1
        >>> spec = jax.ShapeDtypeStruct((2,), jnp.float32)
        >>> f = numba_kernel(inc, spec)
        >>> checks = disabled_checks(prepare(f, spec))
        >>> exp = export.export(jax.jit(f), disabled_checks=checks)(spec)
        >>> exp.call(jnp.zeros(2, jnp.float32))
        Array([1., 1.], dtype=float32)
    """
    from jax import export

    names = exportable_targets() if targets is None else tuple(targets)
    return [export.DisabledSafetyCheck.custom_call(t) for t in names]
