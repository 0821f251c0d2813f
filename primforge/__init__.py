"""primforge: custom JAX operators made first-class."""

__version__ = "0.1.0"

from primforge.kernel.kernel import (
    BackendUnavailableWarning,
    KernelEntry,
    KernelError,
    XLACustomKernel,
)
from primforge.kernel.batching import general_batching_rule
from primforge.kernel.selection import use_backend
from primforge.registry import get_kernel, list_kernels
