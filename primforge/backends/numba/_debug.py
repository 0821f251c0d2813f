"""The Numba backend's debug-mode hooks: pre-filled outputs and the error gate.

Pre-filled outputs: a generated ``@njit`` shim takes the kernel's inputs, one extra input
per output it pre-fills (aliased to that output), then the outputs, and forwards to the
kernel without the extra inputs. The gate: a kernel that passes its inputs through
(aliased) and raises the debug report whose id it is given, so the report travels as the
kernel's own error.
"""

from __future__ import annotations

import itertools
import linecache
import re
from collections.abc import Callable, Sequence
from typing import Any

import jax

__all__ = ["gate", "prefilled"]

_SHIM_IDS = itertools.count(1)
_GATES: dict[tuple[int, type], Any] = {}


def _safe(name: str) -> str:
    return re.sub(r"\W", "_", name)


def _compile(src: str, filename: str, namespace: dict[str, Any]) -> None:
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    exec(compile(src, filename, "exec"), namespace)  # noqa: S102 - generated, fixed shape


def prefilled(product: Any, n_in: int, outs: Sequence[Any], name: str, *, numba: Any,
              kernel_type: type):
    """A Numba product whose not-aliased outputs arrive pre-filled, as extra inputs.

    Returns ``(new_product, prefilled)`` where ``prefilled`` lists the output indices that
    get a pre-filled input (appended after the real inputs, in that order); ``None`` when
    ``product`` is not something this can wrap or every output is aliased. ``numba`` is
    the numba module, ``kernel_type`` the backend's ``NumbaKernel``.

    Example:
        >>> import jax, jax.numpy as jnp, numba
        >>> from primforge import NumbaKernel
        >>> @numba.njit
        ... def k(x, out):
        ...     out[0] = x[0]
        >>> s = jax.ShapeDtypeStruct((2,), jnp.float32)
        >>> new, pre = prefilled(k, 1, [s], 'k', numba=numba, kernel_type=NumbaKernel)
        >>> pre, new.input_output_aliases
        ([0], {1: 0})
    """
    if isinstance(product, kernel_type):
        fn, aliases, half_as = product.fn, dict(product.input_output_aliases), product.half_as
    elif callable(product):
        fn, aliases, half_as = product, {}, "float32"
    else:
        return None
    if not hasattr(fn, "py_func"):
        fn = numba.njit(fn)
    filled = [j for j in range(len(outs)) if j not in aliases.values()]
    if not filled:
        return None
    ins = [f"in{i}" for i in range(n_in)]
    pre = [f"prefill{j}" for j in filled]
    out = [f"out{j}" for j in range(len(outs))]
    src = (
        f"def debug_prefilled_{_safe(name)}({', '.join(ins + pre + out)}):\n"
        f"    return kernel({', '.join(ins + out)})\n"
    )
    py = fn.py_func
    # The shim carries the kernel's module and name: errors name the user's function.
    namespace: dict[str, Any] = {"kernel": fn, "__name__": py.__module__}
    _compile(src, f"<primforge-debug-shim-{next(_SHIM_IDS)}>", namespace)
    shim_py = namespace[f"debug_prefilled_{_safe(name)}"]
    shim_py.__qualname__ = py.__qualname__
    aliases.update({n_in + k: j for k, j in enumerate(filled)})
    new = kernel_type(numba.njit(shim_py), tuple(outs), input_output_aliases=aliases,
                      name=name, half_as=half_as)
    return new, filled


def gate(outs: Sequence[Any], report: type[Exception], *, numba: Any, numba_kernel: Callable):
    """``run(code, *results) -> results``: raises ``report(code[0])`` when it is not 0.

    Example:
        >>> import jax.numpy as jnp, numba
        >>> from primforge import numba_kernel
        >>> run = gate([jax.ShapeDtypeStruct((2,), jnp.float32)], RuntimeError, numba=numba,
        ...            numba_kernel=numba_kernel)
        >>> run(jnp.zeros(1, jnp.int32), jnp.ones(2))
        (Array([1., 1.], dtype=float32),)
    """
    n_outs = len(outs)
    fn = _GATES.get((n_outs, report))
    if fn is None:
        rs = [f"r{j}" for j in range(n_outs)]
        os_ = [f"o{j}" for j in range(n_outs)]
        src = (
            f"def primforge_debug_report({', '.join(['code', *rs, *os_])}):\n"
            f"    if code[0] != 0:\n"
            f"        raise DebugReport(code[0])\n"
        )
        namespace: dict[str, Any] = {"DebugReport": report, "__name__": __name__}
        _compile(src, f"<primforge-debug-report-{n_outs}>", namespace)
        fn = _GATES[(n_outs, report)] = numba.njit(namespace["primforge_debug_report"])
    structs = [jax.ShapeDtypeStruct(o.shape, o.dtype) for o in outs]
    kernel = numba_kernel(fn, structs, input_output_aliases={1 + j: j for j in range(n_outs)},
                          name="primforge_debug_report", half_as="bits")

    def run(code, *arrays):
        out = kernel(code, *arrays)
        return tuple(out) if isinstance(out, tuple) else (out,)

    return run
