"""Synaptic delays: event products into a ring buffer of pending input, and its read.

``api`` holds the two kernels (float and binary input) over CSR storage and the public
calls (:func:`delayed_matvec` for CSR, CSC and FixedNum matrices, :func:`delay_read`,
:func:`delay_buffer`); ``numba`` the CPU kernels, ``pallas`` the GPU placeholder,
``bench`` the benchmark cases.
"""

from primforge.ops.delay.api import (
    binary_delayed_csrmv,
    binary_delayed_csrmv_p,
    delay_buffer,
    delay_read,
    delay_read_p,
    delayed_csrmv,
    delayed_csrmv_p,
    delayed_matvec,
)

__all__ = [
    "binary_delayed_csrmv",
    "binary_delayed_csrmv_p",
    "delay_buffer",
    "delay_read",
    "delay_read_p",
    "delayed_csrmv",
    "delayed_csrmv_p",
    "delayed_matvec",
]
