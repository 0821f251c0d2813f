"""The global registry of kernels, and tag filtering.

Design: every ``XLACustomKernel`` registers itself here under its name when it is created;
a second kernel under a taken name is an error unless ``replace=True`` is asked for. Tags
are plain strings; filtering is ``match='all'`` (every tag present) or ``match='any'`` (at
least one), with the same semantics wherever tags are filtered (API and CLI).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from primforge.kernel.kernel import XLACustomKernel

__all__ = ["register_kernel", "get_kernel", "list_kernels", "unregister_kernel", "all_tags"]

_KERNELS: dict[str, XLACustomKernel] = {}


def register_kernel(kernel: XLACustomKernel, *, replace: bool = False) -> None:
    """Add ``kernel`` to the registry (done by ``XLACustomKernel.__init__``).

    Raises:
        ValueError: if the name is taken and ``replace`` is False.

    Example:
        >>> import primforge
        >>> k = primforge.XLACustomKernel('doc_registry_demo')
        >>> primforge.get_kernel('doc_registry_demo') is k
        True
    """
    if kernel.name in _KERNELS and not replace and _KERNELS[kernel.name] is not kernel:
        raise ValueError(
            f"a kernel named {kernel.name!r} is already registered. Pick another name, or "
            f"pass replace=True to XLACustomKernel(...) to replace it."
        )
    _KERNELS[kernel.name] = kernel


def unregister_kernel(name: str) -> None:
    """Remove a kernel from the registry (no error when absent).

    Example:
        >>> unregister_kernel('no_such_kernel')
    """
    _KERNELS.pop(name, None)


def get_kernel(name: str) -> XLACustomKernel:
    """Return the kernel registered under ``name``.

    Raises:
        KeyError: naming the kernels that exist.

    Example:
        >>> import primforge
        >>> k = primforge.XLACustomKernel('doc_get_kernel')
        >>> primforge.get_kernel('doc_get_kernel').name
        'doc_get_kernel'
    """
    try:
        return _KERNELS[name]
    except KeyError:
        known = ", ".join(sorted(_KERNELS)) or "(none)"
        raise KeyError(f"no kernel named {name!r}; registered kernels: {known}") from None


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
