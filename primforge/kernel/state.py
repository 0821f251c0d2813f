"""KernelState: every field an ``XLACustomKernel`` holds, declared in one place.

The kernel class is assembled from mixins, one per concern (registration, checks, lowering,
batching, autodiff, sharding, benchmarking), all deriving from this class. Each field
below names the part that writes it; the others only read it. Anything derived from the
registration (the build caches, ``_memo``) is dropped by :meth:`KernelState._changed`,
which every setter calls.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from primforge.kernel import _lru
from primforge.kernel import selection as _selection
from primforge.kernel.entry import KernelEntry

if TYPE_CHECKING:  # typing only: sharding_rules does not import this module either
    from primforge.kernel.sharding_rules import ShardingRule

__all__ = ["KernelState"]


class KernelState:
    """The state shared by the parts of :class:`primforge.XLACustomKernel`.

    Example:
        >>> s = KernelState('doc_state')
        >>> s.name, s._entries, s._sharding_rule
        ('doc_state', {}, None)
    """

    primitive: Any  # the kernel's KernelPrimitive, created by XLACustomKernel.__init__

    def __init__(self, name: str, doc: str | None = None):
        self.name = name
        self.doc = doc
        # registration.py: kernels per platform and backend, default backend per platform.
        self._entries: dict[str, dict[str, KernelEntry]] = {}
        self._defaults: dict[str, str] = {}
        self.tags: set[str] = set()
        # checks.py: the optional shape rule.
        self._shape_rule: Callable | None = None
        # autodiff.py: whole-call JVP and transpose rules, per-input JVP rules.
        self._jvp_rule: Callable | None = None
        self._transpose_rule: Callable | None = None
        self._per_input_rules: tuple[Callable, ...] = ()
        # batching.py: 'native', 'general' or 'custom', and the custom rule.
        self._batching_mode = "native"
        self._custom_batching: Callable | None = None
        # sharding.py: set only through def_sharding_rule.
        self._sharding_rule: ShardingRule | None = None
        # benchmarking.py: the user-facing call and the benchmark configs.
        self._call_fn: Callable | None = None
        self._benchmark_data_fn: Callable | None = None
        # lowering.py / checks.py: per-signature caches, bounded (least recently used
        # dropped; see kernel._lru), and values derived from the registration.
        self._impl_cache: dict[Any, Callable] = _lru.LRUCache()
        self._build_cache: dict[Any, Callable] = _lru.LRUCache()
        self._ref_cache: dict[Any, Any] = _lru.LRUCache()
        self._product_cache: dict[Any, Any] = _lru.LRUCache()
        self._memo: dict[str, Any] = {}
        self._warned: set[tuple[str, str]] = set()  # (platform, backend) fallbacks warned

    def _backend_table(self) -> dict[str, list[str]]:
        return {p: list(e) for p, e in self._entries.items()}

    def _changed(self) -> None:
        """Registration changed: drop what was built from it, re-lower jitted callers."""
        self._build_cache.clear()
        self._impl_cache.clear()
        self._ref_cache.clear()
        self._product_cache.clear()
        self._memo.clear()
        _selection.defaults_changed()
