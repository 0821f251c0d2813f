"""Sharding rules of the :mod:`primforge.ops` kernels: which dimensions a shard may own.

Each rule gives one factor per dimension (see
:meth:`primforge.XLACustomKernel.def_sharding_rule`); a factor a kernel cannot compute on
a slice is kept whole.
"""

from __future__ import annotations

from collections.abc import Iterable

from primforge.kernel.sharding import ShardingRule

__all__ = [
    "compressed_update_rule",
    "csr_rule",
    "csr_weight_grad_rule",
    "delay_read_rule",
    "delayed_jitc_rule",
    "delayed_rule",
    "dense_rule",
    "dense_update_rule",
    "fixed_num_packed_rule",
    "fixed_num_rule",
    "fixed_num_weight_grad_rule",
    "indexed_rule",
    "install",
    "jitc_rule",
    "replicated_rule",
]


def _cols(x) -> str:
    """The column factor of a matrix input (and of the output), or nothing for a vector."""
    return " c" if len(x.shape) == 2 else ""


def csr_rule(ins, outs, **_) -> ShardingRule:
    """CSR/CSC products ``(data, indices, indptr, x)``: only the columns of a matrix ``x``.

    Example:
        >>> import jax
        >>> s = lambda *shape: jax.ShapeDtypeStruct(shape, 'float32')
        >>> csr_rule((s(5), s(5), s(4), s(3, 8)), (s(3, 8),)).rule
        'w, e, p, r c -> o c'
    """
    c = _cols(ins[3])
    return ShardingRule(f"w, e, p, r{c} -> o{c}", need_replication_factors=("p",))


def csr_weight_grad_rule(ins, outs, *, matrix, **_) -> ShardingRule:
    """The per-synapse weight gradient ``(indices, indptr, ct, x) -> (nnz,)``.

    With matrix inputs it sums over their columns, a reduction factor.

    Example:
        >>> import jax
        >>> s = lambda *shape: jax.ShapeDtypeStruct(shape, 'float32')
        >>> r = csr_weight_grad_rule((s(5), s(4), s(3, 8), s(2, 8)), (s(5),), matrix=True)
        >>> r.rule, r.reduction_factors
        ('e, p, r c, s c -> e', ('c',))
    """
    if matrix:
        return ShardingRule("e, p, r c, s c -> e", reduction_factors=("c",),
                            need_replication_factors=("e",))
    return ShardingRule("e, p, r, s -> e", need_replication_factors=("e",))


def fixed_num_weight_grad_rule(ins, outs, *, transpose, matrix, **_) -> ShardingRule:
    """The per-entry weight gradient of a fixed-number product ``(indices, ct, x) -> (m, k)``.

    The ``m`` rows shard with the result (each row's gradient reads its own row of the
    cotangent, or of the input for ``A.T @ x``); the side gathered through the indices is
    kept whole; matrix inputs sum over their columns, a reduction factor.

    Example:
        >>> import jax
        >>> s = lambda *shape: jax.ShapeDtypeStruct(shape, 'float32')
        >>> r = fixed_num_weight_grad_rule((s(4, 3), s(6, 8), s(4, 8)), (s(4, 3),),
        ...                                transpose=True, matrix=True)
        >>> r.rule, r.reduction_factors
        ('m k, n c, m c -> m k', ('c',))
    """
    c = " c" if matrix else ""
    ct, x = ("n", "m") if transpose else ("m", "n")
    return ShardingRule(f"m k, {ct}{c}, {x}{c} -> m k",
                        reduction_factors=("c",) if matrix else (),
                        need_replication_factors=("n",))


def fixed_num_rule(ins, outs, *, transpose, **_) -> ShardingRule:
    """Fixed-number products ``(weights, indices, x)`` with ``(m, k)`` index rows.

    ``A @ x`` (gather): rows ``m`` shard with the output; ``A.T @ x`` (scatter): ``m`` is
    a reduction. The ``k`` entries of a row are summed in both directions: a reduction.

    Example:
        >>> import jax
        >>> s = lambda *shape: jax.ShapeDtypeStruct(shape, 'float32')
        >>> fixed_num_rule((s(1), s(6, 3), s(5)), (s(6),), transpose=False).rule
        's, m k, n -> m'
        >>> r = fixed_num_rule((s(6, 3), s(6, 3), s(6, 2)), (s(5, 2),), transpose=True)
        >>> r.rule, r.reduction_factors
        ('m k, m k, m c -> n c', ('m', 'k'))
    """
    weights, _, x = ins
    w = "s" if len(weights.shape) == 1 else "m k"
    c = _cols(x)
    if transpose:
        return ShardingRule(f"{w}, m k, m{c} -> n{c}", reduction_factors=("m", "k"))
    return ShardingRule(f"{w}, m k, n{c} -> m{c}", reduction_factors=("k",))


def fixed_num_packed_rule(ins, outs, *, transpose, **_) -> ShardingRule:
    """The fixed-number product on packed events ``(weights, indices, words)``.

    The words stay whole, and so do the index rows they select (``A.T @ x``); ``A @ x``
    shards its rows with the output as on unpacked events.

    Example:
        >>> import jax
        >>> s = lambda *shape: jax.ShapeDtypeStruct(shape, 'float32')
        >>> fixed_num_packed_rule((s(1), s(40, 3), s(2)), (s(5),), transpose=True).rule
        's, m k, r -> n'
    """
    w = "s" if len(ins[0].shape) == 1 else "m k"
    if transpose:
        return ShardingRule(f"{w}, m k, r -> n", reduction_factors=("k",),
                            need_replication_factors=("m", "r"))
    return ShardingRule(f"{w}, m k, r -> m", reduction_factors=("k",),
                        need_replication_factors=("r",))


def jitc_rule(ins, outs, **_) -> ShardingRule:
    """Just-in-time products ``(theta, seed, table, x)``: only the columns of a matrix ``x``.

    The kernel regenerates each row of ``W`` from its global index, so neither the rows
    nor the columns of ``W`` may be split.

    Example:
        >>> import jax
        >>> s = lambda *shape: jax.ShapeDtypeStruct(shape, 'float32')
        >>> jitc_rule((s(1), s(1), s(9), s(6)), (s(4),)).rule
        't, s, q, r -> o'
    """
    c = _cols(ins[3])
    return ShardingRule(f"t, s, q, r{c} -> o{c}", need_replication_factors=("r", "o"))


def dense_rule(ins, outs, *, transpose, **_) -> ShardingRule:
    """Dense event products ``(W, x)``: ``W``'s kept dimension shards with the output, its
    contracted dimension is a reduction, and the columns of a matrix ``x`` shard.

    Example:
        >>> import jax
        >>> s = lambda *shape: jax.ShapeDtypeStruct(shape, 'float32')
        >>> r = dense_rule((s(6, 5), s(6)), (s(5),), transpose=True)
        >>> r.rule, r.reduction_factors
        ('m n, m -> n', ('m',))
    """
    c = _cols(ins[1])
    if transpose:
        return ShardingRule(f"m n, m{c} -> n{c}", reduction_factors=("m",))
    return ShardingRule(f"m n, n{c} -> m{c}", reduction_factors=("n",))


def dense_update_rule(ins, outs, *, on_rows, **_) -> str:
    """Dense plasticity ``(W, spikes, trace) -> W``: both dimensions of ``W`` shard.

    Example:
        >>> import jax
        >>> s = lambda *shape: jax.ShapeDtypeStruct(shape, 'float32')
        >>> dense_update_rule((s(6, 5), s(6), s(5)), (s(6, 5),), on_rows=True)
        'm n, m, n -> m n'
    """
    return "m n, m, n -> m n" if on_rows else "m n, n, m -> m n"


def compressed_update_rule(ins, outs, *, on_rows=True, **_) -> ShardingRule:
    """Compressed plasticity: fixed-number rows shard, CSR / CSC storage is kept whole.

    A ``FixedNum`` arrives as its rows ``(weights, indices, spikes, trace)``: the ``m`` rows
    and ``k`` entries of ``weights`` and ``indices`` shard, the vector indexed by rows
    (the spikes on rows, the trace on columns) follows ``m``, the one indexed through
    ``indices`` (``n``) is kept whole. The flat form ``(data, indices, indptr, spikes,
    trace[, column index])`` is kept whole: ``indptr`` holds global offsets (split a CSR
    by rows with :func:`primforge.ops.csr_row_blocks` inside ``jax.shard_map``).

    Example:
        >>> import jax
        >>> s = lambda *shape: jax.ShapeDtypeStruct(shape, 'float32')
        >>> compressed_update_rule((s(6, 3), s(6, 3), s(6), s(5)), (s(6, 3),)).rule
        'm k, m k, m, n -> m k'
        >>> compressed_update_rule((s(6, 3), s(6, 3), s(5), s(6)), (s(6, 3),),
        ...                        on_rows=False).rule
        'm k, m k, n, m -> m k'
        >>> compressed_update_rule((s(5), s(5), s(4), s(3), s(2)), (s(5),)).rule
        'e, e, p, a, b -> e'
        >>> compressed_update_rule((s(5), s(5), s(4), s(3), s(2), s(4), s(5), s(5)),
        ...                        (s(5),)).rule
        'e, e, p, a, b, c, e, e -> e'
    """
    if len(ins) == 4:  # fixed-number rows
        vectors = "m, n" if on_rows else "n, m"
        return ShardingRule(f"m k, m k, {vectors} -> m k", need_replication_factors=("n",))
    if len(ins) > 5:  # with a column index
        return ShardingRule("e, e, p, a, b, c, e, e -> e",
                            need_replication_factors=("e", "p", "c"))
    return ShardingRule("e, e, p, a, b -> e", need_replication_factors=("e", "p"))


def indexed_rule(ins, outs, **_) -> ShardingRule:
    """The spike-list product ``(data, indices, indptr, spikes, count)``, and the builder
    of spike lists ``(events,) -> (spikes, count)``: kept whole.

    Example:
        >>> import jax
        >>> s = lambda *shape: jax.ShapeDtypeStruct(shape, 'float32')
        >>> indexed_rule((s(5), s(5), s(4), s(2), s(1)), (s(3),)).rule
        'w, e, p, s, k -> o'
        >>> indexed_rule((s(6),), (s(2), s(1))).rule
        'n -> s, k'
    """
    if len(ins) == 1:
        return ShardingRule("n -> s, k", need_replication_factors=("n", "s", "k"))
    if len(ins[3].shape) == 2:  # several lists
        return ShardingRule("w, e, p, b s, b -> b o",
                            need_replication_factors=("w", "e", "p", "b", "s", "o"))
    return ShardingRule("w, e, p, s, k -> o",
                        need_replication_factors=("w", "e", "p", "s", "k", "o"))


def delayed_rule(ins, outs, **_) -> ShardingRule:
    """The delayed product ``(data, indices, indptr, delays, x, buffer, slot) -> buffer``:
    kept whole (global row offsets; a synapse writes any row and column of the buffer).

    Example:
        >>> import jax
        >>> s = lambda *shape: jax.ShapeDtypeStruct(shape, 'float32')
        >>> delayed_rule((s(5), s(5), s(4), s(5), s(3), s(6, 2), s(1)), (s(6, 2),)).rule
        'w, e, p, d, x, t n, s -> t n'
    """
    return ShardingRule("w, e, p, d, x, t n, s -> t n",
                        need_replication_factors=("w", "e", "p", "d", "x", "t", "n", "s"))


def delayed_jitc_rule(ins, outs, **_) -> ShardingRule:
    """The delayed just-in-time product ``(theta, seed, table, events, buffer, slot) ->
    buffer``: kept whole (each row of ``W`` is regenerated from its global index and writes
    any row and column of the buffer).

    Example:
        >>> import jax
        >>> s = lambda *shape: jax.ShapeDtypeStruct(shape, 'float32')
        >>> delayed_jitc_rule((s(1), s(1), s(9), s(3), s(6, 2), s(1)), (s(6, 2),)).rule
        't, q, b, x, d n, s -> d n'
    """
    return ShardingRule("t, q, b, x, d n, s -> d n",
                        need_replication_factors=("t", "q", "b", "x", "d", "n", "s"))


def delay_read_rule(ins, outs, **_) -> ShardingRule:
    """The read of a ring buffer ``(buffer, slot) -> (row, buffer)``: its columns shard.

    Example:
        >>> import jax
        >>> s = lambda *shape: jax.ShapeDtypeStruct(shape, 'float32')
        >>> delay_read_rule((s(6, 2), s(1)), (s(2), s(6, 2))).rule
        't n, s -> n, t n'
    """
    return ShardingRule("t n, s -> n, t n", need_replication_factors=("t", "s"))


def install(kernels: Iterable, rule) -> None:
    """Give every kernel of ``kernels`` the sharding rule ``rule``.

    Example:
        >>> import primforge
        >>> k = primforge.XLACustomKernel('doc_ops_sharding_install')
        >>> install([k], dense_update_rule)
        >>> k.sharding_rule.rule is dense_update_rule
        True
    """
    for kernel in kernels:
        kernel.def_sharding_rule(rule)


def replicated_rule(ins, outs, **_) -> ShardingRule:
    """Every dimension of every operand and result kept whole on each device.

    Example:
        >>> import jax
        >>> s = lambda *shape: jax.ShapeDtypeStruct(shape, 'float32')
        >>> replicated_rule((s(4, 3), s(2), s(1)), (s(3),)).rule
        'f0 f1, f2, f3 -> f4'
    """
    names, groups = [], []
    for group in (ins, outs):
        parts = []
        for a in group:
            dims = [f"f{len(names) + d}" for d in range(len(a.shape))]
            names += dims
            parts.append(" ".join(dims))
        groups.append(", ".join(parts))
    return ShardingRule(" -> ".join(groups), need_replication_factors=tuple(names))
