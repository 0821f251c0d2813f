"""Numba CPU kernels for CSR products (Numba itself is imported only when one is built).

Product kernels are ``kernel(data, indices, indptr, x, out)`` (the weight gradient's
``kernel(indices, indptr, ct, x, out)``), each variant fixed by closure constants; a
malformed structure fills ``out`` with NaN. :func:`parallel_generator` builds the opt-in
``numba_parallel`` kernels (tbb or omp threading layer only).
"""

from __future__ import annotations

import functools

import numpy as np

from primforge.ops._prefetch import event_words
from primforge.sim.team import _idle_workers_sleep


@functools.cache
def _indptr_checker():
    """An njit check that ``indptr`` starts at 0, ends at most at ``nnz``, never decreases.

    Every call of a product runs it over all ``m + 1`` offsets, so it has no early exit: the
    branch-free loop vectorizes (4-5x faster than stopping at the first decrease, which
    only a malformed matrix has).
    """
    import numba

    @numba.njit(nogil=True)
    def indptr_ok(indptr, m, nnz):
        if indptr[0] != 0 or indptr[m] > nnz:
            return False
        bad = False
        for i in range(m):
            bad |= indptr[i + 1] < indptr[i]
        return not bad

    return indptr_ok


@functools.cache
def _row_scatter(binary: bool, homo: bool, wide: bool):
    """An njit ``scatter(out, data, indices, lo, hi, w0, xi) -> ok``: one row of ``W.T @ x``.

    Adds the stored entries ``lo:hi`` (weight ``w0`` or their own, times ``xi`` for float
    inputs) into ``out`` through views of the row's slices, each column checked by one
    unsigned compare as wide as the index dtype; returns False at the first column outside
    ``[0, len(out))``, before touching it. About 1.3x faster than indexing the whole arrays
    from ``indptr[i]`` with a signed test of both bounds.
    """
    import numba

    BINARY, HOMO = binary, homo
    U = _unsigned(wide)

    @numba.njit(nogil=True)
    def scatter(out, data, indices, lo, hi, w0, xi):
        un = U(out.shape[0])
        cols = indices[lo:hi]
        vals = data[lo:hi] if not HOMO else data[:1]
        for k in range(hi - lo):
            j = U(cols[k])
            if j >= un:
                return False
            w = w0 if HOMO else vals[k]
            if BINARY:
                out[j] += w
            else:
                out[j] += w * xi
        return True

    return scatter


@functools.cache
def mv_kernel(binary: bool, transpose: bool, homo: bool, wide: bool = False):
    """The njit matrix-vector kernel for one variant (compiled lazily per dtype)."""
    import numba

    BINARY, HOMO = binary, homo
    indptr_ok = _indptr_checker()

    if transpose:
        scatter = _row_scatter(binary, homo, wide)
        words = event_words()

        @numba.njit(nogil=True)
        def csr_t_mv(data, indices, indptr, x, out):
            m = x.shape[0]
            nnz = indices.shape[0]
            out[:] = 0
            if not indptr_ok(indptr, m, nnz):
                out[:] = np.nan
                return
            w0 = data[0] if HOMO else 1.0  # a per-synapse data may be empty
            x_words, n_words = words(x)  # a zero word: 8 bytes of silent events skipped
            size = x.itemsize
            for b in range(n_words + 1):
                if b < n_words and x_words[b] == 0:
                    continue
                hi = 8 * (b + 1) // size if b < n_words else m
                for i in range(8 * b // size, hi):
                    xi = x[i]
                    if xi != 0 and not scatter(out, data, indices, indptr[i], indptr[i + 1],
                                               w0, xi):
                        out[:] = np.nan
                        return

        return csr_t_mv

    return _gather_mv(BINARY, HOMO, parallel=False, wide=wide)


@functools.cache
def _trailing_zeros():
    """Numba's count of trailing zero bits (one instruction), or a loop where it is missing."""
    try:
        from numba.cpython.unsafe.numbers import trailing_zeros
    except ImportError:  # pragma: no cover - an internal Numba helper
        import numba

        @numba.njit(nogil=True)
        def trailing_zeros(bits):
            b = 0
            while (bits >> b) & 1 == 0:
                b += 1
            return b

    return trailing_zeros


@functools.cache
def packed_mv_kernel(transpose: bool, homo: bool, wide: bool, n_events: int):
    """The binary matrix-vector kernel reading ``n_events`` bit-packed events:
    ``kernel(data, indices, indptr, words, out)``, ``words`` ``uint32``, event ``i`` bit
    ``i % 32`` of word ``i // 32`` (bits past ``n_events`` ignored).

    The same sums in the same order as :func:`mv_kernel` on the unpacked events: with
    ``transpose`` each set bit scatters its row (a zero word skips 32 rows at once); else
    the gather reads a 0/1 table built from the words.
    """
    import numba

    trailing_zeros = _trailing_zeros()
    HOMO, N = homo, n_events
    indptr_ok = _indptr_checker()

    if transpose:
        scatter = _row_scatter(True, homo, wide)
        one = np.uint32(1)

        @numba.njit(nogil=True)
        def csr_t_mv_packed(data, indices, indptr, words, out):
            nnz = indices.shape[0]
            out[:] = 0
            if not indptr_ok(indptr, N, nnz):
                out[:] = np.nan
                return
            w0 = data[0] if HOMO else 1.0  # a per-synapse data may be empty
            for wi in range(words.shape[0]):
                bits = np.uint32(words[wi])
                while bits != 0:  # the set bits, lowest first: rows in increasing order
                    i = wi * 32 + trailing_zeros(bits)
                    if i >= N:
                        break
                    if not scatter(out, data, indices, indptr[i], indptr[i + 1], w0, 1.0):
                        out[:] = np.nan
                        return
                    bits &= bits - one

        return csr_t_mv_packed

    return _gather_mv(True, homo, parallel=False, wide=wide, packed_n=n_events)


@functools.cache
def mm_kernel(binary: bool, transpose: bool, homo: bool, wide: bool = False):
    """The njit matrix-matrix kernel for one variant (compiled lazily per dtype).

    The ``transpose=True`` kernel works on batch-major arrays: bind it with
    :func:`scatter_mm_call`.
    """
    if transpose:
        return _scatter_mm(binary, homo, parallel=False, wide=wide)
    return _gather_mm(binary, homo, parallel=False, wide=wide)


@functools.cache
def _scatter_mm(binary: bool, homo: bool, parallel: bool, wide: bool = False):
    """``W.T @ X``, event-driven, on batch-major arrays (``parallel``: columns over threads).

    The kernel takes ``X`` and writes the result *transposed*: ``xb`` is ``X.T``, shape
    ``(kcols, m)``, and ``outb`` is ``(W.T @ X).T``, shape ``(kcols, n)``; bind it with
    :func:`scatter_mm_call`, which transposes around it in JAX. Under ``vmap`` (the batch
    arrives as the leading axis and becomes the columns of ``X``) and in ``x @ W`` with a
    matrix ``x`` those transposes cancel XLA's own, so no copy is made on either side.

    One pass over the rows per column ``c`` of ``X``, scattering the rows whose event fires
    into that column's own contiguous output row (one L2-sized target at a time instead of
    the whole output, where every scattered add would touch its own cache line). Columns
    are independent, so the threaded variant gives each thread whole columns: no shared
    writes, and the same sums in the same order as the serial one. Indices are checked on
    visited rows only (:func:`_row_scatter`).
    """
    import numba

    HOMO = homo
    scatter = _row_scatter(binary, homo, wide)
    indptr_ok = _indptr_checker()
    cols = numba.prange if parallel else range

    @numba.njit(nogil=True, parallel=parallel)
    def csr_t_mm(data, indices, indptr, xb, outb):
        kcols, m = xb.shape
        nnz = indices.shape[0]
        if not indptr_ok(indptr, m, nnz):
            outb[:] = np.nan
            return
        w0 = data[0] if HOMO else 1.0  # a per-synapse 'data' may be empty
        nbad = 0
        for c in cols(kcols):
            row = outb[c]
            row[:] = 0
            # One flag per column, set once and then leaving the loop: a flag tested in the
            # loop's own condition made a cycle that Numba's parfor pass rejects on
            # Python 3.13 ("unexpected cycle in lookup()").
            bad = 0
            for i in range(m):
                xi = xb[c, i]
                if xi != 0 and not scatter(row, data, indices, indptr[i], indptr[i + 1], w0,
                                           xi):
                    bad = 1
                    break
            nbad += bad
        if nbad:
            outb[:] = np.nan

    return csr_t_mm


def scatter_mm_call(fn, out, name: str):
    """A traceable ``W.T @ X`` through the batch-major kernel ``fn`` (:func:`_scatter_mm`).

    ``out`` is the product's output spec ``(n, kcols)``; the kernel is bound to its
    transpose and called on ``X.T``, and the result is transposed back.
    """
    import jax

    from primforge.backends.numba import numba_kernel

    n, kcols = out.shape
    kernel = numba_kernel(fn, outs=jax.ShapeDtypeStruct((kcols, n), out.dtype), name=name)

    def call(data, indices, indptr, x):
        return kernel(data, indices, indptr, x.T).T

    return call


# Float reassociation only: lets LLVM vectorise the row sums (the summation order changes,
# nothing else; NaN and infinity keep their IEEE meaning, so the NaN poisoning stays exact).
_REASSOC = {"reassoc"}


@functools.cache
def _event_table(binary: bool, matrix: bool):
    """An njit copy of ``x`` as floats with one zero row appended (the clamp target).

    Binary events become 0/1 in float32 (so a gather is a multiply, with no branch per
    entry), float inputs keep their dtype. Row ``n`` is zero: a column index outside
    ``[0, n)`` is clamped to ``n`` before the load, so it reads a harmless zero while the
    kernel counts it and poisons its output at the end.
    """
    import numba

    BINARY, MATRIX = binary, matrix

    @numba.njit(nogil=True)
    def table(x):
        n = x.shape[0]
        if MATRIX:
            kcols = x.shape[1]
            t = np.zeros((n + 1, kcols), np.float32 if BINARY else x.dtype)
            for j in range(n):
                for c in range(kcols):
                    if BINARY:
                        t[j, c] = 1.0 if x[j, c] != 0 else 0.0
                    else:
                        t[j, c] = x[j, c]
        else:
            t = np.zeros(n + 1, np.float32 if BINARY else x.dtype)
            for j in range(n):
                if BINARY:
                    t[j] = 1.0 if x[j] != 0 else 0.0
                else:
                    t[j] = x[j]
        return t

    return table


def _unsigned(wide: bool):
    """The unsigned type the clamp compares in: as wide as the index dtype."""
    return np.uint64 if wide else np.uint32


@functools.cache
def _packed_table(n: int):
    """An njit ``table(words)``: :func:`_event_table` of ``n`` bit-packed binary events."""
    import numba

    N = n

    @numba.njit(nogil=True)
    def table(words):
        t = np.zeros(N + 1, np.float32)
        for j in range(N):
            t[j] = 1.0 if (words[j >> 5] >> (j & 31)) & 1 else 0.0
        return t

    return table


@functools.cache
def _gather_mv(binary: bool, homo: bool, parallel: bool, wide: bool = False,
               packed_n: int | None = None):
    """``W @ x`` as one branch-free pass per row (``parallel``: rows spread over threads).

    ``x`` is first copied into a float table with a zero row appended
    (:func:`_event_table`, O(cols)); every stored entry then costs one gather and one
    multiply-add. The column check is folded into that gather: the index is compared
    unsigned (as wide as the index dtype, ``wide``: 64-bit), clamped to the zero row and
    counted when outside ``[0, n)``, and a non-zero count poisons the output at the end.
    No early exit, no branch per entry, so the loop vectorises; ``indptr`` is checked
    first, in its own O(rows) pass, because every row's range is read from it.
    ``packed_n``: ``x`` holds that many binary events bit-packed in ``uint32`` words.
    """
    import numba

    BINARY, HOMO = binary, homo
    PACKED, N_PACKED = packed_n is not None, packed_n or 0
    U = _unsigned(wide)
    indptr_ok = _indptr_checker()
    table = _packed_table(packed_n) if PACKED else _event_table(binary, False)
    rows = numba.prange if parallel else range

    @numba.njit(nogil=True, fastmath=_REASSOC, parallel=parallel)
    def csr_mv(data, indices, indptr, x, out):
        m = out.shape[0]
        n = N_PACKED if PACKED else x.shape[0]
        nnz = indices.shape[0]
        if not indptr_ok(indptr, m, nnz) or (n == 0 and indptr[m] > 0):
            out[:] = np.nan
            return
        t = table(x)
        un = U(n)
        w0 = data[0] if HOMO else 1.0  # a per-synapse 'data' may be empty
        nbad = 0
        for i in rows(m):
            s = 0.0  # accumulate in float64
            bad = 0
            # Row views (indptr is checked): a zero-based loop over contiguous slices is
            # what LLVM vectorises; indexing the whole arrays from indptr[i] is not.
            lo, hi = indptr[i], indptr[i + 1]
            cols = indices[lo:hi]
            vals = data[lo:hi] if not HOMO else data[:0]
            for k in range(hi - lo):
                u = U(cols[k])
                bad += u >= un
                j = min(u, un)
                if HOMO:
                    s += t[j]
                elif BINARY:  # a select, not a multiply: an inactive event's weight,
                    s += vals[k] if t[j] != 0 else 0.0  # even NaN or inf, never enters
                else:
                    s += vals[k] * t[j]
            nbad += bad
            out[i] = s * w0 if HOMO else s
        if nbad:
            out[:] = np.nan

    return csr_mv


@functools.cache
def _gather_mm(binary: bool, homo: bool, parallel: bool, wide: bool = False):
    """``W @ X`` for a matrix ``X``: the row loop of :func:`_gather_mv`, columns inside.

    ``X`` (``(n, k)``, the batch of a ``vmap`` as its columns) is copied into a float
    table first, so a stored entry adds one contiguous row of ``k`` values (a SIMD add,
    no branch per column) into the output row, which stays in L1 (sums in ``out``'s dtype).
    """
    import numba

    BINARY, HOMO = binary, homo
    U = _unsigned(wide)
    indptr_ok = _indptr_checker()
    table = _event_table(binary, True)
    rows = numba.prange if parallel else range

    @numba.njit(nogil=True, fastmath=_REASSOC, parallel=parallel)
    def csr_mm(data, indices, indptr, x, out):
        m = out.shape[0]
        n, kcols = x.shape
        nnz = indices.shape[0]
        if not indptr_ok(indptr, m, nnz) or (n == 0 and indptr[m] > 0):
            out[:] = np.nan
            return
        t = table(x)
        un = U(n)
        w0 = data[0] if HOMO else 1.0
        nbad = 0
        for i in rows(m):
            for c in range(kcols):
                out[i, c] = 0
            bad = 0
            for k in range(indptr[i], indptr[i + 1]):
                u = U(indices[k])
                bad += u >= un
                j = min(u, un)
                if HOMO:
                    for c in range(kcols):
                        out[i, c] += t[j, c]
                elif BINARY:  # a select: an inactive event's weight never enters
                    w = data[k]
                    for c in range(kcols):
                        out[i, c] += w if t[j, c] != 0 else 0.0
                else:
                    w = data[k]
                    for c in range(kcols):
                        out[i, c] += w * t[j, c]
            nbad += bad
            if HOMO:
                for c in range(kcols):
                    out[i, c] *= w0
        if nbad:
            out[:] = np.nan

    return csr_mm


def parallel_threading_layer() -> str:
    """The Numba threading layer the parallel kernels run on; raise if it is not thread-safe.

    XLA may call one FFI handler from several threads at once (concurrent ``jit`` calls,
    independent ops of one program). Numba's ``workqueue`` layer is not safe for that:
    two parallel regions entered at once from different threads abort the process. The
    ``tbb`` and (GNU) ``omp`` layers are. Numba picks its layer once per process, at the
    first parallel launch; this checks the one it picked, or the one it will pick.
    """
    import numba
    from numba.np.ufunc import parallel as numba_parallel

    _idle_workers_sleep()  # before Numba's first parallel launch, which comes after this
    if numba_parallel._is_initialized:  # chosen already: it must be tbb or omp
        layer = numba.threading_layer()
        if layer in ("tbb", "omp"):
            return layer
        raise RuntimeError(
            f"the parallel CSR kernels need Numba's 'tbb' or 'omp' threading layer (safe for "
            f"concurrent calls); this process already runs on {layer!r}. Set "
            f"NUMBA_THREADING_LAYER=omp (or tbb) before the first parallel Numba call, or use "
            f"backend='numba'"
        )
    forced = str(numba.config.THREADING_LAYER).lower()
    candidates = {"default": ("tbb", "omp"), "safe": ("tbb",), "threadsafe": ("tbb", "omp"),
                  "forksafe": ("tbb",), "tbb": ("tbb",), "omp": ("omp",)}.get(forced, ())
    for layer in candidates:
        try:
            __import__(f"numba.np.ufunc.{layer}pool")
        except ImportError:
            continue
        return layer
    raise RuntimeError(
        f"the parallel CSR kernels need Numba's 'tbb' or 'omp' threading layer (safe for "
        f"concurrent calls), but NUMBA_THREADING_LAYER={forced!r} offers none that loads "
        f"here (install tbb, or libgomp for omp); use backend='numba'"
    )


def parallel_kernel(matrix: bool, binary: bool, transpose: bool, homo: bool,
                    wide: bool = False):
    """The threaded kernel of one variant.

    ``W @ x`` and ``W @ X``: rows over threads (``numba.prange``); each thread owns whole
    rows of ``out``, so no two threads write one element and the result equals the serial
    kernel's up to the summation order inside a row. ``W.T @ X``: the columns of ``X``
    over threads (:func:`_scatter_mm`), each result column written by one thread.
    ``W.T @ x`` scatters into shared output elements; it gets the serial event-driven
    kernel.
    """
    if transpose and not matrix:
        return mv_kernel(binary, True, homo, wide)
    parallel_threading_layer()
    if transpose:
        return _scatter_mm(binary, homo, parallel=True, wide=wide)
    return (_gather_mm if matrix else _gather_mv)(binary, homo, parallel=True, wide=wide)


def parallel_generator(binary: bool, matrix: bool):
    """Kernel generator of the opt-in ``numba_parallel`` CPU backend of the CSR products.

    It returns a :func:`primforge.numba_kernel` (a traceable call through the same XLA FFI
    handler as the ``numba`` backend) of :func:`parallel_kernel`; the threads are Numba's
    (``NUMBA_NUM_THREADS``, :func:`numba.set_num_threads` of the calling thread).
    """

    def generate(*, ins, outs, transpose, **_):
        from primforge.backends.numba import numba_kernel

        homo = tuple(ins[0].shape) == (1,) and ins[1].shape[0] != 1
        wide = np.dtype(ins[1].dtype).itemsize > 4
        fn = parallel_kernel(matrix, binary, bool(transpose), homo, wide)
        if matrix and transpose:
            name = ("binary_" if binary else "") + f"csrmm_{fn.__name__}_parallel"
            return scatter_mm_call(fn, outs[0], name)
        return numba_kernel(fn, outs=list(outs), name=f"{fn.__name__}_parallel")

    return generate
