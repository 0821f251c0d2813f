"""Numba kernels on CPU, served by the typed XLA FFI with no Python on the call path.

A kernel is a Numba ``@njit`` function ``kernel(*inputs, *outputs)`` that fills its outputs
in place and returns nothing or an integer status (non-zero is an error). This module is the
backend's contract (``NAME``, ``PLATFORMS``, ``EXTRA``, :func:`is_available`,
:func:`make_callable`, :func:`product_form`, :func:`release`, :func:`owns`,
:func:`debug_prefill`, :func:`debug_gate`, :func:`export_checks`) and its public helpers
(:func:`numba_kernel`, :func:`clear`, ``prepare`` and ``disabled_checks`` for export).
Nothing is cached on disk; ``PRIMFORGE_NUMBA_MAX_KERNELS`` (default 256) bounds the kernels
kept alive in memory. The design is in docs/architecture.md ("The Numba backend").
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import sys
import types as _pytypes
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from primforge import debug as _debug_mode
from primforge._compat import ffi as _ffi
from primforge.backends import _common, _contract
from primforge.backends.numba import _boundscheck, _debug, _identity, _signature, _targets
from primforge.backends.numba._signature import HALF_MODES as _HALF_MODES
from primforge.backends.numba._targets import (
    ENV_MAX_KERNELS,
    disabled_checks,
    exportable_targets,
    held_kernels,
    max_kernels,
    prepare,
    registered_targets,
)

__all__ = [
    "ENV_MAX_KERNELS",
    "EXTRA",
    "NAME",
    "PLATFORMS",
    "NumbaKernel",
    "clear",
    "debug_gate",
    "debug_prefill",
    "disabled_checks",
    "export_checks",
    "exportable_targets",
    "held_kernels",
    "is_available",
    "make_callable",
    "max_kernels",
    "numba_kernel",
    "owns",
    "prepare",
    "product_form",
    "registered_targets",
    "release",
]

NAME = "numba"
PLATFORMS = ("cpu",)
EXTRA = "cpu"

_NEEDS = "the numba package"


@functools.cache
def is_available(platform: str | None = None) -> bool:
    """Whether this backend can run here: Numba imports, and it serves ``platform``.

    Args:
        platform: a platform name (``"cpu"``, ``"gpu"``...), or ``None`` for any of
            :data:`PLATFORMS`.

    Returns:
        ``True`` when the numba package is installed (found without importing it) and
        ``platform`` is ``None`` or in :data:`PLATFORMS`; never raises. The answer is
        cached for the process.

    Example:
        >>> isinstance(is_available(), bool), is_available("gpu")
        (True, False)
    """
    if platform is not None and platform not in PLATFORMS:
        return False
    return _common.package_installed("numba")


def _require_numba():
    if not is_available():
        raise _common.missing_package(NAME, _NEEDS, EXTRA)
    try:
        import numba
    except Exception as e:  # a broken install: say what to reinstall
        raise _common.missing_package(NAME, _NEEDS, EXTRA, f"(importing it failed: {e})") from e
    return numba


# --------------------------------------------------------------------------------------
# The public helper
# --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class NumbaKernel:
    """A Numba kernel bound to its output specs: a traceable JAX callable.

    Made by :func:`numba_kernel`; see there for the arguments. Calling it with arrays runs
    the kernel through the XLA FFI (eagerly or under ``jax.jit``) and returns one array
    when ``outs`` was a single struct, else a tuple. Under ``jax.vmap`` it batches
    natively: one XLA call that loops over the batch inside the compiled handler.

    Attributes:
        fn: the kernel (a ``numba.njit`` dispatcher or a plain function).
        outs: the output specs, a tuple of ``jax.ShapeDtypeStruct``.
        input_output_aliases: ``{input index: output index}``.
        name: the name used for the FFI target and in error messages.
        half_as: ``"float32"`` or ``"bits"``.
        single: whether a call returns one array rather than a tuple; by default, whether
            ``outs`` was given as one struct (kept by ``dataclasses.replace``).

    Instances compare and hash by identity, as a function does (``jax.jit`` keys its
    cache on the callable).

    Example:
        >>> import jax, jax.numpy as jnp, numba
        >>> @numba.njit
        ... def axpy(x, y, out):
        ...     for i in range(x.size):
        ...         out[i] = 2 * x[i] + y[i]
        >>> k = NumbaKernel(axpy, jax.ShapeDtypeStruct((3,), jnp.float32))
        >>> k(jnp.ones(3), jnp.arange(3.0))
        Array([2., 3., 4.], dtype=float32)
    """

    fn: Any
    outs: Any
    input_output_aliases: Mapping[int, int] | None = dataclasses.field(default=None, kw_only=True)
    name: str | None = dataclasses.field(default=None, kw_only=True)
    half_as: str = dataclasses.field(default="float32", kw_only=True)
    single: bool | None = dataclasses.field(default=None, kw_only=True, repr=False)

    def __post_init__(self) -> None:
        if self.half_as not in _HALF_MODES:
            raise ValueError(f"half_as must be one of {_HALF_MODES}, got {self.half_as!r}")
        one = not isinstance(self.outs, Sequence)
        outs = (self.outs,) if one else tuple(self.outs)
        for i, o in enumerate(outs):
            if not (hasattr(o, "shape") and hasattr(o, "dtype")):
                raise TypeError(
                    f"outs[{i}] must be a jax.ShapeDtypeStruct (or have .shape and .dtype), "
                    f"got {o!r}; e.g. outs=jax.ShapeDtypeStruct(x.shape, x.dtype)"
                )
        single = one if self.single is None else bool(self.single)
        if single and len(outs) != 1:
            raise ValueError(f"single=True needs exactly one output, got {len(outs)} in outs")
        py = getattr(self.fn, "py_func", self.fn)
        setattr_ = functools.partial(object.__setattr__, self)  # frozen: set once, here
        setattr_("single", single)
        setattr_("outs", tuple(jax.ShapeDtypeStruct(tuple(o.shape), o.dtype) for o in outs))
        setattr_("input_output_aliases", dict(self.input_output_aliases or {}))
        setattr_("name", self.name or getattr(py, "__name__", "kernel"))

    def __repr__(self) -> str:
        return f"NumbaKernel({self.name}, outs={self.outs})"

    def __call__(self, *args: Any) -> Any:
        args = tuple(jnp.asarray(a) for a in args)
        ins = tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args)
        res = self._vmappable(ins, ())(*args)
        return res[0] if self.single else tuple(res)

    def _vmappable(self, ins: tuple, batch: tuple) -> Callable:
        call = make_callable(
            self, ins=ins, outs=self.outs, platform="cpu", name=self.name, batch=batch
        )

        @jax.custom_batching.custom_vmap
        def run(*xs):
            return tuple(call(*xs))

        @run.def_vmap
        def _rule(axis_size, in_batched, *xs):
            # custom_vmap puts every batched axis first; this level is outside the others.
            level = (int(axis_size), tuple(bool(b) for b in in_batched))
            inner = self._vmappable(ins, (level, *batch))
            out = inner(*xs)
            return out, tuple(True for _ in out)

        return run


def numba_kernel(
    fn: Any,
    outs: Any,
    *,
    input_output_aliases: Mapping[int, int] | None = None,
    name: str | None = None,
    half_as: str = "float32",
    vmap_method: str | None = None,
) -> NumbaKernel:
    """Bind a Numba kernel to its outputs, giving a callable served by the XLA FFI.

    Args:
        fn: a ``numba.njit`` function with the convention ``fn(*inputs, *outputs)``: it
            writes the outputs in place and returns nothing or an integer status where
            non-zero means failure (raised as an exception on the JAX side).
            ``parallel=True`` kernels work. A plain Python function (a lambda included)
            is refused: decorate it with ``@numba.njit``.
        outs: a ``jax.ShapeDtypeStruct`` (the call returns one array) or a sequence of
            them (the call returns a tuple).
        input_output_aliases: ``{input index: output index}``: that output is written
            into the input's buffer (donate the input under ``jax.jit`` to avoid a copy).
            The kernel sees the same memory as both arguments.
        name: name used for the FFI target and in error messages (default: ``fn``'s).
        half_as: how ``float16``/``bfloat16``/8-bit floats reach the kernel: ``"float32"``
            (converted by JAX) or ``"bits"`` (unsigned integers holding the bit patterns).
        vmap_method: accepted for code written against ``jax.ffi.ffi_call``'s batching
            methods (``"sequential"``, ``"sequential_unrolled"``, ``"expand_dims"``,
            ``"broadcast_all"``, ``"legacy_vectorized"``); every one gives the same result,
            since the kernel batches natively under ``jax.vmap`` (one XLA call that loops
            over the batch). Another value raises ``ValueError``.

    Returns:
        A :class:`NumbaKernel`; call it with the input arrays.

    Raises:
        TypeError: ``fn`` is not a Numba-compiled (``@numba.njit``) function.

    Example:
        >>> import jax, jax.numpy as jnp, numba
        >>> @numba.njit
        ... def add_mul(x, y, s, p):
        ...     for i in range(x.size):
        ...         s[i] = x[i] + y[i]
        ...         p[i] = x[i] * y[i]
        >>> spec = jax.ShapeDtypeStruct((2,), jnp.float32)
        >>> k = numba_kernel(add_mul, outs=[spec, spec])
        >>> jax.jit(k)(jnp.array([1.0, 2.0]), jnp.array([3.0, 4.0]))
        (Array([4., 6.], dtype=float32), Array([3., 8.], dtype=float32))
    """
    _common.check_vmap_method("numba_kernel", vmap_method)
    numba = _require_numba()
    if not isinstance(fn, numba.core.registry.CPUDispatcher):
        what = "a lambda" if getattr(fn, "__name__", "") == "<lambda>" else type(fn).__name__
        raise TypeError(
            f"numba_kernel: 'fn' must be a Numba-compiled function (decorate it with "
            f"@numba.njit), got {what}"
        )
    return NumbaKernel(
        fn, outs, input_output_aliases=input_output_aliases, name=name, half_as=half_as
    )



# --------------------------------------------------------------------------------------
# The backend contract
# --------------------------------------------------------------------------------------


def make_callable(
    product: Any,
    *,
    ins: Sequence[Any],
    outs: Sequence[Any],
    platform: str,
    name: str,
    batch: Sequence[tuple[int, Sequence[bool]]] = (),
    **options: Any,
) -> Callable[..., tuple[jax.Array, ...]]:
    """Turn a Numba kernel into a traceable JAX callable (the backend contract).

    Args:
        product: a ``numba.njit`` dispatcher following ``kernel(*inputs, *outputs)``, or a
            :class:`NumbaKernel` (its aliases and ``half_as`` are used).
        ins: ``jax.ShapeDtypeStruct`` per input, with the per-example (core) shape.
        outs: ``jax.ShapeDtypeStruct`` per output, with the core shape.
        platform: must be ``"cpu"``.
        name: primitive name, used for the FFI target name and in error messages.
        batch: native batch levels, outermost first: ``(size, mapped)`` pairs where
            ``mapped`` has one bool per input. An input's physical shape is the sizes of
            the levels where it is mapped, then its core shape; every output has all the
            level sizes, then its core shape. The handler loops over the levels itself.
        **options: none other is taken; an unknown one raises ``TypeError`` naming it.

    Returns:
        ``f(*arrays) -> tuple of jax.Array``. It checks shapes and dtypes at trace time.

    Example:
        >>> import jax, jax.numpy as jnp, numba
        >>> @numba.njit
        ... def affine(x, out):
        ...     for i in range(x.size):
        ...         out[i] = 2 * x[i] + 1
        >>> s = jax.ShapeDtypeStruct((4,), jnp.float32)
        >>> f = make_callable(affine, ins=(s,), outs=(s,), platform="cpu", name="affine")
        >>> jax.jit(f)(jnp.arange(4.0))
        (Array([1., 3., 5., 7.], dtype=float32),)
        >>> g = make_callable(affine, ins=(s,), outs=(s,), platform="cpu", name="affine",
        ...                   batch=((2, (True,)),))
        >>> g(jnp.ones((2, 4)))[0].shape
        (2, 4)
    """
    _common.check_request(NAME, PLATFORMS, EXTRA, is_available, platform=platform,
                          kernel=name, options=options, needs=_NEEDS)
    _require_numba()  # a broken install is found here, on import
    fn, aliases, half_as = _unbind(product, outs, name)
    kernel = _identity.as_dispatcher(fn)
    plan = _signature.plan(
        ins, outs, batch=batch, aliases=aliases, half_as=half_as, name=name
    )
    target = _targets.ensure_registered(
        kernel, name, plan.in_sig, plan.out_sig, plan.n_levels, debug=_debug_mode.enabled()
    )
    return _ffi_callable(target, plan, name)


def _unbind(product: Any, outs: Sequence[Any], name: str) -> tuple[Any, Mapping[int, int], str]:
    """``(kernel, aliases, half_as)`` of a product: a NumbaKernel's own, else the defaults."""
    if not isinstance(product, NumbaKernel):
        return product, {}, "float32"
    bound = [(tuple(o.shape), np.dtype(o.dtype).name) for o in product.outs]
    given = [(tuple(o.shape), np.dtype(o.dtype).name) for o in outs]
    if bound != given:
        raise ValueError(
            f"{name}: the NumbaKernel declares outputs {bound} (numba_kernel(..., outs=...)) "
            f"but the call's outs are {given}"
        )
    return product.fn, product.input_output_aliases, product.half_as


def _ffi_callable(target: str, plan: _signature.CallPlan, name: str) -> Callable:
    """The traceable call of FFI ``target``: checks and converts inputs, converts outputs."""
    ins, outs = plan.ins, plan.outs
    ffi_outs = [jax.ShapeDtypeStruct(shape, dt) for shape, dt in zip(plan.out_phys, plan.ffi_out)]
    call = _ffi.ffi_call(
        target,
        ffi_outs,
        vmap_method="sequential",
        input_output_aliases=dict(plan.aliases) or None,
    )

    def f(*arrays: Any) -> tuple[jax.Array, ...]:
        if len(arrays) != len(ins):
            raise TypeError(f"{name}: expected {len(ins)} input arrays, got {len(arrays)}")
        xs = []
        for i, a in enumerate(arrays):
            a = jnp.asarray(a)
            if a.dtype != ins[i].dtype or tuple(a.shape) != plan.given_phys[i]:
                raise ValueError(
                    f"{name}: input {i} has shape {tuple(a.shape)} and dtype {a.dtype}, but the "
                    f"numba kernel was specialised for shape {plan.given_phys[i]} (batch sizes "
                    f"of the levels where it is mapped, then core shape {ins[i].shape}) and "
                    f"dtype {np.dtype(ins[i].dtype).name}"
                )
            if tuple(a.shape) != plan.in_phys[i]:  # an unmapped aliased input: broadcast it
                a = jnp.broadcast_to(a, plan.in_phys[i])
            if a.dtype != np.dtype(plan.ffi_in[i]):
                a = a.astype(plan.ffi_in[i])
            xs.append(a)
        res = call(*xs)
        return tuple(r.astype(o.dtype) if r.dtype != o.dtype else r for r, o in zip(res, outs))

    return f


def product_form(product: Any, *, n_ins: int, n_outs: int, name: str) -> str:
    """What a numba kernel generator returned: ``"kernel"`` or ``"callable"``.

    ``"kernel"``: something this backend compiles and serves through the XLA FFI (a
    :class:`NumbaKernel`, a ``numba.njit`` dispatcher, or a plain function taking the
    inputs then the outputs, which is jitted here). ``"callable"``: a function that is
    already a traceable JAX callable taking only the inputs, e.g. one that calls
    ``numba_kernel(fn, outs=...)(*inputs)`` itself; the kernel then uses it as it is.

    A plain function is told apart by how many positional arguments it takes; one that
    fits neither form is an error naming both.

    Example:
        >>> import numba
        >>> @numba.njit
        ... def k(x, out):
        ...     out[0] = x[0]
        >>> product_form(k, n_ins=1, n_outs=1, name='k')
        'kernel'
        >>> product_form(lambda x: x, n_ins=1, n_outs=1, name='k')
        'callable'
        >>> product_form(lambda a, b, c: a, n_ins=1, n_outs=1, name='k')
        Traceback (most recent call last):
        ...
        TypeError: kernel 'k': the 'numba' kernel generator returned a plain function with
        signature (a, b, c): ...
    """
    if isinstance(product, NumbaKernel):
        return "kernel"
    if isinstance(product, _pytypes.FunctionType):
        if _binds(product, n_ins + n_outs):
            return "kernel"
        if _binds(product, n_ins):
            return "callable"
        raise TypeError(
            f"kernel {name!r}: the 'numba' kernel generator returned a plain function with "
            f"signature {_signature_text(product)}: as a Numba kernel it must take the "
            f"{n_ins} input(s) then the {n_outs} output(s) ({n_ins + n_outs} positional "
            f"arguments); as a traceable JAX callable, the {n_ins} input(s) only. Return the "
            f"@numba.njit kernel, numba_kernel(kernel, outs=outs), or a function of the "
            f"inputs that calls it."
        )
    if hasattr(product, "py_func") or not callable(product):
        return "kernel"  # a Numba dispatcher, or something make_callable reports
    return "callable"


def _binds(fn, n: int) -> bool:
    try:
        inspect.signature(fn).bind(*range(n))
    except TypeError:
        return False
    except ValueError:  # no signature to read: let the kernel route report it
        return True
    return True


def _signature_text(fn) -> str:
    try:
        return str(inspect.signature(fn))
    except (TypeError, ValueError):
        return "(?)"


# --------------------------------------------------------------------------------------
# Compiled code held in memory
# --------------------------------------------------------------------------------------


def clear(kernel: Any = None) -> int:
    """Drop the compiled code primforge holds for ``kernel`` (every kernel when ``None``).

    ``kernel`` is a ``numba.njit`` dispatcher, a plain function given to this backend, or a
    :class:`NumbaKernel`. What is dropped is primforge's *entry* for each of its signatures
    (the reference to the kernel's Numba compile result, and the slot its handler calls
    through) and the bounds-checked copy debug mode made of it; once the program no longer
    references the kernel, Python frees what Numba can free of it. Machine code is never
    freed (neither Numba's nor primforge's), so the entry's code is kept and a rebuild of the
    same kernel code compiles nothing.

    Dropping never leaves XLA a dangling pointer: a registered FFI target can't be removed,
    so its handler stays, and reads the entry's address from a slot that is zeroed here.
    A computation that still calls the target (one already compiled by ``jax.jit``)
    rebuilds the entry on its next call while the kernel object is alive, and otherwise
    fails with an error naming the kernel; it never jumps into freed code. (Machine code
    is never unmapped, so even an entry dropped mid-call stays valid.) The same happens
    automatically to the least recently used entry once more than :func:`max_kernels` are
    held.

    Returns:
        How many compiled entries were dropped.

    Example:
        >>> import jax, jax.numpy as jnp, numba
        >>> @numba.njit
        ... def neg(x, out):
        ...     for i in range(x.size):
        ...         out[i] = -x[i]
        >>> k = numba_kernel(neg, jax.ShapeDtypeStruct((2,), jnp.float32))
        >>> f = jax.jit(k)
        >>> f(jnp.ones(2))
        Array([-1., -1.], dtype=float32)
        >>> clear(neg)
        1
        >>> f(jnp.ones(2))  # compiled by jax.jit before the drop: the entry is rebuilt
        Array([-1., -1.], dtype=float32)
    """
    with _targets.LOCK:
        if kernel is None:
            _identity.forget_jitted()
            _boundscheck.forget()
            return _targets.drop(None)
        if isinstance(kernel, NumbaKernel):
            kernel = kernel.fn
        _boundscheck.forget(_identity.jitted(kernel))
        return _targets.drop(_identity.jitted(kernel))


# --------------------------------------------------------------------------------------
# The other hooks of the contract: release, debug mode, export
# --------------------------------------------------------------------------------------


def release(product: Any) -> None:
    """Drop the compiled code held for a kernel this backend built (see :func:`clear`).

    Example:
        >>> release(lambda x, out: None)  # never built: nothing to drop
    """
    clear(product)


def owns(product: Any) -> bool:
    """Whether ``product`` is a Numba CPU kernel (a :class:`NumbaKernel` or a dispatcher),
    whichever backend's generator returned it.

    Example:
        >>> import numba
        >>> owns(numba.njit(lambda x, out: None)), owns(lambda x: x)
        (True, False)
    """
    if isinstance(product, NumbaKernel):
        return True
    registry = sys.modules.get("numba.core.registry")  # not imported: not a dispatcher
    return registry is not None and isinstance(product, registry.CPUDispatcher)


def debug_prefill(product: Any, *, n_ins: int, outs: Sequence[Any], name: str):
    """Debug mode: ``product`` with its not-aliased outputs pre-filled (extra inputs).

    Example:
        >>> import jax, jax.numpy as jnp, numba
        >>> s = jax.ShapeDtypeStruct((2,), jnp.float32)
        >>> new, filled = debug_prefill(numba.njit(lambda x, out: None), n_ins=1, outs=[s],
        ...                             name='k')
        >>> filled, new.input_output_aliases
        ([0], {1: 0})
    """
    return _debug.prefilled(product, n_ins, outs, name, numba=_require_numba(),
                                  kernel_type=NumbaKernel)


def debug_gate(outs: Sequence[Any], report: type[Exception], platform: str):
    """Debug mode: a Numba kernel passing outputs through that raises ``report`` (CPU).

    Example:
        >>> debug_gate([], RuntimeError, 'gpu') is None
        True
    """
    if platform not in PLATFORMS or not is_available(platform):
        return None
    return _debug.gate(outs, report, numba=_require_numba(), numba_kernel=numba_kernel)


def export_checks(fn: Callable, *specs: Any) -> list[Any]:
    """``jax.export``'s exemptions for the Numba targets ``fn`` calls (see :func:`prepare`).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> export_checks(jnp.sin, jax.ShapeDtypeStruct((2,), jnp.float32))
        []
    """
    targets = prepare(fn, *specs)
    return disabled_checks(targets) if targets else []


class NumbaBackend(_contract.BackendBase):
    """The Numba backend as the registry holds it: this module's hooks, bound once."""

    NAME, PLATFORMS, EXTRA = NAME, PLATFORMS, EXTRA
    BATCHES_NATIVELY = True  # make_callable's batch=: one FFI call over every level
    is_available = staticmethod(is_available)
    make_callable = staticmethod(make_callable)
    product_form = staticmethod(product_form)
    release = staticmethod(release)
    owns = staticmethod(owns)
    debug_prefill = staticmethod(debug_prefill)
    debug_gate = staticmethod(debug_gate)
    export_checks = staticmethod(export_checks)


#: This module's backend: :func:`primforge.backends.get_backend` registers it on first use.
BACKEND = NumbaBackend()
