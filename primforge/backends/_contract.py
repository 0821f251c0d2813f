"""The backend contract: every step of a kernel's life a backend takes part in.

:class:`BackendBase` holds each hook with its default, so a backend overrides only what it
needs, built-in backends and plugins alike; :class:`Backend` is the minimal structural
protocol (a built-in backend's module satisfies it too); :func:`problems` checks names,
types and signatures. The kernel core calls backends only through these hooks.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, Protocol, runtime_checkable

import jax

__all__ = [
    "ALL_PLATFORMS",
    "HOOKS",
    "Backend",
    "BackendBase",
    "launcher_product_form",
    "problems",
    "traceable",
    "tuple_results",
]

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
        >>> from primforge.backends import get_backend
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


def tuple_results(product: Callable) -> Callable:
    """``product`` as a call that always returns a tuple (one array becomes a 1-tuple).

    Example:
        >>> tuple_results(lambda x: x + 1)(1), tuple_results(lambda x: [x, x])(2)
        ((2,), (2, 2))
    """

    def call(*arrays):
        result = product(*arrays)
        return tuple(result) if isinstance(result, (tuple, list)) else (result,)

    return call


def traceable(product: Any, *, backend: str, name: str, expected: str) -> Callable:
    """The end of ``make_callable`` for a product that is a traceable JAX function.

    Raises ``TypeError`` naming ``expected`` when ``product`` is not callable; otherwise
    returns it as a call that returns a tuple.

    Example:
        >>> traceable(lambda x: -x, backend='mine', name='k', expected='a function')(1)
        (-1,)
        >>> traceable(3, backend='mine', name='k', expected='a function')
        Traceback (most recent call last):
        ...
        TypeError: kernel 'k': the 'mine' kernel generator must return a function, got int.
    """
    if not callable(product):
        raise TypeError(
            f"kernel {name!r}: the {backend!r} kernel generator must return {expected}, got "
            f"{type(product).__name__}."
        )
    return tuple_results(product)


def launcher_product_form(backend: str, what: str,
                          is_kernel: Callable[[Any], bool]) -> Callable[..., str]:
    """The ``product_form`` hook of a backend that launches kernels of its own kind.

    The hook answers ``"kernel"`` for ``what`` (``is_kernel(product)``) and for anything
    not callable (which ``make_callable`` reports), ``"callable"`` for any other callable,
    taken to be a traceable JAX function of the inputs (e.g. one that launches the kernel
    itself) that the kernel uses as it is.

    Example:
        >>> form = launcher_product_form('mine', 'an int', lambda p: isinstance(p, int))
        >>> form(lambda x: x, n_ins=1, n_outs=1, name='k'), form(3, n_ins=1, n_outs=1, name='k')
        ('callable', 'kernel')
    """

    def product_form(product: Any, *, n_ins: int, n_outs: int, name: str) -> str:
        return "kernel" if is_kernel(product) or not callable(product) else "callable"

    product_form.__doc__ = (
        f"What a {backend!r} kernel generator returned: ``\"kernel\"`` ({what}, which this "
        f"backend launches, or anything not callable, which ``make_callable`` reports) or "
        f"``\"callable\"`` (any other callable: a traceable JAX function of the inputs).\n\n"
        f"Example:\n"
        f"    >>> product_form(lambda x: x, n_ins=1, n_outs=1, name='k')\n"
        f"    'callable'\n"
        f"    >>> product_form(42, n_ins=1, n_outs=1, name='k')\n"
        f"    'kernel'\n"
    )
    return product_form


#: The hooks of :class:`BackendBase`, in the order of a kernel's life.
HOOKS = ("is_available", "make_callable", "product_form", "release", "owns",
         "debug_prefill", "debug_gate", "export_checks")


class BackendBase:
    """A backend: every hook of the contract, each with a default to override.

    Subclass it, set ``NAME`` and ``PLATFORMS`` (``EXTRA`` when an optional package is
    needed), override the hooks the backend takes part in, and register an instance
    with :func:`primforge.backends.register_backend`. Kernels then name it in
    ``def_kernel``; selection, ``use_backend``, the build caches and ``clear_cache``,
    debug mode, benchmarking, autotuning, ``primforge check`` and export all go through
    these hooks.

    The defaults: available on every platform in ``PLATFORMS``; a product is a traceable
    JAX function of the inputs (:meth:`make_callable` returns it, as a tuple of outputs);
    nothing to release; no pre-filled outputs or error gate in debug mode; no custom calls
    that ``jax.export`` must be told about.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> class Doubling(BackendBase):
        ...     NAME, PLATFORMS = 'doc_doubling', ('cpu',)
        ...     def make_callable(self, product, *, ins, outs, platform, name, **options):
        ...         call = super().make_callable(product, ins=ins, outs=outs,
        ...                                      platform=platform, name=name, **options)
        ...         return lambda *xs: tuple(2 * y for y in call(*xs))
        >>> b = Doubling()
        >>> s = jax.ShapeDtypeStruct((2,), jnp.float32)
        >>> b.make_callable(lambda x: x + 1, ins=[s], outs=[s], platform='cpu',
        ...                 name='k')(jnp.zeros(2))
        (Array([2., 2.], dtype=float32),)
        >>> problems(b)
        []
    """

    NAME: str = ""
    PLATFORMS: tuple[str, ...] = ALL_PLATFORMS
    EXTRA: str | None = None
    #: Whether :meth:`make_callable` takes batch levels (``batch=((size, mapped), ...)``,
    #: outermost first, ``mapped`` one flag per input) and builds one call over them; when
    #: False the kernel vmaps the unbatched callable instead.
    BATCHES_NATIVELY: bool = False

    def is_available(self, platform: str | None = None) -> bool:
        """Whether the backend can build for ``platform`` here (None: for any it serves).

        Never raises; False for a platform not in ``PLATFORMS``. Keep it cheap: it is
        asked at every selection.
        """
        return platform is None or platform in self.PLATFORMS

    def make_callable(self, product: Any, *, ins: Sequence[jax.ShapeDtypeStruct],
                      outs: Sequence[jax.ShapeDtypeStruct], platform: str, name: str,
                      **options: Any) -> Callable[..., tuple[jax.Array, ...]]:
        """Build: turn a generator's ``product`` into a traceable call returning a tuple.

        Checks, in order: the platform (``ValueError``), the package
        (:class:`~._common.MissingPackageError` naming ``EXTRA``), the options
        (``TypeError``; ``batch=()`` is taken by every backend), the product. In debug
        mode it is called with :func:`primforge.debug.enabled` true, so a backend can
        build a checked variant (the Numba backend compiles with bounds checks).
        """
        from primforge.backends import _common

        _common.check_request(self.NAME, self.PLATFORMS, self.EXTRA, self.is_available,
                              platform=platform, kernel=name, options=options,
                              needs=f"what the {self.NAME!r} backend needs")
        return traceable(product, backend=self.NAME, name=name,
                         expected="a traceable JAX function of the inputs")

    def product_form(self, product: Any, *, n_ins: int, n_outs: int, name: str) -> str:
        """``"kernel"`` (this backend builds it) or ``"callable"`` (a traceable JAX function
        of the inputs that the reference backend's ``make_callable`` uses as it is)."""
        return "kernel"

    def release(self, product: Any) -> None:
        """Release what was built for ``product`` (``XLACustomKernel.clear_cache``)."""

    def owns(self, product: Any) -> bool:
        """Whether ``product``, returned by another backend's generator, is one of this
        backend's kernels (debug mode then asks this backend to pre-fill its outputs)."""
        return False

    def debug_prefill(self, product: Any, *, n_ins: int, outs: Sequence[Any],
                      name: str) -> tuple[Any, list[int]] | None:
        """Debug mode, output coverage: ``(new_product, prefilled)`` or None.

        ``new_product`` takes the inputs, then one pre-filled buffer for each output index
        in ``prefilled`` (aliased to that output), and is built by :meth:`make_callable`.
        Debug mode runs it with two fill patterns: an element that differs was never
        written. None: the backend does not offer the check.
        """
        return None

    def debug_gate(self, outs: Sequence[jax.ShapeDtypeStruct], report: type[Exception],
                   platform: str) -> Callable[..., tuple[jax.Array, ...]] | None:
        """Debug mode, failures: ``gate(code, *results) -> results`` or None.

        The gate passes ``results`` through and raises ``report(code[0])`` inside the
        compiled call when ``code[0]`` is not 0, so the report is the error XLA raises.
        None: this backend offers no gate on ``platform`` (a host callback is used).
        """
        return None

    def export_checks(self, fn: Callable, *specs: Any) -> list[Any]:
        """Export: the ``jax.export`` safety checks to disable for ``fn`` on ``specs``
        (custom calls this backend lowers to that ``jax.export`` does not know)."""
        return []


def _params(fn) -> list[inspect.Parameter] | None:
    try:
        return list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None


def _is_available_problems(fn, owner) -> list[str]:
    params = _params(fn)
    if params is None:
        return ["is_available has no inspectable signature"]
    out = []
    if [(p.name, p.default) for p in params] != [("platform", None)]:
        out.append(f"is_available must take one parameter `platform=None`, it takes "
                   f"{[p.name for p in params]}")
    if isinstance(owner, ModuleType) and not hasattr(fn, "cache_clear"):
        out.append("is_available is not cached (no cache_clear)")
    return out


def _make_callable_problems(fn, owner) -> list[str]:
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


def problems(module: Any) -> list[str]:
    """How ``module`` (a backend module or object) departs from :class:`Backend`.

    An empty list: it conforms. A module's ``is_available`` must be cached.

    Example:
        >>> from primforge.backends import get_backend
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
    if not isinstance(getattr(module, "BATCHES_NATIVELY", False), bool):
        out.append("BATCHES_NATIVELY must be a bool")
    for attr, check in (("is_available", _is_available_problems),
                        ("make_callable", _make_callable_problems)):
        fn = getattr(module, attr, None)
        out += [f"{attr} is missing or not callable"] if not callable(fn) else check(fn, module)
    return out
