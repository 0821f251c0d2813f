"""Products whose binary events arrive as a spike list: firing indices plus a count.

:func:`build` makes a family's vector and matrix kernels from its ``jax`` reference and
Numba kernels: argument checks, shape rule, JVP, transpose (the weights only), ``vmap``
and a sharding rule that keeps everything whole. An index outside the sources or a count
outside ``[0, len(spikes)]`` gives NaN everywhere (an error on concrete input).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from primforge import _compat
from primforge._compat import Tracer
from primforge.ops import _scaffold, _sharding
from primforge.ops._operator import Form, Operator

__all__ = ["batch_lists", "build", "check_concrete", "list_args", "numba_list_ok",
           ]


# ----------------------------------------------------------------------------- the list
def list_dtype(dtype) -> np.dtype:
    """The dtype a list of ``dtype`` and its count are read in: int64 for a 64-bit list,
    else int32, so a count up to the list's length is exact whatever the list's own range
    (a uint8 list of 256 entries has count 256). A uint32 entry past the int32 range reads
    as negative: outside the sources either way.

    Example:
        >>> list_dtype(np.uint8), list_dtype(np.int64)
        (dtype('int32'), dtype('int64'))
    """
    return np.dtype(np.int64 if np.dtype(dtype).itemsize == 8 else np.int32)


def widen(spikes, count):
    """``spikes`` and ``count`` in :func:`list_dtype` of the list."""
    wide = list_dtype(spikes.dtype)
    return spikes.astype(wide), count.astype(wide)


def valid_entries(spikes, count, size):
    """``(valid, ok)``: which entries are inside the count, and whether the list is good."""
    spikes, count = widen(spikes, count)
    n_list = spikes.shape[0]
    c = count[0]
    valid = jnp.arange(n_list) < c
    bad = jnp.any(valid & ((spikes < 0) | (spikes >= size))) | (c < 0) | (c > n_list)
    return valid, ~bad


@functools.cache
def numba_list_ok():
    """An njit ``list_ok(spikes, count, size) -> bool``: the count is in ``[0, len(spikes)]``
    and every entry inside it is in ``[0, size)`` (the Numba kernels' NaN condition).

    Example:
        >>> import numpy as np
        >>> list_ok = numba_list_ok()
        >>> list_ok(np.array([2, 0, 9]), np.array([2]), 3), list_ok(np.array([3]), np.array([1]), 3)
        (True, False)
    """
    import numba

    @numba.njit(inline="always", nogil=True)
    def list_ok(spikes, count, size):
        c = count[0]
        if c < 0 or c > spikes.shape[0]:
            return False
        for s in range(c):
            if spikes[s] < 0 or spikes[s] >= size:
                return False
        return True

    return list_ok


def check_list(who, spikes, count, matrix):
    """The abstract checks of a spike list and its count (shape rule)."""
    if len(spikes.shape) != 1 + matrix or not jnp.issubdtype(spikes.dtype, jnp.integer):
        want = "a 2-D (lists, length)" if matrix else "a 1-D"
        raise TypeError(f"{who}: 'spike_indices' must be {want} integer array, got "
                        f"{spikes.dtype}{list(spikes.shape)}")
    want_shape = tuple(spikes.shape[:1]) if matrix else (1,)
    if tuple(count.shape) != want_shape or not jnp.issubdtype(count.dtype, jnp.integer):
        want = f"one integer per list, shape {want_shape}" if matrix else "an integer scalar"
        raise TypeError(f"{who}: 'spike_count' must be {want}, got "
                        f"{count.dtype}{list(count.shape)}")


def check_concrete(who, spikes, count, size: int) -> None:
    """Eager checks of a concrete list (a traced one gives NaN in the kernel instead).

    Example:
        >>> import numpy as np
        >>> check_concrete('f', np.array([0, 3]), np.array([2]), 3)
        Traceback (most recent call last):
        ...
        IndexError: f: 'spike_indices' holds 3, outside [0, 3) (the sources of the product)
    """
    if isinstance(spikes, Tracer) or isinstance(count, Tracer):
        return
    s, c = np.asarray(spikes), int(np.asarray(count).reshape(-1)[0])
    if not 0 <= c <= s.shape[0]:
        raise ValueError(f"{who}: 'spike_count' must be in [0, {s.shape[0]}] (the length of "
                         f"'spike_indices'), got {c}")
    bad = s[:c][(s[:c] < 0) | (s[:c] >= size)]
    if bad.size:
        raise IndexError(f"{who}: 'spike_indices' holds {int(bad[0])}, outside [0, {size}) "
                         f"(the sources of the product)")


def _concrete_count(who, count, lengths):
    """Checks a concrete count against the lists' lengths on its own values (before any
    cast), so a count past the int32 range or the list's dtype is named as given."""
    if isinstance(count, Tracer):
        return
    c = np.asarray(count)
    if c.dtype.kind not in "iu":
        return  # the abstract check names the dtype
    for v in c.reshape(-1).tolist():
        if not 0 <= v <= lengths:
            raise ValueError(f"{who}: 'spike_count' must be in [0, {lengths}] (the length of "
                             f"'spike_indices'), got {v}")


def list_args(who, spike_indices, spike_count, size: int, matrix: bool):
    """The public arguments as ``(spikes, count)`` arrays for the kernel, checked, in
    :func:`list_dtype` of the list.

    Example:
        >>> import numpy as np
        >>> s, c = list_args('f', np.array([2, 0]), None, 3, False)
        >>> s.tolist(), c.tolist()
        ([2, 0], [2])
        >>> s, c = list_args('f', np.zeros(256, np.uint8), None, 3, False)
        >>> s.dtype, c.tolist()
        (dtype('int32'), [256])
    """
    spikes = _scaffold.index_array(spike_indices, who, "spike_indices")
    if spike_count is None:
        spike_count = spikes.shape[-1] if spikes.ndim else 0
    if not isinstance(spike_count, Tracer):
        _concrete_count(who, spike_count, spikes.shape[-1] if spikes.ndim else 0)
        c = np.asarray(spike_count)
        if c.dtype.kind in "iu":  # in range (checked): any integer dtype fits the list's
            spike_count = c.astype(list_dtype(spikes.dtype))
    count = jnp.asarray(spike_count)
    if matrix:
        if spikes.ndim == 2 and count.ndim == 0 and jnp.issubdtype(count.dtype, jnp.integer):
            count = jnp.broadcast_to(count, spikes.shape[:1])
    elif count.size == 1 and count.ndim <= 1:
        count = count.reshape(1)
    check_list(who, spikes, count, matrix)
    if not isinstance(spikes, Tracer) and not isinstance(count, Tracer):
        lists, counts = (spikes, count) if matrix else (spikes[None], count)
        for s, c in zip(np.asarray(lists), np.asarray(counts)):
            check_concrete(who, s, c.reshape(1), size)
    return widen(spikes, count)



# ----------------------------------------------------------------------------- kernels
def batch_lists(kernels: dict, matrix: bool, args, axes, kw: dict):
    """``vmap`` of a spike-list product (its last two operands the list and its count):
    over the lists alone, one call of the matrix form ``kernels[True]``; else one call of
    ``kernels[matrix]`` per element (``jax.lax.map``)."""
    if not matrix and all(ax is None for ax in axes[:-2]):
        *fixed, spikes, count = args
        ax_s, ax_c = axes[-2:]
        spikes = jnp.moveaxis(spikes, ax_s, 0) if ax_s is not None else None
        count = jnp.moveaxis(count, ax_c, 0) if ax_c is not None else count
        size = (spikes if spikes is not None else count).shape[0]
        if spikes is None:
            spikes = jnp.broadcast_to(args[-2], (size,) + args[-2].shape)
        count = jnp.broadcast_to(count.reshape(-1), (size,))
        return [kernels[True](*fixed, spikes, count, **kw)], [0]
    moved = [a if ax is None else jnp.moveaxis(a, ax, 0) for a, ax in zip(args, axes)]
    mapped = [ax is not None for ax in axes]

    def one(sliced):
        it = iter(sliced)
        full = [next(it) if mp else a for a, mp in zip(moved, mapped)]
        return kernels[matrix](*full, **kw)

    return [jax.lax.map(one, [a for a, mp in zip(moved, mapped) if mp])], [0]


def build(operator: Operator, name: str, *, who: str, who_mm: str, n_struct: int,
          params: tuple[str, ...], reference: Callable,
          numba_generator: Callable, sizes: Callable, tags: tuple[str, ...],
          bench: tuple[str, str, str], doc: str) -> tuple[Form, Form]:
    """The vector and matrix spike-list forms of one family's kernel.

    Args:
        operator: the family's kernel (forms ``events='spikes'``, ``matrix`` False/True).
        name: name of the vector form (``primforge.ops.<name>``); ``who_mm`` the
            matrix form's public name (its form is ``primforge.ops.<who_mm>``).
        who: the vector form's public name, for messages.
        n_struct: structure operands after the weights (the kernel takes ``(weights,
            *structure, spikes, count)``).
        params: the names of the kernels' static params.
        reference: ``reference(weights, *structure, spikes, valid, **params) -> y``: the
            product over the listed sources (``valid`` marks the entries inside the count;
            ``spikes`` are clipped into range), ``params`` the kernel's static params.
        numba_generator: ``numba_generator(matrix) -> generator`` of the Numba kernels.
        sizes: ``sizes(who, weights, *structure, **params) -> (out, sources)``: checks the
            operands (abstract values) and gives the output length and the sources' count.
        tags: the kernels' tags (``spike_list``, ``event`` and the form are added).
        bench: ``(module, vector cases, matrix cases)`` of the benchmark data.
        doc: the kernels' docstring.

    Example:
        >>> from primforge.ops import dense_event
        >>> dense_event.binary_densemv_spikes_p.name
        'primforge.ops.binary_densemv_spikes'
    """
    kernels = {}
    own = params

    def _params(given: dict[str, Any]) -> dict[str, Any]:
        return {k: given[k] for k in own}

    def full_reference(matrix, kw, dtype):
        def one(weights, *rest):
            *struct, spikes, count = rest
            spikes, count = widen(spikes, count)
            _, size = sizes(who, weights, *struct, **kw)
            valid, ok = valid_entries(spikes, count, size)
            safe = jnp.clip(spikes, 0, max(size - 1, 0))
            y = reference(weights.astype(dtype), *struct, safe, valid, **kw)
            return jnp.where(ok, y, jnp.nan).astype(dtype)

        if not matrix:
            return one
        many = jax.vmap(one, in_axes=(None,) * (1 + n_struct) + (0, 0))
        return lambda weights, *rest: many(weights, *rest[:-1], rest[-1].reshape(-1, 1))

    def jax_generator(matrix):
        def generate(*, outs, **given):
            return full_reference(matrix, _params(given), outs[0].dtype)

        return generate

    def shape_rule(matrix):
        me = who_mm if matrix else who

        def rule(weights, *rest, **given):
            *struct, spikes, count = rest
            out, _ = sizes(me, weights, *struct, **_params(given))
            check_list(me, spikes, count, matrix)
            lead = tuple(spikes.shape[:1]) if matrix else ()
            return jax.ShapeDtypeStruct(lead + (out,), weights.dtype)

        return rule

    def jvp_rule(matrix):
        def jvp(primals, tangents, *, outs, backend=None, **given):
            prim, kw = kernels[matrix], _params(given)
            y = prim(*primals, backend=backend, **kw)
            d_w = tangents[0]
            if type(d_w) is _compat.Zero:
                return [y], [jnp.zeros_like(y)]
            return [y], [prim(d_w, *primals[1:], backend=backend, **kw)]

        return jvp

    def transpose_rule(matrix):
        def rule(cts, weights, *rest, outs, backend=None, **given):
            (ct,) = cts
            none = [None] * (len(rest) + 1)
            if type(ct) is _compat.Zero:
                return none
            if any(_compat.is_undefined_primal(a) for a in rest):
                raise ValueError(f"{who_mm if matrix else who} is linear in the weights only")
            if not _compat.is_undefined_primal(weights):
                return none
            aval = weights.aval
            ref = full_reference(matrix, _params(given), aval.dtype)
            w0 = jnp.zeros(aval.shape, aval.dtype)
            _, pullback = jax.vjp(lambda w: ref(w, *rest), w0)
            (ct_w,) = pullback(jnp.asarray(ct).astype(aval.dtype))
            return [ct_w] + none[1:]

        return rule

    def batching_rule(matrix):
        def batch(args, axes, *, outs, backend=None, **given):
            return batch_lists(kernels, matrix, args, axes, dict(_params(given),
                                                                 backend=backend))

        return batch

    module, vec_cases, mat_cases = bench
    for matrix in (False, True):
        k = operator.form(who_mm if matrix else name, doc=doc, events="spikes", matrix=matrix)
        for platform in ("cpu", "gpu", "tpu"):
            k.def_kernel("jax", platform, jax_generator(matrix))
        k.def_numba_kernel(numba_generator(matrix), asdefault=True)
        k.def_abstract_eval(shape_rule(matrix))
        k.def_jvp_rule(jvp_rule(matrix))
        k.def_transpose_rule(transpose_rule(matrix))
        k.def_batching_rule(batching_rule(matrix))
        k.def_tags(*tags, "event", "matmat" if matrix else "matvec", "spike_list")
        k.def_sharding_rule(_sharding.replicated_rule)
        k.def_benchmark_data(_scaffold.lazy_benchmark_data(
            module, mat_cases if matrix else vec_cases))
        kernels[matrix] = k
    return kernels[False], kernels[True]


