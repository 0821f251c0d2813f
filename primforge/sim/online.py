"""Choosing, while a long computation runs, the fastest of equivalent ways to run its chunks.

A simulation run in chunks (each a compiled call that carries the state on) can often run
a chunk several ways that give the same results: a kernel on one thread or on two, say.
Which way is fastest can change while it runs: two threads pay only while both cores are
free and the machine (a virtual one above all) keeps them close. :class:`OnlineChoice`
is given the time each chunk took and says which way to run the next one:

* each way once, in order, first;
* then the way whose last chunk was fastest;
* every other way again after ``min_interval`` chunks; a way that loses that trial waits
  twice as long for the next one (up to ``max_interval`` chunks), a way that wins it
  becomes the choice.

The decision depends only on the times it is given (tests feed it any sequence), and
the time lost to trials is bounded: once a way has lost a few trials in a row, it runs at
most one chunk in ``max_interval``. When the chosen way slows down below another way's
last time, the next chunk goes to that other way at once.
"""

from __future__ import annotations

import math
import operator
import time
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["OnlineChoice"]


def _int(value: Any, where: str, name: str) -> int:
    """``value`` as an int; ``TypeError`` naming ``where`` and ``name`` if it is none (a
    bool is refused: True is an int to ``operator.index``, not a count or a way)."""
    try:
        if isinstance(value, bool):
            raise TypeError
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{where}: {name!r} must be an int, got "
                        f"{type(value).__name__}") from None


def _positive_int(value: Any, name: str) -> int:
    n = _int(value, "OnlineChoice", name)
    if n < 1:
        raise ValueError(f"OnlineChoice: {name!r} must be at least 1, got {n}")
    return n


class OnlineChoice:
    """The fastest of ``ways`` equivalent ways to run the chunks of a computation, chosen
    from the times of the chunks run so far.

    Args:
      ways: how many ways there are (numbered from 0).
      min_interval: chunks before a way not chosen is tried again after it won, or after
        it became a way not chosen.
      max_interval: the longest wait between two trials of a way that keeps losing.
      clock: what :meth:`run` times a chunk with (seconds; ``time.perf_counter``).

    Example (the times given by hand; :meth:`run` measures them):

    >>> choice = OnlineChoice(2, min_interval=2, max_interval=8)
    >>> for seconds in (1.0, 0.5):   # way 0, then way 1, each tried once
    ...     choice.record(choice.pick(), seconds)
    >>> choice.best, [choice.pick() for _ in range(1)]
    (1, [1])
    >>> choice.record(1, 0.5); choice.record(1, 0.5)
    >>> choice.pick()                 # two chunks on way 1: way 0 is tried again
    0
    >>> choice.record(0, 2.0)         # it lost: its next trial waits 4 chunks
    >>> [choice.pick() for _ in range(1)], choice.chunks
    ([1], [2, 3])
    """

    def __init__(self, ways: int, *, min_interval: int = 4, max_interval: int = 64,
                 clock: Callable[[], float] = time.perf_counter):
        self.ways = _positive_int(ways, "ways")
        self.min_interval = _positive_int(min_interval, "min_interval")
        self.max_interval = _positive_int(max_interval, "max_interval")
        if self.max_interval < self.min_interval:
            raise ValueError(f"OnlineChoice: 'max_interval' ({self.max_interval}) must be at "
                             f"least 'min_interval' ({self.min_interval})")
        if not callable(clock):
            raise TypeError(f"OnlineChoice: 'clock' must be callable, got {clock!r}")
        self._clock = clock
        self._last: list[float | None] = [None] * self.ways  # seconds of each way's last chunk
        self._interval = [self.min_interval] * self.ways  # wait after a lost trial
        self._due = [0] * self.ways  # chunks until the way is tried again
        self.chunks = [0] * self.ways  #: chunks recorded per way
        self.seconds = [0.0] * self.ways  #: their total time per way

    @property
    def best(self) -> int | None:
        """The way whose last chunk was fastest (the lowest number among equals), or
        ``None`` while some way has not run yet.

        >>> choice = OnlineChoice(2)
        >>> choice.record(0, 1.0); choice.best is None
        True
        >>> choice.record(1, 1.0); choice.best
        0
        """
        if any(t is None for t in self._last):
            return None
        return min(range(self.ways), key=lambda w: self._last[w])

    @property
    def last_seconds(self) -> list[float | None]:
        """Each way's last chunk time (``None``: not run yet).

        >>> choice = OnlineChoice(3)
        >>> choice.record(1, 0.25); choice.last_seconds
        [None, 0.25, None]
        """
        return list(self._last)

    def pick(self) -> int:
        """The way to run the next chunk: one not run yet, else one due for a trial (the
        most overdue), else :attr:`best`.

        >>> choice = OnlineChoice(2)
        >>> choice.pick()
        0
        >>> choice.record(0, 1.0); choice.pick()
        1
        """
        for w, t in enumerate(self._last):
            if t is None:
                return w
        best = self.best
        due = [w for w in range(self.ways) if w != best and self._due[w] <= 0]
        if due:
            return min(due, key=lambda w: self._due[w])
        return best

    def record(self, way: int, seconds: float) -> None:
        """Note that a chunk run ``way`` took ``seconds``.

        >>> choice = OnlineChoice(2)
        >>> choice.record(1, 0.5); choice.record(1, 0.25); choice.chunks, choice.seconds
        ([0, 2], [0.0, 0.75])
        >>> choice.record(0, float("nan"))
        Traceback (most recent call last):
        ...
        ValueError: OnlineChoice.record: 'seconds' must be finite and >= 0, got nan
        """
        way = _int(way, "OnlineChoice.record", "way")
        if not 0 <= way < self.ways:
            raise ValueError(f"OnlineChoice.record: 'way' must be in [0, {self.ways}), got "
                             f"{way}")
        seconds = float(seconds)
        if not (math.isfinite(seconds) and seconds >= 0.0):
            raise ValueError(f"OnlineChoice.record: 'seconds' must be finite and >= 0, got "
                             f"{seconds}")
        before = self.best
        self._last[way] = seconds
        self.chunks[way] += 1
        self.seconds[way] += seconds
        for w in range(self.ways):
            if w != way:
                self._due[w] -= 1
        after = self.best
        if before is None:  # the first tries: every other way is due after min_interval
            self._due[way] = self.min_interval
            return
        if way != before:  # a trial
            if after == way:
                self._interval[way] = self.min_interval
            else:
                self._interval[way] = min(2 * self._interval[way], self.max_interval)
            self._due[way] = self._interval[way]
        if after != before:  # the former choice is now a way not chosen
            self._interval[before] = self.min_interval
            self._due[before] = self.min_interval

    def run(self, calls: Sequence[Callable[..., Any]], *args: Any, **kwargs: Any) -> Any:
        """Run one chunk: ``calls[self.pick()](*args, **kwargs)``, waited for
        (``jax.block_until_ready``) and timed with ``clock``; its result.

        >>> import jax.numpy as jnp
        >>> choice = OnlineChoice(2)
        >>> double = (lambda x: 2 * x, lambda x: x + x)
        >>> [int(choice.run(double, jnp.int32(3))) for _ in range(3)], sum(choice.chunks)
        ([6, 6, 6], 3)
        """
        import jax

        if len(calls) != self.ways:
            raise ValueError(f"OnlineChoice.run: {len(calls)} calls given for {self.ways} "
                             "ways")
        way = self.pick()
        t0 = self._clock()
        out = jax.block_until_ready(calls[way](*args, **kwargs))
        self.record(way, self._clock() - t0)
        return out
