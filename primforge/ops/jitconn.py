"""Just-in-time (procedural) connectivity: products with a random matrix that is never stored.

Design:
    * ``W`` (shape ``(m, n)``; rows are the sources, i.e. presynaptic neurons) holds each entry
      independently with probability ``prob``. Row ``i`` is regenerated from ``seed`` inside
      the kernel whenever it is needed, with a counter-based generator that every backend
      computes with the same integer operations, so the connectivity is bit-for-bit the same
      on every backend, in both directions (``W @ x`` and ``W.T @ x`` use the same rows) and
      for every weight kind. Memory: the output plus a table of about ``22 / prob`` uint32
      thresholds (depends on ``prob`` only, never on the matrix size or nnz).
    * The generator (all arithmetic on uint32, wrapping):
      ``mix`` is a 32-bit integer finaliser (xor-shift, multiply, xor-shift, multiply,
      xor-shift); ``key = mix(seed ^ SEED_SALT)``; row ``i`` has ``r_i = mix(key +
      mix(i ^ ROW_SALT))``; its ``c``-th draw is ``d(i, c) = mix(r_i + (c + 1) * GOLDEN)``.
      Synapse ``s`` of a row uses draws ``3s`` (its gap), ``3s + 1`` and ``3s + 2`` (its
      weight). The gap is a geometric variate found without floating point: ``g = #{k >= 1 :
      d < T_k}`` with ``T_k = floor((1 - prob)^k * 2**32)`` (the threshold table, computed
      once on the host in float64), so ``P(g >= k) = (1 - prob)^k``; the next column is
      ``previous + 1 + g``, and the row ends at the first column ``>= n``: every entry is
      present independently with probability ``prob`` and the work is O(nnz).
      ``unit(d) = (2 * (d >> 9) + 1) * 2**-24`` (exact in float32, in ``(0, 1)``) gives the
      weights: ``'homo'`` one shared weight; ``'uniform'`` ``low + (high - low) * unit(d1)``;
      ``'normal'`` ``mean + std * sqrt(-2 log unit(d1)) * cos(2 pi unit(d2))``. Weights are
      floating-point functions of exact integers: equal across backends up to rounding.
    * Four :class:`~primforge.XLACustomKernel` objects (float or binary input, vector or
      matrix), each taking ``(theta, seed, table, x)``: ``theta`` the weight parameters
      (``(w,)``, ``(low, high)`` or ``(mean, std)``), ``seed`` a ``(1,)`` uint32 array,
      ``table`` the thresholds; static params ``shape``, ``prob``, ``transpose`` and
      ``weight_kind``. Backends: ``jax`` (reference: all rows advance together one synapse
      per step of a ``while_loop``, the gap found by a fixed-length binary search; work
      ``rows x longest row``), ``numba`` (CPU default; event-driven, see
      :mod:`primforge.ops._numba_jitconn`) and ``pallas`` (blocks of rows per program;
      Triton on the GPU, interpreted on the CPU; :mod:`primforge.ops._pallas_jitconn`).
    * Autodiff: every weight kind is linear in ``theta`` (``low + (high - low) u = low (1 - u)
      + high u``), so the product is bilinear in ``(theta, x)``: the JVP is two kernel calls,
      the transpose w.r.t. ``x`` is the float kernel with ``transpose`` flipped, and w.r.t.
      ``theta`` one kernel call per parameter with a unit parameter vector. The seed and the
      table are integers (no tangent).
    * Batching: ``vmap`` over ``x`` alone is one matmat call (the batch becomes columns);
      anything else (a batch of seeds or weights) maps the kernel with ``lax.map``.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from primforge import _compat
from primforge.kernel.kernel import XLACustomKernel

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

WEIGHT_KINDS = {"homo": 1, "uniform": 2, "normal": 2}  # kind -> number of parameters
SEED_SALT = 0x3C6EF372
ROW_SALT = 0x85EBCA6B
GOLDEN = 0x9E3779B9
MIX_1 = 0x7FEB352D
MIX_2 = 0x846CA68B
MAX_TABLE = 2**23  # thresholds; prob >= ~2.7e-6

KERNELS: dict[tuple[bool, bool], XLACustomKernel] = {}  # (binary, matrix) -> kernel


# ----------------------------------------------------------------------------- the generator
def check_prob(prob: Any, who: str) -> float:
    """``prob`` as a float in ``(0, 1]``, or a clear error."""
    try:
        p = float(prob)
    except (TypeError, ValueError):
        raise TypeError(f"{who}: 'prob' must be a float in (0, 1], got {prob!r}") from None
    if not 0.0 < p <= 1.0:
        raise ValueError(f"{who}: 'prob' must be in (0, 1], got {prob!r}")
    return p


@functools.lru_cache(maxsize=64)
def _table(p: float) -> np.ndarray:
    if p >= 1.0:
        return np.zeros(1, np.uint32)
    logq = math.log1p(-p)
    k_max = int(32 * math.log(2) / -logq) + 2
    if k_max > MAX_TABLE:
        raise ValueError(
            f"jitc: 'prob' = {p} is too small: its threshold table would hold {k_max} entries "
            f"(at most {MAX_TABLE}, i.e. prob >= {22.2 / MAX_TABLE:.1e}); store the matrix as "
            f"CSR instead"
        )
    ks = np.arange(1, k_max + 1, dtype=np.float64)
    t = np.floor(np.exp(ks * logq) * 2.0**32)
    t = t[t >= 1.0]
    out = np.zeros(t.size + 1, np.uint32)  # the trailing 0 ends every search
    out[:-1] = np.minimum(t, 2.0**32 - 1).astype(np.uint32)
    out.setflags(write=False)
    return out


def threshold_table(prob: float) -> np.ndarray:
    """The gap thresholds of connection probability ``prob`` (read-only uint32 array).

    Entry ``k - 1`` is ``floor((1 - prob)**k * 2**32)`` for ``k = 1 .. K`` (every
    non-zero one), followed by a 0. A gap of ``g`` columns follows a draw ``d`` when
    exactly ``g`` entries exceed ``d``.

    Example:
        >>> t = threshold_table(0.5)
        >>> [int(v) for v in t[:3]], int(t[-1]), t.size
        ([2147483648, 1073741824, 536870912], 0, 33)
    """
    return _table(check_prob(prob, "threshold_table"))


def mix32(x):
    """The 32-bit integer finaliser of the generator, on uint32 arrays (wrapping)."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(MIX_1)
    x = x ^ (x >> 15)
    x = x * jnp.uint32(MIX_2)
    return x ^ (x >> 16)


def row_keys(seed, rows):
    """Per-row keys ``r_i`` for uint32 ``seed`` (scalar) and int ``rows``."""
    key = mix32(seed ^ jnp.uint32(SEED_SALT))
    return mix32(key + mix32(rows.astype(jnp.uint32) ^ jnp.uint32(ROW_SALT)))


def draw(keys, c):
    """Draw ``c`` (uint32 scalar) of every row key."""
    return mix32(keys + (c + jnp.uint32(1)) * jnp.uint32(GOLDEN))


def unit(h):
    """A uint32 draw as a float32 in (0, 1): an odd multiple of 2**-24 (exact)."""
    odd = ((h >> 9) * jnp.uint32(2) + jnp.uint32(1)).astype(jnp.int32)
    return odd.astype(jnp.float32) * jnp.float32(2.0**-24)


def gap(u, load, k_max: int):
    """Number of thresholds above ``u``: a fixed-length binary search through ``load``."""
    lo = jnp.zeros(u.shape, jnp.int32)
    hi = jnp.full(u.shape, k_max, jnp.int32)
    for _ in range(int(k_max).bit_length()):
        mid = (lo + hi) // 2
        le = load(mid) <= u
        hi = jnp.where(le, mid, hi)
        lo = jnp.where(le, lo, mid + 1)
    return lo


def next_column(j, alive, u, load, k_max: int, n: int):
    """Advance each live row to its next column; a row dies at the first column >= n."""
    g = gap(u, load, k_max)
    fits = alive & (g < n - 1 - j)
    return jnp.where(fits, j + 1 + g, j), fits


def weights(theta, keys, s, kind: str, dtype):
    """The weight of synapse ``s`` (uint32 scalar) of every row, in ``dtype``."""
    if kind == "homo":
        return jnp.broadcast_to(theta[0], keys.shape).astype(dtype)
    three = jnp.uint32(3)
    u1 = unit(draw(keys, three * s + jnp.uint32(1))).astype(dtype)
    if kind == "uniform":
        return theta[0] + (theta[1] - theta[0]) * u1
    u2 = unit(draw(keys, three * s + jnp.uint32(2))).astype(dtype)
    z = jnp.sqrt(-2 * jnp.log(u1)) * jnp.cos((2 * np.pi) * u2)
    return theta[0] + theta[1] * z


# ----------------------------------------------------------------------------- jax reference
def _jax_generator(binary: bool, matrix: bool):
    def generate(*, ins, outs, shape, transpose, weight_kind, **_):
        m, n = shape
        dtype = outs[0].dtype
        k_max = int(ins[2].shape[0]) - 1

        def kernel(theta, seed, table, x):
            if min(m, n) == 0:
                return jnp.zeros(outs[0].shape, dtype)
            ev = (x != 0).astype(dtype) if binary else x.astype(dtype)
            keys = row_keys(seed[0], jnp.arange(m, dtype=jnp.int32))
            load = lambda idx: table[idx]  # noqa: E731
            if transpose:
                alive0 = jnp.any(ev != 0, axis=1) if matrix else ev != 0
            else:
                alive0 = jnp.ones((m,), bool)
            y0 = jnp.zeros(outs[0].shape, dtype)

            def cond(state):
                return jnp.any(state[2])

            def body(state):
                s, j, alive, y = state
                j, alive = next_column(j, alive, draw(keys, jnp.uint32(3) * s), load, k_max, n)
                w = weights(theta, keys, s, weight_kind, dtype)
                if transpose:  # y[j_i] += w_i x[i], only rows still alive
                    contrib = w[:, None] * ev if matrix else w * ev
                    y = y.at[jnp.where(alive, j, n)].add(contrib, mode="drop")
                else:  # y[i] += w_i x[j_i]
                    got = ev[jnp.where(alive, j, 0)]
                    live = alive[:, None] if matrix else alive
                    y = y + jnp.where(live, (w[:, None] if matrix else w) * got, 0)
                return s + jnp.uint32(1), j, alive, y

            init = (jnp.uint32(0), jnp.full((m,), -1, jnp.int32), alive0, y0)
            return jax.lax.while_loop(cond, body, init)[3]

        return kernel

    return generate


def _numba_generator(binary: bool, matrix: bool):
    def generate(*, prob, transpose, weight_kind, **_):
        from primforge.ops import _numba_jitconn

        return _numba_jitconn.kernel(binary, matrix, bool(transpose), weight_kind, float(prob))

    return generate


def _pallas_generator(binary: bool, matrix: bool):
    def generate(**kw):
        from primforge.ops import _pallas_jitconn

        return _pallas_jitconn.generator(binary, matrix, _jax_generator(binary, matrix))(**kw)

    return generate


# ----------------------------------------------------------------------------- shape rule
def _name(binary: bool, matrix: bool) -> str:
    return ("binary_" if binary else "") + ("jitc_matmat" if matrix else "jitc_matvec")


def _shape_rule(binary: bool, matrix: bool):
    who = _name(binary, matrix)

    def rule(theta, seed, table, x, *, shape, prob, transpose, weight_kind, **_):
        m, n = _check_shape(shape, who)
        p = check_prob(prob, who)
        _check_kind(weight_kind, who)
        want_theta = (WEIGHT_KINDS[weight_kind],)
        if tuple(theta.shape) != want_theta or not jnp.issubdtype(theta.dtype, jnp.floating):
            raise ValueError(
                f"{who}: the weight parameters must be a float array of shape {want_theta} for "
                f"weight_kind={weight_kind!r}, got {theta.dtype}{list(theta.shape)}"
            )
        if tuple(seed.shape) != (1,) or seed.dtype != jnp.uint32:
            raise ValueError(f"{who}: 'seed' must be a (1,) uint32 array, got "
                             f"{seed.dtype}{list(seed.shape)}")
        want_table = _table(p).shape
        if tuple(table.shape) != want_table or table.dtype != jnp.uint32:
            raise ValueError(f"{who}: 'table' must be threshold_table({p}) (uint32{list(want_table)}), "
                             f"got {table.dtype}{list(table.shape)}")
        rows_in, rows_out = (m, n) if transpose else (n, m)
        want = 2 if matrix else 1
        if len(x.shape) != want or x.shape[0] != rows_in:
            what = f"({rows_in}, k)" if matrix else f"({rows_in},)"
            op = "W.T @ x" if transpose else "W @ x"
            raise ValueError(f"{who}: for {op} with W of shape {(m, n)} the input must have "
                             f"shape {what}, got {tuple(x.shape)}")
        if not binary and not jnp.issubdtype(x.dtype, jnp.floating):
            raise TypeError(f"{who}: the input must be floating point, got {x.dtype}; use "
                            f"binary_{who} for bool or integer events")
        return jax.ShapeDtypeStruct((rows_out,) + tuple(x.shape[1:]), theta.dtype)

    return rule


def _check_shape(shape, who):
    try:
        m, n = (int(s) for s in shape)
    except (TypeError, ValueError):
        raise TypeError(f"{who}: 'shape' must be a pair of ints (rows, cols), got {shape!r}") from None
    if m < 0 or n < 0 or max(m, n) >= 2**31 - 1:
        raise ValueError(f"{who}: 'shape' must be non-negative and below 2**31 - 1, got {shape!r}")
    return m, n


def _check_kind(kind, who):
    if kind not in WEIGHT_KINDS:
        raise ValueError(f"{who}: 'weight_kind' must be one of {sorted(WEIGHT_KINDS)}, got {kind!r}")


# ----------------------------------------------------------------------------- rules
def _call(binary, matrix, theta, seed, table, x, *, shape, prob, transpose, weight_kind,
          backend=None):
    return KERNELS[(binary, matrix)](theta, seed, table, x, shape=shape, prob=prob,
                                     transpose=transpose, weight_kind=weight_kind,
                                     backend=backend)


def _jvp_rule(binary: bool, matrix: bool):
    def jvp(primals, tangents, *, outs, backend=None, **kw):
        theta, seed, table, x = primals
        d_theta, _, _, d_x = tangents
        kw = {k: kw[k] for k in ("shape", "prob", "transpose", "weight_kind")}
        y = _call(binary, matrix, theta, seed, table, x, backend=backend, **kw)
        t = None
        if type(d_theta) is not _compat.Zero:  # linear in theta
            t = _call(binary, matrix, d_theta, seed, table, x, backend=backend, **kw)
        if type(d_x) is not _compat.Zero:
            tx = _call(False, matrix, theta, seed, table, d_x.astype(theta.dtype),
                       backend=backend, **kw)
            t = tx if t is None else t + tx
        return [y], [t]

    return jvp


def _transpose_rule(binary: bool, matrix: bool):
    def transpose_rule(cts, theta, seed, table, x, *, outs, backend=None, **kw):
        (ct,) = cts
        kw = {k: kw[k] for k in ("shape", "prob", "transpose", "weight_kind")}
        if type(ct) is _compat.Zero:
            return [None, None, None, None]
        if _compat.is_undefined_primal(seed) or _compat.is_undefined_primal(table):
            raise ValueError("jitc products are not linear in 'seed' or the threshold table")
        if _compat.is_undefined_primal(x):
            if _compat.is_undefined_primal(theta):
                raise ValueError("jitc products are bilinear: transpose w.r.t. the weights or "
                                 "x, not both")
            flipped = dict(kw, transpose=not kw["transpose"])
            ct_x = _call(False, matrix, theta, seed, table, ct, backend=backend, **flipped)
            return [None, None, None, ct_x.astype(x.aval.dtype)]
        if _compat.is_undefined_primal(theta):
            ct = jnp.asarray(ct)
            dtype = theta.aval.dtype
            size = theta.aval.shape[0]
            grads = []
            for k in range(size):  # <ct, W(e_k) x>: one kernel call per weight parameter
                e_k = jnp.zeros((size,), dtype).at[k].set(1)
                y_k = _call(binary, matrix, e_k, seed, table, x, backend=backend, **kw)
                grads.append(jnp.sum(ct * y_k))
            return [jnp.stack(grads).astype(dtype), None, None, None]
        return [None, None, None, None]

    return transpose_rule


def _batching_rule(binary: bool, matrix: bool):
    def batch(args, axes, *, outs, backend=None, **kw):
        kw = {k: kw[k] for k in ("shape", "prob", "transpose", "weight_kind")}
        theta, seed, table, x = args
        if axes[0] is None and axes[1] is None and axes[2] is None:
            # Only the input is batched: the batch becomes extra columns of one matmat call.
            xb = jnp.moveaxis(x, axes[3], 1)  # (rows_in, batch) or (rows_in, batch, k)
            size = xb.shape[1]
            flat = xb.reshape(xb.shape[0], -1)
            y = _call(binary, True, theta, seed, table, flat, backend=backend, **kw)
            return [y.reshape((y.shape[0], size) + tuple(xb.shape[2:]))], [1]
        moved = [a if ax is None else jnp.moveaxis(a, ax, 0) for a, ax in zip(args, axes)]
        mapped = [ax is not None for ax in axes]

        def one(sliced):
            it = iter(sliced)
            full = [next(it) if mp else a for a, mp in zip(moved, mapped)]
            return _call(binary, matrix, *full, backend=backend, **kw)

        return [jax.lax.map(one, [a for a, mp in zip(moved, mapped) if mp])], [0]

    return batch


def _make_kernel(binary: bool, matrix: bool) -> XLACustomKernel:
    kernel = XLACustomKernel("primforge.ops." + _name(binary, matrix), doc=__doc__, replace=True)
    gen = _jax_generator(binary, matrix)
    for platform in ("cpu", "gpu", "tpu"):
        kernel.def_kernel("jax", platform, gen)
    kernel.def_numba_kernel(_numba_generator(binary, matrix), asdefault=True)
    kernel.def_pallas_kernel("gpu", _pallas_generator(binary, matrix))
    kernel.def_pallas_kernel("cpu", _pallas_generator(binary, matrix))
    kernel.def_abstract_eval(_shape_rule(binary, matrix))
    kernel.def_jvp_rule(_jvp_rule(binary, matrix))
    kernel.def_transpose_rule(_transpose_rule(binary, matrix))
    kernel.def_batching_rule(_batching_rule(binary, matrix))
    kernel.def_tags("jitconn", "sparse", "event" if binary else "float",
                    "matmat" if matrix else "matvec")
    KERNELS[(binary, matrix)] = kernel
    return kernel


jitc_matvec_p = _make_kernel(binary=False, matrix=False)
binary_jitc_matvec_p = _make_kernel(binary=True, matrix=False)
jitc_matmat_p = _make_kernel(binary=False, matrix=True)
binary_jitc_matmat_p = _make_kernel(binary=True, matrix=True)


# ----------------------------------------------------------------------------- public calls
def _theta(weight, weight_kind, who):
    _check_kind(weight_kind, who)
    theta = jnp.asarray(weight)
    if not jnp.issubdtype(theta.dtype, jnp.floating):
        theta = theta.astype(jnp.result_type(float))
    want = WEIGHT_KINDS[weight_kind]
    if theta.size != want or theta.ndim > 1:
        what = {"homo": "a scalar", "uniform": "a pair (low, high)",
                "normal": "a pair (mean, std)"}[weight_kind]
        raise ValueError(f"{who}: 'weight' must be {what} for weight_kind={weight_kind!r}, got "
                         f"shape {tuple(theta.shape)}")
    return theta.reshape(want)


def _seed(seed, who):
    s = seed if isinstance(seed, jax.Array) or hasattr(seed, "aval") else np.asarray(seed)
    if not jnp.issubdtype(s.dtype, jnp.integer) or s.size != 1:
        raise TypeError(f"{who}: 'seed' must be one integer, got {getattr(s, 'dtype', s)}"
                        f"{list(getattr(s, 'shape', ()))}")
    if isinstance(s, np.ndarray):  # any Python or NumPy integer, taken modulo 2**32
        return jnp.asarray(np.asarray(int(s.reshape(())) % 2**32, np.uint32).reshape(1))
    return s.reshape(1).astype(jnp.uint32)


def _public(binary: bool, matrix: bool, weight, seed, x, *, shape, prob, transpose,
            weight_kind, backend):
    who = _name(binary, matrix)
    shape = _check_shape(shape, who)
    prob = check_prob(prob, who)
    theta = _theta(weight, weight_kind, who)
    x = jnp.asarray(x)
    if not binary:
        if not jnp.issubdtype(x.dtype, jnp.floating):
            x = x.astype(theta.dtype)
        elif x.dtype != theta.dtype:
            x = x.astype(jnp.promote_types(x.dtype, theta.dtype))
            theta = theta.astype(x.dtype)
    table = jnp.asarray(_table(prob))
    return _call(binary, matrix, theta, _seed(seed, who), table, x, shape=shape, prob=prob,
                 transpose=bool(transpose), weight_kind=weight_kind, backend=backend)


_ARGS_DOC = """
    Args:
        weight: ``weight_kind='homo'``: the weight every synapse shares (scalar);
            ``'uniform'``: ``(low, high)``; ``'normal'``: ``(mean, std)``. Differentiable.
        seed: an integer (Python or traced): the matrix it describes is
            :func:`jitc_todense` of the same arguments.
        {xname}
        shape: ``(rows, cols)`` of ``W``; rows are the sources (presynaptic neurons).
        prob: probability of each entry, in ``(0, 1]``.
        transpose: compute ``W.T @ x`` (the same as ``x @ W``), event-driven: only the
            rows whose input is non-zero are generated.
        weight_kind: 'homo', 'uniform' or 'normal'.
        backend: force a backend ('numba', 'jax', 'pallas'); default numba on CPU, jax on
            GPU and TPU.
"""


def jitc_matvec(weight: Any, seed: Any, x: Any, *, shape: tuple[int, int], prob: float,
                transpose: bool = False, weight_kind: str = "homo",
                backend: str | None = None) -> jax.Array:
    """``W @ x`` (or ``W.T @ x``) for the random matrix ``W`` that ``seed`` describes.

    {args}
    Returns:
        The product, dtype of the weights.

    Example:
        >>> import numpy as np
        >>> x = np.arange(6.0, dtype=np.float32)
        >>> y = jitc_matvec(0.5, 7, x, shape=(4, 6), prob=0.5)
        >>> np.allclose(y, jitc_todense(7, (4, 6), 0.5, 0.5) @ x)
        True
    """
    return _public(False, False, weight, seed, x, shape=shape, prob=prob, transpose=transpose,
                   weight_kind=weight_kind, backend=backend)


def binary_jitc_matvec(weight: Any, seed: Any, events: Any, *, shape: tuple[int, int],
                       prob: float, transpose: bool = False, weight_kind: str = "homo",
                       backend: str | None = None) -> jax.Array:
    """``W @ (e != 0)`` (or ``W.T @ (e != 0)``): the summed weights of active events.

    {args}
    Returns:
        The product, dtype of the weights.

    Example:
        >>> import numpy as np
        >>> spikes = np.array([True, False, True, False])
        >>> y = binary_jitc_matvec((0.0, 1.0), 3, spikes, shape=(4, 5), prob=0.6,
        ...                        transpose=True, weight_kind='uniform')
        >>> w = jitc_todense(3, (4, 5), 0.6, (0.0, 1.0), 'uniform')
        >>> np.allclose(y, spikes @ w)
        True
    """
    return _public(True, False, weight, seed, events, shape=shape, prob=prob,
                   transpose=transpose, weight_kind=weight_kind, backend=backend)


def jitc_matmat(weight: Any, seed: Any, x: Any, *, shape: tuple[int, int], prob: float,
                transpose: bool = False, weight_kind: str = "homo",
                backend: str | None = None) -> jax.Array:
    """``W @ B`` (or ``W.T @ B``) for the random matrix ``W`` that ``seed`` describes.

    {args}
    Returns:
        The ``(rows, k)`` (or ``(cols, k)``) product, dtype of the weights.

    Example:
        >>> import numpy as np
        >>> b = np.ones((6, 2), np.float32)
        >>> y = jitc_matmat((0.0, 1.0), 1, b, shape=(3, 6), prob=0.5, weight_kind='normal')
        >>> np.allclose(y, jitc_todense(1, (3, 6), 0.5, (0.0, 1.0), 'normal') @ b, atol=1e-5)
        True
    """
    return _public(False, True, weight, seed, x, shape=shape, prob=prob, transpose=transpose,
                   weight_kind=weight_kind, backend=backend)


def binary_jitc_matmat(weight: Any, seed: Any, events: Any, *, shape: tuple[int, int],
                       prob: float, transpose: bool = False, weight_kind: str = "homo",
                       backend: str | None = None) -> jax.Array:
    """``W @ (E != 0)`` (or ``W.T @ (E != 0)``) for a matrix of events, one vector a column.

    {args}
    Returns:
        The ``(rows, k)`` (or ``(cols, k)``) product, dtype of the weights.

    Example:
        >>> import numpy as np
        >>> e = np.array([[True, False], [True, True], [False, False]])
        >>> y = binary_jitc_matmat(1.0, 5, e, shape=(3, 4), prob=0.5, transpose=True)
        >>> np.array_equal(y, jitc_todense(5, (3, 4), 0.5).T @ e)
        True
    """
    return _public(True, True, weight, seed, events, shape=shape, prob=prob,
                   transpose=transpose, weight_kind=weight_kind, backend=backend)


for _fn, _x in ((jitc_matvec, "x: float vector of length ``cols`` (``rows`` with ``transpose``)."),
                (binary_jitc_matvec, "events: bool (or numeric: non-zero is active) vector of "
                 "length ``cols`` (``rows`` with ``transpose``)."),
                (jitc_matmat, "x: float matrix ``(cols, k)`` (``(rows, k)`` with ``transpose``)."),
                (binary_jitc_matmat, "events: bool (or numeric) matrix ``(cols, k)`` (``(rows, "
                 "k)`` with ``transpose``).")):
    _fn.__doc__ = _fn.__doc__.replace("{args}", _ARGS_DOC.format(xname=_x).strip())
del _fn, _x


# ----------------------------------------------------------------------------- the explicit matrix
def jitc_todense(seed: int, shape: tuple[int, int], prob: float, weight: Any = 1.0,
                 weight_kind: str = "homo", rows: Any = None) -> np.ndarray:
    """The explicit matrix ``W`` that the jitc products with these arguments use (NumPy).

    Computed by a plain Python loop over the generator (independent of the kernels; for
    tests and small matrices). ``rows`` selects some rows only (a ``(len(rows), cols)``
    result), which keeps this usable for spot checks of large matrices.

    Example:
        >>> jitc_todense(7, (2, 6), 0.5, 0.5)
        array([[0. , 0. , 0. , 0.5, 0.5, 0.5],
               [0. , 0.5, 0.5, 0. , 0.5, 0. ]])
    """
    m, n = _check_shape(shape, "jitc_todense")
    p = check_prob(prob, "jitc_todense")
    _check_kind(weight_kind, "jitc_todense")
    theta = [float(v) for v in np.ravel(np.asarray(weight, np.float64))]
    if len(theta) != WEIGHT_KINDS[weight_kind]:
        raise ValueError(f"jitc_todense: 'weight' needs {WEIGHT_KINDS[weight_kind]} value(s) "
                         f"for weight_kind={weight_kind!r}, got {len(theta)}")
    neg = -_table(p)[:-1].astype(np.int64)  # ascending
    full = 0xFFFFFFFF

    def mix(v):
        v ^= v >> 16
        v = (v * MIX_1) & full
        v ^= v >> 15
        v = (v * MIX_2) & full
        return v ^ (v >> 16)

    def dr(r, c):
        return mix((r + (c + 1) * GOLDEN) & full)

    def uni(h):
        return ((h >> 9) * 2 + 1) * 2.0**-24

    key = mix((int(seed) & full) ^ SEED_SALT)
    rows = range(m) if rows is None else [int(i) for i in np.ravel(rows)]
    out = np.zeros((len(rows), n))
    for a, i in enumerate(rows):
        r = mix((key + mix(i ^ ROW_SALT)) & full)
        j, s = -1, 0
        while True:
            g = int(np.searchsorted(neg, -dr(r, 3 * s), side="left"))  # thresholds > draw
            j += 1 + g
            if j >= n:
                break
            if weight_kind == "homo":
                w = theta[0]
            elif weight_kind == "uniform":
                w = theta[0] + (theta[1] - theta[0]) * uni(dr(r, 3 * s + 1))
            else:
                z = math.sqrt(-2 * math.log(uni(dr(r, 3 * s + 1)))) * math.cos(
                    2 * math.pi * uni(dr(r, 3 * s + 2)))
                w = theta[0] + theta[1] * z
            out[a, j] = w
            s += 1
    return out


# ----------------------------------------------------------------------------- benchmark hooks
_BENCH_RATE = 0.05
_BENCH_COLS = 8
# (n, prob, transpose, weight_kind)
_BENCH_CASES = ((1000, 0.05, False, "homo"), (1000, 0.05, True, "homo"),
                (2000, 0.02, True, "uniform"), (2000, 0.02, False, "normal"))


def _benchmark_data(binary: bool, matrix: bool):
    def configs(*, platform: str) -> list:
        del platform
        from primforge.bench import BenchmarkConfig

        out = []
        for i, (n, prob, transpose, kind) in enumerate(_BENCH_CASES):
            rs = np.random.RandomState(4321 + i)
            xshape = (n, _BENCH_COLS) if matrix else (n,)
            active = rs.random_sample(xshape) < _BENCH_RATE
            x = active if binary else np.where(active, rs.standard_normal(xshape), 0.0).astype(
                np.float32)
            weight = np.float32(0.5) if kind == "homo" else np.array([0.1, 0.5], np.float32)
            params = {"n": n, "p": prob, "rate": _BENCH_RATE, "transpose": transpose,
                      "weight": kind}
            if matrix:
                params["k"] = _BENCH_COLS
            out.append(BenchmarkConfig(
                args=(weight, 1234 + i, x),
                kwargs={"shape": (n, n), "prob": prob, "transpose": transpose,
                        "weight_kind": kind},
                params=params,
            ))
        return out

    return configs


for (_binary, _matrix), _public_fn in {
    (False, False): jitc_matvec,
    (True, False): binary_jitc_matvec,
    (False, True): jitc_matmat,
    (True, True): binary_jitc_matmat,
}.items():
    KERNELS[(_binary, _matrix)].def_call(_public_fn)
    KERNELS[(_binary, _matrix)].def_benchmark_data(_benchmark_data(_binary, _matrix))
del _binary, _matrix, _public_fn
