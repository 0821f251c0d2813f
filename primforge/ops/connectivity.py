"""Random connectivity generators that return :class:`~primforge.ops.CSR` matrices.

:func:`fixed_prob` draws the geometric gaps between connections (cost proportional to the
number of synapses), in NumPy on concrete values.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from primforge.ops import _scaffold
from primforge.ops.csr.matrix import CSR

__all__ = ["fixed_prob"]

_BLOCK_SYNAPSES = 8_000_000  # expected synapses per generation block


def _columns_of_block(rng, n_rows: int, n_cols: int, prob: float) -> tuple[np.ndarray, np.ndarray]:
    """Rows (block-local) and columns of the successes among ``n_rows * n_cols`` flips."""
    cells = n_rows * n_cols
    if prob >= 1.0:
        flat = np.arange(cells, dtype=np.int64)
    else:
        expected = cells * prob
        draw = int(expected + 6.0 * np.sqrt(expected) + 16)
        pieces, last = [], -1
        while True:
            pos = last + np.cumsum(rng.geometric(prob, size=draw), dtype=np.int64)
            inside = pos[pos < cells]
            pieces.append(inside)
            if inside.size < pos.size:
                break
            last = int(pos[-1])
        flat = np.concatenate(pieces)
    return flat // n_cols, (flat % n_cols).astype(np.int32)


def fixed_prob(
    n_rows: int,
    n_cols: int,
    prob: float,
    *,
    weight: float | Callable[[np.random.Generator, int], np.ndarray] = 1.0,
    seed: int | np.random.Generator = 0,
    allow_self_connections: bool = True,
    dtype=jnp.float32,
) -> CSR:
    """Random connectivity: each of the ``n_rows x n_cols`` pairs is connected with ``prob``.

    Args:
        n_rows: number of rows (presynaptic neurons: ``events @ W`` is event-driven).
        n_cols: number of columns (postsynaptic neurons).
        prob: connection probability in ``[0, 1]``.
        weight: a number gives one shared weight (a homogeneous matrix, ``data.shape ==
            (1,)``); a callable ``weight(rng, nnz)`` returns one weight per synapse.
        seed: integer seed or a ``numpy.random.Generator``.
        allow_self_connections: when False, drop the diagonal ``(i, i)`` entries.
        dtype: floating dtype of the weights.

    Returns:
        A :class:`CSR` of shape ``(n_rows, n_cols)`` with sorted column indices per row.

    Example:
        >>> W = fixed_prob(1000, 500, 0.1, weight=0.5, seed=1)
        >>> W.shape, W.data.tolist()
        ((1000, 500), [0.5])
        >>> abs(W.nnz / (1000 * 500) - 0.1) < 0.005
        True
        >>> V = fixed_prob(50, 50, 0.2, weight=lambda rng, k: rng.normal(size=k), seed=2)
        >>> V.data.shape == (V.nnz,)
        True
    """
    n_rows, n_cols = int(n_rows), int(n_cols)
    if n_rows < 0 or n_cols < 0:
        raise ValueError(f"fixed_prob: sizes must be non-negative, got ({n_rows}, {n_cols})")
    n_rows, n_cols = _scaffold.check_shape((n_rows, n_cols), "fixed_prob", int32=True)
    if not 0.0 <= float(prob) <= 1.0:
        raise ValueError(f"fixed_prob: 'prob' must lie in [0, 1], got {prob!r}")
    prob = float(prob)
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    counts = np.zeros(n_rows, np.int64)
    chunks = []
    if prob > 0.0 and n_cols > 0:
        block = max(1, int(_BLOCK_SYNAPSES / max(1.0, n_cols * prob)))
        for r0 in range(0, n_rows, block):
            nr = min(block, n_rows - r0)
            rows, cols = _columns_of_block(rng, nr, n_cols, prob)
            if not allow_self_connections:
                keep = rows + r0 != cols
                rows, cols = rows[keep], cols[keep]
            counts[r0 : r0 + nr] = np.bincount(rows, minlength=nr)
            chunks.append(cols)
    indices = np.concatenate(chunks) if chunks else np.zeros(0, np.int32)
    if indices.size >= 2**31:
        raise ValueError(f"fixed_prob: {indices.size} synapses do not fit int32 indices")
    indptr = np.zeros(n_rows + 1, np.int32)
    np.cumsum(counts, out=indptr[1:])
    data = _weights(weight, rng, indices.size, dtype)
    return CSR(*(jax.device_put(a) for a in (data, indices, indptr)), shape=(n_rows, n_cols))


def _weights(weight, rng, nnz: int, dtype) -> np.ndarray:
    """One shared weight (a number) or ``weight(rng, nnz)``, checked."""
    if not callable(weight):
        return np.full((1,), weight, dtype=dtype)
    data = np.asarray(weight(rng, nnz), dtype=dtype)
    if data.shape != (nnz,):
        raise ValueError(
            f"fixed_prob: weight(rng, nnz) must return shape ({nnz},), got {data.shape}")
    return data
