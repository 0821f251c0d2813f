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

    A call that named no backend is built with :attr:`fallback` instead (the backend
    chosen was a default: the kernel's, or one set with :func:`primforge.use_backend`);
    the benchmark runner and the autotuner pass over a backend that declines.

    Example:
        >>> from primforge.kernel.errors import BackendDeclined, KernelError
        >>> issubclass(BackendDeclined, KernelError)
        True
    """

    backend_declined = True  # read by the benchmark runner, a layer below the kernel

    def __init__(self, message: str, fallback: str | None = None):
        super().__init__(message)
        #: The backend that serves these params by default: a call that did not ask for
        #: a backend is built with it instead.
        self.fallback = fallback


class BackendUnavailableWarning(UserWarning):
    """A kernel's backend package is not installed, so another backend was used.

    Example:
        >>> from primforge.kernel.errors import BackendUnavailableWarning
        >>> issubclass(BackendUnavailableWarning, UserWarning)
        True
    """
