"""The kernel layer's error and warning types.

Kept in a module of their own, below everything else in ``primforge.kernel``, so that every
part of the kernel (lowering, debug checks, autodiff) raises the same types without
importing the class that assembles them.
"""

from __future__ import annotations

__all__ = ["BackendUnavailableWarning", "KernelError"]


class KernelError(RuntimeError):
    """A kernel failed to build or run; the message names the primitive, backend and cause.

    Example:
        >>> from primforge.kernel.errors import KernelError
        >>> issubclass(KernelError, RuntimeError)
        True
    """


class BackendUnavailableWarning(UserWarning):
    """A kernel's backend package is not installed, so another backend was used.

    Example:
        >>> from primforge.kernel.errors import BackendUnavailableWarning
        >>> issubclass(BackendUnavailableWarning, UserWarning)
        True
    """
