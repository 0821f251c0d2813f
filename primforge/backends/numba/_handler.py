"""The XLA FFI handler of a Numba kernel, written directly as LLVM IR (nothing to cache).

The handler checks the buffers, loops over the native batch levels and calls the entry
whose address it reads from a slot; it holds no user code.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
from collections.abc import Sequence

from primforge.backends import _xla_ffi as _x

__all__ = ["MESSAGE_BYTES", "BufferSpec", "build_handler", "jit_module", "unique_symbol"]

#: Size of the stack buffer the report callback writes an error message into.
MESSAGE_BYTES = 2048

#: Entry results (``kind``): 0 ok; the others are passed to the report callback.
KIND_OK = 0
KIND_STATUS = 1  # the kernel returned a non-zero integer status (info: the status)
KIND_EXCEPTION = 2  # the kernel raised (info: Numba's excinfo pointer, or 0)
KIND_DROPPED = 3  # the entry was dropped and could not be rebuilt


@dataclasses.dataclass(frozen=True)
class BufferSpec:
    """One FFI buffer as the handler checks and slices it.

    Attributes:
        ffi_code: its ``XLA_FFI_DataType`` code.
        itemsize: bytes per element.
        rank: core rank (the kernel sees this many dimensions).
        mapped: one bool per batch level, outermost first: whether the buffer has that
            level's dimension in front of its core shape.
        what: ``"input 0"``, ``"output 1"``... for error messages.

    Example:
        >>> BufferSpec(ffi_code=11, itemsize=4, rank=1, mapped=(), what="input 0").lead
        0
    """

    ffi_code: int
    itemsize: int
    rank: int
    mapped: tuple[bool, ...]
    what: str

    @property
    def lead(self) -> int:
        """Number of batch dimensions in front of the core shape."""
        return sum(self.mapped)


def build_handler(
    symbol: str,
    label: str,
    ins: Sequence[BufferSpec],
    outs: Sequence[BufferSpec],
    *,
    n_levels: int,
    slot_addr: int,
    revive_addr: int,
    report_addr: int,
    token: int,
) -> str:
    """LLVM IR text of the handler ``i8* symbol(i8* call_frame)``.

    Args:
        symbol: the function's name in the module.
        label: the kernel's description, used in the messages the handler owns.
        ins, outs: the buffers, in XLA's order.
        n_levels: number of native batch levels (every output has them all).
        slot_addr: address of the int64 holding the entry's address (0: none).
        revive_addr: ``int64 revive(int64 token)``: rebuilds the entry, returns its address.
        report_addr: ``void report(int64 token, int64 kind, int64 info, i8* buf, int64 n)``:
            writes the error message for ``kind`` into ``buf``.
        token: passed to both callbacks to name this handler.

    Returns:
        The module's text (``llvmlite.binding.parse_assembly`` reads it).

    Example:
        >>> spec = BufferSpec(_x.dtype_code("float32"), 4, 1, (), "input 0")
        >>> text = build_handler("h", "k", [spec], [spec], n_levels=0, slot_addr=8,
        ...                      revive_addr=16, report_addr=24, token=0)
        >>> "define" in text and "h" in text
        True
    """
    emitter = _HandlerIR(symbol, label, ins, outs, n_levels)
    return emitter.emit(
        slot_addr=slot_addr, revive_addr=revive_addr, report_addr=report_addr, token=token
    )


class _HandlerIR:
    """Writes one handler module. Each method emits one part of the handler, in the order
    the handler runs them; values a later part needs are kept on ``self``."""

    def __init__(self, symbol, label, ins, outs, n_levels):
        from llvmlite import ir

        self.ir = ir
        self.i8, self.i32, self.i64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
        self.i8p = self.i8.as_pointer()
        self.symbol, self.label, self.n_levels = symbol, label, n_levels
        self.ins, self.outs = list(ins), list(outs)
        self.bufs = self.ins + self.outs
        self.e_invalid = _x.enum_value("XLA_FFI_Error_Code", "XLA_FFI_Error_Code_INVALID_ARGUMENT")
        self.e_internal = _x.enum_value("XLA_FFI_Error_Code", "XLA_FFI_Error_Code_INTERNAL")
        self.mod = ir.Module(name=symbol)
        self.strings: dict[str, object] = {}

    # --- small emitters ----------------------------------------------------------------------

    def cstring(self, b, text: str):
        """Address (i64) of a module constant holding ``text`` NUL-terminated."""
        ir, i8 = self.ir, self.i8
        if text not in self.strings:
            data = bytearray(text.encode("utf-8")) + b"\0"
            ty = ir.ArrayType(i8, len(data))
            gv = ir.GlobalVariable(self.mod, ty, name=f"msg{len(self.strings)}")
            gv.global_constant = True
            gv.linkage = "internal"
            gv.initializer = ir.Constant(ty, data)
            self.strings[text] = gv
        return b.ptrtoint(self.strings[text], self.i64)

    def at(self, b, addr, offset, ty):
        return b.inttoptr(b.add(addr, self.i64(offset)), ty.as_pointer())

    def load(self, b, addr, offset, ty=None):
        return b.load(self.at(b, addr, offset, ty or self.i64))

    def store(self, b, addr, offset, value, ty=None):
        ty = ty or self.i64
        b.store(ty(value) if isinstance(value, int) else value, self.at(b, addr, offset, ty))

    def fail(self, b, text: str, code: int) -> None:
        """Return an ``XLA_FFI_Error`` with ``label: text`` from the current block."""
        msg = self.cstring(b, f"{self.label}: {text}")
        b.ret(b.call(self.err_fn, [self.api_v, msg, self.i64(code)]))

    # --- the parts -----------------------------------------------------------------------------

    def error_function(self) -> None:
        """``i8* error(api, message, errc)``: api->XLA_FFI_Error_Create(&{...})."""
        ir, i8, i32, i64, i8p = self.ir, self.i8, self.i32, self.i64, self.i8p
        create = _x.layout()["XLA_FFI_Error_Create_Args"]
        err_fn = ir.Function(
            self.mod, ir.FunctionType(i8p, [i64, i64, i64]), name=self.symbol + "_error"
        )
        err_fn.linkage = "internal"
        eb = ir.IRBuilder(err_fn.append_basic_block())
        api, message, errc = err_fn.args
        raw = eb.alloca(ir.ArrayType(i8, create.size))
        raw.align = 16
        args = eb.ptrtoint(raw, i64)
        self.store(eb, args, 0, create.struct_size)
        self.store(eb, args, create.offsets["extension_start"], 0)
        self.store(eb, args, create.offsets["message"], message)
        self.store(eb, args, create.offsets["errc"], eb.trunc(errc, i32), i32)
        fp = self.load(eb, api, _x.layout()["XLA_FFI_Api"].offsets["XLA_FFI_Error_Create"])
        fn_ty = ir.FunctionType(i8p, [i8p])
        eb.ret(eb.call(eb.inttoptr(fp, fn_ty.as_pointer()), [eb.inttoptr(args, i8p)]))
        self.err_fn = err_fn

    def prologue(self):
        """The handler function, its stack arrays; returns its builder."""
        ir, i8, i64 = self.ir, self.i8, self.i64
        n_bufs = len(self.bufs)
        self.fn = ir.Function(self.mod, ir.FunctionType(self.i8p, [self.i8p]), name=self.symbol)
        b = ir.IRBuilder(self.fn.append_basic_block("start"))
        self.data_arr = b.alloca(ir.ArrayType(i64, max(n_bufs, 1)))
        self.dims_arr = b.alloca(ir.ArrayType(i64, max(n_bufs, 1)))
        self.info = b.alloca(i64)
        self.msgbuf = b.alloca(ir.ArrayType(i8, MESSAGE_BYTES))
        self.frame = b.ptrtoint(self.fn.args[0], i64)
        self.null = ir.Constant(self.i8p, None)
        return b

    def answer_metadata(self, b) -> None:
        """XLA first asks for the handler's API version through a metadata extension: walk
        the frame's extensions; answer and return if one is the metadata query."""
        blk, i32, i64, off = self.fn.append_basic_block, self.i32, self.i64, _x.offset
        major, minor = _x.api_version()
        first = self.load(b, self.frame, off("XLA_FFI_CallFrame.extension_start"))
        head, body, meta, nxt, run = (
            blk("ext"),
            blk("ext_body"),
            blk("meta"),
            blk("ext_next"),
            blk("run"),
        )
        pre = b.block
        b.branch(head)
        b.position_at_end(head)
        ext = b.phi(i64)
        ext.add_incoming(first, pre)
        b.cbranch(b.icmp_unsigned("!=", ext, i64(0)), body, run)
        b.position_at_end(body)
        base = _x.spelled("extension")
        kind = self.load(b, ext, off(base + ".type"), i32)
        meta_type = _x.enum_value(_x.spelled("extension_type"), "XLA_FFI_Extension_Metadata")
        b.cbranch(b.icmp_unsigned("==", kind, i32(meta_type)), meta, nxt)
        b.position_at_end(meta)
        md = self.load(b, ext, off("XLA_FFI_Metadata_Extension.metadata"))
        av = "XLA_FFI_Metadata.api_version"
        version_size = _x.layout()["XLA_FFI_Api_Version"].struct_size
        self.store(b, md, off(av + ".struct_size"), version_size)
        self.store(b, md, off(av + ".extension_start"), 0)
        self.store(b, md, off(av + ".major_version"), major, i32)
        self.store(b, md, off(av + ".minor_version"), minor, i32)
        self.store(b, md, off("XLA_FFI_Metadata.traits"), 0, i32)
        b.ret(self.null)
        b.position_at_end(nxt)
        ext.add_incoming(self.load(b, ext, off(base + ".next")), nxt)
        b.branch(head)
        b.position_at_end(run)

    def check_counts(self, b) -> None:
        """A call: the numbers of buffers must be the kernel's."""
        blk, i64, off = self.fn.append_basic_block, self.i64, _x.offset
        self.api_v = self.load(b, self.frame, off("XLA_FFI_CallFrame.api"))
        nargs = self.load(b, self.frame, off("XLA_FFI_CallFrame.args.size"))
        nrets = self.load(b, self.frame, off("XLA_FFI_CallFrame.rets.size"))
        ok = b.and_(
            b.icmp_signed("==", nargs, i64(len(self.ins))),
            b.icmp_signed("==", nrets, i64(len(self.outs))),
        )
        good, bad = blk("counts_ok"), blk("counts_bad")
        b.cbranch(ok, good, bad)
        b.position_at_end(bad)
        self.fail(b, "XLA passed an unexpected number of buffers", self.e_invalid)
        b.position_at_end(good)

    def check_buffers(self, b) -> None:
        """Check each buffer's dtype and rank; keep its data pointer, the address of its core
        dims (in ``dims_arr``) and the bytes of one core element (one batch element)."""
        blk, i32, i64, off = self.fn.append_basic_block, self.i32, self.i64, _x.offset
        argv = self.load(b, self.frame, off("XLA_FFI_CallFrame.args.args"))
        retv = self.load(b, self.frame, off("XLA_FFI_CallFrame.rets.rets"))
        n_ins = len(self.ins)
        self.base_ptrs, self.elem_bytes, self.out0_dims = [], [], None
        for k, spec in enumerate(self.bufs):
            vec, slot = (argv, k) if k < n_ins else (retv, k - n_ins)
            buf = self.load(b, vec, 8 * slot)
            dt = self.load(b, buf, off("XLA_FFI_Buffer.dtype"), i32)
            rank = self.load(b, buf, off("XLA_FFI_Buffer.rank"))
            ok = b.and_(
                b.icmp_signed("==", dt, i32(spec.ffi_code)),
                b.icmp_signed("==", rank, i64(spec.lead + spec.rank)),
            )
            good, bad = blk(f"buf{k}_ok"), blk(f"buf{k}_bad")
            b.cbranch(ok, good, bad)
            b.position_at_end(bad)
            self.fail(b, f"{spec.what} has an unexpected dtype or rank", self.e_invalid)
            b.position_at_end(good)
            self.base_ptrs.append(self.load(b, buf, off("XLA_FFI_Buffer.data")))
            dims = self.load(b, buf, off("XLA_FFI_Buffer.dims"))
            if k == n_ins:
                self.out0_dims = dims
            core = b.add(dims, i64(8 * spec.lead))
            b.store(core, b.gep(self.dims_arr, [i32(0), i32(k)]))
            nbytes = i64(spec.itemsize)
            for d in range(spec.rank):
                nbytes = b.mul(nbytes, self.load(b, core, 8 * d))
            self.elem_bytes.append(nbytes)

    def open_loop(self, b):
        """Start the loop over the batch elements (read from the first output's leading
        dims); point ``data_arr`` at this element's slices. Returns the element index."""
        blk, i32, i64, n_levels = self.fn.append_basic_block, self.i32, self.i64, self.n_levels
        sizes = [self.load(b, self.out0_dims, 8 * lvl) for lvl in range(n_levels)]
        inner = [i64(1)] * n_levels  # product of the sizes of the levels inside each level
        for lvl in range(n_levels - 2, -1, -1):
            inner[lvl] = b.mul(inner[lvl + 1], sizes[lvl + 1])
        total = b.mul(inner[0], sizes[0]) if n_levels else i64(1)

        loop_pre = b.block
        self.head, self.body, self.done = blk("loop"), blk("loop_body"), blk("done")
        b.branch(self.head)
        b.position_at_end(self.head)
        e = b.phi(i64)
        e.add_incoming(i64(0), loop_pre)
        b.cbranch(b.icmp_signed("<", e, total), self.body, self.done)

        b.position_at_end(self.body)
        index = [b.urem(b.udiv(e, inner[lvl]), sizes[lvl]) for lvl in range(n_levels)]
        for k, spec in enumerate(self.bufs):
            lin = i64(0)
            for lvl, m in enumerate(spec.mapped):
                if m:
                    lin = b.add(b.mul(lin, sizes[lvl]), index[lvl])
            ptr = b.add(self.base_ptrs[k], b.mul(lin, self.elem_bytes[k]))
            b.store(ptr, b.gep(self.data_arr, [i32(0), i32(k)]))
        return e

    def call_entry(self, b, e, *, slot_addr, revive_addr, report_addr, token) -> None:
        """Call the entry whose address is in the slot (reviving it when the slot is empty),
        continue the loop on success, report and return an error otherwise."""
        ir, blk, i64 = self.ir, self.fn.append_basic_block, self.i64
        entry_ty = ir.FunctionType(i64, [i64, i64, i64])
        slot = b.inttoptr(i64(slot_addr), i64.as_pointer())
        loaded = b.load(slot, name="entry")
        have, revive, call = blk("have_entry"), blk("revive"), blk("call")
        b.cbranch(b.icmp_unsigned("!=", loaded, i64(0)), call, revive)
        b.position_at_end(revive)
        revive_ty = ir.FunctionType(i64, [i64])
        revived = b.call(b.inttoptr(i64(revive_addr), revive_ty.as_pointer()), [i64(token)])
        gone = blk("gone")
        b.cbranch(b.icmp_unsigned("!=", revived, i64(0)), have, gone)
        b.position_at_end(have)
        b.branch(call)
        b.position_at_end(call)
        target = b.phi(i64)
        target.add_incoming(loaded, self.body)
        target.add_incoming(revived, have)
        callee = b.inttoptr(target, entry_ty.as_pointer())
        args = [b.ptrtoint(a, i64) for a in (self.data_arr, self.dims_arr, self.info)]
        status = b.call(callee, args)
        cont, err = blk("next"), blk("error")
        b.cbranch(b.icmp_signed("==", status, i64(KIND_OK)), cont, err)
        b.position_at_end(cont)
        e.add_incoming(b.add(e, i64(1)), cont)
        b.branch(self.head)

        b.position_at_end(self.done)
        b.ret(self.null)

        b.position_at_end(gone)
        b.store(i64(0), self.info)
        b.branch(err)
        b.position_at_end(err)
        why = b.phi(i64)
        why.add_incoming(status, call)
        why.add_incoming(i64(KIND_DROPPED), gone)
        report_ty = ir.FunctionType(ir.VoidType(), [i64, i64, i64, i64, i64])
        report = b.inttoptr(i64(report_addr), report_ty.as_pointer())
        info = b.load(self.info)
        b.call(report, [i64(token), why, info, b.ptrtoint(self.msgbuf, i64), i64(MESSAGE_BYTES)])
        msg = b.ptrtoint(self.msgbuf, i64)
        b.ret(b.call(self.err_fn, [self.api_v, msg, i64(self.e_internal)]))

    def emit(self, *, slot_addr, revive_addr, report_addr, token) -> str:
        self.error_function()
        b = self.prologue()
        self.answer_metadata(b)
        self.check_counts(b)
        self.check_buffers(b)
        e = self.open_loop(b)
        self.call_entry(
            b, e, slot_addr=slot_addr, revive_addr=revive_addr, report_addr=report_addr, token=token
        )
        return str(self.mod)


_ENGINE: list = []  # [(engine, target machine)] once made
_JIT_LOCK = threading.Lock()


def jit_module(text: str, symbol: str) -> int:
    """Compile LLVM IR ``text`` and return the address of its function ``symbol``.

    One llvmlite MCJIT engine, made on first use, holds the machine code of every module
    primforge compiles this way, and never frees it, so an address stays valid for the
    process. The module's LLVM IR is released once its code is made: only the code stays.
    The code calls nothing by name (only addresses baked in as constants), so no symbol has
    to be resolved, and LLVM's code generator at ``-O2`` is all it needs: a few milliseconds.

    Example:
        >>> import ctypes
        >>> ir = ('define i64 @twice(i64 %x) {\\n  %y = mul i64 %x, 2\\n  ret i64 %y\\n}\\n')
        >>> addr = jit_module(ir, "twice")
        >>> ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64)(addr)(21)
        42
    """
    from llvmlite import binding as ll

    with _JIT_LOCK:
        if not _ENGINE:
            ll.initialize_native_target()
            ll.initialize_native_asmprinter()
            target = ll.Target.from_default_triple()
            machine = target.create_target_machine(opt=2, codemodel="jitdefault", jit=True)
            backing = ll.parse_assembly("")
            backing.triple = ll.get_process_triple()
            engine = ll.create_mcjit_compiler(backing, machine)
            _ENGINE.append((engine, machine))
        engine, machine = _ENGINE[0]
        module = ll.parse_assembly(text)
        module.triple = ll.get_process_triple()
        module.data_layout = str(machine.target_data)
        module.verify()
        engine.add_module(module)
        engine.finalize_object()
        address = engine.get_function_address(symbol)
        # MCJIT keeps a finalized module's IR until it is removed; its loaded code stays.
        engine.remove_module(module)
        module.close()
    if not address:
        raise RuntimeError(f"LLVM did not produce the function {symbol}")
    return address


_SYMBOLS = itertools.count()


def unique_symbol(prefix: str) -> str:
    """A function name not used before in this process (the JIT engine is shared).

    Example:
        >>> unique_symbol("f") != unique_symbol("f")
        True
    """
    return f"{prefix}_{next(_SYMBOLS)}"
