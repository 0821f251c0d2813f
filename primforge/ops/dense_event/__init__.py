"""Event-driven products with a dense weight matrix.

``api`` holds the four product kernels and their public calls, ``indexed`` the products
taking a spike list; ``numba`` and ``pallas`` the backends' kernels, ``bench`` the
benchmark cases.
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
from primforge.ops.dense_event.indexed import (
    binary_densemm_spikes,
    binary_densemm_spikes_p,
    binary_densemv_spikes,
    binary_densemv_spikes_p,
)

__all__ = [
    "binary_densemm",
    "binary_densemm_p",
    "binary_densemm_spikes",
    "binary_densemm_spikes_p",
    "binary_densemv",
    "binary_densemv_p",
    "binary_densemv_spikes",
    "binary_densemv_spikes_p",
    "densemm",
    "densemm_p",
    "densemv",
    "densemv_p",
]
