"""Just-in-time connectivity: products with a random matrix regenerated from a seed.

``generator`` states the hash generator and its constants, ``api`` the four product
kernels, their public calls and :func:`jitc_todense`, ``indexed`` the products taking a
spike list; ``numba`` and ``pallas`` the backends' kernels, ``numba_columns`` the
generator as a Numba function, ``bench`` the benchmark cases.
"""

from primforge.ops.jitconn.api import (
    WEIGHT_KINDS,
    binary_jitc_matmat,
    binary_jitc_matmat_p,
    binary_jitc_matvec,
    binary_jitc_matvec_p,
    jitc_matmat,
    jitc_matmat_p,
    jitc_matvec,
    jitc_matvec_p,
    jitc_todense,
    threshold_table,
)
from primforge.ops.jitconn.indexed import (
    binary_jitc_mm_spikes,
    binary_jitc_mm_spikes_p,
    binary_jitc_mv_spikes,
    binary_jitc_mv_spikes_p,
)
from primforge.ops.jitconn.numba_columns import jitc_numba_columns

__all__ = [
    "WEIGHT_KINDS",
    "binary_jitc_matmat",
    "binary_jitc_matmat_p",
    "binary_jitc_matvec",
    "binary_jitc_matvec_p",
    "binary_jitc_mm_spikes",
    "binary_jitc_mm_spikes_p",
    "binary_jitc_mv_spikes",
    "binary_jitc_mv_spikes_p",
    "jitc_matmat",
    "jitc_matmat_p",
    "jitc_matvec",
    "jitc_matvec_p",
    "jitc_numba_columns",
    "jitc_todense",
    "threshold_table",
]
