"""KernelState: the base every part of an ``XLACustomKernel`` builds on.

Each part declares and writes its own fields in ``_init_state`` and asks others through
methods; :meth:`KernelState._changed` calls every part's ``_drop_derived``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from primforge.kernel import selection as _selection

__all__ = ["KernelState"]


class KernelState:
    """The base of the parts of :class:`primforge.XLACustomKernel`.

    Each part extends ``_init_state`` (declare its fields), ``_drop_derived`` (drop what
    it derived from the registration) and ``_declared_rules`` (the rule functions it
    holds), calling ``super()``.

    Example:
        >>> s = KernelState('doc_state')
        >>> s.name, s.doc, s._declared_rules()
        ('doc_state', None, ())
    """

    primitive: Any  # the kernel's KernelPrimitive, created by XLACustomKernel.__init__

    def __init__(self, name: str, doc: str | None = None):
        self.name = name
        self.doc = doc
        self._init_state()

    def _init_state(self) -> None:
        """Declare the part's fields (each part extends it)."""

    def _drop_derived(self) -> None:
        """Drop what the part derived from the registration (each part extends it)."""

    def _declared_rules(self) -> tuple[Callable | None, ...]:
        """The rule functions the parts hold (each part adds its own)."""
        return ()

    def _changed(self) -> None:
        """Registration changed: drop what was built from it, re-lower jitted callers."""
        self._drop_derived()
        _selection.defaults_changed()
