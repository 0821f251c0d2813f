"""The global registry of kernels, and tag filtering.

A plain store: every kernel registers itself here under its name; :func:`list_kernels`
filters by tags (``match='all'`` or ``'any'``), :func:`select_kernels` also rejects
unknown names and tags, :func:`load_modules` imports the modules that define kernels.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from primforge.utils._suggest import close_matches

if TYPE_CHECKING:  # pragma: no cover
    from primforge.kernel.kernel import XLACustomKernel

__all__ = [
    "KernelReplacedWarning",
    "UnknownKernelError",
    "UnknownTagError",
    "all_tags",
    "get_kernel",
    "kernel_summary",
    "list_kernels",
    "load_modules",
    "matches_tags",
    "register_alias",
    "register_kernel",
    "select_kernels",
    "unregister_kernel",
]

BUILTIN_OPS_MODULE = "primforge.ops"


class UnknownKernelError(KeyError):
    """A kernel name that is not registered; the message lists the registered ones."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class UnknownTagError(ValueError):
    """A tag no registered kernel carries; the message lists the tags in use."""


class KernelReplacedWarning(UserWarning):
    """A new kernel took the name of a registered one, which it replaced in the registry.

    Example:
        >>> import warnings, primforge
        >>> from primforge.registry import KernelReplacedWarning
        >>> first = primforge.XLACustomKernel('doc_replaced')
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter('always')
        ...     second = primforge.XLACustomKernel('doc_replaced')
        >>> [w.category.__name__ for w in caught]
        ['KernelReplacedWarning']
        >>> primforge.get_kernel('doc_replaced') is second
        True
    """


_KERNELS: dict[str, XLACustomKernel] = {}


def register_kernel(kernel: XLACustomKernel, *, replace: bool = False) -> None:
    """Add ``kernel`` to the registry (done by ``XLACustomKernel.__init__``).

    A name already taken by another kernel is given to ``kernel``: with one
    :class:`KernelReplacedWarning` naming it, or silently when ``replace`` is True. The
    kernel it replaces keeps working where it is still referenced; lookups by name
    (:func:`get_kernel`, the CLI, autotuned defaults) find the new one.

    Example:
        >>> import primforge
        >>> k = primforge.XLACustomKernel('doc_registry_demo')
        >>> primforge.get_kernel('doc_registry_demo') is k
        True
    """
    old = _KERNELS.get(kernel.name)
    if old is not None and old is not kernel and not replace:
        warnings.warn(
            f"a kernel named {kernel.name!r} was already registered; the new "
            f"XLACustomKernel({kernel.name!r}) replaces it in the registry (the old object "
            f"still works where it is referenced). Pass replace=True to XLACustomKernel(...) "
            f"to replace it without this warning, or pick another name.",
            KernelReplacedWarning,
            stacklevel=3,
        )
    _KERNELS[kernel.name] = kernel


def unregister_kernel(name: str) -> None:
    """Remove a kernel from the registry (no error when absent).

    Example:
        >>> unregister_kernel('no_such_kernel')
    """
    _KERNELS.pop(name, None)


_ALIASES: dict[str, Any] = {}


def register_alias(name: str, target: Any) -> None:
    """Let :func:`get_kernel` find ``target`` (a kernel, or one form of an operator's
    kernel that acts like one) under ``name``; :func:`list_kernels` lists kernels only.

    Example:
        >>> import primforge
        >>> k = primforge.XLACustomKernel('doc_alias_target')
        >>> register_alias('doc_alias_name', k)
        >>> get_kernel('doc_alias_name') is k
        True
    """
    _ALIASES[name] = target


def get_kernel(name: str) -> XLACustomKernel:
    """Return the kernel registered under ``name``, or under a dotted name ending in it.

    A short name (the part after the last dots, ``'csrmv'`` or ``'ops.csrmv'`` for
    ``'primforge.ops.csrmv'``) finds the kernel when exactly one registered name ends in
    it; where several do, the error lists them. Names given by :func:`register_alias`
    (the forms of the operators' kernels, ``'primforge.ops.csrmv'``) are found too.

    Raises:
        KeyError: naming the kernels that exist, or those a short name could mean.

    Example:
        >>> import primforge
        >>> k = primforge.XLACustomKernel('doc_get_kernel')
        >>> primforge.get_kernel('doc_get_kernel').name
        'doc_get_kernel'
        >>> k2 = primforge.XLACustomKernel('docpkg.kernels.doc_short_name')
        >>> primforge.get_kernel('doc_short_name').name
        'docpkg.kernels.doc_short_name'
    """
    table = {**_ALIASES, **_KERNELS}
    try:
        return table[name]
    except KeyError:
        ending = [n for n in table if n.endswith("." + name)] if name else []
        if len(ending) == 1:
            return table[ending[0]]
        if ending:
            raise UnknownKernelError(
                f"{name!r} is the end of several kernel names: "
                f"{', '.join(repr(n) for n in sorted(ending))}; give one in full"
            ) from None
        close = close_matches(name, table)
        if close:  # the close names only, not every registered kernel
            raise UnknownKernelError(
                f"no kernel named {name!r}; did you mean "
                f"{' or '.join(repr(c) for c in close)}? ({len(_KERNELS)} kernels are "
                f"registered: `primforge list` shows them)"
            ) from None
        known = ", ".join(sorted(_KERNELS)) or "(none)"
        raise UnknownKernelError(
            f"no kernel named {name!r}; registered kernels: {known}"
        ) from None


def _normalize_tags(tags: str | Iterable[str] | None) -> tuple[str, ...]:
    if tags is None:
        return ()
    if isinstance(tags, str):
        return (tags,)
    return tuple(tags)


def matches_tags(kernel_tags: Iterable[str], tags, match: str = "all") -> bool:
    """Whether a kernel's tags satisfy a filter.

    Args:
        kernel_tags: the kernel's tags.
        tags: the tags asked for (a string or an iterable); empty matches everything.
        match: 'all' (every asked tag present) or 'any' (at least one present).

    Example:
        >>> matches_tags({'csr', 'binary'}, ['csr', 'float'], 'any')
        True
        >>> matches_tags({'csr', 'binary'}, ['csr', 'float'], 'all')
        False
    """
    wanted = set(_normalize_tags(tags))
    have = set(kernel_tags)
    if match not in ("all", "any"):
        raise ValueError(f"match must be 'all' or 'any', got {match!r}")
    if not wanted:
        return True
    return wanted <= have if match == "all" else bool(wanted & have)


def list_kernels(tags=None, match: str = "all") -> list[XLACustomKernel]:
    """Registered kernels, sorted by name, optionally filtered by tags.

    Example:
        >>> import primforge
        >>> k = primforge.XLACustomKernel('doc_list_kernels')
        >>> k.def_tags('demo_tag_x')
        >>> [k.name for k in list_kernels('demo_tag_x')]
        ['doc_list_kernels']
    """
    return [
        k for name, k in sorted(_KERNELS.items()) if matches_tags(k.tags, tags, match)
    ]


def all_tags() -> list[str]:
    """Every tag used by a registered kernel, sorted.

    Example:
        >>> isinstance(all_tags(), list)
        True
    """
    return sorted({t for k in _KERNELS.values() for t in k.tags})


def select_kernels(
    names: Sequence[str] = (), tags=None, match: str = "all"
) -> list[XLACustomKernel]:
    """Kernels by name and tags, rejecting names and tags that do not exist.

    With no names, every registered kernel is a candidate; tags then filter the candidates
    with :func:`matches_tags` semantics.

    Raises:
        UnknownKernelError: a name is not registered (the message lists registered names).
        UnknownTagError: a tag is carried by no kernel (the message lists the tags in use).

    Example:
        >>> import primforge
        >>> k = primforge.XLACustomKernel('doc_select_kernels')
        >>> k.def_tags('doc_sel_a', 'doc_sel_b')
        >>> [k.name for k in select_kernels(tags=['doc_sel_a', 'doc_sel_zzz'], match='any')]
        Traceback (most recent call last):
        ...
        primforge.registry.UnknownTagError: unknown tag 'doc_sel_zzz'; tags in use: ...
        >>> [k.name for k in select_kernels(['doc_select_kernels'], tags='doc_sel_b')]
        ['doc_select_kernels']
    """
    if isinstance(names, str):
        names = [names]
    wanted = _normalize_tags(tags)
    if match not in ("all", "any"):
        raise ValueError(f"match must be 'all' or 'any', got {match!r}")
    in_use = set(all_tags())
    for t in wanted:
        if t not in in_use:
            raise UnknownTagError(
                f"unknown tag {t!r}; tags in use: {', '.join(sorted(in_use)) or '(none)'}"
            )
    chosen = [get_kernel(n) for n in dict.fromkeys(names)] if names else list_kernels()
    return [k for k in chosen if matches_tags(k.tags, wanted, match)]


def load_modules(modules: Iterable[str] = (), *, builtin: bool = True) -> list[str]:
    """Import the modules that define kernels, so their kernels are registered.

    Args:
        modules: importable module names (``'mypkg.kernels'``); an import error propagates
            with the module's name.
        builtin: also import the library's own operators (``primforge.ops``) when present.

    Returns:
        notes about optional imports that failed (the builtin operators).

    Example:
        >>> load_modules(['json'], builtin=False)
        []
    """
    notes = []
    if builtin:
        try:
            importlib.import_module(BUILTIN_OPS_MODULE)
        except ImportError as e:
            if getattr(e, "name", None) != BUILTIN_OPS_MODULE:
                notes.append(f"{BUILTIN_OPS_MODULE} could not be imported: {e}")
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as e:
            raise ImportError(
                f"could not import kernel module {name!r}: {e}. Is it installed or on "
                f"PYTHONPATH?"
            ) from e
    return notes


def kernel_summary(
    kernel: XLACustomKernel, tuned: dict[str, str] | None = None
) -> dict[str, Any]:
    """A kernel's registration as plain data (what ``primforge list --json`` prints).

    Args:
        kernel: the kernel.
        tuned: its stored autotune choices, platform -> backend, shown as they are (the
            ``primforge`` command passes those of ``primforge.autotune.choices()``).

    Example:
        >>> import primforge
        >>> k = primforge.XLACustomKernel('doc_kernel_summary', 'Adds one.')
        >>> k.def_kernel('jax', 'cpu', lambda **kw: lambda x: x + 1)
        >>> s = kernel_summary(k)
        >>> s['backends'], s['defaults'], s['doc'], s['tuned']
        ({'cpu': ['jax']}, {'cpu': 'jax'}, 'Adds one.', {})
    """
    platforms = [p for p in ("cpu", "gpu", "tpu") if kernel.available_backends(p)]
    return {
        "name": kernel.name,
        "doc": kernel.doc,
        "tags": sorted(kernel.tags),
        "backends": {p: kernel.available_backends(p) for p in platforms},
        "defaults": {p: d for p, d in kernel.defaults.items() if p in platforms},
        "tuned": dict(tuned or {}),
        "has_call": kernel.has_call(),
        "has_benchmark_data": kernel.has_benchmark_data(),
    }
