"""The XLA FFI C ABI, read from the header that ships with jaxlib.

The API version, struct field offsets (LP64 layout) and ``XLA_FFI_DataType`` codes, all
derived at run time from ``jax.ffi.include_dir()/xla/ffi/api/c_api.h``.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import re
import struct
from typing import Any

import numpy as np

__all__ = [
    "StructLayout",
    "api_version",
    "data_type_codes",
    "dtype_code",
    "enum_value",
    "header_path",
    "layout",
    "layout_digest",
    "offset",
    "spelled",
]

_POINTER_SIZE = 8
# LP64 sizes (and alignments) of the scalar types the header uses.
_SCALARS = {
    "size_t": 8,
    "int64_t": 8,
    "uint64_t": 8,
    "int32_t": 4,
    "uint32_t": 4,
    "int": 4,
    "char": 1,
}


def header_path() -> str:
    """Path of the XLA FFI C header that the installed jaxlib ships.

    Returns:
        An absolute path ending in ``xla/ffi/api/c_api.h``.

    Example:
        >>> header_path().endswith("xla/ffi/api/c_api.h")
        True
    """
    import jax.ffi

    return os.path.join(jax.ffi.include_dir(), "xla", "ffi", "api", "c_api.h")


@functools.cache
def _header_text() -> str:
    with open(header_path(), encoding="utf-8") as f:
        text = f.read()
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.DOTALL)
    text = re.sub(r"//[^\n]*", " ", text)
    return text.replace("\\\n", " ")  # join macro continuation lines


@functools.cache
def _declarations() -> str:
    """The header without preprocessor lines (macro bodies would look like declarations)."""
    return "\n".join(ln for ln in _header_text().splitlines() if not ln.lstrip().startswith("#"))


@functools.cache
def api_version() -> tuple[int, int]:
    """The ``(major, minor)`` XLA FFI API version declared by the header.

    Returns:
        The values of ``XLA_FFI_API_MAJOR`` and ``XLA_FFI_API_MINOR``.

    Example:
        >>> major, minor = api_version()
        >>> isinstance(major, int) and isinstance(minor, int)
        True
    """
    text = _header_text()
    found = []
    for part in ("MAJOR", "MINOR"):
        m = re.search(rf"#define\s+XLA_FFI_API_{part}\s+(\d+)", text)
        if m is None:
            raise RuntimeError(f"XLA_FFI_API_{part} is not defined in {header_path()}")
        found.append(int(m.group(1)))
    return found[0], found[1]


# Names the header has changed between releases, with an unchanged ABI: role -> the
# spellings, newest first. The first one the installed header declares is used.
_SPELLINGS = {
    "extension": ("XLA_FFI_InternalExtension", "XLA_FFI_Extension_Base"),
    "extension_type": ("XLA_FFI_InternalExtension_Type", "XLA_FFI_Extension_Type"),
    "error_message": ("XLA_FFI_Error_GetDetails", "XLA_FFI_Error_GetMessage"),
}


@functools.cache
def spelled(role: str) -> str:
    """The installed header's name for a declaration that releases spell differently.

    Args:
        role: ``"extension"`` (the struct that starts every extension chain),
            ``"extension_type"`` (the enum of its ``type`` field) or ``"error_message"``
            (the API function that reads an error's message; its argument struct is the
            name plus ``_Args``).

    Returns:
        The spelling the header declares.

    Raises:
        KeyError: for an unknown role.
        RuntimeError: if the header declares none of the known spellings.

    Example:
        >>> spelled("extension") in ("XLA_FFI_InternalExtension", "XLA_FFI_Extension_Base")
        True
    """
    known = set(_struct_bodies()) | set(_enums())
    for name in _SPELLINGS[role]:
        probe = name + "_Args" if role == "error_message" else name
        if probe in known:
            return name
    raise RuntimeError(
        f"{header_path()} declares none of {list(_SPELLINGS[role])}: this jaxlib's XLA FFI "
        "header is newer than primforge knows")


@functools.cache
def _enums() -> dict[str, dict[str, int]]:
    """Every enum in the header: enum (or typedef) name -> {member: value}."""
    text = _declarations()
    out: dict[str, dict[str, int]] = {}
    pattern = r"(?:typedef\s+)?enum\s*(\w*)\s*\{(.*?)\}\s*(\w*)\s*;"
    for m in re.finditer(pattern, text, flags=re.DOTALL):
        name = m.group(3) or m.group(1)
        members: dict[str, int] = {}
        nxt = 0
        for item in m.group(2).split(","):
            item = item.strip()
            if not item:
                continue
            if "=" in item:
                key, value = (s.strip() for s in item.split("=", 1))
                value = value.rstrip("u")
                shift = re.fullmatch(r"1u?\s*<<\s*(\d+)", value)
                nxt = 1 << int(shift.group(1)) if shift else int(value, 0)
            else:
                key = item
            members[key] = nxt
            nxt += 1
        out[name] = members
    return out


def enum_value(enum: str, member: str) -> int:
    """Value of ``member`` of the header's enum ``enum``.

    Example:
        >>> enum_value(spelled("extension_type"), "XLA_FFI_Extension_Metadata") >= 0
        True
    """
    return _enums()[enum][member]


@functools.cache
def _typedefs() -> dict[str, str]:
    """Scalar typedefs such as ``typedef uint32_t XLA_FFI_Handler_Traits;``."""
    text = _declarations()
    return {m.group(2): m.group(1) for m in re.finditer(r"typedef\s+(\w+)\s+(\w+)\s*;", text)}


@dataclasses.dataclass(frozen=True)
class StructLayout:
    """Byte layout of one C struct of the FFI header on this platform.

    Attributes:
        name: the struct's name, e.g. ``"XLA_FFI_Buffer"``.
        size: ``sizeof`` the struct, trailing padding included.
        align: its alignment.
        offsets: field name -> byte offset, in declaration order.
        sizes: field name -> size of the field in bytes.
        last_field: the field that ends the struct for ``XLA_FFI_STRUCT_SIZE``.

    Example:
        >>> buf = layout()["XLA_FFI_Buffer"]
        >>> buf.offsets["struct_size"]
        0
    """

    name: str
    size: int
    align: int
    offsets: dict[str, int]
    sizes: dict[str, int]

    last_field: str

    @property
    def struct_size(self) -> int:
        """``<name>_STRUCT_SIZE``: offset plus size of the header's declared last field.

        The header names that field in ``XLA_FFI_DEFINE_STRUCT_TRAITS(name, last_field)``
        (it is not always the last one declared); without such a line, the last declared.

        Example:
            >>> layout()[spelled("extension")].struct_size
            24
        """
        return self.offsets[self.last_field] + self.sizes[self.last_field]


def _split_declarations(body: str) -> list[tuple[str, str]]:
    """Struct body -> [(type, field name)]; every pointer type is spelled ``'*'``."""
    fields = []
    for decl in body.split(";"):
        decl = " ".join(decl.split())
        if not decl:
            continue
        m = re.fullmatch(r"_XLA_FFI_API_STRUCT_FIELD\((\w+)\)", decl)
        if m:  # a function pointer named after its type
            fields.append(("*", m.group(1)))
            continue
        m = re.fullmatch(r".*\(\s*\*\s*(\w+)\s*\)\s*\(.*\)", decl)
        if m:  # a plain function pointer, e.g. `void (*deleter)(void* object)`
            fields.append(("*", m.group(1)))
            continue
        m = re.fullmatch(r"(?:const\s+)?(?:struct\s+)?(\w+)\s*(\**)\s*(\w+)", decl)
        if m is None:
            raise RuntimeError(f"cannot parse the field declaration {decl!r} in {header_path()}")
        typ, stars, fname = m.groups()
        fields.append(("*" if stars else typ, fname))
    return fields


@functools.cache
def _struct_bodies() -> dict[str, str]:
    """Struct name (and typedef name, where one is given) -> the text between its braces."""
    bodies: dict[str, str] = {}
    pattern = r"struct\s+(\w+)\s*\{(.*?)\}\s*(\w*)\s*;"
    for m in re.finditer(pattern, _declarations(), flags=re.DOTALL):
        bodies[m.group(1)] = m.group(2)
        if m.group(3):
            bodies[m.group(3)] = m.group(2)
    return bodies


class _LayoutBuilder:
    """Lays out the header's structs one by one, each after the structs it embeds."""

    def __init__(self) -> None:
        self.bodies = _struct_bodies()
        self.enums = _enums()
        self.typedefs = _typedefs()
        pattern = r"XLA_FFI_DEFINE_STRUCT_TRAITS\(\s*(\w+)\s*,\s*(\w+)\s*\)"
        self.traits = dict(re.findall(pattern, _declarations()))
        self.done: dict[str, StructLayout] = {}

    def size_align(self, typ: str) -> tuple[int, int]:
        if typ == "*":
            return _POINTER_SIZE, _POINTER_SIZE
        typ = self.typedefs.get(typ, typ) if typ not in self.bodies else typ
        if typ in _SCALARS:
            return _SCALARS[typ], _SCALARS[typ]
        if typ in self.enums:
            return 4, 4
        if typ in self.bodies:
            sub = self.build(typ)
            return sub.size, sub.align
        raise RuntimeError(f"unknown C type {typ!r} in {header_path()}")

    def build(self, name: str) -> StructLayout:
        if name in self.done:
            return self.done[name]
        offsets: dict[str, int] = {}
        sizes: dict[str, int] = {}
        pos, align = 0, 1
        for typ, fname in _split_declarations(self.bodies[name]):
            size, al = self.size_align(typ)
            pos = (pos + al - 1) // al * al
            offsets[fname], sizes[fname] = pos, size
            pos += size
            align = max(align, al)
        total = (pos + align - 1) // align * align
        last = self.traits.get(name, next(reversed(offsets)))
        self.done[name] = StructLayout(name, total, align, offsets, sizes, last)
        return self.done[name]


@functools.cache
def layout() -> dict[str, StructLayout]:
    """Layouts of every struct the FFI header declares, for this platform's LP64 ABI.

    Returns:
        Struct name -> :class:`StructLayout`.

    Raises:
        RuntimeError: if this is not a 64-bit platform or a declaration is not understood.

    Example:
        >>> frame = layout()["XLA_FFI_CallFrame"]
        >>> frame.offsets["api"] > frame.offsets["extension_start"]
        True
    """
    if struct.calcsize("P") != _POINTER_SIZE:
        raise RuntimeError("primforge's XLA FFI layout assumes a 64-bit (LP64) platform")
    builder = _LayoutBuilder()
    for name in builder.bodies:
        builder.build(name)
    return dict(builder.done)


def offset(path: str) -> int:
    """Byte offset of a (possibly nested) field, e.g. ``"XLA_FFI_CallFrame.args.size"``.

    Args:
        path: struct name followed by dotted field names; each field but the last must be
            an embedded struct.

    Returns:
        The offset from the start of the outer struct.

    Example:
        >>> offset("XLA_FFI_CallFrame.args.size") == (
        ...     offset("XLA_FFI_CallFrame.args") + offset("XLA_FFI_Args.size"))
        True
    """
    struct_name, *fields = path.split(".")
    lays = layout()
    total = 0
    current = struct_name
    for i, fname in enumerate(fields):
        lay = lays[current]
        if fname not in lay.offsets:
            raise KeyError(f"{current} has no field {fname!r}")
        total += lay.offsets[fname]
        if i + 1 < len(fields):
            body_types = {f: t for t, f in _split_declarations(_struct_body(current))}
            current = body_types[fname]
    return total


def _struct_body(name: str) -> str:
    m = re.search(rf"struct\s+{name}\s*\{{(.*?)\}}", _declarations(), flags=re.DOTALL)
    if m is None:
        raise KeyError(name)
    return m.group(1)


# XLA primitive type name (header enum suffix) -> NumPy/ml_dtypes dtype name.
_DTYPE_NAMES = {
    "PRED": "bool",
    "S8": "int8",
    "S16": "int16",
    "S32": "int32",
    "S64": "int64",
    "U8": "uint8",
    "U16": "uint16",
    "U32": "uint32",
    "U64": "uint64",
    "F16": "float16",
    "F32": "float32",
    "F64": "float64",
    "BF16": "bfloat16",
    "C64": "complex64",
    "C128": "complex128",
    "S4": "int4",
    "U4": "uint4",
    "S2": "int2",
    "U2": "uint2",
    "F8E5M2": "float8_e5m2",
    "F8E4M3FN": "float8_e4m3fn",
    "F8E4M3B11FNUZ": "float8_e4m3b11fnuz",
    "F8E5M2FNUZ": "float8_e5m2fnuz",
    "F8E4M3FNUZ": "float8_e4m3fnuz",
    "F8E3M4": "float8_e3m4",
    "F8E4M3": "float8_e4m3",
    "F8E8M0FNU": "float8_e8m0fnu",
    "F4E2M1FN": "float4_e2m1fn",
}


@functools.cache
def data_type_codes() -> dict[str, int]:
    """NumPy dtype name -> ``XLA_FFI_DataType`` code, for the types both sides know.

    Example:
        >>> data_type_codes()["float32"] == enum_value("XLA_FFI_DataType", "XLA_FFI_DataType_F32")
        True
    """
    members = _enums()["XLA_FFI_DataType"]
    out = {}
    for suffix, dname in _DTYPE_NAMES.items():
        key = f"XLA_FFI_DataType_{suffix}"
        if key in members:
            out[dname] = members[key]
    return out


def dtype_code(dtype: Any) -> int:
    """The ``XLA_FFI_DataType`` code of a NumPy/JAX dtype.

    Args:
        dtype: anything ``numpy.dtype`` (with ml_dtypes registered by JAX) accepts.

    Raises:
        TypeError: if the header has no code for it.

    Example:
        >>> import numpy as np
        >>> dtype_code(np.float64) == data_type_codes()["float64"]
        True
    """
    name = np.dtype(dtype).name
    try:
        return data_type_codes()[name]
    except KeyError:
        raise TypeError(f"dtype {name} has no XLA FFI data type code") from None


def layout_digest() -> str:
    """A short digest of the API version, the layouts and the dtype codes.

    Generated handlers embed it, so that a jaxlib whose ABI differs invalidates them.

    Example:
        >>> len(layout_digest())
        16
    """
    parts = [repr(api_version()), repr(sorted(data_type_codes().items()))]
    for name, lay in sorted(layout().items()):
        parts.append(f"{name}:{lay.size}:{sorted(lay.offsets.items())}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]
