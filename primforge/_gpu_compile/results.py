"""What compiling for a GPU target gives back, and its two errors.

A failed compile is a result (``ok=False``) unless the caller asks for
:class:`GpuCompileError`; :class:`GpuCompilerUnavailable` means the compiler cannot run
here at all. Re-exported by :mod:`primforge.testing`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

__all__ = ["GpuCompileError", "GpuCompileResult", "GpuCompilerUnavailable", "GpuKernel"]


class GpuCompilerUnavailable(RuntimeError):
    """XLA:GPU cannot be run here: the CUDA plugin, its version, ptxas or the setup is wrong.

    Example:
        >>> issubclass(GpuCompilerUnavailable, RuntimeError)
        True
    """


class GpuCompileError(RuntimeError):
    """XLA:GPU rejected the function; ``.result`` is the :class:`GpuCompileResult`.

    Example:
        >>> issubclass(GpuCompileError, RuntimeError)
        True
    """

    def __init__(self, result: GpuCompileResult):
        super().__init__(result.describe())
        self.result = result


@dataclasses.dataclass(frozen=True)
class GpuKernel:
    """One launch XLA:GPU planned: a GPU kernel (with its launch shape) or a custom call.

    Attributes:
        name: the kernel's name (a fusion, a Triton kernel, or the custom call's target).
        kind: XLA's thunk kind, e.g. ``'kKernel'``, ``'kCustomKernel'``, ``'kCustomCall'``;
            ``'embedded-ptx'`` for a kernel whose PTX a custom call launches itself
            (primforge's PTX launcher), assembled by ptxas for the target.
        grid: blocks per grid ``(x, y, z)``, or None for a custom call (it launches itself;
            for ``'embedded-ptx'``, the grid primforge's launcher will use).
        block: threads per block ``(x, y, z)``, or None for a custom call.
        shared_memory: dynamic shared memory in bytes, or None for a custom call.

    Example:
        >>> k = GpuKernel('loop_add_fusion', 'kKernel', (8, 1, 1), (128, 1, 1), 0)
        >>> k.threads
        1024
    """

    name: str
    kind: str
    grid: tuple[int, int, int] | None = None
    block: tuple[int, int, int] | None = None
    shared_memory: int | None = None

    @property
    def threads(self) -> int | None:
        """Threads in the whole launch (grid times block), or None for a custom call.

        Example:
            >>> GpuKernel('fusion', 'kKernel', (8, 1, 1), (128, 1, 1), 0).threads
            1024
        """
        if self.grid is None or self.block is None:
            return None
        return int(np.prod(self.grid) * np.prod(self.block))


@dataclasses.dataclass(frozen=True)
class GpuCompileResult:
    """What XLA:GPU made of a function for one target.

    Attributes:
        target: the target as given (``'h100'``, ``'a100'`` or a path).
        device_kind: the device the target describes, e.g. ``'NVIDIA H100 80GB HBM3'``.
        compute_capability: e.g. ``'9.0'``.
        ok: whether XLA:GPU compiled the function.
        error: XLA's error text when it did not, else None.
        failed_kernel: the kernel or custom call the error names, when it names one.
        kernels: every launch of the compiled program, in order, then the PTX kernels that
            custom calls launch themselves (empty on failure).
        custom_calls: the custom-call targets of the lowered program (FFI handlers, Triton).
        ptx: kernel entry name -> the PTX module holding it (only with ``ptx=True``), for
            XLA's kernels and for PTX that custom calls carry.
        hlo: XLA's optimised HLO text (on success).

    Example:
        >>> r = GpuCompileResult('h100', 'NVIDIA H100 80GB HBM3', '9.0', ok=False,
        ...                      error='bad', failed_kernel='k')
        >>> r.describe().splitlines()[0]
        "XLA:GPU failed to compile for h100 (NVIDIA H100 80GB HBM3, sm_90), in kernel 'k':"
    """

    target: str
    device_kind: str
    compute_capability: str
    ok: bool
    error: str | None = None
    failed_kernel: str | None = None
    kernels: tuple[GpuKernel, ...] = ()
    custom_calls: tuple[str, ...] = ()
    ptx: Mapping[str, str] = dataclasses.field(default_factory=dict)
    hlo: str | None = None

    @property
    def sm(self) -> str:
        """The target architecture as ``'sm_XY'``.

        Example:
            >>> r = GpuCompileResult('a100', 'NVIDIA A100-SXM4-40GB', '8.0', ok=True,
            ...     kernels=(GpuKernel('fusion', 'kKernel', (4, 1, 1), (64, 1, 1), 0),))
            >>> r.sm
            'sm_80'
        """
        return "sm_" + self.compute_capability.replace(".", "")

    def describe(self) -> str:
        """A human-readable summary: the error, or the kernels with their launch shapes.

        Example:
            >>> r = GpuCompileResult('a100', 'NVIDIA A100-SXM4-40GB', '8.0', ok=True,
            ...     kernels=(GpuKernel('fusion', 'kKernel', (4, 1, 1), (64, 1, 1), 0),))
            >>> print(r.describe())
            XLA:GPU compiled for a100 (NVIDIA A100-SXM4-40GB, sm_80): 1 launch(es)
              kKernel        fusion grid=(4, 1, 1) block=(64, 1, 1) shared=0
        """
        where = f"{self.target} ({self.device_kind}, {self.sm})"
        if not self.ok:
            named = f", in kernel {self.failed_kernel!r}" if self.failed_kernel else ""
            calls = (
                f"\ncustom calls in the program: {', '.join(self.custom_calls)}"
                if self.custom_calls
                else ""
            )
            return f"XLA:GPU failed to compile for {where}{named}:\n{self.error}{calls}"
        lines = [f"XLA:GPU compiled for {where}: {len(self.kernels)} launch(es)"]
        for k in self.kernels:
            if k.grid is None:
                lines.append(f"  {k.kind:14s} {k.name}")
            else:
                lines.append(
                    f"  {k.kind:14s} {k.name} grid={k.grid} block={k.block} "
                    f"shared={k.shared_memory}"
                )
        return "\n".join(lines)

    def check(self) -> GpuCompileResult:
        """Raise :class:`GpuCompileError` unless the compile succeeded; return self.

        Example:
            >>> r = GpuCompileResult('a100', 'NVIDIA A100-SXM4-40GB', '8.0', ok=True,
            ...     kernels=(GpuKernel('fusion', 'kKernel', (4, 1, 1), (64, 1, 1), 0),))
            >>> r.check() is r
            True
            >>> GpuCompileResult('a100', 'A100', '8.0', ok=False, error='bad').check()
            Traceback (most recent call last):
                ...
            primforge._gpu_compile.results.GpuCompileError: XLA:GPU failed to compile for a100
            (A100, sm_80): bad
        """
        if not self.ok:
            raise GpuCompileError(self)
        return self
