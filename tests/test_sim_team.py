"""primforge.sim.numba_team: many phases on the threads of one Numba parallel region."""

from __future__ import annotations

import numpy as np
import pytest

numba = pytest.importorskip("numba")

from primforge.sim import numba_team


@pytest.fixture(scope="module")
def relax():
    """``phases`` Jacobi sweeps of a ring, ``parts`` ranges a phase, in one region: each
    sweep reads the neighbours the sweep before wrote (two buffers), so a part done before
    the phase before it has ended reads stale values and the result differs."""
    counters, draw, wait, done = numba_team()

    @numba.njit(parallel=True)
    def run(x, phases, parts, workers, claimed, room):
        n = x.shape[0]
        buf = np.empty((2, n))
        buf[0] = x
        who = np.full((phases, parts), -1, np.int64)  # the ticket that did each part
        c = counters(room)
        size = (n + parts - 1) // parts
        for _ in numba.prange(workers):
            while True:
                k = draw(c, parts) if claimed else draw(c)
                q, part = k // parts, k % parts
                if q >= phases:
                    break
                wait(c, q * parts)
                src, dst = buf[q % 2], buf[1 - q % 2]
                for i in range(min(n, part * size), min(n, (part + 1) * size)):
                    dst[i] = 0.25 * src[i - 1] + 0.5 * src[i] + 0.25 * src[(i + 1) % n]
                who[q, part] = k
                done(c)
        return buf[phases % 2], who, c

    return run


def _numpy_relax(x, phases):
    for _ in range(phases):
        x = 0.25 * np.roll(x, 1) + 0.5 * x + 0.25 * np.roll(x, -1)
    return x


@pytest.mark.parametrize("draws", ["in order", "claimed", "claimed, no room"])
@pytest.mark.parametrize("threads,parts,workers", [(2, 2, 2), (2, 7, 2), (2, 3, 5), (1, 4, 2)])
def test_every_phase_sees_the_phase_before_whatever_the_threads(relax, threads, parts,
                                                                 workers, draws):
    """Parts more or fewer than the workers, and one thread running every worker (a pool of
    one: a worker that waited for another would never return); tickets in order, claimed
    part by part, or asked to be claimed from counters without a counter per part."""
    x = np.random.default_rng(0).standard_normal(100_003)
    phases = 100
    claimed = draws != "in order"
    room = parts if draws == "claimed" else 0
    before = numba.get_num_threads()
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    try:
        got, who, c = relax(x, phases, parts, workers, claimed, room)
    finally:
        numba.set_num_threads(before)
    np.testing.assert_allclose(got, _numpy_relax(x, phases), rtol=1e-12, atol=1e-12)
    # every part of every phase done exactly once, by the ticket that names it
    np.testing.assert_array_equal(who, np.arange(phases * parts).reshape(phases, parts))
    assert c[8] == phases * parts
    # and one ticket past the end per worker: from the shared counter, or claimed
    drawn = c[16::8].sum() if room else c[0]
    assert drawn == phases * parts + workers
    assert c.shape == (16 + 8 * room,)


def test_the_operator_library_gives_the_same_team():
    import primforge.ops
    import primforge.sim

    assert primforge.ops.numba_team is numba_team
    assert primforge.ops.NumbaTeam is primforge.sim.NumbaTeam


def test_one_set_of_helpers_per_process():
    """Kernels built at different times share the helpers (compiled once)."""
    assert numba_team() is numba_team()


def test_counters_must_be_int64_vectors():
    draw = numba_team().draw

    @numba.njit
    def bad(c):
        return draw(c)

    with pytest.raises(numba.core.errors.TypingError):
        bad(np.zeros(16, np.int32))


_POLICY = """
import os
import numba
import numpy as np
from primforge.sim import numba_team
counters, draw, wait, done = numba_team()

@numba.njit(parallel=True)
def count(parts):
    c, hit = counters(), np.zeros(parts, np.int64)
    for _ in numba.prange(2):
        while True:
            k = draw(c)
            if k >= parts:
                break
            hit[k] += 1
            done(c)
    return hit

assert (count(5) == 1).all()
print("policy", os.environ.get("OMP_WAIT_POLICY"))
"""


@pytest.mark.parametrize("preset,want", [(None, "PASSIVE"), ("ACTIVE", "ACTIVE")])
def test_a_team_makes_idle_openmp_workers_sleep_unless_told(preset, want):
    """Workers spinning between two regions take the cores the code between them needs:
    unless the environment says otherwise, OpenMP starts with the passive policy."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    env.update(NUMBA_NUM_THREADS="2", NUMBA_THREADING_LAYER="omp")
    if preset is not None:
        env["OMP_WAIT_POLICY"] = preset
    res = subprocess.run([sys.executable, "-c", _POLICY], capture_output=True, text=True,
                         env=env, timeout=600, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"policy {want}" in res.stdout, res.stdout
