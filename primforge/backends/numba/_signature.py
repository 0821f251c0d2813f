"""How one call of a Numba kernel looks to XLA and to the kernel: its checked signature.

:func:`plan` turns ``make_callable``'s arguments into a :class:`CallPlan`; its
``in_sig``/``out_sig`` name a target's dtypes and ranks, never sizes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

__all__ = ["HALF_MODES", "CallPlan", "plan"]

#: The accepted values of ``half_as``.
HALF_MODES = ("float32", "bits")

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


@dataclasses.dataclass(frozen=True)
class CallPlan:
    """A checked call: what the FFI target is built for and how arrays reach it.

    Attributes:
        ins, outs: the specs (core shapes), as ``jax.ShapeDtypeStruct``.
        aliases: ``{input index: output index}``, checked.
        given_phys: the physical shape each input arrives with.
        in_phys, out_phys: the physical shapes XLA passes (an aliased input is mapped at
            every level, so it may be broadcast first).
        ffi_in, ffi_out: the dtype name of each buffer XLA passes.
        in_sig: per input ``(ffi dtype, kernel dtype, core rank, mapped per level)``.
        out_sig: per output ``(ffi dtype, kernel dtype, core rank)``.
        n_levels: number of native batch levels.

    Example:
        >>> s = jax.ShapeDtypeStruct((3,), "float16")
        >>> p = plan((s,), (s,), batch=((2, (True,)),), aliases={}, half_as="float32",
        ...          name="k")
        >>> p.in_sig, p.out_phys
        ((('float32', 'float32', 1, (True,)),), ((2, 3),))
    """

    ins: tuple[jax.ShapeDtypeStruct, ...]
    outs: tuple[jax.ShapeDtypeStruct, ...]
    aliases: dict[int, int]
    given_phys: tuple[tuple[int, ...], ...]
    in_phys: tuple[tuple[int, ...], ...]
    out_phys: tuple[tuple[int, ...], ...]
    ffi_in: tuple[str, ...]
    ffi_out: tuple[str, ...]
    in_sig: tuple[tuple[Any, ...], ...]
    out_sig: tuple[tuple[Any, ...], ...]
    n_levels: int


def plan(
    ins: Sequence[Any],
    outs: Sequence[Any],
    *,
    batch: Sequence[tuple[int, Sequence[bool]]],
    aliases: Mapping[int, int],
    half_as: str,
    name: str,
) -> CallPlan:
    """Check a call's specs, batch levels and aliases; see :class:`CallPlan`.

    Raises:
        ValueError, TypeError: naming ``name`` and the offending argument.

    Example:
        >>> s = jax.ShapeDtypeStruct((3,), "float32")
        >>> plan((s,), (), batch=(), aliases={}, half_as="float32", name="k")
        Traceback (most recent call last):
        ...
        ValueError: k: a numba kernel needs at least one output (outs is empty)
    """
    ins = tuple(jax.ShapeDtypeStruct(tuple(s.shape), s.dtype) for s in ins)
    outs = tuple(jax.ShapeDtypeStruct(tuple(s.shape), s.dtype) for s in outs)
    if not outs:
        raise ValueError(f"{name}: a numba kernel needs at least one output (outs is empty)")
    given = _check_batch(batch, len(ins), name)
    sizes = tuple(size for size, _ in given)
    aliases = _check_aliases(aliases, ins, outs, name)
    # Aliased inputs must have the outputs' physical shape: map them at every level.
    levels = given
    for i in aliases:
        levels = tuple((size, m[:i] + (True,) + m[i + 1 :]) for size, m in levels)
    in_kinds = tuple(_dtype_kind(s.dtype, half_as, f"{name}: ins[{i}]") for i, s in enumerate(ins))
    out_kinds = tuple(
        _dtype_kind(s.dtype, half_as, f"{name}: outs[{i}]") for i, s in enumerate(outs)
    )
    return CallPlan(
        ins=ins,
        outs=outs,
        aliases=aliases,
        given_phys=tuple(_phys(given, i, s) for i, s in enumerate(ins)),
        in_phys=tuple(_phys(levels, i, s) for i, s in enumerate(ins)),
        out_phys=tuple(sizes + s.shape for s in outs),
        ffi_in=tuple(k[0] for k in in_kinds),
        ffi_out=tuple(k[0] for k in out_kinds),
        in_sig=tuple(
            (k[0], k[1], len(s.shape), tuple(m[i] for _, m in levels))
            for i, (k, s) in enumerate(zip(in_kinds, ins))
        ),
        out_sig=tuple((k[0], k[1], len(s.shape)) for k, s in zip(out_kinds, outs)),
        n_levels=len(levels),
    )


def _phys(levels, i: int, spec) -> tuple[int, ...]:
    """Input ``i``'s physical shape: the sizes of the levels mapping it, then its core."""
    return tuple(size for size, m in levels if m[i]) + spec.shape


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
