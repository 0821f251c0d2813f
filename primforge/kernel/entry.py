"""KernelEntry: one registered kernel generator, for one backend on one platform.

An entry knows which keyword arguments its generator accepts (read once from its signature)
and calls it with only those, so generators may name just the params they use.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from typing import Any

__all__ = ["GENERATOR_ARGS", "KernelEntry", "accepted_args"]

# Keyword arguments primforge itself passes to kernel generators (never user params).
GENERATOR_ARGS = frozenset({"ins", "outs", "platform", "batch_shape"})


@dataclasses.dataclass(frozen=True)
class KernelEntry:
    """One registered kernel: which backend, which platform, and its generator.

    Attributes:
        backend: backend name ('jax', 'numba', 'pallas', 'triton', 'warp', 'cuda_raw',
            'numba_cuda', or any name whose generator returns a traceable JAX callable).
        platform: 'cpu', 'gpu' or 'tpu'.
        kernel_generator: called with keyword arguments (the call's static params, plus
            ``outs`` and ``ins`` — tuples of ``jax.ShapeDtypeStruct`` — and ``batch_shape``
            when it declares that argument) and returns the backend's kernel.

    Example:
        >>> entry = KernelEntry('jax', 'cpu', lambda **kw: lambda x: x)
        >>> entry.backend, entry.platform
        ('jax', 'cpu')
    """

    backend: str
    platform: str
    kernel_generator: Callable[..., Any]

    @functools.cached_property
    def _accepted(self) -> tuple[bool, frozenset[str]]:
        try:
            sig = inspect.signature(self.kernel_generator)
        except (TypeError, ValueError):  # builtins, some C callables
            return True, frozenset()
        params = sig.parameters.values()
        var_kw = any(p.kind is p.VAR_KEYWORD for p in params)
        named = frozenset(
            p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
        )
        return var_kw, named

    @property
    def wants_batch_shape(self) -> bool:
        """Whether the generator declares ``batch_shape`` (it then handles batches itself).

        Example:
            >>> KernelEntry('jax', 'cpu', lambda batch_shape, **kw: None).wants_batch_shape
            True
            >>> KernelEntry('jax', 'cpu', lambda **kw: None).wants_batch_shape
            False
        """
        return "batch_shape" in self._accepted[1]

    def generate(self, **kwargs) -> Any:
        """Call the generator with the keyword arguments its signature accepts.

        Example:
            >>> entry = KernelEntry('jax', 'cpu', lambda factor: lambda x: factor * x)
            >>> entry.generate(factor=3.0, platform='cpu')(2.0)  # platform: not in its signature
            6.0
        """
        var_kw, named = self._accepted
        if not var_kw:
            kwargs = {k: v for k, v in kwargs.items() if k in named}
        return self.kernel_generator(**kwargs)


def accepted_args(entry: KernelEntry) -> tuple[bool, frozenset[str]]:
    """``(takes **kwargs, keyword names)`` of ``entry``'s generator (read once).

    Example:
        >>> accepted_args(KernelEntry('jax', 'cpu', lambda factor, **kw: None))
        (True, frozenset({'factor'}))
    """
    return entry._accepted
