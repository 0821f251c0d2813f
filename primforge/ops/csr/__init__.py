"""Compressed sparse row matrices and their event-driven products.

``matrix`` holds the :class:`CSR` / :class:`CSC` pytrees, ``api`` the four product kernels
and their public calls, ``structure`` the structure checks, ``grad`` the weight gradient,
``convert`` the COO/CSR/CSC index conversions, ``slicing`` row slices, row blocks and
diagonal updates, ``sddmm`` the sampled dense-dense product, ``indexed`` the products
taking a spike list, ``packed`` the vector product reading bit-packed events; ``numba``,
``pallas`` and ``cuda`` the backends' kernels, ``bench`` the benchmark cases.
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
from primforge.ops.csr.convert import (
    coo2csr,
    coo_to_csc_index,
    csc_to_csr_index,
    csr_to_coo_index,
    csr_to_csc_index,
)
from primforge.ops.csr.indexed import (
    binary_csrmm_spikes,
    binary_csrmm_spikes_p,
    binary_csrmv_spikes,
    binary_csrmv_spikes_p,
    spike_list,
)
from primforge.ops.csr.matrix import CSC, CSR
from primforge.ops.csr.packed import binary_csrmv_packed_p  # noqa: F401 - registers it
from primforge.ops.csr.sddmm import csr_sddmm
from primforge.ops.csr.slicing import (
    CSRRowBlocks,
    csr_diag_add,
    csr_diag_position,
    csr_row_blocks,
    csr_slice_rows,
    diag_add,
)
from primforge.ops.csr.structure import CSRStructureError

__all__ = [
    "CSC",
    "CSR",
    "CSRRowBlocks",
    "CSRStructureError",
    "binary_csrmm",
    "binary_csrmm_p",
    "binary_csrmm_spikes",
    "binary_csrmm_spikes_p",
    "binary_csrmv",
    "binary_csrmv_p",
    "binary_csrmv_spikes",
    "binary_csrmv_spikes_p",
    "coo2csr",
    "coo_to_csc_index",
    "csc_to_csr_index",
    "csr_diag_add",
    "csr_diag_position",
    "csr_row_blocks",
    "csr_sddmm",
    "csr_slice_rows",
    "csr_to_coo_index",
    "csr_to_csc_index",
    "csrmm",
    "csrmm_p",
    "csrmv",
    "csrmv_p",
    "diag_add",
    "spike_list",
]
