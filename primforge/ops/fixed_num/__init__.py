"""Fixed-number connectivity: each row connects to the same number of columns.

``matrix`` holds the :class:`FixedNum` pytree and :func:`fixed_num`, ``api`` the four
product kernels and their public calls, ``indexed`` the products taking a spike list,
``packed`` the vector product reading bit-packed events, ``grad`` the weight gradient;
``numba`` and ``pallas`` the backends' kernels, ``bench`` the benchmark cases.
"""

from primforge.ops.fixed_num.api import (
    binary_fixed_num_mm,
    binary_fixed_num_mm_p,
    binary_fixed_num_mv,
    binary_fixed_num_mv_p,
    fixed_num_mm,
    fixed_num_mm_p,
    fixed_num_mv,
    fixed_num_mv_p,
)
from primforge.ops.fixed_num.indexed import (
    binary_fixed_num_mm_spikes,
    binary_fixed_num_mm_spikes_p,
    binary_fixed_num_mv_spikes,
    binary_fixed_num_mv_spikes_p,
)
from primforge.ops.fixed_num.matrix import FixedNum, FixedNumStructureError, fixed_num
from primforge.ops.fixed_num.packed import binary_fixed_num_mv_packed_p  # noqa: F401 - registers it

__all__ = [
    "FixedNum",
    "FixedNumStructureError",
    "binary_fixed_num_mm",
    "binary_fixed_num_mm_p",
    "binary_fixed_num_mm_spikes",
    "binary_fixed_num_mm_spikes_p",
    "binary_fixed_num_mv",
    "binary_fixed_num_mv_p",
    "binary_fixed_num_mv_spikes",
    "binary_fixed_num_mv_spikes_p",
    "fixed_num",
    "fixed_num_mm",
    "fixed_num_mm_p",
    "fixed_num_mv",
    "fixed_num_mv_p",
]
