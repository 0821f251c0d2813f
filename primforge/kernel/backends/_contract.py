"""The backend contract, as code: what every module in ``KNOWN_BACKENDS`` offers.

Design: a backend is a module, not a class, so the contract is a ``typing.Protocol`` that
a module satisfies structurally; ``isinstance(module, Backend)`` checks the names, and
:func:`problems` also checks their types and signatures (a test holds every backend to
it). The four answers a backend gives: whether it is available here (``is_available``:
a cached probe that never imports the optional package), which platforms it serves
(``PLATFORMS``), how a kernel generator's product becomes a traceable callable
(``make_callable``, which checks the platform first, then that its package is there,
then the product), and what to install when it is missing (``EXTRA``). Helpers shared
by the backends live in :mod:`._common`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, Protocol, runtime_checkable

import jax

__all__ = ["ALL_PLATFORMS", "Backend", "problems"]

#: The platforms a backend may serve (primforge's names: JAX's 'cuda'/'rocm' are 'gpu').
ALL_PLATFORMS = ("cpu", "gpu", "tpu")


@runtime_checkable
class Backend(Protocol):
    """A backend module: ``NAME``, ``PLATFORMS``, ``EXTRA``, ``is_available``, ``make_callable``.

    Attributes:
        NAME: the backend's name (its key in ``KNOWN_BACKENDS``).
        PLATFORMS: the platforms it serves, a tuple drawn from :data:`ALL_PLATFORMS`.
        EXTRA: the pip extra that installs what it needs (``pip install -e ".[EXTRA]"`` in
            the primforge checkout), or None when it needs nothing beyond JAX.

    Example:
        >>> from primforge.kernel.backends import get_backend
        >>> isinstance(get_backend('jax'), Backend)
        True
    """

    NAME: str
    PLATFORMS: tuple[str, ...]
    EXTRA: str | None

    def is_available(self, platform: str | None = None) -> bool:
        """Whether the backend can build for ``platform`` here (None: for any it serves).

        Cached (``is_available.cache_clear()`` probes again). Never imports the optional
        package and never raises; False for a platform not in ``PLATFORMS``.
        """

    def make_callable(self, product: Any, *, ins: Sequence[jax.ShapeDtypeStruct],
                      outs: Sequence[jax.ShapeDtypeStruct], platform: str, name: str,
                      **options: Any) -> Callable[..., tuple[jax.Array, ...]]:
        """Turn a kernel generator's ``product`` into a traceable callable of the inputs.

        The callable returns a tuple of outputs shaped like ``outs``. Raises
        ``ValueError`` for a platform not in ``PLATFORMS``, then
        :class:`~._common.MissingPackageError` (naming ``EXTRA``) when ``is_available``
        says no, then ``TypeError`` for a product of the wrong kind or an option the
        backend does not take (``batch=()`` is taken by every backend).
        """


def _params(fn) -> list[inspect.Parameter] | None:
    try:
        return list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None


def _is_available_problems(fn) -> list[str]:
    params = _params(fn)
    if params is None:
        return ["is_available has no inspectable signature"]
    out = []
    if [(p.name, p.default) for p in params] != [("platform", None)]:
        out.append(f"is_available must take one parameter `platform=None`, it takes "
                   f"{[p.name for p in params]}")
    if not hasattr(fn, "cache_clear"):
        out.append("is_available is not cached (no cache_clear)")
    return out


def _make_callable_problems(fn) -> list[str]:
    params = _params(fn)
    if params is None:
        return ["make_callable has no inspectable signature"]
    kinds = {p.name: p.kind for p in params}
    out = []
    if not params or params[0].kind not in (inspect.Parameter.POSITIONAL_ONLY,
                                            inspect.Parameter.POSITIONAL_OR_KEYWORD):
        out.append("make_callable must take the product as its first, positional parameter")
    for needed in ("ins", "outs", "platform", "name"):
        if kinds.get(needed) is not inspect.Parameter.KEYWORD_ONLY:
            out.append(f"make_callable must take keyword-only `{needed}`")
    if inspect.Parameter.VAR_KEYWORD not in kinds.values():
        out.append("make_callable must take `**options`")
    return out


def problems(module: ModuleType) -> list[str]:
    """How ``module`` departs from :class:`Backend` (an empty list: it conforms).

    Example:
        >>> from primforge.kernel.backends import get_backend
        >>> problems(get_backend('jax'))
        []
        >>> import types
        >>> problems(types.ModuleType('empty'))[0]
        'NAME must be a non-empty str'
    """
    out = []
    name = getattr(module, "NAME", None)
    if not isinstance(name, str) or not name:
        out.append("NAME must be a non-empty str")
    platforms = getattr(module, "PLATFORMS", None)
    if (not isinstance(platforms, tuple) or not platforms
            or not set(platforms) <= set(ALL_PLATFORMS)):
        out.append(f"PLATFORMS must be a non-empty tuple drawn from {ALL_PLATFORMS}")
    extra = getattr(module, "EXTRA", "<missing>")
    if extra is not None and (not isinstance(extra, str) or not extra or extra == "<missing>"):
        out.append("EXTRA must be a non-empty str or None")
    for attr, check in (("is_available", _is_available_problems),
                        ("make_callable", _make_callable_problems)):
        fn = getattr(module, attr, None)
        out += [f"{attr} is missing or not callable"] if not callable(fn) else check(fn)
    return out
