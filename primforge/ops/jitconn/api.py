"""Just-in-time connectivity: products with a random matrix that is never stored.

Four kernels (float or binary input, vector or matrix) take ``(theta, seed, table, x)``
and regenerate the rows of ``W`` from ``seed`` while they run, bit-for-bit the same on
every backend; the generator is in :mod:`primforge.ops.jitconn.generator`, stated exactly
in docs/architecture.md.
"""

from __future__ import annotations

import math
import operator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from primforge._compat import Tracer
from primforge.ops import _scaffold, _sharding
from primforge.ops.jitconn import generator as _jitc_generator
from primforge.ops.jitconn.generator import (  # the generator; these names stay importable here
    FEW_FLIPS,
    FLIP,
    GAMMA_SALT,
    MASK,
    MIX_1,
    MIX_2,
    ROW_SALT,
    SEED_SALT,
    WEIGHT_KINDS,
    cached_table,
    check_kind,
    check_prob,
    draw,
    next_column,
    row_streams,
    threshold_table,
    weights,
)
from primforge.ops.jitconn.structure import seed_word, weight_params

__all__ = [
    "WEIGHT_KINDS",
    "binary_jitc_matmat",
    "binary_jitc_matmat_p",
    "binary_jitc_matvec",
    "binary_jitc_matvec_p",
    "jitc_matmat",
    "jitc_matmat_p",
    "jitc_matvec",
    "jitc_matvec_p",
    "jitc_todense",
    "threshold_table",
]

# The rest of the generator, still importable from here.
gap, mix32, unit, MAX_TABLE = (_jitc_generator.gap, _jitc_generator.mix32, _jitc_generator.unit,
                               _jitc_generator.MAX_TABLE)

FAMILY = _scaffold.Family(
    "jitc", ("jitc_matvec", "jitc_matmat"),
    params=("shape", "prob", "transpose", "weight_kind", "block"),
    what="jitc products", weights="the weights", structure="'seed' or the threshold table",
    inputs=("x", "x"), doc=__doc__)
KERNELS = FAMILY.kernels  # (binary, matrix) -> kernel


# ----------------------------------------------------------------------------- jax reference
def _block_window(seed, shape, block):
    """``(rows, row_ok, c0, stop)`` of the block that ``seed = (seed, r0, c0)`` places.

    ``r0`` and ``c0`` are the uint32 bits of signed int32 starts. ``rows`` are the block's
    global row indices (int32), ``row_ok`` those inside the matrix; the block's columns are
    ``c0 ..`` (int32, clipped to ``[-w, n]``, which keeps the same columns inside the
    matrix) and every row is generated up to column ``stop``: past the window it is not
    needed.
    """
    m, n = shape
    h, w = block
    r0, c0 = (jax.lax.bitcast_convert_type(v, jnp.int32) for v in (seed[1], seed[2]))
    r0 = jnp.clip(r0, -h, m)  # no overflow in r0 + i below; the same rows inside W
    rows = r0 + jnp.arange(h, dtype=jnp.int32)
    row_ok = (rows >= 0) & (rows < m)
    c0 = jnp.clip(c0, -w, n)
    stop = c0 + jnp.minimum(jnp.int32(w), jnp.int32(n) - c0)
    return jnp.maximum(rows, 0), row_ok, c0, stop


def _jax_generator(binary: bool, matrix: bool):
    def generate(*, ins, outs, shape, transpose, weight_kind, block=None, **_):
        m, n = shape
        dtype = outs[0].dtype
        k_max = int(ins[2].shape[0]) - 1
        homo = weight_kind == "homo"
        rows_b, cols_b = (m, n) if block is None else block

        def kernel(theta, seed, table, x):
            if min(rows_b, cols_b) == 0:
                return jnp.zeros(outs[0].shape, dtype)
            ev = (x != 0).astype(dtype) if binary else x.astype(dtype)
            if block is None:
                rows, row_ok, c0, stop = jnp.arange(m, dtype=jnp.int32), None, 0, n
            else:
                rows, row_ok, c0, stop = _block_window(seed, shape, block)
            stream = row_streams(seed[0], rows)

            def load(idx):
                return table[idx]

            if transpose:
                alive0 = jnp.any(ev != 0, axis=1) if matrix else ev != 0
            else:
                alive0 = jnp.ones((rows_b,), bool)
            if row_ok is not None:
                alive0 = alive0 & row_ok
            y0 = jnp.zeros(outs[0].shape, dtype)

            def cond(state):
                return jnp.any(state[2])

            def body(state):
                s, j, alive, y = state
                j, alive = next_column(j, alive, draw(stream, jnp.uint32(3) * s), load, k_max,
                                       stop)
                w = weights(theta, stream, s, weight_kind, dtype)
                hit = alive if block is None else alive & (j >= c0)  # inside the window
                if transpose:  # y[j_i] += w_i x[i], only rows still alive
                    contrib = w[:, None] * ev if matrix else w * ev
                    contrib = jnp.where(ev != 0, contrib, 0)  # inactive inputs: skipped
                    y = y.at[jnp.where(hit, j - c0, cols_b)].add(contrib, mode="drop")
                else:  # y[i] += w_i x[j_i]; a shared weight multiplies the sum once
                    w = jnp.ones_like(w) if homo else w
                    got = ev[jnp.where(hit, j - c0, 0)]
                    live = hit[:, None] if matrix else hit
                    live = live & (got != 0) if binary else live  # inactive events: skipped
                    y = y + jnp.where(live, (w[:, None] if matrix else w) * got, 0)
                return s + jnp.uint32(1), j, alive, y

            init = (jnp.uint32(0), jnp.full((rows_b,), -1, jnp.int32), alive0, y0)
            y = jax.lax.while_loop(cond, body, init)[3]
            return y * theta[0].astype(dtype) if homo and not transpose else y

        return kernel

    return generate


def _numba_generator(binary: bool, matrix: bool):
    def generate(*, shape, prob, transpose, weight_kind, block=None, **_):
        from primforge.ops.jitconn import numba as _numba_jitconn

        blocked = None if block is None else tuple(int(v) for v in shape)
        return _numba_jitconn.kernel(binary, matrix, bool(transpose), weight_kind, float(prob),
                                     blocked)

    return generate


# ----------------------------------------------------------------------------- shape rule
def check_operands(who: str, theta, seed, table, *, shape, prob, weight_kind,
                   block=None) -> tuple[int, int]:
    """Check the weight parameters, seed and threshold table of a jitc kernel (abstract
    values) against its static params; the shape of the matrix, or of the block."""
    m, n = _scaffold.check_shape(shape, who, int32=True)
    if block is not None:
        h, w = _scaffold.check_shape(block, who, int32=True)
        if h > m or w > n:
            raise ValueError(f"{who}: 'block' {(h, w)} must fit in 'shape' {(m, n)}")
    p = check_prob(prob, who)
    check_kind(weight_kind, who)
    want_theta = (WEIGHT_KINDS[weight_kind],)
    if tuple(theta.shape) != want_theta or not jnp.issubdtype(theta.dtype, jnp.floating):
        raise ValueError(
            f"{who}: the weight parameters must be a float array of shape {want_theta} for "
            f"weight_kind={weight_kind!r}, got {theta.dtype}{list(theta.shape)}"
        )
    want_seed = (1,) if block is None else (3,)
    if tuple(seed.shape) != want_seed or seed.dtype != jnp.uint32:
        raise ValueError(f"{who}: 'seed' must be a {want_seed} uint32 array (with a "
                         f"'block': the seed, first row, first column), got "
                         f"{seed.dtype}{list(seed.shape)}")
    want_table = cached_table(p).shape
    if tuple(table.shape) != want_table or table.dtype != jnp.uint32:
        raise ValueError(
            f"{who}: 'table' must be threshold_table({p}) (uint32{list(want_table)}), "
            f"got {table.dtype}{list(table.shape)}")
    return (m, n) if block is None else (h, w)


def _shape_rule(binary: bool, matrix: bool):
    who = FAMILY.name(binary, matrix)

    def rule(theta, seed, table, x, *, shape, prob, transpose, weight_kind, block=None, **_):
        size = check_operands(who, theta, seed, table, shape=shape, prob=prob,
                              weight_kind=weight_kind, block=block)
        return FAMILY.output(who, x, size, theta.dtype, binary=binary, matrix=matrix,
                             transpose=transpose)

    return rule


def _weight_cotangent(binary, matrix, ct, w_aval, structure, x, *, backend, **kw):
    """<ct, W(e_k) x> for each weight parameter k: the product is linear in theta."""
    return _scaffold.unit_weight_cotangent(
        lambda e: FAMILY.call(binary, matrix, e, *structure, x, backend=backend, **kw), ct,
        w_aval.dtype, w_aval.shape[0])


FAMILY.build(jax_gen=_jax_generator, numba_gen=_numba_generator,
             pallas_module="primforge.ops.jitconn.pallas", shape_rule=_shape_rule,
             weight_cotangent=_weight_cotangent, tags=("jitconn", "sparse"))
_sharding.install(FAMILY.kernels.values(), _sharding.jitc_rule)
jitc_matvec_p = KERNELS[(False, False)]
binary_jitc_matvec_p = KERNELS[(True, False)]
jitc_matmat_p = KERNELS[(False, True)]
binary_jitc_matmat_p = KERNELS[(True, True)]


# ----------------------------------------------------------------------------- public calls
def _window(window, size, who, name):
    """``(start, length)`` of the ``rows`` or ``cols`` argument, checked (``None``: all)."""
    if window is None:
        return 0, size, True
    try:
        start, length = window
    except (TypeError, ValueError):
        raise TypeError(f"{who}: '{name}' must be a pair (start, size), got {window!r}") from None
    try:
        length = operator.index(length)
    except TypeError:
        raise TypeError(f"{who}: the size in '{name}' must be an int (static), got "
                        f"{length!r}") from None
    if not 0 <= length <= size:
        raise ValueError(f"{who}: the size in '{name}' must be in [0, {size}], got {length}")
    if isinstance(start, jax.Array) or hasattr(start, "aval"):
        if start.shape != () or not jnp.issubdtype(start.dtype, jnp.integer):
            raise TypeError(f"{who}: the start in '{name}' must be an integer scalar, got "
                            f"{start.dtype}{list(start.shape)}")
        if not isinstance(start, Tracer):
            return _window((int(start), length), size, who, name)
        return start, length, False
    try:
        start = operator.index(start)
    except TypeError:
        raise TypeError(f"{who}: the start in '{name}' must be an integer, got "
                        f"{start!r}") from None
    if not 0 <= start <= size - length:
        raise ValueError(f"{who}: '{name}' = ({start}, {length}) must lie in [0, {size}]: "
                         f"the start must be in [0, {size - length}]")
    return start, length, start == 0 and length == size


def _int32_start(start):
    """A block start (int or integer scalar, maybe traced) as int32, clamped into range."""
    start = jnp.asarray(start)
    if start.dtype == jnp.int32:
        return start
    lo, hi = jnp.iinfo(jnp.int32).min, jnp.iinfo(jnp.int32).max
    if jnp.issubdtype(start.dtype, jnp.unsignedinteger):
        return jnp.minimum(start, jnp.asarray(hi).astype(start.dtype)).astype(jnp.int32)
    if jnp.iinfo(start.dtype).bits > 32:
        return jnp.clip(start, lo, hi).astype(jnp.int32)
    return start.astype(jnp.int32)


def _signature(weight: Any, seed: Any, x: Any, *, shape: tuple[int, int], prob: float,
               transpose: bool = False, weight_kind: str = "homo",
               backend: str | None = None, rows: Any = None, cols: Any = None) -> jax.Array:
    """The products' signature, ``x`` their input."""


def _operands(who: str, args: dict) -> tuple:
    """The checked weight parameters, structure (seed, threshold table) and static params of
    a call; the spike-list forms have no ``transpose``, ``rows`` or ``cols``."""
    shape = _scaffold.check_shape(args["shape"], who, int32=True)
    prob = check_prob(args["prob"], who)
    theta = weight_params(args["weight"], args["weight_kind"], who)
    seed = seed_word(args["seed"], who)
    params = {"shape": shape, "prob": prob, "transpose": bool(args.get("transpose")),
              "weight_kind": args["weight_kind"]}
    r0, h, all_rows = _window(args.get("rows"), shape[0], who, "rows")
    c0, w, all_cols = _window(args.get("cols"), shape[1], who, "cols")
    if not (all_rows and all_cols):  # a block: its offsets travel with the seed
        if args["backend"] == "pallas":
            raise ValueError(f"{who}: backend 'pallas' does not take 'rows' or 'cols' (a block "
                             f"of W); use backend 'jax' or 'numba'")
        # The starts travel as the uint32 bits of int32 values (the kernels read them
        # back signed); a 64-bit or unsigned start is first clamped into int32, where
        # every start past the matrix gives the same zero block.
        starts = [jax.lax.bitcast_convert_type(_int32_start(v), jnp.uint32).reshape(1)
                  for v in (r0, c0)]
        seed = jnp.concatenate([seed, *starts])
        params["block"] = (h, w)
    return theta, (seed, jnp.asarray(cached_table(prob))), params


FAMILY.def_public(_signature, _operands, {
    "weight": "``weight_kind='homo'``: the weight every synapse shares (scalar); "
              "``'uniform'``: ``(low, high)``; ``'normal'``: ``(mean, std)``. Differentiable.",
    "seed": "an integer (Python or traced): the matrix it describes is :func:`jitc_todense` "
            "of the same arguments.",
    "shape": "``(rows, cols)`` of ``W``; rows are the sources (presynaptic neurons).",
    "prob": "probability of each entry, in ``(0, 1]``.",
    "transpose": "compute ``W.T @ x`` (the same as ``x @ W``), event-driven: only the rows "
                 "whose input is non-zero are generated.",
    "weight_kind": "'homo', 'uniform' or 'normal'.",
    "backend": "force a backend ('numba', 'jax', 'pallas'); default numba on CPU, jax on GPU "
               "and TPU.",
    "rows": "``(start, size)``: use the rows ``start .. start + size - 1`` of ``W`` only "
            "(default all), i.e. ``W[start:start + size]``, the rows of the same global "
            "matrix. ``size`` is a static int; ``start`` may be traced (for example "
            "``jax.lax.axis_index`` times a block size inside ``jax.shard_map``). A traced "
            "start that puts part of the block outside ``W`` (negative, or past its end) "
            "makes that part zero and keeps ``W``'s rows in the rest; a concrete start must "
            "put the whole block inside ``W`` (``ValueError`` otherwise).",
    "cols": "``(start, size)``: the same for the columns: ``W[:, start:start + size]``. Each "
            "generated row stops past the block's last column. With a block the input and "
            "output have the block's lengths; the transpose of a block product is the same "
            "block's product in the other direction. Backends numba and jax.",
    "returns": "The product, dtype of the weights, ``(rows,)`` or ``(rows, k)`` (``(cols,)`` "
               "or ``(cols, k)`` with ``transpose``; a block's lengths with ``rows`` or "
               "``cols``).",
})

jitc_matvec = FAMILY.public(False, False, __name__, """
    ``W @ x`` (or ``W.T @ x``) for the random matrix ``W`` that ``seed`` describes.

    {args}

    Example:
        >>> import numpy as np
        >>> x = np.arange(6.0, dtype=np.float32)
        >>> y = jitc_matvec(0.5, 7, x, shape=(4, 6), prob=0.5)
        >>> np.allclose(y, jitc_todense(7, (4, 6), 0.5, 0.5) @ x)
        True
    """)

binary_jitc_matvec = FAMILY.public(True, False, __name__, """
    ``W @ (e != 0)`` (or ``W.T @ (e != 0)``): the summed weights of active events.

    {args}

    Example:
        >>> import numpy as np
        >>> spikes = np.array([True, False, True, False])
        >>> y = binary_jitc_matvec((0.0, 1.0), 3, spikes, shape=(4, 5), prob=0.6,
        ...                        transpose=True, weight_kind='uniform')
        >>> w = jitc_todense(3, (4, 5), 0.6, (0.0, 1.0), 'uniform')
        >>> np.allclose(y, spikes @ w)
        True
        >>> part = binary_jitc_matvec((0.0, 1.0), 3, spikes, shape=(4, 5), prob=0.6,
        ...                           transpose=True, weight_kind='uniform', cols=(2, 3))
        >>> np.allclose(part, spikes @ w[:, 2:5])  # columns 2 .. 4 of the same matrix
        True
    """)

jitc_matmat = FAMILY.public(False, True, __name__, """
    ``W @ B`` (or ``W.T @ B``) for the random matrix ``W`` that ``seed`` describes.

    {args}

    Example:
        >>> import numpy as np
        >>> b = np.ones((6, 2), np.float32)
        >>> y = jitc_matmat((0.0, 1.0), 1, b, shape=(3, 6), prob=0.5, weight_kind='normal')
        >>> np.allclose(y, jitc_todense(1, (3, 6), 0.5, (0.0, 1.0), 'normal') @ b, atol=1e-5)
        True
    """)

binary_jitc_matmat = FAMILY.public(True, True, __name__, """
    ``W @ (E != 0)`` (or ``W.T @ (E != 0)``) for a matrix of events, one vector a column.

    {args}

    Example:
        >>> import numpy as np
        >>> e = np.array([[True, False], [True, True], [False, False]])
        >>> y = binary_jitc_matmat(1.0, 5, e, shape=(3, 4), prob=0.5, transpose=True)
        >>> np.array_equal(y, jitc_todense(5, (3, 4), 0.5).T @ e)
        True
    """)


# ----------------------------------------------------------------------------- the explicit matrix
def jitc_todense(seed: int, shape: tuple[int, int], prob: float, weight: Any = 1.0,
                 weight_kind: str = "homo", rows: Any = None) -> np.ndarray:
    """The explicit matrix ``W`` that the jitc products with these arguments use (NumPy).

    Computed by a plain Python loop over the generator (independent of the kernels; for
    tests and small matrices). ``rows`` selects some rows only (a ``(len(rows), cols)``
    result), which keeps this usable for spot checks of large matrices.

    Example:
        >>> jitc_todense(7, (2, 6), 0.5, 0.5)
        array([[0.5, 0.5, 0.5, 0. , 0.5, 0.5],
               [0.5, 0.5, 0.5, 0.5, 0. , 0. ]])
    """
    m, n = _scaffold.check_shape(shape, "jitc_todense", int32=True)
    p = check_prob(prob, "jitc_todense")
    check_kind(weight_kind, "jitc_todense")
    theta = [float(v) for v in np.ravel(np.asarray(weight, np.float64))]
    if len(theta) != WEIGHT_KINDS[weight_kind]:
        raise ValueError(f"jitc_todense: 'weight' needs {WEIGHT_KINDS[weight_kind]} value(s) "
                         f"for weight_kind={weight_kind!r}, got {len(theta)}")
    neg = -cached_table(p)[:-1].astype(np.int64)  # ascending
    full = MASK

    def mix(v):
        v ^= v >> 16
        v = (v * MIX_1) & full
        v ^= v >> 15
        v = (v * MIX_2) & full
        return v ^ (v >> 16)

    def uni(h):
        return ((h >> 9) * 2 + 1) * 2.0**-24

    start_key = mix((int(seed) & full) ^ SEED_SALT)
    gamma_key = mix((int(seed) & full) ^ GAMMA_SALT)
    rows = range(m) if rows is None else [int(i) for i in np.ravel(rows)]
    out = np.zeros((len(rows), n))
    for a, i in enumerate(rows):
        h = mix(i ^ ROW_SALT)
        start = mix((h + start_key) & full)
        gamma = mix(h ^ gamma_key) | 1
        if (gamma ^ (gamma >> 1)).bit_count() < FEW_FLIPS:
            gamma ^= FLIP

        def dr(c, start=start, gamma=gamma):  # draw c of this row
            return mix((start + c * gamma) & full)

        j, s = -1, 0
        while True:
            g = int(np.searchsorted(neg, -dr(3 * s), side="left"))  # thresholds > draw
            j += 1 + g
            if j >= n:
                break
            if weight_kind == "homo":
                w = theta[0]
            elif weight_kind == "uniform":
                w = theta[0] + (theta[1] - theta[0]) * uni(dr(3 * s + 1))
            else:
                z = math.sqrt(-2 * math.log(uni(dr(3 * s + 1)))) * math.cos(
                    2 * math.pi * uni(dr(3 * s + 2)))
                w = theta[0] + theta[1] * z
            out[a, j] = w
            s += 1
    return out


# ----------------------------------------------------------------------------- benchmark hooks
FAMILY.install("primforge.ops.jitconn.bench")
