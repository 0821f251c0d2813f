"""The per-kernel entry: wraps raw buffers in Numba arrays and calls the compiled kernel.

The entry, ``int64 entry(int64* data, int64* dims, int64* info)``, returns 0 (done), 1 (a
non-zero kernel status in ``info``) or 2 (an exception record in ``info``); it never
raises. :func:`describe_failure` turns a failure into text.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

from primforge.backends.numba._handler import (
    KIND_DROPPED,
    KIND_EXCEPTION,
    KIND_STATUS,
    jit_module,
    unique_symbol,
)

__all__ = ["Entry", "compile_entry", "compiled_entries", "describe_failure"]


# (kernel's native address, argument types, kernel signature) -> the entry's address. An
# entry's code is never freed (see ``jit_module``), so an entry compiled once serves every
# later build of the same kernel code: dropping and rebuilding costs no new machine code.
_CODE: dict[tuple, int] = {}


class Entry:
    """A compiled entry: its address, and what keeps its code and the kernel's alive."""

    def __init__(self, address, cres):
        self.address = address
        self.cres = cres  # keeps the kernel's compiled code referenced


def _resolve(kernel, argtys):
    """Compile ``kernel`` for ``argtys`` (Numba's own dispatch rules) -> its compile result."""
    from numba import types
    from numba.core.errors import TypingError
    from numba.core.registry import cpu_target

    tyctx = cpu_target.typing_context
    tyctx.refresh()
    fnty = tyctx.resolve_value_type(kernel)
    sig = fnty.get_call_type(tyctx, argtys, {})
    if sig is None:
        raise TypingError(f"the kernel cannot be called with arguments {argtys}")
    rt = sig.return_type
    if not isinstance(rt, (types.NoneType, types.Integer, types.Boolean)):
        raise TypingError(
            f"a primforge numba kernel must return nothing or an integer status, not {rt}"
        )
    return kernel.overloads[tuple(sig.args)]


def compile_entry(kernel: Any, views: Sequence[tuple[str, int]], label: str) -> Entry:
    """Compile ``kernel`` (a dispatcher) for C-contiguous arrays of the given
    ``(dtype name, rank)`` views, and the entry calling it.

    The kernel is compiled by its own dispatcher, exactly as a call from Python would; the
    entry is a few LLVM instructions emitted with Numba's target context (the same array
    structures ``numba.carray`` builds, then Numba's CPU calling convention) that call the
    kernel's native function at its address, so nothing of the kernel is compiled twice.

    Returns:
        An :class:`Entry`; ``.address`` is ``int64 entry(int64* data, int64* dims, int64* info)``.
    """
    import numpy as np
    from numba import types
    from numba.core.compiler_lock import global_compiler_lock
    from numba.np.numpy_support import from_dtype

    argtys = tuple(types.Array(from_dtype(np.dtype(d)), rank, "C") for d, rank in views)
    try:
        cres = _resolve(kernel, argtys)
    except BaseException as e:
        e.add_note(f"primforge: while compiling the numba kernel for {label}")
        raise
    with global_compiler_lock:
        kernel_addr = cres.library.get_pointer_to_function(cres.fndesc.llvm_func_name)
        if not kernel_addr:
            raise RuntimeError(f"{label}: Numba did not expose the kernel's native function")
        # What decides the entry's machine code: the kernel's address and the two signatures.
        key = (kernel_addr, argtys, cres.signature)
        address = _CODE.get(key)
        if address is None:
            symbol = unique_symbol("primforge_entry")
            text = _entry_ir(symbol, cres, kernel_addr, argtys)
    if address is None:
        address = _CODE.setdefault(key, jit_module(text, symbol))
    return Entry(address, cres)


def compiled_entries() -> int:
    """How many distinct entries this process compiled (each is kept for the process).

    Example:
        >>> compiled_entries() >= 0
        True
    """
    return len(_CODE)


def _entry_ir(symbol: str, cres: Any, kernel_addr: int, argtys: tuple) -> str:
    """LLVM IR of ``int64 symbol(int64* data, int64* dims, int64* info)`` calling the
    kernel's native function at ``kernel_addr`` (called under Numba's compiler lock)."""
    from llvmlite import ir
    from numba.core.registry import cpu_target

    context = cpu_target.target_context
    module = ir.Module(name=symbol)
    i64 = ir.IntType(64)
    fn = ir.Function(module, ir.FunctionType(i64, [i64, i64, i64]), name=symbol)
    b = ir.IRBuilder(fn.append_basic_block())
    data, dims, info = fn.args
    values = [_array_value(context, b, aryty, data, dims, k) for k, aryty in enumerate(argtys)]
    sig = cres.signature
    values = [context.cast(b, v, have, want) for v, have, want in zip(values, argtys, sig.args)]
    _call_kernel(context, b, fn, sig, kernel_addr, values, info)
    return str(module)


def _load_i64(b: Any, addr: Any, off: int) -> Any:
    i64 = addr.type
    return b.load(b.inttoptr(b.add(addr, i64(off)), i64.as_pointer()))


def _array_value(context: Any, b: Any, aryty: Any, data: Any, dims: Any, k: int) -> Any:
    """The Numba array structure of buffer ``k``: C-contiguous over its core dims."""
    i64 = data.type
    core = _load_i64(b, dims, 8 * k)
    shape = [_load_i64(b, core, 8 * d) for d in range(aryty.ndim)]
    itemsize = i64(context.get_abi_sizeof(context.get_data_type(aryty.dtype)))
    strides, step = [], itemsize
    for extent in reversed(shape):
        strides.append(step)
        step = b.mul(step, extent)
    strides.reverse()
    ptr = b.inttoptr(_load_i64(b, data, 8 * k), context.get_data_type(aryty.dtype).as_pointer())
    ary = context.make_array(aryty)(context, b)
    context.populate_array(
        ary, data=ptr, shape=shape, strides=strides, itemsize=itemsize, meminfo=None
    )
    return ary._getvalue()


def _call_kernel(context, b, fn, sig, kernel_addr, values, info) -> None:
    """Call the kernel with Numba's CPU calling convention; return the entry's result kind
    (and store the status or the exception record in ``*info``)."""
    from llvmlite import ir
    from numba import types
    from numba.core import callconv, cgutils

    i64 = ir.IntType(64)
    conv = context.call_conv
    fnty = conv.get_function_type(sig.return_type, sig.args)
    callee = b.inttoptr(i64(kernel_addr), fnty.as_pointer())
    retty = fnty.args[0].pointee
    retval = cgutils.alloca_once(b, retty)
    b.store(cgutils.get_null_value(retty), retval)
    excinfo = cgutils.alloca_once(b, callconv.excinfo_ptr_t)
    b.store(cgutils.get_null_value(callconv.excinfo_ptr_t), excinfo)
    args = list(conv._get_arg_packer(sig.args).as_arguments(b, values))
    code = b.call(callee, [retval, excinfo, *args])
    status = conv._get_return_status(b, code, b.load(excinfo))
    failed, fine = fn.append_basic_block("failed"), fn.append_basic_block("fine")
    b.cbranch(status.is_error, failed, fine)
    b.position_at_end(failed)
    exc = b.select(status.is_user_exc, b.ptrtoint(b.load(excinfo), i64), i64(0))
    b.store(exc, b.inttoptr(info, i64.as_pointer()))
    b.ret(i64(KIND_EXCEPTION))
    b.position_at_end(fine)
    restype = sig.return_type
    if isinstance(restype, (types.Integer, types.Boolean)):
        value = context.get_returned_value(b, restype, b.load(retval))
        value = context.cast(b, value, restype, types.int64)
        b.store(value, b.inttoptr(info, i64.as_pointer()))
        nonzero = b.icmp_signed("!=", value, i64(0))
        b.ret(b.select(nonzero, i64(KIND_STATUS), i64(0)))
    else:
        b.ret(i64(0))


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
            f"{label}: its compiled code was dropped (primforge.backends.numba.clear or "
            "the in-memory bound) and the kernel no longer exists to rebuild it; trace the "
            "call again"
        )
    if kind == KIND_EXCEPTION:
        if info:
            try:
                exc = _exception_from(info)
            except Exception as e:  # noqa: BLE001  (still name the kernel)
                return f"{label} raised an exception (its details could not be read: {e!r})"
            if exc is not None and getattr(exc, "primforge_report", False):
                return str(exc)  # a primforge debug-mode report: its own words, first
            if exc is not None:
                text = str(exc)
                name = type(exc).__name__
                return f"{label} raised {name}: {text}" if text else f"{label} raised {name}"
        return f"{label} raised an exception"
    return f"{label} failed (result {kind}, {info})"
