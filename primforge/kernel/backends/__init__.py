"""Backends: one module per backend, all answering the same four questions.

Each module defines ``NAME``, ``PLATFORMS``, ``EXTRA``, ``is_available()`` and
``make_callable(product, *, ins, outs, platform, name)`` (see docs/architecture.md).
Modules are imported lazily by :func:`get_backend`, so a missing optional package never
breaks ``import primforge``.
"""

from __future__ import annotations

import importlib
from types import ModuleType

#: Backend name -> module path. Unknown names are still allowed for user-registered
#: kernels whose generator already returns a traceable JAX callable (treated like 'jax').
KNOWN_BACKENDS: dict[str, str] = {
    "jax": "primforge.kernel.backends.jax",
    "numba": "primforge.kernel.backends.numba",
    "pallas": "primforge.kernel.backends.pallas",
    "triton": "primforge.kernel.backends.triton",
    "warp": "primforge.kernel.backends.warp",
    "cuda_raw": "primforge.kernel.backends.cuda",
    "numba_cuda": "primforge.kernel.backends.numba_cuda",
}


def get_backend(name: str) -> ModuleType:
    """Import and return the backend module for ``name`` (``'jax'`` for unknown names).

    Example:
        >>> from primforge.kernel.backends import get_backend
        >>> get_backend('jax').NAME
        'jax'
    """
    return importlib.import_module(KNOWN_BACKENDS.get(name, KNOWN_BACKENDS["jax"]))
