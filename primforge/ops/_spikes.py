"""Products whose binary events arrive compacted: as a spike list or as bit-packed words.

:func:`forms` makes a family's spike-list forms (firing indices plus a count) from its
``jax`` reference and Numba kernels (argument checks, shape rule, JVP, transpose: the
weights only, ``vmap`` and a sharding rule that keeps everything whole) and their public
calls, which take the family's arguments with a list and a count for the input. An index
outside the sources or a count outside ``[0, len(spikes)]`` gives NaN everywhere (an error
on concrete input). :func:`packed` makes the binary vector product's form reading packed
words, on the rules of the product on the unpacked events.
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
from primforge.ops.packed import PackedEvents, pack_events

__all__ = ["batch_lists", "bench_list", "bench_lists", "check_concrete", "check_packed_words",
           "forms", "list_args", "numba_list_ok", "packed"]


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


#: The docstrings' entries of the vector and the matrix spike-list forms that differ from
#: the family's dense forms.
ENTRIES = (
    {"spike_indices": "1-D integer array of firing sources (rows of the matrix for the "
                      "transposed product, else columns), of a fixed length under ``jit`` "
                      "(see :func:`~primforge.ops.spike_list`).",
     "spike_count": "how many leading entries are valid (default: all); later ones are "
                    "ignored.",
     "returns": "The product, dtype of the weights. A valid index outside the sources raises "
                "``IndexError`` on concrete input and gives NaN everywhere under ``jit``, as "
                "does a count outside ``[0, len(spike_indices)]`` (``ValueError`` eagerly)."},
    {"spike_indices": "integer array ``(lists, length)``: one list of firing sources per "
                      "row of the result.",
     "spike_count": "the valid length of each list, shape ``(lists,)``, or one int for all "
                    "(default: every entry is valid).",
     "returns": "The ``(lists, size)`` products, dtype of the weights; a bad list makes its "
                "own row NaN under ``jit``."},
)
BACKEND = "'numba' (CPU default) or 'jax' (reference; GPU/TPU default)."
SEVERAL = """:func:`{who}` for several spike lists of one length at once.

    Row ``b`` of the result is the product with list ``spike_indices[b]`` and count
    ``spike_count[b]``; ``vmap`` of :func:`{who}` over the lists calls this kernel.

    {{args}}

    """


def forms(family, names: tuple[str, str], *, module: str, params: tuple[str, ...],
          reference: Callable, numba_generator: Callable, sizes: Callable,
          tags: tuple[str, ...], bench: tuple[str, str, str], docs: tuple[str, str], doc: str,
          weight_cotangent: Callable | None = None,
          sharding: Callable = _sharding.replicated_rule) -> tuple[tuple, tuple]:
    """The vector and matrix spike-list forms of one family's kernel, and their public calls.

    The calls take the family's arguments (:meth:`~primforge.ops._scaffold.Family.def_public`)
    with the input replaced by ``spike_indices`` and ``spike_count``, and those of its
    keyword arguments that the forms have (``params``, ``backend``).

    Args:
        family: the :class:`~primforge.ops._scaffold.Family` whose kernel gets the forms
            (``events='spikes'``, ``matrix`` False/True).
        names: the public names of the vector and the matrix form (their forms are
            ``primforge.ops.<name>``), functions of ``module``.
        params: the names of the forms' static params.
        reference: ``reference(weights, *structure, spikes, valid, **params) -> y``: the
            product over the listed sources (``valid`` marks the entries inside the count;
            ``spikes`` are clipped into range).
        numba_generator: ``numba_generator(matrix) -> generator`` of the Numba kernels.
        sizes: ``sizes(who, weights, *structure, **params) -> (out, sources)``: checks the
            operands (abstract or concrete) and gives the output length and the sources'
            count.
        tags: the kernels' tags (``spike_list``, ``event`` and the form are added).
        bench: ``(module, vector cases, matrix cases)`` of the benchmark data.
        docs: the vector call's docstring (``{args}`` where the Args section goes) and the
            matrix call's example, after a summary made here.
        doc: the kernels' docstring.
        weight_cotangent: ``weight_cotangent(ct, w_aval, *structure, spikes, count,
            **params)``, one list's cotangent of the weights; default: the reference's.
        sharding: the kernels' sharding rule.

    Returns:
        ``((vector kernel, matrix kernel), (vector call, matrix call))``.

    Example:
        >>> import inspect
        >>> from primforge.ops import binary_csrmm_spikes, binary_csrmm_spikes_p
        >>> binary_csrmm_spikes_p.name
        'primforge.ops.binary_csrmm_spikes'
        >>> list(inspect.signature(binary_csrmm_spikes).parameters)
        ['data', 'indices', 'indptr', 'spike_indices', 'spike_count', 'shape', 'transpose',
         'backend']
    """
    first = [p for p in family.signature.parameters.values() if p.kind is p.POSITIONAL_OR_KEYWORD]
    kernels = _kernels(family.operator, names, params=params,
                       reference=reference, numba_generator=numba_generator, sizes=sizes,
                       tags=tags, bench=bench, doc=doc,
                       weight_cotangent=weight_cotangent, sharding=sharding)
    x = first[-1]
    signature = family.signature.replace(parameters=[
        *first[:-1], x.replace(name="spike_indices"), x.replace(name="spike_count", default=None),
        *(p for p in family.signature.parameters.values()
          if p.kind is p.KEYWORD_ONLY and (p.name in params or p.name == "backend"))])

    def public(matrix):
        who = names[matrix]

        def call(args):
            weights, structure, given = family.operands(who, args)
            kw = {k: given[k] for k in params}
            _, size = sizes(who, weights, *structure, **kw)
            spikes, count = list_args(who, args["spike_indices"], args["spike_count"], size,
                                      matrix)
            return kernels[matrix](weights, *structure, spikes, count,
                                   backend=args["backend"], **kw)

        doc = SEVERAL.format(who=names[0]) + docs[1] if matrix else docs[0]
        entries = dict(family.args, backend=BACKEND, **ENTRIES[matrix])
        fn = _scaffold.public_function(who, module, signature, call,
                                       _scaffold.document(doc, signature, entries))
        kernels[matrix].def_call(fn)
        return fn

    return (kernels[False], kernels[True]), (public(False), public(True))


def _kernels(operator: Operator, names: tuple[str, str], *, params, reference,
             numba_generator, sizes, tags, bench, doc, weight_cotangent=None,
             sharding=_sharding.replicated_rule) -> dict[bool, Form]:
    who, who_mm = names
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

        def many(weights, *rest):  # the weights and structure shared, a list a row
            shared = (None,) * (len(rest) - 1)
            return jax.vmap(one, in_axes=shared + (0, 0))(weights, *rest[:-1],
                                                           rest[-1].reshape(-1, 1))

        return many

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
            aval, ct, kw = weights.aval, jnp.asarray(ct), _params(given)
            if weight_cotangent is not None:  # one list's, the lists' added up
                *struct, spikes, count = rest
                one = lambda c, s, n: weight_cotangent(c, aval, *struct, s, n, **kw)
                if not matrix:
                    return [one(ct, spikes, count)] + none[1:]
                return [jnp.sum(jax.vmap(one)(ct, spikes, count.reshape(-1, 1)), axis=0)
                        ] + none[1:]
            ref = full_reference(matrix, kw, aval.dtype)
            w0 = jnp.zeros(aval.shape, aval.dtype)
            _, pullback = jax.vjp(lambda w: ref(w, *rest), w0)
            (ct_w,) = pullback(ct.astype(aval.dtype))
            return [ct_w] + none[1:]

        return rule

    def batching_rule(matrix):
        def batch(args, axes, *, outs, backend=None, **given):
            return batch_lists(kernels, matrix, args, axes, dict(_params(given),
                                                                 backend=backend))

        return batch

    module, vec_cases, mat_cases = bench
    for matrix in (False, True):
        k = operator.form(names[matrix], doc=doc, events="spikes", matrix=matrix)
        for platform in ("cpu", "gpu", "tpu"):
            k.def_kernel("jax", platform, jax_generator(matrix))
        k.def_numba_kernel(numba_generator(matrix), asdefault=True)
        k.def_abstract_eval(shape_rule(matrix))
        k.def_jvp_rule(jvp_rule(matrix))
        k.def_transpose_rule(transpose_rule(matrix))
        k.def_batching_rule(batching_rule(matrix))
        k.def_tags(*tags, "event", "matmat" if matrix else "matvec", "spike_list")
        k.def_sharding_rule(sharding)
        k.def_benchmark_data(_scaffold.lazy_benchmark_data(
            module, mat_cases if matrix else vec_cases))
        kernels[matrix] = k
    return kernels




# ----------------------------------------------------------------------------- packed words
def check_packed_words(who: str, shape: tuple[int, int], transpose: bool, n: Any,
                       words: Any) -> None:
    """Raise unless ``words`` packs exactly the events a vector product of ``shape`` takes.

    Example:
        >>> import jax
        >>> check_packed_words('binary_csrmv', (40, 3), True, 40,
        ...                    jax.ShapeDtypeStruct((2,), 'uint32'))
        >>> check_packed_words('binary_csrmv', (40, 3), False, 40,
        ...                    jax.ShapeDtypeStruct((2,), 'uint32'))
        Traceback (most recent call last):
        ...
        ValueError: binary_csrmv: packed events for shape (40, 3) (transpose=False) must be 3
        events in 1 uint32 words, got n = 40 in uint32[2]
    """
    m, cols = shape
    want = m if transpose else cols
    n_words = -(-want // 32)
    if int(n) != want or tuple(words.shape) != (n_words,) or words.dtype != np.uint32:
        raise ValueError(f"{who}: packed events for shape {(m, cols)} (transpose="
                         f"{bool(transpose)}) must be {want} events in {n_words} uint32 "
                         f"words, got n = {n} in {words.dtype}{list(words.shape)}")


def packed(family, *, module: str, numba_generator: Callable, tags: tuple[str, ...],
           sharding: Callable, bench: str, doc: str, call_doc: str) -> tuple[Form, Callable]:
    """The family's binary vector product reading bit-packed events, and its public call.

    The kernel takes ``(w, *structure, words)`` with the static ``n`` (events) besides the
    family's params; ``numba_generator`` makes the kernel reading the words, while the
    ``jax`` backend unpacks them and runs the binary vector product's reference (CPU) or
    its default kernel (GPU, TPU). The shape rule and the rules are those of the product
    on the unpacked events (:meth:`~primforge.ops._scaffold.Family.build`'s): linear in
    ``w``, ``vmap`` one batched unpacked product. The call takes the binary vector
    product's arguments (a bool vector is packed first); that product hands its
    :class:`~primforge.ops.PackedEvents` vectors to it from now on.

    Args:
        family: the :class:`~primforge.ops._scaffold.Family` whose kernel gets the form.
        module: the module of the call, named ``<binary vector product>_packed``.
        numba_generator: the generator of the Numba kernel reading the words.
        tags: the kernel's tags (``sparse``, ``event``, ``matvec``, ``packed`` added).
        sharding: the kernel's sharding rule.
        bench: the module whose ``packed`` gives the benchmark cases.
        doc: the kernel's docstring; ``call_doc``: the call's (``{args}`` where the Args
            section goes).

    Example:
        >>> from primforge.ops.csr import packed
        >>> packed.binary_csrmv_packed_p.name, packed.binary_csrmv_packed.__name__
        ('primforge.ops.binary_csrmv_packed', 'binary_csrmv_packed')
    """
    unpacked = family.kernels[(True, False)]
    who = family.name(True, False)
    event = lambda n: jax.ShapeDtypeStruct((n,), np.dtype(bool))
    own = family.own_params

    def events(words, n):
        return PackedEvents(words, n).unpack()

    def shape_rule(*ins, n, shape, transpose, **kw):
        check_packed_words(who, _scaffold.check_shape(shape, who), transpose, n, ins[-1])
        return family.shape_rule(True, False)(*ins[:-1], event(n), shape=shape,
                                              transpose=transpose, **kw)

    def reference(*, ins, outs, n, **kw):
        ref = family.jax_gen(True, False)(ins=(*ins[:-1], event(n)), outs=outs, **own(kw))
        return lambda *a: ref(*a[:-1], events(a[-1], n))

    def delegate(*, n, **kw):
        kw = own(kw)
        return lambda *a: unpacked(*a[:-1], events(a[-1], n), **kw)

    def jvp(primals, tangents, *, outs, backend=None, n, **kw):
        kw = dict(own(kw), n=n, backend=backend)
        y = kernel(*primals, **kw)
        if type(tangents[0]) is _compat.Zero:
            return [y], [jnp.zeros_like(y)]
        return [y], [kernel(tangents[0], *primals[1:], **kw)]

    def transpose(cts, w, *rest, outs, backend=None, n, **kw):
        (ct,), none = cts, [None] * (1 + len(rest))
        if type(ct) is _compat.Zero or not _compat.is_undefined_primal(w):
            return none
        if any(_compat.is_undefined_primal(a) for a in rest):
            raise ValueError(f"{who} is linear in {family.weights!r} only")
        *structure, words = rest
        ct_w = family.weight_cotangent(True, False, jnp.asarray(ct), w.aval, tuple(structure),
                                       events(words, n), backend=backend, **own(kw))
        return [ct_w] + none[1:]

    def batch(args, axes, *, outs, backend=None, n, **kw):
        kw = own(kw)

        def one(*a):
            return unpacked(*a[:-1], events(a[-1], n), backend=backend, **kw)

        return [jax.vmap(one, in_axes=tuple(axes))(*args)], [0]

    def product(args: dict) -> jax.Array:
        words = args["events"]
        if not isinstance(words, PackedEvents):
            words = pack_events(words)
        weights, structure, params = family.operands(who, args)
        return kernel(weights, *structure, words.words, n=int(words.n),
                      backend=args["backend"], **params)

    kernel = family.operator.form(f"{who}_packed", doc=doc, events="packed", matrix=False)
    kernel.def_kernel("jax", "cpu", reference)
    for platform in ("gpu", "tpu"):  # the binary product's own kernel on unpacked events
        kernel.def_kernel("jax", platform, delegate)
    kernel.def_numba_kernel(numba_generator, asdefault=True)
    kernel.def_abstract_eval(shape_rule)
    kernel.def_jvp_rule(jvp)
    kernel.def_transpose_rule(transpose)
    kernel.def_batching_rule(batch)
    kernel.def_tags(*tags, "sparse", "event", "matvec", "packed")
    kernel.def_sharding_rule(sharding)
    kernel.def_benchmark_data(_scaffold.lazy_benchmark_data(bench, "packed"))

    (m, n), signature = family.dims, family.named("events")
    entries = dict(family.args, events=(
        f":class:`~primforge.ops.PackedEvents` of ``{n}`` events (``{m}`` with "
        f"``transpose``), or a bool vector, packed here."), backend=(
        f"'numba' (CPU default) or 'jax' (the reference, on the CPU); on GPU and TPU the "
        f"words are unpacked and the product runs with ``{who}``'s backend."))
    call = _scaffold.public_function(f"{who}_packed", module, signature, product,
                                     _scaffold.document(call_doc, signature, entries))
    kernel.def_call(call)
    family.packed_product = product
    return kernel, call


# ----------------------------------------------------------------------------- benchmark data
def bench_list(rs: np.random.RandomState, n: int) -> tuple[np.ndarray, np.int32]:
    """A benchmark spike list over ``n`` sources and its count: ``2 * BENCH_RATE * n``
    entries, the first one repeated, half of them inside the count."""
    spikes = rs.randint(0, n, int(2 * _scaffold.BENCH_RATE * n)).astype(np.int32)
    spikes[1] = spikes[0]
    return spikes, np.int32(spikes.size // 2)


def bench_lists(configs: list, seed: int) -> list:
    """The matrix forms' benchmark cases: each of the vector form's ``configs`` (square, of
    ``params['n']`` sources) with ``BENCH_COLS`` lists of its own and their counts."""
    from primforge.bench import BenchmarkConfig

    out = []
    for i, cfg in enumerate(configs):
        rs = np.random.RandomState(seed + 300 + i)
        *fixed, spikes, _ = cfg.args
        lists = rs.randint(0, cfg.params["n"], (_scaffold.BENCH_COLS, spikes.size))
        counts = rs.randint(0, spikes.size + 1, _scaffold.BENCH_COLS).astype(np.int32)
        out.append(BenchmarkConfig(args=(*fixed, lists.astype(np.int32), counts),
                                   kwargs=cfg.kwargs,
                                   params=dict(cfg.params, lists=_scaffold.BENCH_COLS)))
    return out
