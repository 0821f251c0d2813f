"""Plasticity: weight updates driven by pre- and postsynaptic spikes.

``api`` holds the update kernels and their public calls; ``numba`` and ``pallas`` the
backends' kernels, ``bench`` the benchmark cases.
"""

from primforge.ops.plasticity.api import (
    compressed_update_p,
    dense_update_p,
    update_on_post,
    update_on_pre,
)

__all__ = ["compressed_update_p", "dense_update_p", "update_on_post", "update_on_pre"]
