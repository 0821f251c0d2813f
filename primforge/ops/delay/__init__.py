"""Synaptic delays: event products into a ring buffer of pending input, and its read.

``ring`` holds the buffer (:func:`delay_buffer`), the checks of its arguments and the one
kernel whose forms the delayed products are; ``csr`` the product of stored synapses
(:func:`delayed_csrmv`, :func:`binary_delayed_csrmv`), ``jitc`` that of a just-in-time
matrix (:func:`binary_delayed_jitc_matvec`), ``read`` the read (:func:`delay_read`);
``api`` the call over matrix objects (:func:`delayed_matvec`); ``numba`` the CPU kernels,
``bench`` the benchmark cases.
"""

from primforge.ops.delay.api import delayed_matvec
from primforge.ops.delay.csr import (
    binary_delayed_csrmv,
    binary_delayed_csrmv_p,
    delayed_csrmv,
    delayed_csrmv_p,
)
from primforge.ops.delay.jitc import (
    binary_delayed_jitc_matvec,
    binary_delayed_jitc_matvec_p,
    jitc_delays_todense,
)
from primforge.ops.delay.read import delay_read, delay_read_p
from primforge.ops.delay.ring import delay_buffer

__all__ = [
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
