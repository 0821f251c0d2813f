"""The header-derived XLA FFI layout against independent ctypes declarations."""

from __future__ import annotations

import ctypes as C
import re

import numpy as np
import pytest

from primforge.backends import _xla_ffi as x

P = C.c_void_p
ENUM = C.c_int  # C enums are int-sized on LP64 platforms

# FFI API 0.4 (jaxlib 0.11) renamed the extension base, the error-message call and the
# execution context (same places and types) and appended a bundle slot and an API function.
API_0_4 = x.api_version() >= (0, 4)
EXTENSION = "XLA_FFI_InternalExtension" if API_0_4 else "XLA_FFI_Extension_Base"


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
    _fields_ = [("instantiate", P), ("prepare", P), ("initialize", P), ("execute", P)] + (
        [("record", P)] if API_0_4 else [])


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
    "XLA_FFI_Error_GetDetails" if API_0_4 else "XLA_FFI_Error_GetMessage",
    "XLA_FFI_Error_Destroy",
    "XLA_FFI_Handler_Register",
    "XLA_FFI_Stream_Get",
    _TYPE_REGISTER,
    "XLA_FFI_InvokeContext_Get" if API_0_4 else "XLA_FFI_ExecutionContext_Get",
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
] + (["XLA_FFI_InvokeContext_FindExtension"] if API_0_4 else [])


class Api(C.Structure):
    _fields_ = [
        ("struct_size", C.c_size_t),
        ("extension_start", P),
        ("api_version", ApiVersion),
        ("internal_api", P),
    ] + [(name, P) for name in _API_FUNCTIONS]


CASES = {
    EXTENSION: ExtensionBase,
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


def test_renamed_declarations_resolve_to_this_headers_spelling():
    assert x.spelled("extension") == EXTENSION
    kind = "XLA_FFI_InternalExtension_Type" if API_0_4 else "XLA_FFI_Extension_Type"
    assert x.spelled("extension_type") == kind
    message = "XLA_FFI_Error_GetDetails" if API_0_4 else "XLA_FFI_Error_GetMessage"
    assert x.spelled("error_message") == message
    # The call's argument struct exists under that name and ends at the message it reads.
    args = x.layout()[message + "_Args"]
    assert "message" in args.offsets and "error" in args.offsets
    with pytest.raises(KeyError):
        x.spelled("no_such_role")


def test_layout_digest_is_stable():
    assert x.layout_digest() == x.layout_digest()
    assert re.fullmatch(r"[0-9a-f]{16}", x.layout_digest())


