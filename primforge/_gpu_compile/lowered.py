"""Custom calls of a lowered module, the kernel names they carry, and the PTX they embed.

PTX that a custom call hands the driver itself (the numba_cuda launcher) is invisible to
XLA:GPU, so it is assembled here with ptxas for the target.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import tempfile
from typing import Any

import numpy as np

from primforge._gpu_compile.results import GpuKernel

__all__ = ["assemble_embedded_ptx", "custom_calls", "kernel_names"]


def custom_calls(module) -> list[tuple[str, dict[str, Any]]]:
    """(target, backend_config attributes) of every custom call in a lowered module."""
    found: list[tuple[str, dict[str, Any]]] = []

    def walk(op):
        for region in op.regions:
            for block in region.blocks:
                for inner in block.operations:
                    o = inner.operation
                    if o.name == "stablehlo.custom_call":
                        attrs = o.attributes
                        target = attrs["call_target_name"].value
                        config = {}
                        if "mhlo.backend_config" in attrs:
                            try:
                                config = {a.name: a.attr for a in attrs["mhlo.backend_config"]}
                            except TypeError:  # a string backend_config (e.g. Triton's)
                                config = {}
                        found.append((target, config))
                    walk(o)

    walk(module.operation)
    return found


def kernel_names(calls: list[tuple[str, dict[str, Any]]]) -> set[str]:
    """What an XLA error may name: the custom-call targets and the kernels they carry
    (Triton's ``name``, the PTX launcher's ``kernel``)."""
    names = {target for target, _ in calls}
    for _, config in calls:
        for key in ("name", "kernel"):
            value = getattr(config.get(key), "value", None)
            if isinstance(value, str) and value:
                names.add(value)
    return names


def assemble_embedded_ptx(
    calls: list[tuple[str, dict[str, Any]]], sm: str, ptx: dict[str, str], cuda_dir: str | None
) -> tuple[list[GpuKernel], str | None, str | None]:
    """Assemble, with ptxas for ``sm``, the PTX that custom calls carry as an attribute.

    primforge's PTX launcher (the numba_cuda backend) hands the driver PTX at run time; XLA
    never looks inside it, so ptxas is what proves it assembles for the target. Returns the
    launches found, and the kernel and error of the first PTX that does not assemble; fills
    ``ptx`` (entry name -> PTX). ptxas is taken from ``cuda_dir``'s ``bin`` folder.
    """
    kernels, ptxas = [], os.path.join(cuda_dir or "", "bin", "ptxas")
    for target, config in calls:
        if "ptx" not in config or "kernel" not in config:
            continue
        name = config["kernel"].value
        dims = {
            key: tuple(int(v) for v in np.asarray(config[key]))
            for key in ("grid", "block")
            if key in config
        }
        smem = int(config["shared_mem"].value) if "shared_mem" in config else None
        ptx[name] = config["ptx"].value
        with tempfile.TemporaryDirectory(prefix="primforge-ptxas-") as tmp:
            src = pathlib.Path(tmp, "kernel.ptx")
            src.write_text(ptx[name])
            proc = subprocess.run(
                [ptxas, f"-arch={sm}", str(src), "-o", str(pathlib.Path(tmp, "kernel.cubin"))],
                capture_output=True,
                text=True,
                check=False,
            )
        if proc.returncode != 0:
            return (
                kernels,
                name,
                (
                    f"ptxas -arch={sm} rejected the PTX of {name!r} "
                    f"(custom call {target}):\n{proc.stderr.strip()}"
                ),
            )
        kernels.append(GpuKernel(name, "embedded-ptx", dims.get("grid"), dims.get("block"), smem))
    return kernels, None, None
