"""The kernel layer's error and warning types.

Kept in a module of their own, below everything else in ``primforge.kernel``, so that every
part of the kernel (lowering, debug checks, autodiff) raises the same types without
importing the class that assembles them.
"""

from __future__ import annotations

__all__ = ["BackendDeclined", "BackendUnavailableWarning", "KernelError"]


class KernelError(RuntimeError):
    """A kernel failed to build or run; the message names the primitive, backend and cause.

    Example:
        >>> from primforge.kernel.errors import KernelError
        >>> issubclass(KernelError, RuntimeError)
        True
    """


class BackendDeclined(KernelError):
    """A backend has no kernel for the params of this call (one form of an operator that
    another backend serves); the message names the backends that have one.

    The benchmark runner and the autotuner pass over a backend that declines.

    Example:
        >>> from primforge.kernel.errors import BackendDeclined, KernelError
        >>> issubclass(BackendDeclined, KernelError)
        True
    """

    backend_declined = True  # read by the benchmark runner, a layer below the kernel


class BackendUnavailableWarning(UserWarning):
    """A kernel's backend package is not installed, so another backend was used.

    Example:
        >>> from primforge.kernel.errors import BackendUnavailableWarning
        >>> issubclass(BackendUnavailableWarning, UserWarning)
        True
    """
