"""Compressed sparse row matrices and their event-driven products.

``matrix`` holds the :class:`CSR` / :class:`CSC` pytrees, ``api`` the four product kernels
and their public calls, ``structure`` the structure checks, ``grad`` the weight gradient;
``numba``, ``pallas`` and ``cuda`` the backends' kernels, ``bench`` the benchmark cases.
"""

from primforge.ops.csr.api import (
    binary_csrmm,
    binary_csrmm_p,
    binary_csrmv,
    binary_csrmv_p,
    csrmm,
    csrmm_p,
    csrmv,
    csrmv_p,
)
from primforge.ops.csr.matrix import CSC, CSR
from primforge.ops.csr.structure import CSRStructureError

__all__ = [
    "CSC",
    "CSR",
    "CSRStructureError",
    "binary_csrmm",
    "binary_csrmm_p",
    "binary_csrmv",
    "binary_csrmv_p",
    "csrmm",
    "csrmm_p",
    "csrmv",
    "csrmv_p",
]
