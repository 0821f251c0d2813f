"""The per-kernel entry: a small Numba ``cfunc`` that wraps raw buffers and calls the kernel.

Design: the entry is compiled by Numba in every process that uses the kernel, from the
kernel's live dispatcher, and is never written to disk; whatever the kernel calls, reads
or closes over is what Numba sees now. Its C signature is
``int64 entry(int64* data, int64* dims, int64* info)``: ``data[k]`` is buffer ``k``'s data
pointer, ``dims[k]`` points at its core dimensions. It builds one ``numba.carray`` per
buffer (before the call: a ``parallel=True`` kernel must get typed arrays, not raw
pointers) and calls the kernel through :func:`call_kernel`, which uses Numba's CPU calling
convention without propagating errors, so that the entry itself never raises:

* ``0``: the kernel returned nothing or status 0;
* ``1`` (``info``: the status): the kernel returned a non-zero integer;
* ``2`` (``info``: Numba's exception record, or 0): the kernel raised.

:func:`describe_failure` turns the last two into text, from Python, on the error path
only.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence
from typing import Any

from primforge.kernel.backends._ffi_handler import KIND_DROPPED, KIND_EXCEPTION, KIND_STATUS

__all__ = ["compile_entry", "describe_failure", "entry_source"]


@functools.cache
def _intrinsics() -> dict[str, Any]:
    from numba import types
    from numba.core import cgutils
    from numba.core.errors import TypingError
    from numba.extending import intrinsic

    @intrinsic
    def call_kernel(typingctx, fn, args):
        """``(kind, info)`` of calling dispatcher ``fn`` with the tuple ``args``."""
        if not isinstance(fn, types.Dispatcher) or not isinstance(args, types.BaseTuple):
            return None
        argtys = tuple(args.types)
        sig = typingctx.resolve_function_type(fn, argtys, {})
        if sig is None:
            raise TypingError(f"the kernel cannot be called with arguments {argtys}")
        rt = sig.return_type
        if not (rt is types.none or isinstance(rt, (types.NoneType, types.Integer, types.Boolean))):
            raise TypingError(
                f"a primforge numba kernel must return nothing or an integer status, not {rt}"
            )

        def codegen(context, builder, signature, llargs):
            dispatcher = fn.dispatcher
            cres = dispatcher.overloads[tuple(sig.args)]
            context.add_linking_libs([cres.library])
            callee = context.declare_function(builder.module, cres.fndesc)
            values = cgutils.unpack_tuple(builder, llargs[1], len(argtys))
            values = [
                context.cast(builder, v, have, want)
                for v, have, want in zip(values, argtys, cres.signature.args)
            ]
            restype = cres.signature.return_type
            status, res = context.call_conv.call_function(
                builder, callee, restype, cres.signature.args, values
            )
            i64 = context.get_value_type(types.int64)
            kind = cgutils.alloca_once_value(builder, i64(0))
            info = cgutils.alloca_once_value(builder, i64(0))
            with builder.if_else(status.is_error, likely=False) as (failed, fine):
                with failed:
                    builder.store(i64(KIND_EXCEPTION), kind)
                    with builder.if_then(status.is_user_exc):
                        builder.store(builder.ptrtoint(status.excinfoptr, i64), info)
                with fine:
                    if isinstance(restype, (types.Integer, types.Boolean)):
                        value = context.cast(builder, res, restype, types.int64)
                        builder.store(value, info)
                        nonzero = builder.icmp_signed("!=", value, i64(0))
                        builder.store(builder.select(nonzero, i64(KIND_STATUS), i64(0)), kind)
            tup = context.make_tuple(
                builder,
                signature.return_type,
                [builder.load(kind), builder.load(info)],
            )
            return tup

        return types.UniTuple(types.int64, 2)(fn, args), codegen

    return {"call_kernel": call_kernel}


def entry_source(views: Sequence[tuple[str, int]]) -> str:
    """Python source of the entry for buffers seen as ``(numpy dtype name, core rank)``.

    Example:
        >>> print(entry_source([("float32", 1)]).splitlines()[2])
            v0 = carray(as_ptr(load_i64(data, 0), np.float32), (load_i64(d0, 0),))
    """
    lines = ["def entry(data, dims, info):"]
    names = []
    for k, (dtype, rank) in enumerate(views):
        lines.append(f"    d{k} = load_i64(dims, {8 * k})")
        shape = [f"load_i64(d{k}, {8 * d})" for d in range(rank)]
        tup = "(" + ", ".join(shape) + ("," if len(shape) == 1 else "") + ")"
        lines.append(f"    v{k} = carray(as_ptr(load_i64(data, {8 * k}), np.{dtype}), {tup})")
        names.append(f"v{k}")
    args = "(" + ", ".join(names) + ("," if len(names) == 1 else "") + ")"
    lines.append(f"    kind, value = call_kernel(kernel, {args})")
    lines.append("    store_i64(info, 0, value)")
    lines.append("    return kind")
    return "\n".join(lines) + "\n"


def compile_entry(kernel: Any, views: Sequence[tuple[str, int]], label: str) -> Any:
    """Compile the entry calling ``kernel`` (a dispatcher) for the given buffer views.

    Returns:
        The Numba ``CFunc``; its ``.address`` is the entry's.
    """
    import numpy as np
    from numba import carray, cfunc, types

    from primforge.kernel.backends import _xla_ffi as x

    namespace = {
        "np": np,
        "carray": carray,
        "load_i64": x.load_i64,
        "store_i64": x.store_i64,
        "as_ptr": x.as_ptr,
        "call_kernel": _intrinsics()["call_kernel"],
        "kernel": kernel,
    }
    source = entry_source(views)
    code = compile(source, f"<primforge numba entry for {label}>", "exec")
    exec(code, namespace)  # noqa: S102  (our own generated source, no user text in it)
    try:
        return cfunc(types.int64(types.int64, types.int64, types.int64), nopython=True)(
            namespace["entry"]
        )
    except BaseException as e:
        e.add_note(f"primforge: while compiling the numba kernel for {label}")
        raise


# --------------------------------------------------------------------------------------
# Failure text (Python, error path only)
# --------------------------------------------------------------------------------------


class _ExcInfo(ctypes.Structure):
    # Numba's excinfo record: {i8* pickled, i32 size, i8* hash or dynamic args,
    # i8* unwrap function, i32 alloc flag}.
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("size", ctypes.c_int32),
        ("extra", ctypes.c_void_p),
        ("unwrap", ctypes.c_void_p),
        ("alloc", ctypes.c_int32),
    ]


def _exception_from(addr: int) -> BaseException | None:
    from numba.core import serialize

    rec = _ExcInfo.from_address(addr)
    static = ctypes.string_at(rec.data, rec.size)
    if rec.alloc > 0:  # runtime values in the message: Numba packed them for us
        # (PYFUNCTYPE: the unwrapper builds Python objects, so it must run with the GIL)
        unwrap = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p)(rec.unwrap)
        dynamic = unwrap(rec.extra)
        exc, args, _loc = serialize.runtime_build_excinfo_struct(static, dynamic)
        _nrt_free(addr)
    else:
        exc, args, _loc = serialize.loads(static)
    if isinstance(exc, type):
        return exc(*args)
    return exc


def _nrt_free(addr: int) -> None:
    try:
        from numba.core.runtime import _nrt_python

        ctypes.CFUNCTYPE(None, ctypes.c_void_p)(_nrt_python.c_helpers["Free"])(addr)
    except Exception:  # noqa: BLE001, S110  (a leak of a few bytes beats a crash)
        pass


def describe_failure(label: str, kind: int, info: int) -> str:
    """The error message for an entry result ``(kind, info)``.

    Example:
        >>> describe_failure("kernel 'k'", 1, 7)
        "kernel 'k' returned the non-zero status 7"
    """
    if kind == KIND_STATUS:
        return f"{label} returned the non-zero status {info}"
    if kind == KIND_DROPPED:
        return (
            f"{label}: its compiled code was dropped (primforge.kernel.backends.numba.clear or "
            "the in-memory bound) and the kernel no longer exists to rebuild it; trace the "
            "call again"
        )
    if kind == KIND_EXCEPTION:
        if info:
            try:
                exc = _exception_from(info)
            except Exception as e:  # noqa: BLE001  (still name the kernel)
                return f"{label} raised an exception (its details could not be read: {e!r})"
            if exc is not None:
                text = str(exc)
                name = type(exc).__name__
                return f"{label} raised {name}: {text}" if text else f"{label} raised {name}"
        return f"{label} raised an exception"
    return f"{label} failed (result {kind}, {info})"
