"""primforge.ops: event-driven sparse connectivity built on :class:`~primforge.XLACustomKernel`.

CSR/CSC, fixed-number, just-in-time and dense event products, bit-packed events and
plasticity updates; each operation is one kernel (``*_p``) with a ``jax`` reference.
"""

from primforge.ops.connectivity import fixed_prob
from primforge.ops.csr import (
    CSC,
    CSR,
    CSRStructureError,
    binary_csrmm,
    binary_csrmm_p,
    binary_csrmm_spikes,
    binary_csrmm_spikes_p,
    binary_csrmv,
    binary_csrmv_p,
    binary_csrmv_spikes,
    binary_csrmv_spikes_p,
    csrmm,
    csrmm_p,
    csrmv,
    csrmv_p,
)
from primforge.ops.jitconn import (
    binary_jitc_matmat,
    binary_jitc_matmat_p,
    binary_jitc_matvec,
    binary_jitc_matvec_p,
    jitc_matmat,
    jitc_matmat_p,
    jitc_matvec,
    jitc_matvec_p,
    jitc_todense,
)

__all__ = [
    "CSC",
    "CSR",
    "CSRStructureError",
    "binary_csrmm",
    "binary_csrmm_p",
    "binary_csrmm_spikes",
    "binary_csrmm_spikes_p",
    "binary_csrmv",
    "binary_csrmv_p",
    "binary_csrmv_spikes",
    "binary_csrmv_spikes_p",
    "binary_jitc_matmat",
    "binary_jitc_matmat_p",
    "binary_jitc_matvec",
    "binary_jitc_matvec_p",
    "csrmm",
    "csrmm_p",
    "csrmv",
    "csrmv_p",
    "fixed_prob",
    "jitc_matmat",
    "jitc_matmat_p",
    "jitc_matvec",
    "jitc_matvec_p",
    "jitc_todense",
]

# Fixed-number connectivity and dense event products.
from primforge.ops.dense_event import (
    binary_densemm,
    binary_densemm_p,
    binary_densemv,
    binary_densemv_p,
    densemm,
    densemm_p,
    densemv,
    densemv_p,
)
from primforge.ops.fixed_num import (
    FixedNum,
    FixedNumStructureError,
    binary_fixed_num_mm,
    binary_fixed_num_mm_p,
    binary_fixed_num_mv,
    binary_fixed_num_mv_p,
    fixed_num,
    fixed_num_mm,
    fixed_num_mm_p,
    fixed_num_mv,
    fixed_num_mv_p,
)

__all__ += [
    "FixedNum",
    "FixedNumStructureError",
    "binary_densemm",
    "binary_densemm_p",
    "binary_densemv",
    "binary_densemv_p",
    "binary_fixed_num_mm",
    "binary_fixed_num_mm_p",
    "binary_fixed_num_mv",
    "binary_fixed_num_mv_p",
    "densemm",
    "densemm_p",
    "densemv",
    "densemv_p",
    "fixed_num",
    "fixed_num_mm",
    "fixed_num_mm_p",
    "fixed_num_mv",
    "fixed_num_mv_p",
]

# Plasticity: weight updates driven by pre- and postsynaptic spikes.
from primforge.ops.plasticity import (
    compressed_update_p,
    dense_update_p,
    update_on_post,
    update_on_pre,
)

__all__ += ["compressed_update_p", "dense_update_p", "update_on_post", "update_on_pre"]

# A matrix with an index of its synapses by stored column: column-side updates event-driven.
from primforge.ops.column_index import ColumnIndexed, with_column_index

__all__ += ["ColumnIndexed", "with_column_index"]

# Bit-packed binary events, accepted by every binary product.
from primforge.ops.packed import PackedEvents, pack_events

__all__ += ["PackedEvents", "pack_events"]

# The just-in-time generator as a Numba function, for fused kernels of one's own.
from primforge.ops.jitconn import jitc_numba_columns

__all__ += ["jitc_numba_columns"]

# Many phases (steps) on the threads of one Numba parallel region, for fused kernels (the
# thread team of primforge.sim, importable from here too).
from primforge.sim.team import NumbaTeam, numba_team

__all__ += ["NumbaTeam", "numba_team"]

# Index conversions, row slices and blocks, diagonal updates, the sampled dense-dense product.
from primforge.ops.csr import (
    CSRRowBlocks,
    coo2csr,
    coo_to_csc_index,
    csc_to_csr_index,
    csr_diag_add,
    csr_diag_position,
    csr_row_blocks,
    csr_sddmm,
    csr_slice_rows,
    csr_to_coo_index,
    csr_to_csc_index,
    diag_add,
)

__all__ += ["CSRRowBlocks", "coo2csr", "coo_to_csc_index", "csc_to_csr_index",
            "csr_diag_add", "csr_diag_position", "csr_row_blocks", "csr_sddmm", "csr_slice_rows",
            "csr_to_coo_index", "csr_to_csc_index", "diag_add"]

# Spike lists: firing indices plus a count, built under jit by spike_list.
from primforge.ops.csr import spike_list
from primforge.ops.dense_event import (
    binary_densemm_spikes,
    binary_densemm_spikes_p,
    binary_densemv_spikes,
    binary_densemv_spikes_p,
)
from primforge.ops.fixed_num import (
    binary_fixed_num_mm_spikes,
    binary_fixed_num_mm_spikes_p,
    binary_fixed_num_mv_spikes,
    binary_fixed_num_mv_spikes_p,
)
from primforge.ops.jitconn import (
    binary_jitc_mm_spikes,
    binary_jitc_mm_spikes_p,
    binary_jitc_mv_spikes,
    binary_jitc_mv_spikes_p,
)

__all__ += ["binary_densemm_spikes", "binary_densemm_spikes_p", "binary_densemv_spikes",
            "binary_densemv_spikes_p", "binary_fixed_num_mm_spikes",
            "binary_fixed_num_mm_spikes_p", "binary_fixed_num_mv_spikes",
            "binary_fixed_num_mv_spikes_p", "binary_jitc_mm_spikes", "binary_jitc_mm_spikes_p",
            "binary_jitc_mv_spikes", "binary_jitc_mv_spikes_p", "spike_list"]

# Synaptic delays: event products into a ring buffer of pending input.
from primforge.ops.delay import (
    binary_delayed_csrmv,
    binary_delayed_csrmv_p,
    binary_delayed_jitc_matvec,
    binary_delayed_jitc_matvec_p,
    delay_buffer,
    delay_read,
    delay_read_p,
    delayed_csrmv,
    delayed_csrmv_p,
    delayed_matvec,
    jitc_delays_todense,
)

__all__ += [
    "binary_delayed_csrmv",
    "binary_delayed_csrmv_p",
    "binary_delayed_jitc_matvec",
    "binary_delayed_jitc_matvec_p",
    "delay_buffer",
    "delay_read",
    "delay_read_p",
    "delayed_csrmv",
    "delayed_csrmv_p",
    "delayed_matvec",
    "jitc_delays_todense",
]
