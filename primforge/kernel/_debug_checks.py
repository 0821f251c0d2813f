"""Debug-mode checks woven into a kernel's lowering (what ``primforge.debug_mode`` turns on).

Design:
    * Output coverage (Numba kernels): the kernel gets its output buffers pre-filled, as
      inputs aliased to its outputs (a generated ``@njit`` shim forwards to the user's
      kernel, dropping the extra arguments), and runs twice with two different fill
      patterns (NaN-like, then another bit pattern). An element whose bits differ between
      the two runs was never written, or its value depended on what the buffer held
      before: both are bugs the default (uninitialised) buffers would hide.
    * Reference comparison: the kernel's ``jax`` backend, when it has one on the platform,
      runs on the same inputs and every output is compared with a tolerance by dtype.
    * Failures: a host callback words the first failure as a
      :class:`~primforge.KernelError` and returns its id; a small Numba *gate* kernel
      passes the outputs through and raises :class:`DebugReport` for a non-zero id, so the
      report is the kernel error XLA raises (its first line, also under a user's
      ``jax.jit``). Eager calls re-raise the ``KernelError`` itself.
"""

from __future__ import annotations

import itertools
import linecache
import re
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from primforge.kernel.errors import KernelError

__all__ = ["checked_call", "is_numba_product", "prefilled_numba", "reraise"]

_LOW_PRECISION = (1e-1, 1e-1)  # 8-bit float formats

_MARK = "[primforge debug #{}]"
_MARK_RE = re.compile(r"\[primforge debug #(\d+)\]")
_ERRORS: dict[int, Exception] = {}
_ERRORS_LOCK = threading.Lock()
_ERROR_IDS = itertools.count(1)
_SHIM_IDS = itertools.count(1)


# ------------------------------------------------------------------ pre-filled Numba kernels
def prefilled_numba(product: Any, n_in: int, outs: Sequence[Any], name: str):
    """A Numba product whose not-aliased outputs arrive pre-filled, as extra inputs.

    Returns ``(new_product, prefilled)`` where ``prefilled`` lists the output indices that
    get a pre-filled input (appended after the real inputs, in that order); ``None`` when
    ``product`` is not something this can wrap.

    Example:
        >>> import jax, jax.numpy as jnp, numba
        >>> @numba.njit
        ... def k(x, out):
        ...     out[0] = x[0]
        >>> s = jax.ShapeDtypeStruct((2,), jnp.float32)
        >>> new, pre = prefilled_numba(k, 1, [s], 'k')
        >>> pre, new.input_output_aliases
        ([0], {1: 0})
    """
    from primforge.kernel.backends.numba import NumbaKernel, _require_numba

    _require_numba()
    import numba

    if isinstance(product, NumbaKernel):
        fn, aliases, half_as = product.fn, dict(product.input_output_aliases), product.half_as
    elif callable(product):
        fn, aliases, half_as = product, {}, "float32"
    else:
        return None
    if not hasattr(fn, "py_func"):
        fn = numba.njit(fn)
    prefilled = [j for j in range(len(outs)) if j not in aliases.values()]
    if not prefilled:
        return None
    ins = [f"in{i}" for i in range(n_in)]
    pre = [f"prefill{j}" for j in prefilled]
    out = [f"out{j}" for j in range(len(outs))]
    src = (
        f"def debug_prefilled_{_safe(name)}({', '.join(ins + pre + out)}):\n"
        f"    return kernel({', '.join(ins + out)})\n"
    )
    filename = f"<primforge-debug-shim-{next(_SHIM_IDS)}>"
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    py = fn.py_func
    # The shim carries the kernel's module and name: errors name the user's function.
    namespace: dict[str, Any] = {"kernel": fn, "__name__": py.__module__}
    exec(compile(src, filename, "exec"), namespace)  # noqa: S102 - generated, fixed shape
    shim_py = namespace[f"debug_prefilled_{_safe(name)}"]
    shim_py.__qualname__ = py.__qualname__
    shim = numba.njit(shim_py)
    aliases.update({n_in + k: j for k, j in enumerate(prefilled)})
    new = NumbaKernel(shim, tuple(outs), input_output_aliases=aliases, name=name,
                      half_as=half_as)
    return new, prefilled


def is_numba_product(backend: str, module, product, ins, outs, name: str, route) -> bool:
    """Whether ``product`` (made for ``backend``) is a Numba CPU kernel the coverage check
    can wrap: one the ``numba`` backend serves, or a :class:`NumbaKernel` or Numba
    dispatcher another backend returned (e.g. a threaded variant).

    Example:
        >>> from primforge.kernel.lowering import _route
        >>> is_numba_product('jax', None, lambda x: x, (), (), 'k', _route)
        False
    """
    from primforge.kernel.backends.numba import NumbaKernel

    if backend == "numba":
        return route(module, product, ins, outs, name) is module
    if isinstance(product, NumbaKernel):
        return True
    registry = sys.modules.get("numba.core.registry")  # not imported: not a dispatcher
    return registry is not None and isinstance(product, registry.CPUDispatcher)


def _safe(name: str) -> str:
    return re.sub(r"\W", "_", name)


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
) -> Callable[..., tuple[jax.Array, ...]]:
    """Wrap a lowered kernel call with the debug checks (see the module docstring).

    ``run(*arrays)`` is the plain call; ``prefilled_run(arrays, pattern)`` the call with
    outputs ``prefilled`` pre-filled by pattern 0 or 1 (None: no coverage check);
    ``reference(*arrays)`` the ``jax`` backend's call (None: no comparison).
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
        return _gate(len(results), results)(code, *results)

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
                    f"the 'jax' reference backend; first differing index {index}: got "
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


_GATES: dict[int, Any] = {}


def _gate(n_outs: int, results: Sequence[jax.Array]):
    """A Numba kernel passing ``results`` through (aliased) that raises the report whose
    id it is given (0: none): the failure travels as the kernel's own error."""
    from primforge.kernel.backends.numba import _require_numba, numba_kernel

    numba = _require_numba()
    fn = _GATES.get(n_outs)
    if fn is None:
        rs = [f"r{j}" for j in range(n_outs)]
        os_ = [f"o{j}" for j in range(n_outs)]
        src = (
            f"def primforge_debug_report({', '.join(['code', *rs, *os_])}):\n"
            f"    if code[0] != 0:\n"
            f"        raise DebugReport(code[0])\n"
        )
        filename = f"<primforge-debug-report-{n_outs}>"
        linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
        namespace: dict[str, Any] = {"DebugReport": DebugReport, "__name__": __name__}
        exec(compile(src, filename, "exec"), namespace)  # noqa: S102 - generated, fixed shape
        fn = _GATES[n_outs] = numba.njit(namespace["primforge_debug_report"])
    outs = [jax.ShapeDtypeStruct(r.shape, r.dtype) for r in results]
    kernel = numba_kernel(fn, outs, input_output_aliases={1 + j: j for j in range(n_outs)},
                          name="primforge_debug_report", half_as="bits")

    def run(code, *arrays):
        out = kernel(code, *arrays)
        return tuple(out) if isinstance(out, tuple) else (out,)

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
