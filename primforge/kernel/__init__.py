"""XLACustomKernel: one named primitive, kernels registered per backend and platform.

The class lives in :mod:`primforge.kernel.kernel`, assembled from the parts in this
package (see that module's note); it is re-exported here and from :mod:`primforge`.
"""

from primforge.kernel.kernel import (
    BackendUnavailableWarning,
    KernelEntry,
    KernelError,
    XLACustomKernel,
)

__all__ = ["BackendUnavailableWarning", "KernelEntry", "KernelError", "XLACustomKernel"]
