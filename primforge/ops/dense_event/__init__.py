"""Event-driven products with a dense weight matrix.

``api`` holds the four product kernels and their public calls; ``numba`` and ``pallas``
the backends' kernels, ``bench`` the benchmark cases.
"""

from primforge.ops.dense_event.api import (
    binary_densemm,
    binary_densemm_p,
    binary_densemv,
    binary_densemv_p,
    densemm,
    densemm_p,
    densemv,
    densemv_p,
)

__all__ = [
    "binary_densemm",
    "binary_densemm_p",
    "binary_densemv",
    "binary_densemv_p",
    "densemm",
    "densemm_p",
    "densemv",
    "densemv_p",
]
