"""A bounded mapping for the kernel layer's per-signature caches.

:class:`LRUCache` keeps the ``PRIMFORGE_KERNEL_CACHE_SIZE`` most recently used entries
(default 256); a dropped entry is rebuilt when a trace needs it.
"""

from __future__ import annotations

import collections
import os
from typing import Any

__all__ = ["ENV_SIZE", "LRUCache", "max_entries"]

ENV_SIZE = "PRIMFORGE_KERNEL_CACHE_SIZE"
_DEFAULT = 256


def max_entries() -> int:
    """The bound from ``PRIMFORGE_KERNEL_CACHE_SIZE`` (a positive integer; default 256).

    Example:
        >>> max_entries() >= 1
        True
    """
    raw = os.environ.get(ENV_SIZE, "").strip()
    if not raw:
        return _DEFAULT
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{ENV_SIZE} must be a positive integer, got {raw!r}")
    return value


class LRUCache(collections.OrderedDict):
    """A dict that keeps at most :func:`max_entries` items, dropping the least recently used.

    Example:
        >>> c = LRUCache(maxsize=2)
        >>> c["a"], c["b"] = 1, 2
        >>> _ = c.get("a")      # "a" is now the most recent
        >>> c["c"] = 3          # drops "b"
        >>> sorted(c)
        ['a', 'c']
    """

    def __init__(self, maxsize: int | None = None):
        super().__init__()
        self.maxsize = maxsize

    def _bound(self) -> int:
        return self.maxsize if self.maxsize is not None else max_entries()

    def get(self, key: Any, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default

    def __getitem__(self, key: Any) -> Any:
        value = super().__getitem__(key)
        self.move_to_end(key)
        return value

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(key, value)
        self.move_to_end(key)
        bound = self._bound()
        while len(self) > bound:
            self.popitem(last=False)
