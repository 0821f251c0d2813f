"""Reading what XLA:GPU wrote into its dump folder: launches, PTX, and the kernel an error names.

Custom-call thunks are named by their ``custom_call_target``, so a result lists FFI
handlers by the name they were registered under.
"""

from __future__ import annotations

import os
import pathlib
import re

from primforge._gpu_compile.results import GpuKernel

__all__ = ["named_in", "parse_thunks", "read_dump"]

_THUNK = re.compile(
    r"^(?P<id>\d+):\s+(?P<kind>k\w+)\s+\[[^\]]*\]\s+(?P<name>\S+)"
    r"(?:\s+grid:\s*\[(?P<grid>[\d,\s]+)\]\s+threads:\s*\[(?P<block>[\d,\s]+)\]"
    r"\s+shared_memory:\s*(?P<smem>\d+))?"
)
_THUNK_META = re.compile(
    r'profile_annotation:\s*"(?P<name>[^"]*)"\s*thunk_id:\s*(?P<id>\d+)\s*\}\s*'
    r'thunk_kind:\s*"(?P<kind>\w+)"'
)
_CUSTOM_CALL_HLO = re.compile(
    r"%(?P<inst>[\w.\-]+) = [^\n]*?custom-call\([^\n]*?"
    r'custom_call_target="(?P<target>[^"]+)"'
)


def _dims(text: str) -> tuple[int, int, int]:
    vals = [int(v) for v in text.replace(" ", "").split(",") if v]
    return tuple((vals + [1, 1, 1])[:3])  # type: ignore[return-value]


def parse_thunks(sequence: str, metadata: str, hlo: str) -> tuple[GpuKernel, ...]:
    """Launches from XLA's thunk sequence; custom calls named by their target."""
    annotation = {m["id"]: m["name"] for m in _THUNK_META.finditer(metadata)}
    targets = {m["inst"]: m["target"] for m in _CUSTOM_CALL_HLO.finditer(hlo)}
    kernels = []
    for line in sequence.splitlines():
        m = _THUNK.match(line.strip())
        if m is None:
            continue
        if m["grid"] is not None:
            kernels.append(
                GpuKernel(m["name"], m["kind"], _dims(m["grid"]), _dims(m["block"]), int(m["smem"]))
            )
            continue
        inst = annotation.get(str(int(m["id"])), m["name"])
        kernels.append(GpuKernel(targets.get(inst, inst), m["kind"]))
    return tuple(kernels)


def read_dump(folder: str, hlo: str, want_ptx: bool):
    files = {name: pathlib.Path(folder, name) for name in sorted(os.listdir(folder))}
    kernels: tuple[GpuKernel, ...] = ()
    ptx: dict[str, str] = {}
    for name, path in files.items():
        if name.endswith(".thunk_sequence.txt"):
            meta = files.get(name.replace(".thunk_sequence.txt", ".thunk_metadata.txt"))
            kernels += parse_thunks(path.read_text(), meta.read_text() if meta else "", hlo)
        elif want_ptx and name.endswith(".ptx"):
            text = path.read_text()
            for entry in re.findall(r"\.entry\s+([\w$]+)\s*\(", text):
                ptx[entry] = text
    return kernels, ptx


def named_in(error: str, names) -> str | None:
    hits = [n for n in names if n and n in error]
    return max(hits, key=len) if hits else None
