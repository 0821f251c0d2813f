"""Phases on a team of threads inside one Numba parallel region (Numba imported on first use).

A simulation kernel that runs many steps per call pays a parallel region per step if each
step is a ``prange``: tens of microseconds each, more than a small network's step. This
module lets the threads of one region run every step instead. The work is a sequence of
phases (one per step, say), each cut into the same number of parts; phase ``q`` may read
what any part of phase ``q - 1`` wrote. A thread draws a ticket, ``k``: part ``k % parts``
of phase ``k // parts``; waits until every part of the phases before it is done (a
counter read with acquire ordering and written with release ordering), does its part,
counts it done and draws again, until its ticket lies past the last phase.

Tickets come two ways. Drawn from one shared counter, they hand out the parts in order,
to whichever thread comes first. Claimed part by part (one counter per part: the next
phase of that part), a thread takes a part of the earliest phase that has one left,
preferring the part with its own thread number (modulo the parts): with balanced work
each thread then keeps its part from phase to phase, and the part's data stays in its
core's cache, where tickets in order would move it between cores whenever the threads
arrive in another order. A claim is a compare-and-swap on the part's counter.

No thread waits for a thread that has no work: the parts are claimed, not assigned, so
one thread alone (Numba's pool set to one, or iterations run one after the other) does
every part in order, and a thread that lags behind finds its phases taken. A thread
takes a part only of the earliest phase with one left, so every part of the phases it
waits for is held by a thread that does not wait for it. The results must not depend on
which thread does a part: a part's work is a function of its phase and index only.
"""

from __future__ import annotations

import collections
import functools
import os
import platform

import numpy as np

__all__ = ["NumbaTeam", "numba_team"]


class NumbaTeam(collections.namedtuple("NumbaTeam", "counters draw wait done")):
    """The njit helpers :func:`numba_team` returns, by name or unpacked in that order.

    >>> numba_team()._fields
    ('counters', 'draw', 'wait', 'done')
    """

    __slots__ = ()


# The counters, each on a cache line (64 bytes) of its own so that drawing, claiming and
# finishing do not contend for one line: tickets drawn at [0], parts done at [_DONE], and
# the next phase of part t at [_CLAIMS + t * _DONE] (as many as the parts counters() got).
_DONE = 8
_CLAIMS = 2 * _DONE
# LLVM's intrinsic for the CPU's spin-wait hint (x86 ``pause``; Arm ``hint #1``, ``yield``).
_SPIN_HINT = {"x86_64": ("llvm.x86.sse2.pause", ()), "amd64": ("llvm.x86.sse2.pause", ()),
              "aarch64": ("llvm.aarch64.hint", (1,)), "arm64": ("llvm.aarch64.hint", (1,))}


# Spins before a waiting thread starts to give its core away (``sched_yield``) at each
# look: a few tens of microseconds, more than a balanced phase's wait, far less than the
# time slice of a thread descheduled while holding a part.
_SPINS = 1024


def _spin_hint() -> tuple[str, tuple[int, ...]] | None:
    return _SPIN_HINT.get(platform.machine().lower())


@functools.cache
def _intrinsics():
    from llvmlite import ir
    from numba.core import types
    from numba.extending import intrinsic

    def _counter(context, builder, signature, args):
        view = context.make_array(signature.args[0])(context, builder, args[0])
        index = context.cast(builder, args[1], signature.args[1], types.intp)
        return builder.gep(view.data, [index])

    def _is_counters(array, index):
        return (isinstance(array, types.Array) and array.ndim == 1
                and array.dtype == types.int64 and isinstance(index, types.Integer))

    def counter_op(emit):
        """An intrinsic ``op(array, index) -> int64`` that ``emit(builder, pointer)`` builds
        on ``&array[index]`` of an int64 vector of counters."""

        @intrinsic
        def op(typingctx, array, index):
            if not _is_counters(array, index):
                return None

            def codegen(context, builder, signature, args):
                return emit(builder, _counter(context, builder, signature, args))

            return types.int64(array, index), codegen

        return op

    # array[index] += 1 atomically (sequentially consistent), giving the old value; and
    # array[index] read with acquire ordering.
    fetch_add = counter_op(
        lambda builder, pointer: builder.atomic_rmw("add", pointer, ir.IntType(64)(1),
                                                    "seq_cst"))
    load_acquire = counter_op(
        lambda builder, pointer: builder.load_atomic(pointer, "acquire", 8))

    @intrinsic
    def claim_next(typingctx, array, index, expected):
        """``array[index] = expected + 1`` if it holds ``expected`` (one compare-and-swap,
        sequentially consistent): whether it did."""
        if not (_is_counters(array, index) and isinstance(expected, types.Integer)):
            return None

        def codegen(context, builder, signature, args):
            pointer = _counter(context, builder, signature, args)
            i64 = ir.IntType(64)
            old = context.cast(builder, args[2], signature.args[2], types.int64)
            pair = builder.cmpxchg(pointer, old, builder.add(old, i64(1)), "seq_cst",
                                   "seq_cst")
            return builder.extract_value(pair, 1)

        return types.boolean(array, index, expected), codegen

    hint = _spin_hint()

    @intrinsic
    def spin_hint(typingctx):
        """The CPU's hint that this thread spins (x86 ``pause``, Arm ``yield``), or none."""

        def codegen(context, builder, signature, args):
            if hint is not None:
                name, operands = hint
                i32, module = ir.IntType(32), builder.module
                fn = module.globals.get(name) or ir.Function(
                    module, ir.FunctionType(ir.VoidType(), [i32] * len(operands)), name=name)
                builder.call(fn, [i32(x) for x in operands])
            return context.get_dummy_value()

        return types.void(), codegen

    # POSIX's sched_yield, resolved by name when the kernel is linked (no address is built
    # into the code); where the C library has none, a waiting thread only spins.
    can_yield = hasattr(os, "sched_yield")

    @intrinsic
    def yield_core(typingctx):
        """Give this thread's core to another runnable thread (``sched_yield``)."""

        def codegen(context, builder, signature, args):
            if can_yield:
                module = builder.module
                fn = module.globals.get("sched_yield") or ir.Function(
                    module, ir.FunctionType(ir.IntType(32), []), name="sched_yield")
                builder.call(fn, [])
            return context.get_dummy_value()

        return types.void(), codegen

    return fetch_add, load_acquire, claim_next, spin_hint, yield_core


#: GNU OpenMP's spins before an idle worker sleeps (``GOMP_SPINCOUNT``), unless the
#: environment sets the policy or the count: on a 2-core machine about 0.1-0.2 ms.
IDLE_SPINS = 10_000


def _idle_workers_sleep() -> None:
    """Unless the environment chose a policy, let OpenMP's idle workers spin briefly when a
    parallel region ends, then sleep (``OMP_WAIT_POLICY=PASSIVE`` with
    ``GOMP_SPINCOUNT=IDLE_SPINS``; a ``GOMP_SPINCOUNT`` already set is kept).

    Between two regions the thread that ran one has serial work to do (XLA's own ops, the
    loop around the kernel); workers spinning beside it for long take the cores it needs.
    A worker that sleeps must be woken by the next region, which costs tens of
    microseconds (80-100 on the 2-core machine of the measured tables, against about 5
    when the worker still spins): the short spin keeps that cost off regions that follow
    each other closely, as the calls of a simulation loop do. libgomp reads both
    variables when it starts, at Numba's first parallel launch: after that, this changes
    nothing.
    """
    from numba.np.ufunc import parallel as numba_parallel

    if not numba_parallel._is_initialized and "OMP_WAIT_POLICY" not in os.environ:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
        os.environ.setdefault("GOMP_SPINCOUNT", str(IDLE_SPINS))


@functools.cache
def numba_team() -> NumbaTeam:
    """Njit helpers to run a sequence of phases on the threads of one parallel region.

    * ``counters(parts=0)``: a new set of counters (an int64 array; one per region's
      run), with one counter per part for claimed tickets;
    * ``draw(c) -> k``: the next ticket, part ``k % parts`` of phase ``k // parts``;
      ``draw(c, parts) -> k``: a ticket claimed, a part of the earliest phase that has
      one left, this thread's own part (its Numba thread number modulo ``parts``) first
      (counters made for fewer parts give the next ticket instead); one run of a region
      draws one way only;
    * ``wait(c, n)``: spin until ``n`` parts are done (``k // parts * parts`` before a
      part of phase ``k // parts``), so that what they wrote is visible; after some
      microseconds of spinning, the waiting thread yields its core at each look;
    * ``done(c)``: count a part done, publishing what it wrote.

    Each of the region's threads loops: draw, stop when the phase is past the last, wait,
    work, done. Claimed tickets keep each part on one thread while the work is balanced,
    and with it the part's data in that thread's cache. Threads wait only for parts
    another thread holds, so the loop ends whatever the number of threads that run it. The
    counters are for these helpers alone: Numba does not see their atomic updates, so a
    direct read of them, in the region or after it, may give an older value (Numba may
    move a read of an array it sees no write to out of the loop). Unless
    ``OMP_WAIT_POLICY`` is set, the first call sets it to ``PASSIVE`` and, unless set,
    ``GOMP_SPINCOUNT`` to 10,000 (before Numba starts OpenMP): the region's
    workers then spin briefly after a region, then sleep, instead of spinning beside the
    thread that runs the code between regions.

    >>> import numba, numpy as np
    >>> counters, draw, wait, done = numba_team()
    >>> @numba.njit(parallel=True)
    ... def neighbours(x, parts):  # phase 0 squares each part; phase 1 adds its neighbour's
    ...     c, n = counters(parts), x.shape[0]
    ...     sq, out = np.empty(n), np.empty(n)
    ...     size = (n + parts - 1) // parts
    ...     for _ in numba.prange(parts):
    ...         while True:
    ...             k = draw(c, parts)
    ...             phase, part = k // parts, k % parts
    ...             if phase >= 2:
    ...                 break
    ...             wait(c, phase * parts)
    ...             lo, hi = min(n, part * size), min(n, (part + 1) * size)
    ...             for i in range(lo, hi):
    ...                 if phase == 0:
    ...                     sq[i] = x[i] * x[i]
    ...                 else:
    ...                     out[i] = sq[i] + sq[(i + size) % n]
    ...             done(c)
    ...     return out
    >>> x = np.arange(6.0)
    >>> bool(np.array_equal(neighbours(x, 3), x ** 2 + np.roll(x ** 2, -2)))
    True
    """
    import numba

    _idle_workers_sleep()
    fetch_add, load_acquire, claim_next, spin_hint, yield_core = _intrinsics()

    @numba.njit(inline="always", nogil=True)
    def counters(parts=0):
        return np.zeros(_CLAIMS + max(parts, 0) * _DONE, np.int64)

    @numba.njit(inline="always", nogil=True)
    def draw(c, parts=0):
        if parts <= 0 or c.shape[0] < _CLAIMS + parts * _DONE:  # no counter per part
            return fetch_add(c, 0)
        own = numba.get_thread_id() % parts
        while True:
            # the part whose next phase is earliest, this thread's own first among equals
            part, phase = own, load_acquire(c, _CLAIMS + own * _DONE)
            for t in range(parts):
                q = load_acquire(c, _CLAIMS + t * _DONE)
                if q < phase:
                    part, phase = t, q
            if claim_next(c, _CLAIMS + part * _DONE, phase):
                return phase * parts + part

    @numba.njit(inline="always", nogil=True)
    def wait(c, n):
        spins = 0
        while load_acquire(c, _DONE) < n:
            if spins < _SPINS:
                spin_hint()
                spins += 1
            else:  # the part waited for is held by a thread without a core
                yield_core()

    @numba.njit(inline="always", nogil=True)
    def done(c):
        fetch_add(c, _DONE)

    return NumbaTeam(counters, draw, wait, done)
