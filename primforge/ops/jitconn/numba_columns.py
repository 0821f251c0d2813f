"""The just-in-time connectivity generator as a Numba function, for fused kernels.

:func:`jitc_numba_columns` gives an inline ``njit`` function that writes the column
indices of one row, bitwise those of :func:`~primforge.ops.jitc_todense`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from primforge.backends import install_hint
from primforge.ops.jitconn.generator import MASK, check_prob, threshold_table

__all__ = ["jitc_numba_columns"]


def jitc_numba_columns(prob: float) -> Callable[..., int]:
    """An ``njit`` function ``columns(seed, row, n, out) -> count`` for connection prob. ``prob``.

    It writes the column indices of row ``row`` of the just-in-time matrix with ``n`` columns
    and seed ``seed`` (the matrix the jitc products with this ``prob`` and ``seed`` use,
    whatever the weight kind) in increasing order into ``out[:count]`` and returns
    ``count``. ``out`` is an int64 array with room for the row (``n`` entries always
    suffice). Call it from your own Numba kernels (for example the Numba backend of an
    :class:`~primforge.XLACustomKernel`) to fuse event propagation over connectivity that is
    never stored; every call with the same arguments gives the same columns.

    Args:
        prob: the connection probability, in ``(0, 1]``.

    Returns:
        The compiled function (cached per ``prob``).

    Raises:
        ValueError: ``prob`` is outside ``(0, 1]`` or too small for the generator.
        ImportError: Numba is not installed (``pip install -e ".[cpu]"`` in the primforge
            checkout).

    Example:
        >>> import numpy as np
        >>> from primforge.ops import jitc_numba_columns, jitc_todense
        >>> columns = jitc_numba_columns(0.2)
        >>> out = np.empty(50, np.int64)
        >>> count = columns(7, 3, 50, out)
        >>> dense_row = jitc_todense(7, (4, 50), 0.2)[3]
        >>> bool(np.array_equal(out[:count], np.flatnonzero(dense_row)))
        True
    """
    return _compiled(check_prob(prob, "jitc_numba_columns"))


def _guide(table: np.ndarray) -> tuple[np.ndarray, int]:
    """int32 guide into ``table`` by the top 16 bits of a draw (see :func:`_compiled`)."""
    bits = min(16, max(8, int(table.size - 1).bit_length()))
    shift = 32 - bits
    tops = (np.arange(1, 2**bits + 1, dtype=np.int64) << shift) - 1  # largest draw per bucket
    guide = np.searchsorted(-table[:-1].astype(np.int64), -tops, side="left")
    return guide.astype(np.int32), shift


@functools.cache
def _compiled(prob: float) -> Any:
    """The generator for ``prob``.

    The gap after a draw ``u`` is the number of thresholds above ``u``: the guide gives
    the first candidate for ``u``'s bucket of top bits, one comparison without a branch
    takes the usual single step, and a loop (rarely entered) walks any further ones. The
    guide is int32 so that it and the table stay small in cache; the integers are those
    of the other backends' search, exactly.
    """
    try:
        import numba
    except ImportError:  # pragma: no cover - numba is a core dependency here
        raise ImportError(
            f"jitc_numba_columns needs Numba: {install_hint('cpu')}") from None

    from primforge.ops.jitconn.numba import _helpers

    mix, seed_keys, row_stream = _helpers()[:3]  # the generator's integer helpers
    table = threshold_table(prob)
    guide, shift = _guide(table)

    @numba.njit(inline="always", nogil=True)
    def columns(seed, row, n, out):
        # Synapse s's gap is the draw with counter 3s: mix(start + gamma * 3s); the
        # argument is carried along and advanced by one addition per synapse.
        ctr, _, step = row_stream(seed_keys(seed), row)
        j = -1
        s = 0
        while True:
            u = mix(ctr)
            g = np.int64(guide[u >> shift])
            g += table[g] > u
            while table[g] > u:  # table[-1] == 0 ends the walk
                g += 1
            if g >= n - 1 - j:
                return s
            j += 1 + g
            out[s] = j
            s += 1
            ctr = (ctr + step) & MASK

    return columns
