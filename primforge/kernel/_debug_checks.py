"""Debug-mode checks woven into a kernel's lowering (what ``primforge.debug_mode`` turns on).

Output coverage (pre-filled outputs, two runs with two fill patterns, for backends with a
``debug_prefill`` hook), comparison with the reference backend, and the report of the first
failure as a :class:`~primforge.KernelError` raised inside the compiled call.
"""

from __future__ import annotations

import itertools
import re
import threading
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from primforge import backends as _backends
from primforge.kernel.errors import KernelError

__all__ = ["checked_call", "reraise"]

_LOW_PRECISION = (1e-1, 1e-1)  # 8-bit float formats

_MARK = "[primforge debug #{}]"
_MARK_RE = re.compile(r"\[primforge debug #(\d+)\]")
_ERRORS: dict[int, Exception] = {}
_ERRORS_LOCK = threading.Lock()
_ERROR_IDS = itertools.count(1)


def fill(struct, pattern: int) -> jax.Array:
    """An array shaped like ``struct`` holding fill pattern 0 (NaN-like) or 1.

    Example:
        >>> fill(jax.ShapeDtypeStruct((2,), jnp.int8), 0)
        Array([90, 90], dtype=int8)
    """
    dtype = np.dtype(struct.dtype)
    if dtype == np.bool_:
        value: Any = pattern == 0
    elif dtype.kind == "c":
        value = complex(np.nan, np.nan) if pattern == 0 else complex(-1.2345e4, 5.4321e3)
    elif dtype.kind == "f" or jnp.issubdtype(dtype, jnp.floating):
        value = np.nan if pattern == 0 else -1.2345e4
    else:
        value = np.frombuffer(bytes([0x5A if pattern == 0 else 0xA5]) * dtype.itemsize,
                              dtype=dtype)[0]
    return jnp.full(tuple(struct.shape), value, dtype)


def _bits(x: jax.Array) -> list[jax.Array]:
    dtype = np.dtype(x.dtype)
    if dtype == np.bool_ or dtype.kind in "iu":
        return [x]
    if dtype.kind == "c":
        return _bits(jnp.real(x)) + _bits(jnp.imag(x))
    width = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}[dtype.itemsize]
    return [jax.lax.bitcast_convert_type(x, width)]


def untouched(a: jax.Array, b: jax.Array) -> jax.Array:
    """Elements whose bits differ between two runs with different fills (bool mask).

    Example:
        >>> untouched(jnp.array([1.0, jnp.nan]), jnp.array([1.0, 2.0]))
        Array([False,  True], dtype=bool)
    """
    mask = jnp.zeros(a.shape, bool)
    for x, y in zip(_bits(a), _bits(b)):
        mask = mask | (x != y)
    return mask


def tolerance(dtype) -> tuple[float, float]:
    """(rtol, atol) used for ``dtype`` (exact for integers and booleans).

    Example:
        >>> tolerance(jnp.float32)
        (0.0001, 1e-06)
    """
    dtype = np.dtype(dtype)
    if dtype == np.bool_ or dtype.kind in "iu":
        return 0.0, 0.0
    from primforge.debug import TOLERANCES

    return TOLERANCES.get(dtype.name, _LOW_PRECISION)


def differs(got: jax.Array, ref: jax.Array) -> jax.Array:
    """Elements where ``got`` and ``ref`` disagree beyond the dtype's tolerance (bool mask).

    NaN matches NaN and infinities match themselves.

    Example:
        >>> differs(jnp.array([1.0, jnp.nan, 3.0]), jnp.array([1.0, jnp.nan, 3.5]))
        Array([False, False,  True], dtype=bool)
    """
    rtol, atol = tolerance(got.dtype)
    if rtol == 0.0 and atol == 0.0:
        return got != ref
    wide = jnp.promote_types(got.dtype, jnp.float32)
    g, r = got.astype(wide), ref.astype(wide)
    both_nan = jnp.isnan(g) & jnp.isnan(r)
    same = (g == r) | both_nan
    close = jnp.abs(g - r) <= atol + rtol * jnp.abs(r)
    return ~(same | close)


# ------------------------------------------------------------------ the checked call
def checked_call(
    name: str,
    backend: str,
    outs: Sequence[Any],
    run: Callable[..., Sequence[jax.Array]],
    prefilled_run: Callable[[Sequence[jax.Array], int], Sequence[jax.Array]] | None,
    prefilled: Sequence[int],
    reference: Callable[..., Sequence[jax.Array]] | None,
    platform: str = "cpu",
) -> Callable[..., tuple[jax.Array, ...]]:
    """Wrap a lowered kernel call with the debug checks (see the module docstring).

    ``run(*arrays)`` is the plain call; ``prefilled_run(arrays, pattern)`` the call with
    outputs ``prefilled`` pre-filled by pattern 0 or 1 (None: no coverage check);
    ``reference(*arrays)`` the reference backend's call (None: no comparison).
    """

    def call(*arrays):
        if prefilled_run is not None:
            results = tuple(prefilled_run(arrays, 0))
            again = tuple(prefilled_run(arrays, 1))
        else:
            results, again = tuple(run(*arrays)), None
        refs = tuple(reference(*arrays)) if reference is not None else None
        report = []
        for j, r in enumerate(results):
            flat_u = jnp.ravel(untouched(r, again[j])) if again is not None and j in prefilled \
                else jnp.zeros((r.size,), bool)
            if refs is not None:
                flat_d = jnp.ravel(differs(r, refs[j]))
                ref_flat = jnp.ravel(refs[j])
            else:
                flat_d = jnp.zeros((r.size,), bool)
                ref_flat = jnp.ravel(r)
            if r.size == 0:
                report.append((False, 0, False, 0, jnp.zeros((), r.dtype), jnp.zeros((), r.dtype)))
                continue
            iu = jnp.argmax(flat_u)
            idd = jnp.argmax(flat_d)
            report.append((flat_u.any(), iu, flat_d.any(), idd, jnp.ravel(r)[idd], ref_flat[idd]))
        shapes = [tuple(r.shape) for r in results]
        host = _make_reporter(name, backend, shapes, [np.dtype(o.dtype).name for o in outs])
        code = jax.pure_callback(host, jax.ShapeDtypeStruct((1,), jnp.int32), report)
        return _gate(results, platform)(code, *results)

    return call


def _make_reporter(name, backend, shapes, dtypes):
    """The host side: 0 when every check passed, else the id of the recorded error."""

    def host(report):
        for j, (any_u, iu, any_d, idd, got, ref) in enumerate(report):
            where = f"output {j} ({dtypes[j]}{list(shapes[j])})"
            if bool(any_u):
                index = tuple(int(i) for i in np.unravel_index(int(iu), shapes[j]))
                return _record(
                    f"kernel {name!r} (backend {backend!r}), debug mode: {where} element "
                    f"{index} was never written by the kernel (or its value depended on the "
                    f"output buffer's prior contents); a kernel must write every element of "
                    f"every output"
                )
            if bool(any_d):
                index = tuple(int(i) for i in np.unravel_index(int(idd), shapes[j]))
                rtol, atol = tolerance(dtypes[j])
                return _record(
                    f"kernel {name!r} (backend {backend!r}), debug mode: {where} differs from "
                    f"the {_backends.REFERENCE!r} reference backend; first differing index "
                    f"{index}: got "
                    f"{np.asarray(got).item()!r}, reference {np.asarray(ref).item()!r} "
                    f"(rtol={rtol}, atol={atol})"
                )
        return np.zeros((1,), np.int32)

    return host


def _record(message: str) -> np.ndarray:
    with _ERRORS_LOCK:
        n = next(_ERROR_IDS)
        _ERRORS[n] = KernelError(f"{message} {_MARK.format(n)}")
        while len(_ERRORS) > 64:  # errors raised under a user's jit are never collected
            _ERRORS.pop(next(iter(_ERRORS)))
    return np.full((1,), n, np.int32)


class DebugReport(Exception):
    """What the gate kernel raises: its text is the recorded report's, whole.

    The Numba backend words an exception carrying ``primforge_report`` as its text alone,
    so the report is the first line of the error XLA raises, also under ``jax.jit``.

    Example:
        >>> str(DebugReport(0))
        'primforge debug report #0'
    """

    primforge_report = True

    def __str__(self) -> str:
        n = int(self.args[0]) if self.args else 0
        with _ERRORS_LOCK:
            found = _ERRORS.get(n)
        return str(found) if found is not None else f"primforge debug report #{n}"


def _gate(results: Sequence[jax.Array], platform: str):
    """``run(code, *results)``: ``results`` passed through, :class:`DebugReport` raised in
    the compiled call for a non-zero ``code`` (a backend's gate, else a host callback)."""
    structs = [jax.ShapeDtypeStruct(r.shape, r.dtype) for r in results]
    gate = _backends.debug_gate(structs, DebugReport, platform)
    if gate is not None:
        return gate

    def host(code, *arrays):
        if int(np.asarray(code)[0]) != 0:
            raise DebugReport(int(np.asarray(code)[0]))
        return arrays

    def run(code, *arrays):
        return tuple(jax.pure_callback(host, tuple(structs), code, *arrays))

    return run


def reraise(error: BaseException) -> None:
    """Raise the debug-mode KernelError carried by ``error``'s message, if there is one.

    Example:
        >>> reraise(RuntimeError('unrelated'))  # nothing to re-raise: returns
    """
    match = _MARK_RE.search(str(error))
    if match is None:
        return
    with _ERRORS_LOCK:
        found = _ERRORS.pop(int(match.group(1)), None)
    if found is not None:
        raise found.with_traceback(None) from None
