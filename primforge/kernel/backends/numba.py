"""Numba kernels on CPU, served by the typed XLA FFI with no Python on the call path.

A kernel is a Numba ``@njit`` function with the convention ``kernel(*inputs, *outputs)``:
it fills its output arrays in place and returns nothing or an integer status (non-zero is
an error). For each kernel and signature (dtypes, ranks, batch levels) this module writes
a small Python source file into a cache directory that defines a Numba ``@cfunc`` with
``cache=True``; that function *is* the XLA FFI handler. It reads the ``XLA_FFI_CallFrame``
through offsets taken from jaxlib's C header (see :mod:`._xla_ffi`), answers XLA's
metadata query, wraps every buffer in a typed array (``numba.carray``) whose data pointer
and dimensions it reads at run time, calls the kernel, and reports failures through the
API table's ``XLA_FFI_Error_Create``. XLA calls it directly: no Python, no GIL.

The handler is registered once per process under a target name derived from the
primitive name, the kernel's qualified name and a hash of its bytecode, constants and
closure (never ``id()``), and the signature, so ``jax.export`` output is the same in every
process. A second process loads the compiled handler from Numba's on-disk cache.

What a kernel sees:

* each input and output as a C-contiguous NumPy array of its core shape; a rank-0 core
  shape gives a 0-d array (read ``x[()]``, write ``out[()] = v``);
* ``float16``, ``bfloat16`` and the 8-bit floats (Numba has no such types on CPU) as
  ``float32`` by default: JAX converts on the way in and out (XLA fuses the converts).
  With ``half_as="bits"`` (see :func:`numba_kernel`) the kernel instead sees the raw bit
  patterns as unsigned integers of the same width, with no conversion;
* with native batch levels, the kernel is called once per batch element, inside the
  handler, on views of that element's slices; an input that is not mapped at a level is
  the same view for every element of that level.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import pickle
import re
import sys
import tempfile
import threading
import types as _pytypes
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from primforge._compat import ffi as _ffi

__all__ = [
    "EXTRA",
    "NAME",
    "PLATFORMS",
    "NumbaKernel",
    "is_available",
    "make_callable",
    "numba_kernel",
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
    target = _ensure_registered(kernel, name, in_sig, out_sig, len(levels))

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
# Kernel identity: stable across processes
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
        f"NumbaKernel from numba_kernel), got {type(fn).__name__}: {fn!r}"
    )


def _feed(h, value, seen):
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
    elif isinstance(value, (tuple, list, frozenset)):
        h.update(b"T" + type(value).__name__.encode())
        for v in value:
            _feed(h, v, seen)
    elif value is None or isinstance(value, (bool, int, float, complex, str, bytes, np.generic)):
        h.update(b"V" + repr(value).encode())
    else:
        # Anything else (an enum, a jitclass instance, ...): its pickle when it has one, which
        # is stable across processes; else its identity, which keeps two different objects
        # from sharing a handler at the price of a process-specific target name.
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
    """``qualname@hash`` of a dispatcher: code, constants, closure, referenced globals."""
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
    for gname in sorted(_global_names(py.__code__)):
        if gname in g:
            h.update(gname.encode())
            _feed(h, g[gname], seen)
    opts = {k: v for k, v in kernel.targetoptions.items() if k != "cache"}
    h.update(repr(sorted(opts.items())).encode())
    return f"{py.__module__}.{py.__qualname__}@{h.hexdigest()[:16]}"


# --------------------------------------------------------------------------------------
# Handler generation, disk cache and registration
# --------------------------------------------------------------------------------------

_LOCK = threading.RLock()
# (kernel, name, signature) -> target name; target name -> the handler module (kept alive).
_TARGETS: dict[tuple, str] = {}
_HANDLERS: dict[str, Any] = {}


def registered_targets() -> dict[str, Any]:
    """FFI targets this process registered: target name -> the Numba ``cfunc`` serving it.

    Example:
        >>> isinstance(registered_targets(), dict)
        True
    """
    return {t: m.handler for t, m in _HANDLERS.items()}


def cache_dir() -> str:
    """Directory holding generated handlers and Numba's cache of them.

    ``$PRIMFORGE_CACHE_DIR/numba`` when that variable is set, else
    ``$XDG_CACHE_HOME/primforge/numba`` (``~/.cache/primforge/numba``).

    Example:
        >>> cache_dir().endswith("numba")
        True
    """
    root = os.environ.get("PRIMFORGE_CACHE_DIR")
    if root:
        return os.path.join(root, "numba")
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(xdg, "primforge", "numba")


def _safe(text: str) -> str:
    return re.sub(r"[^0-9A-Za-z_]+", "_", text).strip("_")[:48]


def _ensure_registered(kernel, name, in_sig, out_sig, n_levels) -> str:
    key = (kernel, name, in_sig, out_sig, n_levels)
    target = _TARGETS.get(key)
    if target is not None:
        return target
    with _LOCK:
        target = _TARGETS.get(key)
        if target is not None:
            return target
        ident = _identity(kernel)
        qual = ident.split("@")[0].rsplit(".", 1)[-1]
        sig_text = repr((ident, name, in_sig, out_sig, n_levels))
        digest = hashlib.sha256(sig_text.encode()).hexdigest()[:16]
        target = f"primforge_numba_{_safe(name)}_{_safe(qual)}_{digest}"
        if target not in _HANDLERS:
            _try_enable_caching(kernel)
            if _uses_parallel(kernel):
                # A handler loaded from Numba's cache calls the parallel runtime directly;
                # unlike a fresh compile, loading does not start it (segfault otherwise).
                from numba.np.ufunc import parallel

                parallel._launch_threads()
            label = f"primforge numba kernel {name!r} ({ident.split('@')[0]})"
            source = _handler_source(target, label, in_sig, out_sig, n_levels)
            module = _load_handler(target, source, kernel, label)
            jax.devices("cpu")  # XLA:CPU must be initialised before registering a target
            _ffi.register_ffi_target(target, _ffi.pycapsule(module.handler.address), platform="cpu")
            _HANDLERS[target] = module
        _TARGETS[key] = target
        return target


def _uses_parallel(kernel, seen=None) -> bool:
    """Whether ``kernel`` or a dispatcher it references was compiled with parallel=True."""
    from numba.core.registry import CPUDispatcher

    seen = set() if seen is None else seen
    if id(kernel) in seen:
        return False
    seen.add(id(kernel))
    if kernel.targetoptions.get("parallel"):
        return True
    py = kernel.py_func
    refs = [c.cell_contents for c in py.__closure__ or () if _cell_full(c)]
    refs += [py.__globals__.get(n) for n in _global_names(py.__code__)]
    return any(isinstance(r, CPUDispatcher) and _uses_parallel(r, seen) for r in refs)


def _cell_full(cell) -> bool:
    try:
        _ = cell.cell_contents
    except ValueError:
        return False
    return True


def _try_enable_caching(kernel):
    from numba.core.caching import NullCache

    if isinstance(getattr(kernel, "_cache", None), NullCache):
        try:
            kernel.enable_caching()
        except Exception:  # noqa: BLE001, S110  (a REPL, no source file: run uncached)
            pass


def _load_handler(target: str, source: str, kernel, label: str):
    directory = cache_dir()
    try:
        os.makedirs(directory, exist_ok=True)
        probe = os.path.join(directory, ".write-test")
        with open(probe, "w"):
            pass
    except OSError:
        directory = _fallback_dir()
    path = os.path.join(directory, f"{target}.py")
    try:
        with open(path, encoding="utf-8") as f:
            current = f.read()
    except OSError:
        current = None
    if current != source:
        fd, tmp = tempfile.mkstemp(dir=directory, suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(source)
        os.replace(tmp, path)
    modname = f"_primforge_numba_handlers.{target}"
    spec = importlib.util.spec_from_file_location(modname, path)
    module = importlib.util.module_from_spec(spec)
    module._kernel = kernel  # read by the handler as a global
    sys.modules[modname] = module  # Numba's cache looks the module up by name
    try:
        spec.loader.exec_module(module)
    except BaseException as e:
        sys.modules.pop(modname, None)
        e.add_note(f"primforge: while compiling the XLA FFI handler {path} for {label}")
        raise
    return module


@functools.cache
def _fallback_dir() -> str:
    return tempfile.mkdtemp(prefix="primforge-numba-")


def _tuple(items: Sequence[str]) -> str:
    if not items:
        return "()"
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


_PROLOGUE = """\
# Generated by primforge for the XLA FFI target {target}. Do not edit.
# XLA FFI API {major}.{minor}, ABI layout {digest}, numba {numba_version}, jax {jax_version}
import numpy as np
from numba import carray, cfunc, types
from primforge.kernel.backends._xla_ffi import (
    as_ptr, cstring, error_create, load_i32, load_i64, status_of, store_i32, store_i64)

# `_kernel` is placed in this module's globals by primforge before it runs.


@cfunc(types.int64(types.int64), cache=True)
def handler(frame):
    # XLA asks for the handler's API version and traits through a metadata extension.
    ext = load_i64(frame, {cf_ext})
    while ext != 0:
        if load_i32(ext, {ext_type}) == {meta_type}:
            md = load_i64(ext, {meta_ptr})
            store_i64(md, {av_size_at}, {av_size})
            store_i64(md, {av_ext_at}, 0)
            store_i32(md, {av_major_at}, {major})
            store_i32(md, {av_minor_at}, {minor})
            store_i32(md, {traits_at}, 0)
            return 0
        ext = load_i64(ext, {ext_next})
    api = load_i64(frame, {cf_api})
    if load_i64(frame, {nargs_at}) != {n_in} or load_i64(frame, {nrets_at}) != {n_out}:
        return error_create(api, {msg_count}, {e_invalid})
    argv = load_i64(frame, {argv_at})
    retv = load_i64(frame, {retv_at})
"""

_BUFFER = """\
    b_{var} = load_i64({vec}, {slot})
    if load_i32(b_{var}, {dtype_at}) != {code} or load_i64(b_{var}, {rank_at}) != {rank}:
        return error_create(api, {msg}, {e_invalid})
    p_{var} = load_i64(b_{var}, {data_at})
    d_{var} = load_i64(b_{var}, {dims_at})
    s_{var} = {shape}
    n_{var} = {nbytes}
"""

_CALL = """\
{ind}try:
{ind}    st = status_of(_kernel({args}))
{ind}except Exception:
{ind}    return error_create(api, {msg_raised}, {e_internal})
{ind}if st != 0:
{ind}    return error_create(api, {msg_status}, {e_internal})
    return 0
"""


def _handler_source(target, label, in_sig, out_sig, n_levels) -> str:
    """Python source of the cfunc serving one kernel signature (offsets baked in)."""
    import numba

    from primforge.kernel.backends import _xla_ffi as x

    off = x.offset
    major, minor = x.api_version()
    codes = x.data_type_codes()
    e_invalid = x.enum_value("XLA_FFI_Error_Code", "XLA_FFI_Error_Code_INVALID_ARGUMENT")
    e_internal = x.enum_value("XLA_FFI_Error_Code", "XLA_FFI_Error_Code_INTERNAL")
    av = "XLA_FFI_Metadata.api_version"

    def msg(text):
        return f"cstring({label + ': ' + text!r})"

    parts = [
        _PROLOGUE.format(
            target=target,
            major=major,
            minor=minor,
            digest=x.layout_digest(),
            numba_version=numba.__version__,
            jax_version=jax.__version__,
            cf_ext=off("XLA_FFI_CallFrame.extension_start"),
            ext_type=off("XLA_FFI_Extension_Base.type"),
            ext_next=off("XLA_FFI_Extension_Base.next"),
            meta_type=x.enum_value("XLA_FFI_Extension_Type", "XLA_FFI_Extension_Metadata"),
            meta_ptr=off("XLA_FFI_Metadata_Extension.metadata"),
            av_size_at=off(av + ".struct_size"),
            av_size=x.layout()["XLA_FFI_Api_Version"].struct_size,
            av_ext_at=off(av + ".extension_start"),
            av_major_at=off(av + ".major_version"),
            av_minor_at=off(av + ".minor_version"),
            traits_at=off("XLA_FFI_Metadata.traits"),
            cf_api=off("XLA_FFI_CallFrame.api"),
            nargs_at=off("XLA_FFI_CallFrame.args.size"),
            nrets_at=off("XLA_FFI_CallFrame.rets.size"),
            argv_at=off("XLA_FFI_CallFrame.args.args"),
            retv_at=off("XLA_FFI_CallFrame.rets.rets"),
            n_in=len(in_sig),
            n_out=len(out_sig),
            e_invalid=e_invalid,
            msg_count=msg("XLA passed an unexpected number of buffers"),
        )
    ]
    # (variable, pointer vector, slot, ffi dtype, view dtype, core rank, mapped, description)
    bufs = [
        (f"a{i}", "argv", i, fd, vd, rank, mapped, f"input {i}")
        for i, (fd, vd, rank, mapped) in enumerate(in_sig)
    ]
    bufs += [
        (f"r{j}", "retv", j, fd, vd, rank, (True,) * n_levels, f"output {j}")
        for j, (fd, vd, rank) in enumerate(out_sig)
    ]
    for var, vec, slot, ffi_dt, view_dt, rank, mapped, what in bufs:
        lead = sum(mapped)  # batch dims in front of the core shape
        dims = [f"load_i64(d_{var}, {8 * (lead + d)})" for d in range(rank)]
        nbytes = [str(np.dtype(view_dt).itemsize)] + [f"s_{var}[{d}]" for d in range(rank)]
        parts.append(
            _BUFFER.format(
                var=var,
                vec=vec,
                slot=8 * slot,
                code=codes[ffi_dt],
                rank=lead + rank,
                dtype_at=off("XLA_FFI_Buffer.dtype"),
                rank_at=off("XLA_FFI_Buffer.rank"),
                data_at=off("XLA_FFI_Buffer.data"),
                dims_at=off("XLA_FFI_Buffer.dims"),
                msg=msg(f"{what} has an unexpected dtype or rank"),
                e_invalid=e_invalid,
                shape=_tuple(dims),
                nbytes=" * ".join(nbytes),
            )
        )
    lines = [f"    L{lvl} = load_i64(d_r0, {8 * lvl})" for lvl in range(n_levels)]
    ind = "    "
    for lvl in range(n_levels):
        lines.append(f"{ind}for i{lvl} in range(L{lvl}):")
        ind += "    "
    for var, _vec, _slot, _ffi_dt, view_dt, _rank, mapped, _what in bufs:
        # Row-major index of this batch element over the levels where the buffer is mapped.
        lin = None
        for lvl, m in enumerate(mapped):
            if m:
                lin = f"i{lvl}" if lin is None else f"({lin}) * L{lvl} + i{lvl}"
        ptr = f"p_{var}" if lin is None else f"p_{var} + ({lin}) * n_{var}"
        lines.append(f"{ind}v_{var} = carray(as_ptr({ptr}, np.{view_dt}), s_{var})")
    parts.append("\n".join(lines) + "\n")
    parts.append(
        _CALL.format(
            ind=ind,
            args=", ".join(f"v_{b[0]}" for b in bufs),
            e_internal=e_internal,
            msg_raised=msg("the kernel raised an exception"),
            msg_status=msg("the kernel returned a non-zero status"),
        )
    )
    return "".join(parts)
