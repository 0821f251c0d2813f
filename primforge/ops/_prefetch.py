"""Software prefetch for the Numba kernels (Numba is imported only when a kernel is built).

A delayed product adds each synapse's weight into a ring buffer far larger than the CPU's
caches, at a target and slot that change from one synapse to the next: each addition
misses the cache, and a kernel that reads, adds and writes one target after another waits
for each miss in turn. The delayed kernels compute a chunk of targets first, asking for
each of them as it is computed (:func:`prefetcher`), then do the chunk's additions in the
order they were computed: the misses overlap. A prefetch is a hint: it never faults (an
address outside the array included) and never changes a value.
"""

from __future__ import annotations

import functools

import numpy as np

#: Additions whose targets are computed and prefetched before they are done.
CHUNK = 256


@functools.cache
def prefetcher():
    """An njit ``prefetch(array, index)``: brings the cache line of ``array[index]`` (a 1-d
    array) close, ready to be written (LLVM's ``llvm.prefetch``)."""
    from llvmlite import ir
    from numba.core import types
    from numba.extending import intrinsic

    @intrinsic
    def prefetch(typingctx, array, index):
        if not (isinstance(array, types.Array) and array.ndim == 1
                and isinstance(index, types.Integer)):
            return None

        def codegen(context, builder, signature, args):
            view = context.make_array(signature.args[0])(context, builder, args[0])
            address = builder.gep(view.data, [args[1]])
            byte_ptr, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
            # The intrinsic's name carries its pointer type: "p0" where LLVM's pointers are
            # opaque (llvmlite prints them "ptr"), "p0i8" where they are typed.
            name = "llvm.prefetch." + ("p0" if str(byte_ptr) == "ptr" else "p0i8")
            module = builder.module
            fn = module.globals.get(name)
            if fn is None:  # (address, rw: 1 = write, locality: 3 = every level, 1 = data)
                fn = ir.Function(module, ir.FunctionType(ir.VoidType(),
                                                         [byte_ptr, i32, i32, i32]),
                                 name=name)
            builder.call(fn, [builder.bitcast(address, byte_ptr), i32(1), i32(3), i32(1)])
            return context.get_dummy_value()

        return types.void(array, index), codegen

    return prefetch


@functools.cache
def chunked_adder():
    """An njit ``add(flat, offsets, values, count)``: ``flat[offsets[q]] += values[q]`` for
    ``q < count``, in order (the chunk's additions, their targets already prefetched)."""
    import numba

    @numba.njit(inline="always", nogil=True)
    def add(flat, offsets, values, count):
        for q in range(count):
            flat[offsets[q]] += values[q]

    return add


@functools.cache
def event_words():
    """An njit ``words(x) -> (words, n_words)``: the whole 8-byte words of the contiguous
    event vector ``x`` as ``uint64``. A zero word holds only zero events (every dtype's
    zero is all zero bits), so a scan skips it whole: 8 bool events per test instead of 1.
    The events of word ``w`` are ``x[8 * w // x.itemsize : 8 * (w + 1) // x.itemsize]``;
    those past the last whole word, ``x[8 * n_words // x.itemsize:]``, are scanned one by
    one."""
    import numba

    @numba.njit(inline="always", nogil=True)
    def words(x):
        raw = x.view(np.uint8)
        n_words = raw.shape[0] // 8
        return raw[:n_words * 8].view(np.uint64), n_words

    return words
