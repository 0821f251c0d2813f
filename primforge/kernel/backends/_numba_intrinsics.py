"""Numba intrinsics for code that reads and writes XLA FFI structs by byte offset.

Design: the handler primforge registers with XLA is emitted as LLVM IR directly
(:mod:`._ffi_handler`), so nothing on the call path needs these. They are the same few
operations for ``@njit``/``@cfunc`` code that wants to serve or probe the typed FFI by
hand: load and store an integer field at a byte offset, make a typed pointer (for
``numba.carray``), reserve stack memory, embed a C string, call a C function pointer, map
a kernel's return value to a status, and :func:`error_create`, which builds an
``XLA_FFI_Error*`` through the API table's ``XLA_FFI_Error_Create``. Every offset comes
from :mod:`._xla_ffi` (jaxlib's header).

The names are created on first attribute access (PEP 562) and cached, so importing this
module imports neither Numba nor llvmlite; bind them to local names before using them
inside a jitted function.

Example:
    >>> import numba, numpy as np
    >>> from primforge.kernel.backends import _numba_intrinsics as nx
    >>> load_i64, store_i64 = nx.load_i64, nx.store_i64
    >>> @numba.njit
    ... def poke(addr):
    ...     store_i64(addr, 8, 42)
    ...     return load_i64(addr, 8)
    >>> poke(np.zeros(2, np.int64).ctypes.data)
    42
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from primforge.kernel.backends import _xla_ffi

# ruff: noqa: F822  (every name below is made on first access, by __getattr__)
__all__ = [
    "as_ptr",
    "call_ptr_fn",
    "cstring",
    "error_create",
    "load_i32",
    "load_i64",
    "stack_bytes",
    "status_of",
    "store_i32",
    "store_i64",
]


def _int_args(*tys: Any) -> bool:
    from numba import types

    return all(isinstance(t, types.Integer) for t in tys)


def _addr(builder: Any, addr: Any, off: Any, lltype: Any) -> Any:
    """``(lltype*)(addr + off)`` in LLVM IR."""
    return builder.inttoptr(builder.add(addr, off), lltype.as_pointer())


def _int64_operands(context: Any, builder: Any, sig: Any, args: Any) -> list[Any]:
    from numba import types

    return [context.cast(builder, v, t, types.int64) for v, t in zip(args, sig.args)]


@functools.cache
def _loads() -> dict[str, Any]:
    from llvmlite import ir
    from numba import types
    from numba.extending import intrinsic

    @intrinsic
    def load_i64(typingctx, addr, off):
        """Load the int64 (or pointer, as an int64) at ``addr + off``."""
        if not _int_args(addr, off):
            return None

        def codegen(context, builder, sig, args):
            a, o = _int64_operands(context, builder, sig, args)
            return builder.load(_addr(builder, a, o, ir.IntType(64)))

        return types.int64(addr, off), codegen

    @intrinsic
    def load_i32(typingctx, addr, off):
        """Load the int32 (or C enum) at ``addr + off``, widened to int64."""
        if not _int_args(addr, off):
            return None

        def codegen(context, builder, sig, args):
            a, o = _int64_operands(context, builder, sig, args)
            return builder.sext(builder.load(_addr(builder, a, o, ir.IntType(32))), ir.IntType(64))

        return types.int64(addr, off), codegen

    return {"load_i64": load_i64, "load_i32": load_i32}


def _store_typer(bits: int) -> Callable[..., Any]:
    """The typing function of an intrinsic storing the low ``bits`` of an integer."""
    from llvmlite import ir
    from numba import types

    def typer(typingctx, addr, off, value):
        if not _int_args(addr, off, value):
            return None

        def codegen(context, builder, sig, args):
            a, o, v = _int64_operands(context, builder, sig, args)
            if bits != 64:
                v = builder.trunc(v, ir.IntType(bits))
            builder.store(v, _addr(builder, a, o, ir.IntType(bits)))
            return context.get_dummy_value()

        return types.none(addr, off, value), codegen

    return typer


@functools.cache
def _stores() -> dict[str, Any]:
    from numba.extending import intrinsic

    return {"store_i64": intrinsic(_store_typer(64)), "store_i32": intrinsic(_store_typer(32))}


@functools.cache
def _pointers() -> dict[str, Any]:
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    @intrinsic
    def as_ptr(typingctx, addr, dtype):
        """Turn an address into a typed pointer ``dtype*`` (for ``numba.carray``)."""
        if not isinstance(addr, types.Integer):
            return None
        elem = getattr(dtype, "dtype", None)
        if elem is None:
            elem = getattr(dtype, "instance_type", None)
        if not isinstance(elem, (types.Number, types.Boolean)):
            return None
        ptr_t = types.CPointer(elem)

        def codegen(context, builder, sig, args):
            a = context.cast(builder, args[0], sig.args[0], types.int64)
            return builder.inttoptr(a, context.get_value_type(ptr_t))

        return ptr_t(addr, dtype), codegen

    @intrinsic(prefer_literal=True)
    def stack_bytes(typingctx, nbytes):
        """Reserve ``nbytes`` (a literal) of 16-byte aligned stack in the calling function."""
        if not isinstance(nbytes, types.IntegerLiteral):
            return None
        n = int(nbytes.literal_value)

        def codegen(context, builder, sig, args):
            buf = cgutils.alloca_once(builder, ir.ArrayType(ir.IntType(8), n))
            buf.align = 16
            return builder.ptrtoint(buf, ir.IntType(64))

        return types.int64(nbytes), codegen

    @intrinsic(prefer_literal=True)
    def cstring(typingctx, text):
        """Address of a NUL-terminated constant holding the literal string ``text``."""
        if not isinstance(text, types.StringLiteral):
            return None
        value = str(text.literal_value)

        def codegen(context, builder, sig, args):
            ptr = context.insert_const_string(builder.module, value)
            return builder.ptrtoint(ptr, ir.IntType(64))

        return types.int64(text), codegen

    return {"as_ptr": as_ptr, "stack_bytes": stack_bytes, "cstring": cstring}


@functools.cache
def _calls() -> dict[str, Any]:
    from llvmlite import ir
    from numba import types
    from numba.core.errors import TypingError
    from numba.extending import intrinsic, overload

    i8p = ir.IntType(8).as_pointer()

    @intrinsic
    def call_ptr_fn(typingctx, fn, arg):
        """Call the C function ``void* fn(void*)`` at address ``fn``; the result as int64."""
        if not _int_args(fn, arg):
            return None

        def codegen(context, builder, sig, args):
            f, a = _int64_operands(context, builder, sig, args)
            fnty = ir.FunctionType(i8p, [i8p])
            fptr = builder.inttoptr(f, fnty.as_pointer())
            res = builder.call(fptr, [builder.inttoptr(a, i8p)])
            return builder.ptrtoint(res, ir.IntType(64))

        return types.int64(fn, arg), codegen

    def status_of(value):  # pragma: no cover - replaced by the overload below
        raise NotImplementedError

    @overload(status_of)
    def _status_of_impl(value):
        if isinstance(value, (types.NoneType, types.Omitted)) or value is types.none:
            return lambda value: 0
        if isinstance(value, (types.Integer, types.Boolean)):
            return lambda value: int(value)
        raise TypingError(
            f"a primforge numba kernel must return nothing or an integer status, not {value}"
        )

    return {"call_ptr_fn": call_ptr_fn, "status_of": status_of}


@functools.cache
def _errors() -> dict[str, Any]:
    from numba import njit

    stack_bytes = _pointers()["stack_bytes"]
    store_i64, store_i32 = _stores()["store_i64"], _stores()["store_i32"]
    load_i64, call_ptr_fn = _loads()["load_i64"], _calls()["call_ptr_fn"]
    create = _xla_ffi.layout()["XLA_FFI_Error_Create_Args"]
    c_struct_size = create.struct_size
    c_nbytes = create.size
    c_ext = create.offsets["extension_start"]
    c_msg = create.offsets["message"]
    c_errc = create.offsets["errc"]
    api_fn = _xla_ffi.layout()["XLA_FFI_Api"].offsets["XLA_FFI_Error_Create"]

    @njit(cache=False)
    def error_create(api, message, errc):
        """``api->XLA_FFI_Error_Create(&{message, errc})``; returns the error's address."""
        args = stack_bytes(c_nbytes)
        store_i64(args, 0, c_struct_size)
        store_i64(args, c_ext, 0)
        store_i64(args, c_msg, message)
        store_i32(args, c_errc, errc)
        return call_ptr_fn(load_i64(api, api_fn), args)

    return {"error_create": error_create}


# Public name -> the cached builder that makes it (with its neighbours).
_BUILDERS: dict[str, Callable[[], dict[str, Any]]] = {
    "load_i64": _loads,
    "load_i32": _loads,
    "store_i64": _stores,
    "store_i32": _stores,
    "as_ptr": _pointers,
    "stack_bytes": _pointers,
    "cstring": _pointers,
    "call_ptr_fn": _calls,
    "status_of": _calls,
    "error_create": _errors,
}


def __getattr__(name: str) -> Any:
    builder = _BUILDERS.get(name)
    if builder is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return builder()[name]
