"""The header-derived XLA FFI layout against independent ctypes declarations."""

from __future__ import annotations

import ctypes as C
import re

import numpy as np
import pytest

from primforge.kernel.backends import _xla_ffi as x

P = C.c_void_p
ENUM = C.c_int  # C enums are int-sized on LP64 platforms


class ExtensionBase(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("type", ENUM), ("next", P)]


class ApiVersion(C.Structure):
    _fields_ = [
        ("struct_size", C.c_size_t),
        ("extension_start", P),
        ("major_version", C.c_int),
        ("minor_version", C.c_int),
    ]


class ErrorCreateArgs(C.Structure):
    _fields_ = [
        ("struct_size", C.c_size_t),
        ("extension_start", P),
        ("message", C.c_char_p),
        ("errc", ENUM),
    ]


class Buffer(C.Structure):
    _fields_ = [
        ("struct_size", C.c_size_t),
        ("extension_start", P),
        ("dtype", ENUM),
        ("data", P),
        ("rank", C.c_int64),
        ("dims", C.POINTER(C.c_int64)),
    ]


class Args(C.Structure):
    _fields_ = [
        ("struct_size", C.c_size_t),
        ("extension_start", P),
        ("size", C.c_int64),
        ("types", P),
        ("args", P),
    ]


class Rets(C.Structure):
    _fields_ = [
        ("struct_size", C.c_size_t),
        ("extension_start", P),
        ("size", C.c_int64),
        ("types", P),
        ("rets", P),
    ]


class Attrs(C.Structure):
    _fields_ = [
        ("struct_size", C.c_size_t),
        ("extension_start", P),
        ("size", C.c_int64),
        ("types", P),
        ("names", P),
        ("attrs", P),
    ]


class CallFrame(C.Structure):
    _fields_ = [
        ("struct_size", C.c_size_t),
        ("extension_start", P),
        ("api", P),
        ("ctx", P),
        ("stage", ENUM),
        ("args", Args),
        ("rets", Rets),
        ("attrs", Attrs),
        ("future", P),
    ]


class TypeId(C.Structure):
    _fields_ = [("type_id", C.c_int64)]


class Metadata(C.Structure):
    _fields_ = [
        ("struct_size", C.c_size_t),
        ("api_version", ApiVersion),
        ("traits", C.c_uint32),
        ("state_type_id", TypeId),
    ]


class MetadataExtension(C.Structure):
    _fields_ = [("extension_base", ExtensionBase), ("metadata", P)]


class ByteSpan(C.Structure):
    _fields_ = [("ptr", P), ("len", C.c_size_t)]


class HandlerBundle(C.Structure):
    _fields_ = [("instantiate", P), ("prepare", P), ("initialize", P), ("execute", P)]


class HandlerRegisterArgs(C.Structure):
    _fields_ = [
        ("struct_size", C.c_size_t),
        ("extension_start", P),
        ("name", ByteSpan),
        ("platform", ByteSpan),
        ("bundle", HandlerBundle),
        ("traits", C.c_uint32),
    ]


# The type-id registration slot was renamed in FFI API 0.2 (jaxlib 0.9); same place and type.
_TYPE_REGISTER = "XLA_FFI_Type_Register" if x.api_version() >= (0, 2) else "XLA_FFI_TypeId_Register"

_API_FUNCTIONS = [
    "XLA_FFI_Error_Create",
    "XLA_FFI_Error_GetMessage",
    "XLA_FFI_Error_Destroy",
    "XLA_FFI_Handler_Register",
    "XLA_FFI_Stream_Get",
    _TYPE_REGISTER,
    "XLA_FFI_ExecutionContext_Get",
    "XLA_FFI_State_Set",
    "XLA_FFI_State_Get",
    "XLA_FFI_DeviceMemory_Allocate",
    "XLA_FFI_DeviceMemory_Free",
    "XLA_FFI_ThreadPool_Schedule",
    "XLA_FFI_ThreadPool_NumThreads",
    "XLA_FFI_Future_Create",
    "XLA_FFI_Future_SetAvailable",
    "XLA_FFI_Future_SetError",
    "XLA_FFI_RunId_Get",
    "XLA_FFI_DeviceOrdinal_Get",
]


class Api(C.Structure):
    _fields_ = [
        ("struct_size", C.c_size_t),
        ("extension_start", P),
        ("api_version", ApiVersion),
        ("internal_api", P),
    ] + [(name, P) for name in _API_FUNCTIONS]


CASES = {
    "XLA_FFI_Extension_Base": ExtensionBase,
    "XLA_FFI_Api_Version": ApiVersion,
    "XLA_FFI_Error_Create_Args": ErrorCreateArgs,
    "XLA_FFI_Buffer": Buffer,
    "XLA_FFI_Args": Args,
    "XLA_FFI_Rets": Rets,
    "XLA_FFI_Attrs": Attrs,
    "XLA_FFI_CallFrame": CallFrame,
    "XLA_FFI_TypeId": TypeId,
    "XLA_FFI_Metadata": Metadata,
    "XLA_FFI_Metadata_Extension": MetadataExtension,
    "XLA_FFI_ByteSpan": ByteSpan,
    "XLA_FFI_Handler_Bundle": HandlerBundle,
    "XLA_FFI_Handler_Register_Args": HandlerRegisterArgs,
    "XLA_FFI_Api": Api,
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_struct_layout_matches_ctypes(name):
    ref = CASES[name]
    lay = x.layout()[name]
    assert lay.size == C.sizeof(ref)
    assert lay.align == C.alignment(ref)
    assert list(lay.offsets) == [f for f, _ in ref._fields_]
    for field, _ in ref._fields_:
        assert lay.offsets[field] == getattr(ref, field).offset, field
        assert lay.sizes[field] == getattr(ref, field).size, field


def test_struct_size_uses_the_declared_last_field():
    # XLA_FFI_Metadata's STRUCT_SIZE ends at `traits`, not at the later `state_type_id`.
    assert x.layout()["XLA_FFI_Metadata"].struct_size == Metadata.traits.offset + 4
    assert x.layout()["XLA_FFI_Error_Create_Args"].struct_size == ErrorCreateArgs.errc.offset + 4
    assert x.layout()["XLA_FFI_Api_Version"].struct_size == C.sizeof(ApiVersion)


def test_nested_offsets():
    assert x.offset("XLA_FFI_CallFrame.args.args") == CallFrame.args.offset + Args.args.offset
    assert x.offset("XLA_FFI_CallFrame.rets.size") == CallFrame.rets.offset + Rets.size.offset
    assert (
        x.offset("XLA_FFI_Metadata.api_version.minor_version")
        == Metadata.api_version.offset + ApiVersion.minor_version.offset
    )
    with pytest.raises(KeyError):
        x.offset("XLA_FFI_Buffer.nope")


def test_api_version_is_read_from_the_header():
    with open(x.header_path(), encoding="utf-8") as f:
        text = f.read()
    major = int(re.search(r"#define XLA_FFI_API_MAJOR (\d+)", text).group(1))
    minor = int(re.search(r"#define XLA_FFI_API_MINOR (\d+)", text).group(1))
    assert x.api_version() == (major, minor)


def test_dtype_codes_match_xla_primitive_types():
    # Codes of xla::PrimitiveType (xla_data.proto), written out independently.
    expected = {
        "bool": 1,
        "int8": 2,
        "int16": 3,
        "int32": 4,
        "int64": 5,
        "uint8": 6,
        "uint16": 7,
        "uint32": 8,
        "uint64": 9,
        "float16": 10,
        "float32": 11,
        "float64": 12,
        "complex64": 15,
        "bfloat16": 16,
        "complex128": 18,
    }
    for name, code in expected.items():
        assert x.dtype_code(name) == code, name
    assert x.dtype_code(np.float32) == 11
    with pytest.raises(TypeError, match="no XLA FFI data type code"):
        x.dtype_code(np.dtype("U3"))


def test_layout_digest_is_stable():
    assert x.layout_digest() == x.layout_digest()
    assert re.fullmatch(r"[0-9a-f]{16}", x.layout_digest())


def test_intrinsics_load_store_and_call_a_function_pointer():
    numba = pytest.importorskip("numba")
    buf = np.zeros(4, np.int64)
    from primforge.kernel.backends import _numba_intrinsics as nx

    # The intrinsics are created on first access (no numba import before): bind them here.
    store_i64, store_i32, load_i64, load_i32 = nx.store_i64, nx.store_i32, nx.load_i64, nx.load_i32
    call_ptr_fn = nx.call_ptr_fn

    @numba.njit
    def roundtrip(addr):
        store_i64(addr, 0, 1 << 40)
        store_i32(addr, 8, -5)
        return load_i64(addr, 0), load_i32(addr, 8)

    big, small = roundtrip(buf.ctypes.data)
    assert big == 1 << 40 and small == -5

    # call_ptr_fn against a C function with the same `void* f(void*)` shape
    @numba.cfunc(numba.types.int64(numba.types.int64))
    def plus_one(v):
        return v + 1

    @numba.njit
    def call(fn, v):
        return call_ptr_fn(fn, v)

    assert call(plus_one.address, 41) == 42


def test_intrinsics_pointers_strings_and_stack():
    numba = pytest.importorskip("numba")
    from primforge.kernel.backends import _numba_intrinsics as nx

    as_ptr, cstring, stack_bytes = nx.as_ptr, nx.cstring, nx.stack_bytes
    store_i64, load_i64 = nx.store_i64, nx.load_i64

    @numba.njit
    def total(addr, n):
        return numba.carray(as_ptr(addr, numba.float32), (n,)).sum()

    data = np.array([1.5, 2.0, -4.0], np.float32)
    assert total(data.ctypes.data, 3) == np.float32(data.sum())

    @numba.njit
    def hello():
        return cstring("hello, ffi")

    assert C.string_at(hello()) == b"hello, ffi"

    @numba.njit
    def scratch():
        buf = stack_bytes(32)
        store_i64(buf, 24, 7)
        return load_i64(buf, 24), buf % 16

    assert scratch() == (7, 0)


def test_status_of_accepts_nothing_or_integers_only():
    numba = pytest.importorskip("numba")
    from numba.core.errors import TypingError

    from primforge.kernel.backends import _numba_intrinsics as nx

    status_of = nx.status_of

    @numba.njit
    def of(v):
        return status_of(v)

    @numba.njit
    def of_none():
        return status_of(None)

    assert of(5) == 5 and of(True) == 1 and of_none() == 0
    with pytest.raises(TypingError, match="integer status"):
        of(1.5)


def test_error_create_fills_the_args_struct_from_the_header():
    pytest.importorskip("numba")
    from primforge.kernel.backends import _numba_intrinsics as nx

    seen = {}

    @C.CFUNCTYPE(C.c_void_p, C.c_void_p)
    def fake_create(addr):
        args = ErrorCreateArgs.from_address(addr)
        seen.update(size=args.struct_size, ext=args.extension_start, msg=args.message,
                    errc=args.errc)
        return 0x1234

    api = (C.c_void_p * (C.sizeof(Api) // 8))()
    C.cast(api, C.POINTER(Api)).contents.XLA_FFI_Error_Create = C.cast(fake_create, C.c_void_p)
    message = C.create_string_buffer(b"boom")
    error_create = nx.error_create
    got = error_create(C.addressof(api), C.addressof(message), 3)
    assert got == 0x1234
    assert seen == {"size": ErrorCreateArgs.errc.offset + 4, "ext": None, "msg": b"boom",
                    "errc": 3}
