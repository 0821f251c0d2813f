"""Synaptic delays: event products into a ring buffer of pending input, and its read.

``api`` holds the kernels (float and binary input over CSR storage, binary input through a
just-in-time matrix) and the public calls (:func:`delayed_matvec` for CSR, CSC and FixedNum
matrices, :func:`binary_delayed_jitc_matvec`, :func:`delay_read`, :func:`delay_buffer`);
``numba`` the CPU kernels, ``bench`` the benchmark cases.
"""

from primforge.ops.delay.api import (
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
