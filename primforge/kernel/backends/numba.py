"""Numba kernels on CPU, served by the typed XLA FFI with no Python on the call path.

A kernel is a Numba ``@njit`` function with the convention ``kernel(*inputs, *outputs)``:
it fills its output arrays in place and returns nothing or an integer status (non-zero is
an error). For each kernel and signature (dtypes, ranks, batch levels) two pieces of
machine code serve it, both built in the process that calls it:

* the kernel itself, compiled by its own dispatcher (as a call from Python would), and a
  few-instruction *entry* that wraps each buffer in a typed array and calls it
  (:mod:`._numba_entry`);
* the XLA FFI *handler*, LLVM IR generated from jaxlib's C header (:mod:`._ffi_handler`,
  :mod:`._xla_ffi`): it answers XLA's metadata query, checks dtypes and ranks, loops over
  native batch levels and calls the entry. XLA calls it directly: no Python, no GIL.

What is cached: nothing on disk. primforge never switches on Numba's disk cache for a
kernel; a kernel the user marked ``@njit(cache=True)`` uses Numba's own cache, under
Numba's rules. So every process runs the code it imported (edited helpers, module
constants, closures, ``NUMBA_BOUNDSCHECK`` all take effect), and the handler costs a few
milliseconds. (``PRIMFORGE_CACHE``/``PRIMFORGE_CACHE_DIR`` govern the other backends'
disk caches; this one reads neither.) Within one process Numba freezes the globals a
kernel reads when it compiles it: edit a module constant, then build a new kernel.

In memory, at most ``PRIMFORGE_NUMBA_MAX_KERNELS`` (default 256) compiled entries are held,
least recently used dropped first; :func:`clear` drops them on request. A registered FFI
target can't be removed from XLA, so its (small) handler stays and reads the entry from a
slot: a dropped entry is rebuilt on the next call, or, if the kernel object is gone, the
call fails with an error naming the kernel; never a jump into freed code.

Target names depend only on the primitive name, the kernel's code, constants, closure,
the globals it reads, its options and the signature (never ``id()`` or hash order), so
they are the same in every process; two different live kernels never share one.
Exporting: ``prepare(f, *specs)`` lists the targets ``f`` uses, ``disabled_checks(...)``
gives ``jax.export`` its exemptions; a process that deserializes the artifact calls
``prepare`` with the same kernels before calling it (an unregistered target is a clean
``NOT_FOUND`` error naming it).

Debug mode (:func:`primforge.debug_mode` or ``PRIMFORGE_DEBUG=1`` at trace time) compiles
a bounds-checked copy of the kernel under its own target: an out-of-bounds index raises
``IndexError``, whose text reaches the Python exception.

What a kernel sees and may assume:

* each input and output as a C-contiguous NumPy array of its core shape; a rank-0 core
  shape gives a 0-d array (read ``x[()]``, write ``out[()] = v``);
* outputs are *not* initialised: the kernel must write every element (``out[:] = 0``
  first when it accumulates);
* an output aliased to an input (``input_output_aliases``) is the same memory as that
  input; other inputs and outputs never overlap; inputs must not be written;
* ``float16``, ``bfloat16`` and the 8-bit floats (Numba has no such types on CPU) as
  ``float32`` by default: JAX converts on the way in and out (XLA fuses the converts).
  With ``half_as="bits"`` (see :func:`numba_kernel`) the kernel instead sees the raw bit
  patterns as unsigned integers of the same width, with no conversion;
* with native batch levels, the kernel is called once per batch element, inside the
  handler, on views of that element's slices; an input that is not mapped at a level is
  the same view for every element of that level;
* an exception it raises (type and message) or a non-zero status it returns becomes the
  Python exception JAX raises, naming the kernel.
"""

from __future__ import annotations

import collections
import ctypes
import functools
import hashlib
import inspect
import os
import pickle
import re
import threading
import types as _pytypes
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from primforge._compat import ffi as _ffi

__all__ = [
    "ENV_MAX_KERNELS",
    "EXTRA",
    "NAME",
    "PLATFORMS",
    "NumbaKernel",
    "clear",
    "disabled_checks",
    "exportable_targets",
    "held_kernels",
    "is_available",
    "make_callable",
    "max_kernels",
    "numba_kernel",
    "prepare",
    "product_form",
    "registered_targets",
]

NAME = "numba"
PLATFORMS = ("cpu",)
EXTRA = "cpu"

MISSING_NUMBA = (
    "The 'numba' backend needs the numba package, which is not installed (or failed to "
    "import). Install it with:\n\n    pip install primforge[cpu]\n"
)

# Dtypes that Numba cannot compute with on CPU: the kernel sees float32 (default) or bits.
_LOW_PRECISION = {
    "float16": "uint16",
    "bfloat16": "uint16",
    "float8_e5m2": "uint8",
    "float8_e4m3fn": "uint8",
    "float8_e4m3b11fnuz": "uint8",
    "float8_e5m2fnuz": "uint8",
    "float8_e4m3fnuz": "uint8",
    "float8_e3m4": "uint8",
    "float8_e4m3": "uint8",
    "float8_e8m0fnu": "uint8",
}
# Dtypes a kernel sees as themselves.
_NATIVE = {
    "bool": "bool_",
    "int8": "int8",
    "int16": "int16",
    "int32": "int32",
    "int64": "int64",
    "uint8": "uint8",
    "uint16": "uint16",
    "uint32": "uint32",
    "uint64": "uint64",
    "float32": "float32",
    "float64": "float64",
    "complex64": "complex64",
    "complex128": "complex128",
}
_HALF_MODES = ("float32", "bits")


@functools.cache
def is_available() -> bool:
    """Whether Numba can be imported here.

    Returns:
        ``True`` when ``import numba`` succeeds; never raises.

    Example:
        >>> isinstance(is_available(), bool)
        True
    """
    try:
        import numba  # noqa: F401
    except Exception:  # noqa: BLE001  (a broken install counts as missing; never raise)
        return False
    return True


def _require_numba():
    if not is_available():
        raise ImportError(MISSING_NUMBA)
    import numba

    return numba


# --------------------------------------------------------------------------------------
# The public helper
# --------------------------------------------------------------------------------------


class NumbaKernel:
    """A Numba kernel bound to its output specs: a traceable JAX callable.

    Made by :func:`numba_kernel`; see there for the arguments. Calling it with arrays runs
    the kernel through the XLA FFI (eagerly or under ``jax.jit``) and returns one array
    when ``outs`` was a single struct, else a tuple. Under ``jax.vmap`` it batches
    natively: one XLA call that loops over the batch inside the compiled handler.

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

    def __init__(
        self,
        fn: Any,
        outs: Any,
        *,
        input_output_aliases: Mapping[int, int] | None = None,
        name: str | None = None,
        half_as: str = "float32",
    ):
        if half_as not in _HALF_MODES:
            raise ValueError(f"half_as must be one of {_HALF_MODES}, got {half_as!r}")
        self.fn = fn
        self.single = not isinstance(outs, Sequence)
        self.outs = (outs,) if self.single else tuple(outs)
        for i, o in enumerate(self.outs):
            if not (hasattr(o, "shape") and hasattr(o, "dtype")):
                raise TypeError(
                    f"outs[{i}] must be a jax.ShapeDtypeStruct (or have .shape and .dtype), "
                    f"got {o!r}"
                )
        self.outs = tuple(jax.ShapeDtypeStruct(tuple(o.shape), o.dtype) for o in self.outs)
        self.input_output_aliases = dict(input_output_aliases or {})
        py = getattr(fn, "py_func", fn)
        self.name = name or getattr(py, "__name__", "kernel")
        self.half_as = half_as

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
) -> NumbaKernel:
    """Bind a Numba kernel to its outputs, giving a callable served by the XLA FFI.

    Args:
        fn: a ``numba.njit`` function (or a plain Python function, jitted here) with the
            convention ``fn(*inputs, *outputs)``: it writes the outputs in place and
            returns nothing or an integer status where non-zero means failure (raised as
            an exception on the JAX side). ``parallel=True`` kernels work.
        outs: a ``jax.ShapeDtypeStruct`` (the call returns one array) or a sequence of
            them (the call returns a tuple).
        input_output_aliases: ``{input index: output index}``: that output is written
            into the input's buffer (donate the input under ``jax.jit`` to avoid a copy).
            The kernel sees the same memory as both arguments.
        name: name used for the FFI target and in error messages (default: ``fn``'s).
        half_as: how ``float16``/``bfloat16``/8-bit floats reach the kernel: ``"float32"``
            (converted by JAX) or ``"bits"`` (unsigned integers holding the bit patterns).

    Returns:
        A :class:`NumbaKernel`; call it with the input arrays.

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
    if platform != "cpu":
        raise ValueError(f"the numba backend serves platform 'cpu' only, got platform={platform!r}")
    _require_numba()
    if isinstance(product, NumbaKernel):
        fn, aliases, half_as = product.fn, product.input_output_aliases, product.half_as
        bound = [(tuple(o.shape), np.dtype(o.dtype).name) for o in product.outs]
        given = [(tuple(o.shape), np.dtype(o.dtype).name) for o in outs]
        if bound != given:
            raise ValueError(
                f"{name}: the NumbaKernel declares outputs {bound} (numba_kernel(..., outs=...)) "
                f"but the call's outs are {given}"
            )
    else:
        fn, aliases, half_as = product, {}, "float32"
    kernel = _as_dispatcher(fn)
    ins = tuple(jax.ShapeDtypeStruct(tuple(s.shape), s.dtype) for s in ins)
    outs = tuple(jax.ShapeDtypeStruct(tuple(s.shape), s.dtype) for s in outs)
    if not outs:
        raise ValueError(f"{name}: a numba kernel needs at least one output (outs is empty)")
    levels = _check_batch(batch, len(ins), name)
    sizes = tuple(size for size, _ in levels)
    aliases = _check_aliases(aliases, ins, outs, name)

    # Aliased inputs must have the outputs' physical shape: map them at every level.
    for i in aliases:
        levels = tuple((size, m[:i] + (True,) + m[i + 1 :]) for size, m in levels)
    in_phys = tuple(tuple(size for size, m in levels if m[i]) + s.shape for i, s in enumerate(ins))
    out_phys = tuple(sizes + s.shape for s in outs)
    given_phys = tuple(
        tuple(size for size, m in _check_batch(batch, len(ins), name) if m[i]) + s.shape
        for i, s in enumerate(ins)
    )

    in_kinds = tuple(_dtype_kind(s.dtype, half_as, f"{name}: ins[{i}]") for i, s in enumerate(ins))
    out_kinds = tuple(
        _dtype_kind(s.dtype, half_as, f"{name}: outs[{i}]") for i, s in enumerate(outs)
    )
    # (ffi dtype name, kernel view dtype name, JAX dtype of the ffi buffer)
    in_sig = tuple(
        (k[0], k[1], len(s.shape), tuple(m[i] for _, m in levels))
        for i, (k, s) in enumerate(zip(in_kinds, ins))
    )
    out_sig = tuple((k[0], k[1], len(s.shape)) for k, s in zip(out_kinds, outs))
    from primforge import debug as _debug

    target = _ensure_registered(kernel, name, in_sig, out_sig, len(levels), debug=_debug.enabled())

    ffi_outs = [jax.ShapeDtypeStruct(shape, k[0]) for shape, k in zip(out_phys, out_kinds)]
    call = _ffi.ffi_call(
        target,
        ffi_outs,
        vmap_method="sequential",
        input_output_aliases=dict(aliases) or None,
    )

    def f(*arrays: Any) -> tuple[jax.Array, ...]:
        if len(arrays) != len(ins):
            raise TypeError(f"{name}: expected {len(ins)} input arrays, got {len(arrays)}")
        xs = []
        for i, a in enumerate(arrays):
            a = jnp.asarray(a)
            if a.dtype != ins[i].dtype or tuple(a.shape) != given_phys[i]:
                raise ValueError(
                    f"{name}: input {i} has shape {tuple(a.shape)} and dtype {a.dtype}, but the "
                    f"numba kernel was specialised for shape {given_phys[i]} (batch sizes of "
                    f"the levels where it is mapped, then core shape {ins[i].shape}) and dtype "
                    f"{np.dtype(ins[i].dtype).name}"
                )
            if tuple(a.shape) != in_phys[i]:  # an unmapped aliased input: broadcast it
                a = jnp.broadcast_to(a, in_phys[i])
            if a.dtype != np.dtype(in_kinds[i][0]):
                a = a.astype(in_kinds[i][0])
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
        TypeError: kernel 'k': the 'numba' kernel generator returned a plain function with signature (a, b, c): as a Numba kernel it must take the 1 input(s) then the 1 output(s) (2 positional arguments); as a traceable JAX callable, the 1 input(s) only. Return the @numba.njit kernel, numba_kernel(kernel, outs=outs), or a function of the inputs that calls it.
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


def _check_batch(batch, n_in, name):
    levels = []
    for lvl, item in enumerate(batch):
        try:
            size, mapped = item
            mapped = tuple(bool(m) for m in mapped)
        except (TypeError, ValueError):
            raise TypeError(
                f"{name}: batch[{lvl}] must be a (size, mapped) pair, got {item!r}"
            ) from None
        if len(mapped) != n_in:
            raise ValueError(
                f"{name}: batch[{lvl}] maps {len(mapped)} inputs, but the kernel has {n_in}"
            )
        if int(size) < 0:
            raise ValueError(f"{name}: batch[{lvl}] has negative size {size}")
        levels.append((int(size), mapped))
    return tuple(levels)


def _check_aliases(aliases, ins, outs, name):
    checked = {}
    for i, o in dict(aliases).items():
        i, o = int(i), int(o)
        if not (0 <= i < len(ins)) or not (0 <= o < len(outs)):
            raise ValueError(
                f"{name}: input_output_aliases entry {i}: {o} is out of range for "
                f"{len(ins)} inputs and {len(outs)} outputs"
            )
        if ins[i].shape != outs[o].shape or np.dtype(ins[i].dtype) != np.dtype(outs[o].dtype):
            raise ValueError(
                f"{name}: input {i} ({ins[i].shape}, {np.dtype(ins[i].dtype).name}) cannot alias "
                f"output {o} ({outs[o].shape}, {np.dtype(outs[o].dtype).name}): shapes and "
                "dtypes must be equal"
            )
        checked[i] = o
    if len(set(checked.values())) != len(checked):
        raise ValueError(f"{name}: two inputs alias the same output in {aliases!r}")
    return checked


def _dtype_kind(dtype, half_as, what):
    """-> (dtype name of the FFI buffer, dtype name the kernel sees)."""
    name = np.dtype(dtype).name
    if name in _NATIVE:
        return name, _NATIVE[name]
    if name in _LOW_PRECISION:
        if half_as == "bits":
            return name, _LOW_PRECISION[name]
        return "float32", "float32"
    raise TypeError(
        f"{what} has dtype {name}, which the numba backend does not support (supported: "
        f"{', '.join(sorted(set(_NATIVE) | set(_LOW_PRECISION)))})"
    )


# --------------------------------------------------------------------------------------
# Kernel identity: stable across processes and hash seeds
# --------------------------------------------------------------------------------------

_JITTED: dict[Any, Any] = {}


def _as_dispatcher(fn):
    numba = _require_numba()
    from numba.core.registry import CPUDispatcher

    if isinstance(fn, CPUDispatcher):
        return fn
    if isinstance(fn, _pytypes.FunctionType):
        if fn not in _JITTED:
            _JITTED[fn] = numba.njit(fn)
        return _JITTED[fn]
    raise TypeError(
        "the numba backend expects a numba.njit function (or a plain Python function, or a "
        "NumbaKernel from numba_kernel), or a kernel generator may return a traceable JAX "
        f"callable of the inputs; got {type(fn).__name__}: {fn!r}"
    )


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
        h.update(_identity(value, seen).encode())
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


def _identity(kernel, seen=None) -> str:
    """``module.qualname@hash`` of a dispatcher: code, constants, closure, globals it reads
    (for a module global, the module's attributes the code names), options."""
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
    opts = {k: v for k, v in kernel.targetoptions.items() if k != "cache"}
    _feed(h, sorted((k, repr(v)) for k, v in opts.items()), seen)
    return f"{py.__module__}.{py.__qualname__}@{h.hexdigest()[:16]}"


# --------------------------------------------------------------------------------------
# Targets, entries and the in-memory bound
# --------------------------------------------------------------------------------------

ENV_MAX_KERNELS = "PRIMFORGE_NUMBA_MAX_KERNELS"
_DEFAULT_MAX_KERNELS = 256

_LOCK = threading.RLock()


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
    """How many compiled kernel entries are held in memory (``PRIMFORGE_NUMBA_MAX_KERNELS``).

    Beyond it, the least recently used entry is dropped (see :func:`clear`); default 256.

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
    compiled kernel may have been dropped (see :func:`clear`) and is then rebuilt on use.

    Example:
        >>> isinstance(registered_targets(), dict)
        True
    """
    with _LOCK:
        return {t.name: t.handler_address for t in _BY_NAME.values()}


def held_kernels() -> list[str]:
    """Targets whose compiled kernel is currently held in memory, least recently used first.

    Example:
        >>> isinstance(held_kernels(), list)
        True
    """
    with _LOCK:
        return list(_HELD)


def clear(kernel: Any = None) -> int:
    """Drop the compiled code primforge holds for ``kernel`` (every kernel when ``None``).

    ``kernel`` is a ``numba.njit`` dispatcher, a plain function given to this backend, or a
    :class:`NumbaKernel`. What is dropped is primforge's compiled *entry* for each of its
    signatures (the wrapper Numba compiled around the kernel, with its own copy of the
    kernel's machine code) and the debug-mode copies of the kernel; the kernel object and
    whatever Numba itself holds for it are the caller's.

    Dropping never leaves XLA a dangling pointer: a registered FFI target can't be removed,
    so its handler stays, and reads the entry's address from a slot that is zeroed here.
    A computation that still calls the target (one already compiled by ``jax.jit``)
    rebuilds the entry on its next call while the kernel object is alive, and otherwise
    fails with an error naming the kernel; it never jumps into freed code. (Numba's JIT
    engine never unmaps machine code, so even an entry dropped mid-call stays valid.)
    The same happens automatically to the least recently used entry once more than
    :func:`max_kernels` are held.

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
    with _LOCK:
        if kernel is None:
            names = list(_HELD)
            _JITTED.clear()
        else:
            if isinstance(kernel, NumbaKernel):
                kernel = kernel.fn
            disp = _JITTED.get(kernel, kernel)
            try:
                names = list(_BY_KERNEL.get(disp, {}).values())
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


def _safe(text: str) -> str:
    return re.sub(r"[^0-9A-Za-z_]+", "_", text).strip("_")[:48]


def _ensure_registered(kernel, name, in_sig, out_sig, n_levels, debug=False) -> str:
    key = (name, in_sig, out_sig, n_levels, bool(debug))
    with _LOCK:
        per_kernel = _BY_KERNEL.get(kernel)
        target = _BY_NAME.get(per_kernel.get(key)) if per_kernel else None
        if target is not None and target.owner() is kernel:
            if target.entry is None:
                _build_entry(target, kernel)
            else:
                _HELD.move_to_end(target.name)
            return target.name
        ident = _identity(kernel)
        qual = ident.split("@")[0].rsplit(".", 1)[-1]
        sig_text = repr((ident, name, in_sig, out_sig, n_levels, bool(debug)))
        digest = hashlib.sha256(sig_text.encode()).hexdigest()[:16]
        base = f"primforge_numba_{_safe(name)}_{_safe(qual)}_{digest}" + ("_dbg" if debug else "")
        # Two live kernels never share a target, even when they look the same: the second
        # gets a numbered name. A target whose kernel is gone is taken over.
        target_name, n = base, 1
        while True:
            target = _BY_NAME.get(target_name)
            if target is None or not target.owner_alive() or target.owner() is kernel:
                break
            n += 1
            target_name = f"{base}_{n}"
        label = f"primforge numba kernel {name!r} ({ident.split('@')[0]})"
        views = tuple((view, rank) for _ffi, view, rank, *_ in in_sig + out_sig)
        if target is None:
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


def _kernel_to_compile(kernel, debug: bool):
    if not debug:
        return kernel
    import numba

    drop = ("boundscheck", "cache", "nopython")  # njit sets nopython itself (and warns)
    opts = {k: v for k, v in kernel.targetoptions.items() if k not in drop}
    return numba.njit(boundscheck=True, **opts)(kernel.py_func)


def _build_entry(target: _Target, kernel) -> None:
    from primforge.kernel.backends import _numba_entry

    compiled = _kernel_to_compile(kernel, target.debug)
    entry = _numba_entry.compile_entry(compiled, target.views, target.label)
    target.entry = entry
    target.slot.value = entry.address
    _HELD[target.name] = target
    _HELD.move_to_end(target.name)
    limit = max_kernels()
    while len(_HELD) > limit:
        _drop(next(iter(_HELD.values())))


def _register_handler(target: _Target, in_sig, out_sig, n_levels) -> None:
    from primforge.kernel.backends import _ffi_handler
    from primforge.kernel.backends import _xla_ffi as x

    codes = x.data_type_codes()
    specs = [
        _ffi_handler.BufferSpec(codes[fd], np.dtype(vd).itemsize, rank, tuple(mapped), f"input {i}")
        for i, (fd, vd, rank, mapped) in enumerate(in_sig)
    ]
    specs += [
        _ffi_handler.BufferSpec(
            codes[fd], np.dtype(vd).itemsize, rank, (True,) * n_levels, f"output {j}"
        )
        for j, (fd, vd, rank) in enumerate(out_sig)
    ]
    revive, report = _callbacks()
    symbol = _ffi_handler.unique_symbol("primforge_handler_" + target.name)
    text = _ffi_handler.build_handler(
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
    address = _ffi_handler.jit_module(text, symbol)
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
        with _LOCK:
            target = _BY_TOKEN[token]
            if target.slot.value:
                return target.slot.value
            kernel = target.owner()
            if kernel is None:
                return 0
            _build_entry(target, kernel)
            return target.slot.value
    except BaseException:  # noqa: BLE001  (never raise into XLA; the handler reports it)
        return 0


def _report(token: int, kind: int, info: int, buf: int, size: int) -> None:
    """Called by a handler (with the GIL, through ctypes) to word a failure."""
    from primforge.kernel.backends import _numba_entry

    try:
        label = _BY_TOKEN[token].label
    except Exception:  # noqa: BLE001
        label = "primforge numba kernel"
    try:
        text = _numba_entry.describe_failure(label, kind, info)
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
    artifact finds its handlers. Nothing runs.

    Args:
        fn: a function of arrays (it may call :class:`NumbaKernel` objects and
            ``XLACustomKernel`` kernels with a Numba backend).
        *args: arrays or ``jax.ShapeDtypeStruct`` in the place of ``fn``'s arguments.

    Returns:
        The sorted names of the numba FFI targets in ``fn``'s lowering.

    Example:
        >>> import jax, jax.numpy as jnp, numba
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
    with _LOCK:
        known = set(_BY_NAME)
    return tuple(sorted({w for w in _TARGET_WORD.findall(text) if w in known}))


def exportable_targets() -> tuple[str, ...]:
    """Names of every numba FFI target registered in this process, sorted.

    Example:
        >>> isinstance(exportable_targets(), tuple)
        True
    """
    with _LOCK:
        return tuple(sorted(_BY_NAME))


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
