"""Backends: one module per backend, all answering the same four questions.

Each module satisfies the :class:`~primforge.kernel.backends._contract.Backend` protocol:
``NAME``, ``PLATFORMS``, ``EXTRA``, a cached ``is_available(platform=None)`` and
``make_callable(product, *, ins, outs, platform, name, **options)`` (see
docs/architecture.md); helpers they share are in :mod:`._common`. Modules are imported
lazily by :func:`get_backend`, and import without their optional package, so a missing
package never breaks ``import primforge``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
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


def is_available_on(module: ModuleType, platform: str) -> bool:
    """Whether backend ``module`` can serve ``platform`` here (its ``is_available(platform)``).

    Example:
        >>> is_available_on(get_backend('jax'), 'cpu'), is_available_on(get_backend('numba'), 'gpu')
        (True, False)
    """
    return bool(module.is_available(platform))


def tuple_results(product: Callable) -> Callable:
    """``product`` as a call that always returns a tuple (one array becomes a 1-tuple).

    Backends whose product is already a traceable JAX function (jax, pallas, cuda_raw) use
    it as their ``make_callable`` result, which must return a tuple of outputs.

    Example:
        >>> tuple_results(lambda x: x + 1)(1), tuple_results(lambda x: [x, x])(2)
        ((2,), (2, 2))
    """

    def call(*arrays):
        result = product(*arrays)
        return tuple(result) if isinstance(result, (tuple, list)) else (result,)

    return call
