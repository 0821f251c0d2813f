"""primforge.sim.OnlineChoice: which way runs each chunk, given scripted chunk times.

The times are made up (no clock is read but a scripted one), so every decision is
deterministic; the bounds below are worked out from the rule (each way once, then the
fastest last time, trials of the others after an interval that doubles on a lost trial),
not taken from a run of the code.
"""

import math

import numpy as np
import pytest

import primforge
from primforge.sim import OnlineChoice


def drive(choice, seconds_of, chunks):
    """Run ``chunks`` chunks, chunk ``i`` run way ``w`` taking ``seconds_of(i, w)``; the
    ways picked, in order."""
    picked = []
    for i in range(chunks):
        w = choice.pick()
        choice.record(w, seconds_of(i, w))
        picked.append(w)
    return picked


def test_is_public_here_and_at_the_top():
    assert "OnlineChoice" in primforge.sim.__all__
    assert primforge.OnlineChoice is OnlineChoice and "OnlineChoice" in primforge.__all__


def test_each_way_runs_once_in_order_first():
    choice = OnlineChoice(3)
    assert choice.best is None
    picked = drive(choice, lambda i, w: [3.0, 1.0, 2.0][w], 3)
    assert picked == [0, 1, 2]
    assert choice.best == 1 and choice.last_seconds == [3.0, 1.0, 2.0]


@pytest.mark.parametrize("fast", [0, 1])
def test_a_way_always_faster_gets_all_but_a_few_trials(fast):
    lo, hi, n = 4, 64, 2000
    choice = OnlineChoice(2, min_interval=lo, max_interval=hi)
    picked = drive(choice, lambda i, w: 0.5 if w == fast else 1.0, n)
    slow_chunks = picked.count(1 - fast)
    # the first try, then trials after lo, 2 lo, ..., hi chunks, then one every hi
    doublings = int(math.log2(hi // lo))
    most = 1 + (doublings + 1) + n // hi
    fewest = n // (2 * hi)  # trials keep coming: a way is never dropped for good
    assert fewest <= slow_chunks <= most, slow_chunks
    assert choice.chunks == [picked.count(0), picked.count(1)]
    assert choice.seconds == [(0.5 if w == fast else 1.0) * picked.count(w) for w in (0, 1)]
    assert choice.best == fast


def test_the_choice_follows_a_change_of_speed_within_bounds():
    """Way 1 is twice as fast, then for a spell twice as slow, then fast again: the choice
    leaves it at the first slow chunk and comes back within the trial interval."""
    lo, hi = 4, 32

    def seconds(i, w):
        if w == 0:
            return 1.0
        return 2.0 if 500 <= i < 900 else 0.5

    choice = OnlineChoice(2, min_interval=lo, max_interval=hi)
    picked = drive(choice, seconds, 1500)
    assert picked[500] == 1 and picked[501] == 0  # one slow chunk, then away at once
    # in the spell, way 1's trials after lo, 2 lo, ..., hi chunks, then one every hi
    trials = picked[501:900].count(1)
    assert 1 <= trials <= 1 + int(math.log2(hi // lo)) + 400 // hi, trials
    assert 1 not in picked[501:501 + lo - 1]
    back = next(i for i in range(900, 1500) if picked[i] == 1)
    assert back <= 900 + hi + 1
    assert all(w == 1 for w in picked[back + 1:back + 1 + lo - 1])  # and it stays
    total = sum(seconds(i, w) for i, w in enumerate(picked))
    oracle = sum(min(seconds(i, 0), seconds(i, 1)) for i in range(1500))
    always = [sum(seconds(i, w) for i in range(1500)) for w in (0, 1)]
    assert total <= 1.05 * oracle < min(always)


def test_noisy_times_still_favour_the_faster_way():
    """Times with 20% noise, one way 0.7x the other: most chunks go to the faster way and
    the total is near the faster way's alone."""
    rng = np.random.default_rng(0)
    mean = (1.0, 0.7)
    noise = rng.uniform(0.8, 1.2, size=(3000, 2))
    choice = OnlineChoice(2)
    picked = drive(choice, lambda i, w: mean[w] * noise[i, w], 3000)
    assert picked.count(1) > 0.85 * 3000
    total = sum(mean[w] * noise[i, w] for i, w in enumerate(picked))
    faster_alone = sum(mean[1] * noise[i, 1] for i in range(3000))
    assert total <= 1.08 * faster_alone


def test_equal_times_choose_the_lowest_way_and_one_way_is_always_it():
    choice = OnlineChoice(3)
    drive(choice, lambda i, w: 1.0, 3)
    assert choice.best == 0
    one = OnlineChoice(1)
    assert drive(one, lambda i, w: 1.0 + i, 10) == [0] * 10 and one.best == 0


def test_run_times_the_picked_call_with_the_clock_and_returns_its_result():
    ticks = iter([0.0, 2.0, 10.0, 11.0, 20.0, 21.0])  # way 0: 2 s; way 1: 1 s; way 1: 1 s
    choice = OnlineChoice(2, clock=lambda: next(ticks))
    calls = (lambda x: ("zero", x), lambda x: ("one", x))
    assert [choice.run(calls, k) for k in range(3)] == [("zero", 0), ("one", 1), ("one", 2)]
    assert choice.last_seconds == [2.0, 1.0] and choice.chunks == [1, 2]


@pytest.mark.parametrize("kwargs, error, match", [
    ({"ways": 0}, ValueError, "'ways' must be at least 1"),
    ({"ways": 2.0}, TypeError, "'ways' must be an int"),
    ({"ways": True}, TypeError, "'ways' must be an int, got bool"),
    ({"ways": 2, "min_interval": 0}, ValueError, "'min_interval' must be at least 1"),
    ({"ways": 2, "min_interval": 8, "max_interval": 4}, ValueError,
     r"'max_interval' \(4\) must be at least 'min_interval' \(8\)"),
    ({"ways": 2, "clock": 3.0}, TypeError, "'clock' must be callable"),
])
def test_bad_settings_are_named(kwargs, error, match):
    with pytest.raises(error, match=match):
        OnlineChoice(**kwargs)


@pytest.mark.parametrize("way, seconds, error, match", [
    (2, 1.0, ValueError, r"'way' must be in \[0, 2\), got 2"),
    (-1, 1.0, ValueError, r"'way' must be in \[0, 2\), got -1"),
    (0.5, 1.0, TypeError, "'way' must be an int"),
    (True, 1.0, TypeError, "'way' must be an int, got bool"),
    (0, float("nan"), ValueError, "'seconds' must be finite and >= 0, got nan"),
    (0, -1.0, ValueError, "'seconds' must be finite and >= 0"),
    (0, float("inf"), ValueError, "'seconds' must be finite"),
])
def test_bad_records_are_refused_and_change_nothing(way, seconds, error, match):
    choice = OnlineChoice(2)
    with pytest.raises(error, match=match):
        choice.record(way, seconds)
    assert choice.chunks == [0, 0] and choice.last_seconds == [None, None]
    assert choice.seconds == [0.0, 0.0]


def test_run_needs_one_call_per_way():
    with pytest.raises(ValueError, match="1 calls given for 2 ways"):
        OnlineChoice(2).run([lambda: 0])
