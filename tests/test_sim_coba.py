"""primforge.sim.coba: the COBA network against an independent NumPy simulation.

The NumPy twin below is written from the model's equations (float64, Brian's refractory
rule, propagation by summing the rows of SciPy's dense copy of each connectivity matrix); it
shares only the connectivity and the initial state with the library.
"""

import pathlib
import subprocess

import numpy as np
import pytest
import scipy.sparse as sp
from _scripts import load_script

from primforge.sim import coba
from primforge.sim.coba import kernels, numba_loop, numba_threaded

ROOT = pathlib.Path(__file__).resolve().parents[1]
N, PROB, DURATION = 2000, 0.04, 0.2  # 80 inputs per neuron, as in the full network


@pytest.fixture(scope="module")
def net():
    return coba.build(N, PROB, seed=0)


def numpy_coba(net, n_steps, dt=0.1):
    """Spike counts (E, I) per step of the COBA network, in float64 NumPy."""
    n, ne = net.n, net.n_exc

    def dense(w):
        if isinstance(w, coba.JitConn):
            from primforge.ops import jitc_todense

            return np.asarray(jitc_todense(w.seed, w.shape, w.prob, w.weight, "homo"),
                              np.float64)
        data = np.broadcast_to(np.asarray(w.data, np.float64), (w.nnz,))
        return sp.csr_matrix((data, np.asarray(w.indices), np.asarray(w.indptr)),
                             shape=w.shape).toarray()

    w_exc, w_inh = dense(net.w_exc), dense(net.w_inh)
    v, ge, gi = (np.asarray(x, np.float64) for x in (net.v0, net.ge0, net.gi0))
    last_spike = np.full(n, -(10**9))
    counts = np.zeros((n_steps, 2), np.int64)
    for t in range(n_steps):
        integrating = (t - last_spike) * dt >= 5.0 - 1e-9  # 5 ms refractory period
        dv = (-60.0 - v) + ge * (0.0 - v) + gi * (-80.0 - v)
        v = np.where(integrating, v + dt * dv / 20.0, v)
        ge = ge - dt * ge / 5.0
        gi = gi - dt * gi / 10.0
        spike = integrating & (v > -50.0)
        ge = ge + w_exc[np.flatnonzero(spike[:ne])].sum(axis=0)
        gi = gi + w_inh[np.flatnonzero(spike[ne:])].sum(axis=0)
        v[spike] = -60.0
        last_spike[spike] = t
        counts[t] = spike[:ne].sum(), spike[ne:].sum()
    return counts


@pytest.fixture(scope="module")
def reference(net):
    return numpy_coba(net, round(DURATION / 1e-4))


@pytest.fixture(scope="module")
def plain(net):
    return coba.simulate(net, DURATION)


@pytest.fixture(scope="module")
def fused(net):
    return coba.simulate(net, DURATION, fused=True)


def _check_against_numpy(result, reference, net):
    got = result["counts"]
    assert got.shape == reference.shape
    # The activity is sustained (otherwise the comparison below says little).
    assert reference[:, 0].sum() / net.n_exc / DURATION > 5.0
    # float32 against float64: the trains agree spike for spike at the start; later a rare
    # threshold crossing may go the other way, so compare rates there.
    early = 500  # 50 ms
    np.testing.assert_array_equal(got[:early], reference[:early])
    for pop, size in ((0, net.n_exc), (1, net.n_inh)):
        want = reference[:, pop].sum() / size / DURATION
        have = got[:, pop].sum() / size / DURATION
        assert abs(have - want) <= 0.05 * want + 0.5, (pop, have, want)


def test_plain_step_matches_numpy(plain, reference, net):
    _check_against_numpy(plain, reference, net)


def test_fused_step_matches_numpy(fused, reference, net):
    _check_against_numpy(fused, reference, net)


def test_counting_per_neuron_only_gives_the_numpy_spike_counts(net, reference):
    n_steps = 400  # 40 ms: the float32 trains still agree spike for spike with NumPy's
    args = (net.v0, net.ge0, net.gi0, net.w_exc, net.w_inh)
    out = coba.simulator(net, n_steps, raster=0, counts=False)(*args)
    assert "counts" not in out and out["raster"].shape == (n_steps, 0)
    per_neuron = np.asarray(out["per_neuron"])
    want = reference[:n_steps].sum(axis=0)
    assert want[0] > 0
    assert [per_neuron[:net.n_exc].sum(), per_neuron[net.n_exc:].sum()] == list(want)


@pytest.fixture(scope="module")
def jitc_net():
    return coba.build(N, PROB, seed=1, conn="jitc")


@pytest.fixture(scope="module")
def jitc_plain(jitc_net):
    return coba.simulate(jitc_net, DURATION)


def test_just_in_time_connectivity_matches_numpy(jitc_net, jitc_plain):
    """The same network with connectivity regenerated from a seed (the 100x configuration)."""
    _check_against_numpy(jitc_plain, numpy_coba(jitc_net, round(DURATION / 1e-4)), jitc_net)


def _check_fired(outputs, ne, count):
    """The kernel's spike counts per population and step, and each neuron's count
    (``count`` plus its spikes in the call), are its spike trains' (NumPy)."""
    spikes, fired = np.asarray(outputs[5]), np.asarray(outputs[6])
    assert fired.dtype == np.int32 and fired.shape == (spikes.shape[0], 2)
    want = np.stack([spikes[:, :ne].sum(axis=1), spikes[:, ne:].sum(axis=1)], axis=1)
    assert want[:, 0].any() and want[:, 1].any()  # both populations fire
    np.testing.assert_array_equal(fired, want)
    per_neuron = np.asarray(outputs[4])
    assert per_neuron.dtype == np.int32
    np.testing.assert_array_equal(per_neuron, np.asarray(count) + spikes.sum(axis=0))


def _busy_jitc_state(jitc_net):
    """A state in which most neurons fire at once: more targets in the first step than one
    block of the one-thread kernel's two-phase propagation holds (several blocks a step);
    the arguments of ``coba_jitc_step_p`` and its parameters but ``steps``."""
    import jax.numpy as jnp

    rs = np.random.default_rng(4)
    n = jitc_net.n
    v = jnp.asarray(rs.uniform(-49.5, -45.0, n).astype(np.float32))  # most neurons spike
    ref = jnp.asarray(rs.choice(np.array([0, 0, 0, 0, 2], np.int32), n))
    count = jnp.asarray(rs.integers(0, 1000, n).astype(np.int32))  # spikes before the call
    we, wi = jitc_net.w_exc, jitc_net.w_inh
    args = (v, jitc_net.ge0, jitc_net.gi0, ref, count, jnp.full((1,), we.weight, jnp.float32),
            jnp.full((1,), wi.weight, jnp.float32), jnp.asarray([we.seed, wi.seed], jnp.uint32))
    return args, {"prob": we.prob, "n_exc": jitc_net.n_exc}


def _fused_jitc_gives_the_plain_trains(jitc_net, jitc_plain, steps_per_call, threads):
    fused = coba.simulate(jitc_net, DURATION, fused=True, steps_per_call=steps_per_call,
                          threads=threads, min_neurons=0,  # threads even for few neurons
                          choose_threads=False)  # every step on the threads
    for key in ("counts", "per_neuron", "raster"):
        np.testing.assert_array_equal(fused[key], jitc_plain[key])
    # One compiled loop serves every number of steps per call and of threads (the cases
    # run in one process: a second compile would add a signature).
    # (The one-thread loop runs here only with one thread; other tests may have run it.)
    loop = numba_loop._numba_loop(numba_loop._jitc_propagate(float(PROB)))
    assert len(loop.signatures) == 1 if threads == 1 else len(loop.signatures) <= 1, \
        loop.signatures
    if threads == 1:
        return
    threaded = numba_threaded._numba_jitc_loop_threaded(float(PROB))
    assert len(threaded.signatures) == 1, threaded.signatures
    args, kw = _busy_jitc_state(jitc_net)
    kw["steps"] = steps_per_call
    one = coba.coba_jitc_step_p(*args, backend="numba", **kw)
    assert int(np.asarray(one[5][0]).sum()) * N * PROB > 2 * numba_loop._BLOCK
    several = coba.coba_jitc_step_p(*args, backend="numba", threads=threads, min_neurons=0,
                                    **kw)
    for g, w in zip(several, one):  # the same sums as one thread, bit for bit
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
    _check_fired(several, kw["n_exc"], args[4])
    # Blocks far smaller than a step's targets: each part leaves rows that every owner
    # generates again; still the same sums
    state = [np.array(a) for a in args[:5]]  # writable copies: the kernel's types
    outs = [np.empty_like(a) for a in state] + [np.empty((steps_per_call, N), np.bool_),
                                                 np.empty((steps_per_call, 2), np.int32)]
    threaded(*state, np.float32(args[5][0]), np.float32(args[6][0]), *np.asarray(args[7]),
             np.int64(kw["n_exc"]), np.int64(threads), np.int64(500), *outs)
    for g, w in zip(outs, one):
        np.testing.assert_array_equal(g, np.asarray(w))


@pytest.mark.parametrize("steps_per_call", [1, 10])
def test_fused_just_in_time_step_gives_the_plain_spike_trains(jitc_net, jitc_plain,
                                                              steps_per_call):
    """The fused kernel regenerates the rows inside the kernel: the plain step's trains."""
    _fused_jitc_gives_the_plain_trains(jitc_net, jitc_plain, steps_per_call, 1)


@pytest.mark.exhaustive  # compiles the threaded kernel (about a minute)
def test_fused_just_in_time_step_on_several_threads_gives_the_plain_spike_trains(
        jitc_net, jitc_plain):
    """The same on two and three threads (one test: one compile of the threaded kernel);
    the threaded kernel (the one compiled for the simulation) also gives the one-thread
    sums bit for bit from a busy state, and when its parts' targets overflow their blocks
    (the loop called with small ones)."""
    for steps_per_call, threads in ((10, 2), (5, 3)):
        _fused_jitc_gives_the_plain_trains(jitc_net, jitc_plain, steps_per_call, threads)


def _thread_choosing_gives(jitc_net, backend, n_steps, chunk_steps, steps_per_call):
    """The thread-choosing simulator, with a choice that alternates the ways chunk by
    chunk, gives the plain step's trains bit for bit, on a first call and on a second one
    (which keeps the choice)."""
    import primforge

    args = (jitc_net.v0, jitc_net.ge0, jitc_net.gi0, jitc_net.w_exc, jitc_net.w_inh)
    want = coba.simulator(jitc_net, n_steps)(*args)
    choice = primforge.OnlineChoice(2, min_interval=1, max_interval=1)
    run = coba.thread_choosing_simulator(jitc_net, n_steps, steps_per_call=steps_per_call,
                                         chunk_steps=chunk_steps, backend=backend,
                                         min_neurons=0, choice=choice)
    assert run.threads == (1, 2) and run.chunk_steps == chunk_steps and run.choice is choice
    chunks = n_steps // chunk_steps
    for calls in (1, 2):
        out = run(*args)
        assert sum(choice.chunks) == chunks * calls
        assert min(choice.chunks) >= (chunks // 2 - 1) * calls  # both ways ran
        assert np.asarray(want["counts"]).sum() > 0
        for key in ("counts", "per_neuron", "raster", "v"):
            np.testing.assert_array_equal(np.asarray(out[key]), np.asarray(want[key]))


def test_thread_choosing_simulator_gives_the_same_trains_whichever_way_runs_a_chunk(
        jitc_net):
    """Over the jax backend of the fused step (which runs every thread count alike, so
    this compiles no threaded kernel; two steps a kernel call keep its compile short):
    the plain step's trains."""
    _thread_choosing_gives(jitc_net, "jax", 200, 20, 2)


@pytest.mark.exhaustive  # compiles the threaded kernel (about a minute)
def test_thread_choosing_simulator_on_the_threaded_kernel_gives_the_plain_trains(
        jitc_net):
    _thread_choosing_gives(jitc_net, None, 2000, 200, 10)


def test_thread_choosing_simulator_runs_a_small_network_one_way_and_checks_its_arguments(
        net, jitc_net, jitc_plain):
    import primforge

    n_steps = round(DURATION / 1e-4)
    run = coba.thread_choosing_simulator(jitc_net, n_steps, raster=0, counts=False,
                                         chunk_steps=400)
    assert run.threads == (1,) and run.choice.ways == 1  # too few neurons for two threads
    assert run.chunk_steps == n_steps  # one way: the whole run in one call
    out = run(jitc_net.v0, jitc_net.ge0, jitc_net.gi0, jitc_net.w_exc, jitc_net.w_inh)
    assert "counts" not in out and out["raster"].shape == (n_steps, 0)
    np.testing.assert_array_equal(out["per_neuron"], jitc_plain["per_neuron"])
    assert run.choice.chunks == [1]
    with pytest.raises(TypeError, match="needs just-in-time connectivity"):
        coba.thread_choosing_simulator(net, n_steps)
    with pytest.raises(ValueError, match="chunk_steps=300 must be a positive divisor of "
                                         "the 2000 steps"):
        coba.thread_choosing_simulator(jitc_net, n_steps, chunk_steps=300)
    with pytest.raises(ValueError, match="steps_per_call=3 must be a positive divisor of "
                                         "the 400 steps"):
        coba.thread_choosing_simulator(jitc_net, n_steps, chunk_steps=400, steps_per_call=3)
    with pytest.raises(ValueError, match="'choice' has 3 ways, the network runs 2"):
        coba.thread_choosing_simulator(jitc_net, n_steps, min_neurons=0,
                                       choice=primforge.OnlineChoice(3))


def test_default_chunks_divide_the_run_and_hold_about_the_set_neuron_steps(jitc_net):
    """Worked out by hand from the rule (the largest multiple of the steps a call that
    divides the run and is at most CHUNK_NEURON_STEPS / n)."""
    n = jitc_net.n  # 2,000 neurons: at most 20,000 steps a chunk
    assert coba.CHUNK_NEURON_STEPS // n == 20_000
    assert coba.chunk_steps_for(jitc_net, 50_000, 10) == 12_500  # 50,000 = 4 x 12,500
    assert coba.chunk_steps_for(jitc_net, 30_000, 10) == 15_000
    assert coba.chunk_steps_for(jitc_net, 70, 10) == 70
    assert coba.chunk_steps_for(jitc_net, 20_010, 10) == 6_670  # 20,010 = 3 x 6,670
    with pytest.raises(ValueError, match="steps_per_call=7 must be a positive divisor"):
        coba.chunk_steps_for(jitc_net, 100, 7)


def test_fused_just_in_time_kernel_backends_agree(jitc_net):
    """The numba kernel (two-phase propagation, several blocks a step) against the jax one;
    several threads on the same state: the threaded test above."""
    args, kw = _busy_jitc_state(jitc_net)
    kw["steps"] = 3
    got = coba.coba_jitc_step_p(*args, backend="numba", **kw)
    want = coba.coba_jitc_step_p(*args, backend="jax", **kw)
    assert int(np.asarray(want[5][0]).sum()) * N * PROB > 2 * numba_loop._BLOCK
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6, atol=1e-5)
    _check_fired(got, kw["n_exc"], args[4])
    _check_fired(want, kw["n_exc"], args[4])
    with pytest.raises(ValueError, match="'threads' must be a positive int"):
        coba.coba_jitc_step_p(*args, backend="numba", threads=0, **kw)
    with pytest.raises(ValueError, match="'min_neurons' must be a non-negative int"):
        coba.coba_jitc_step_p(*args, backend="numba", threads=2, min_neurons=-1, **kw)


def test_threads_are_used_only_where_a_step_pays_for_them(jitc_net, monkeypatch):
    """Two threads on a network too small for them run the one-thread kernel itself (the
    threaded loop is not even built; same sums); from ``THREAD_MIN_NEURONS`` neurons per
    thread on, the threaded one."""
    import jax

    args, kw = _busy_jitc_state(jitc_net)
    kw["steps"] = 2
    want = coba.coba_jitc_step_p(*args, backend="numba", **kw)

    def not_built(prob):
        raise AssertionError("the threaded loop was built for a network run on one thread")

    monkeypatch.setattr(kernels, "_numba_jitc_loop_threaded", not_built)
    outs = tuple(jax.ShapeDtypeStruct(w.shape, w.dtype) for w in want)
    kernel = kernels._numba_jitc_step(**kw, outs=outs, threads=2)
    # the five state arrays are updated in place: XLA hands the kernel one buffer for each
    assert kernel.input_output_aliases == {i: i for i in range(5)}
    state = [np.array(a) for a in args]
    got = [np.empty(o.shape, o.dtype) for o in outs]
    kernel.fn(*state, *got)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, np.asarray(w))
    # and given the same arrays as inputs and outputs, the same results
    state = [np.array(a) for a in args]
    rest = [np.empty(o.shape, o.dtype) for o in outs[5:]]
    kernel.fn(*state, *state[:5], *rest)
    for g, w in zip([*state[:5], *rest], want):
        np.testing.assert_array_equal(g, np.asarray(w))
    # some arrays shared, the others not: each array is copied in or not on its own
    state = [np.array(a) for a in args]
    mixed = [state[0], np.empty_like(state[1]), state[2], np.empty_like(state[3]), state[4]]
    kernel.fn(*state, *mixed, *rest)
    for g, w in zip([*mixed, *rest], want):
        np.testing.assert_array_equal(g, np.asarray(w))
    assert coba.threads_used(jitc_net.n, 2) == 1
    assert coba.threads_used(2 * coba.THREAD_MIN_NEURONS, 2) == 2
    assert coba.threads_used(2 * coba.THREAD_MIN_NEURONS - 1, 2) == 1
    assert coba.threads_used(10**7, 1) == 1
    assert coba.threads_used(jitc_net.n, 3, min_neurons=0) == 3


def test_fused_step_rejects_mixed_or_mismatched_connectivity(net, jitc_net):
    with pytest.raises(TypeError, match="stored CSR or just-in-time"):
        coba.fused_step(net.w_exc, jitc_net.w_inh)
    other = coba.JitConn(3, 6.7, PROB / 2, jitc_net.w_inh.shape)
    with pytest.raises(ValueError, match="same connection prob"):
        coba.fused_step(jitc_net.w_exc, other)
    with pytest.raises(ValueError, match="needs just-in-time connectivity"):
        coba.fused_step(net.w_exc, net.w_inh, threads=2)


def test_fused_and_plain_give_the_same_spike_trains(plain, fused):
    np.testing.assert_array_equal(fused["counts"], plain["counts"])
    np.testing.assert_array_equal(fused["per_neuron"], plain["per_neuron"])
    np.testing.assert_array_equal(fused["raster"], plain["raster"])


def test_several_steps_per_kernel_call_give_the_same_spike_trains(net, plain):
    several = coba.simulate(net, DURATION, fused=True, steps_per_call=10)
    np.testing.assert_array_equal(several["counts"], plain["counts"])
    np.testing.assert_array_equal(several["per_neuron"], plain["per_neuron"])
    np.testing.assert_array_equal(several["raster"], plain["raster"])
    with pytest.raises(ValueError, match="divisor"):
        coba.simulator(net, 15, fused=True, steps_per_call=10)


def test_next_fired_finds_every_spike_of_any_range():
    """The kernels' scan for neurons that fired (64 neurons, then 8, then one at a time)
    against ``np.flatnonzero``: rows of every length mod 8 and mod 64, ranges starting and
    ending anywhere, dense and sparse."""
    import numba

    next_fired = numba_loop._next_fired()
    words = numba.njit(numba_loop._words)

    @numba.njit
    def fired(row, lo, hi):
        wds, out, k = words(row), np.empty(hi - lo, np.int64), 0
        i = next_fired(row, wds, lo, hi)
        while i < hi:
            out[k] = i
            k += 1
            i = next_fired(row, wds, i + 1, hi)
        return out[:k]

    rs = np.random.default_rng(5)
    for n in (1, 7, 8, 9, 63, 64, 65, 100, 1001, 4099):
        for rate in (0.0, 0.02, 0.5, 1.0):
            spk = np.zeros((3, n), np.bool_)  # a row of a 2-D array, as the kernels read
            spk[1] = rs.random(n) < rate
            spk[0] = spk[2] = True  # neighbours that fired: no word may cross the row's edges
            for lo, hi in [(0, n), *(sorted(rs.integers(0, n + 1, 2)) for _ in range(6))]:
                want = lo + np.flatnonzero(spk[1, lo:hi])
                np.testing.assert_array_equal(fired(spk[1], lo, hi), want,
                                              err_msg=f"n={n} rate={rate} {lo}:{hi}")


@pytest.mark.parametrize("conn", ["csr", "jitc"])
def test_fused_step_on_a_network_of_odd_size(conn):
    """Neither the neurons nor the excitatory ones a multiple of the scan's 8-byte words:
    the fused kernel still gives the plain step's trains."""
    odd = coba.build(1003, 0.08, seed=2, conn=conn)
    assert odd.n % 8 and odd.n_exc % 8
    plain = coba.simulate(odd, 0.05)
    fused = coba.simulate(odd, 0.05, fused=True, steps_per_call=10)
    assert plain["counts"].sum() > 50
    for key in ("counts", "per_neuron", "raster"):
        np.testing.assert_array_equal(fused[key], plain[key])


def test_fused_kernel_backends_agree_on_one_step(net):
    """The numba kernel against its jax reference (scatter-add propagation), three steps."""
    import jax.numpy as jnp

    rs = np.random.default_rng(3)
    v = jnp.asarray(rs.uniform(-55.0, -45.0, net.n).astype(np.float32))  # some spike
    ref = jnp.asarray(rs.integers(0, 3, net.n).astype(np.int32))
    count = jnp.asarray(rs.integers(0, 1000, net.n).astype(np.int32))
    args = (v, net.ge0, net.gi0, ref, count, net.w_exc.data, net.w_exc.indices,
            net.w_exc.indptr, net.w_inh.data, net.w_inh.indices, net.w_inh.indptr)
    before = [np.array(a) for a in args[:5]]
    got = coba.coba_step_p(*args, backend="numba", steps=3)
    # updated in place, yet the caller's arrays are left as they were (XLA copies them)
    for a, b in zip(args[:5], before):
        np.testing.assert_array_equal(np.asarray(a), b)
    copied = coba.coba_step_p(*args, backend="numba", steps=3, in_place=False)
    for g, c in zip(got, copied):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(c))
    want = coba.coba_step_p(*args, backend="jax", steps=3)
    assert int(np.asarray(want[5][0]).sum()) > 10
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6, atol=1e-5)
    _check_fired(got, net.n_exc, count)
    _check_fired(want, net.n_exc, count)


def test_fused_kernel_rejects_per_synapse_weights(net):
    w = net.w_exc.with_data(np.full(net.w_exc.nnz, 0.6, np.float32))
    with pytest.raises(ValueError, match="one shared weight"):
        coba.fused_step(w, net.w_inh)


# --- benchmarks/coba_threads.py on this file's network: its threaded kernel is the one the
# threaded test above compiled (about a minute a compile), in the same process.
@pytest.fixture(scope="module")
def bench():
    return load_script("benchmarks/coba_threads.py", "coba_threads")


@pytest.mark.exhaustive  # runs the threaded kernel the test above compiled
def test_the_benchmark_s_ways_run_the_same_steps_and_a_difference_is_caught(
        monkeypatch, bench, jitc_net):
    settled, outputs, ways = bench.runners(jitc_net, 300)
    assert tuple(ways) == bench.WAYS
    results = []
    for way in bench.WAYS:
        out = outputs(40)
        ways[way]([x.copy() for x in settled], out)
        results.append(out)
    assert results[0][5].any()  # neurons fire in these steps
    for other in results[1:]:
        for got, want in zip(other, results[0]):
            np.testing.assert_array_equal(got, want)

    row = bench.measure(1, 40, 2, 300, net=jitc_net)
    assert row["one thread"]["ratio"] == 1.0 and row["fired_per_step"] > 0
    for way in bench.WAYS:
        assert len(row[way]["all"]) == 2
        assert row[way]["q1"] <= row[way]["us_per_step"] <= row[way]["q3"]

    # calls of 10 steps, each from where the one before ended: where one call of 40 ends
    state = [x.copy() for x in settled]
    for call in range(4):
        out = outputs(10)
        ways["two threads"](state, out)
        state = out[:5]
    for got, want in zip(out, results[0]):
        np.testing.assert_array_equal(got, want[-10:] if got.ndim == 2 else want)
    row = bench.measure(1, 40, 1, 300, per_call=10, net=jitc_net)
    assert row["steps_per_call"] == 10 and len(row["two threads"]["all"]) == 1
    with pytest.raises(ValueError, match="multiple"):
        bench.measure(1, 40, 1, 300, per_call=15, net=jitc_net)

    # a way whose spikes differ from the first run's stops the benchmark
    real = bench.runners

    def flipped(*args):
        settled, outputs, ways = real(*args)
        two = ways["two threads"]

        def wrong(state, out):
            two(state, out)
            out[5][-1, 0] = ~out[5][-1, 0]

        return settled, outputs, {**ways, "two threads": wrong}

    monkeypatch.setattr(bench, "runners", flipped)
    with pytest.raises(AssertionError, match="two threads at 1x differs"):
        bench.measure(1, 40, 1, 300, net=jitc_net)


@pytest.mark.exhaustive
def test_the_benchmark_against_a_revision_loads_that_revision_s_example_and_runs_its_kernel(
        tmp_path, bench, jitc_net):
    """benchmarks/coba_threads.py ``--against REV``: the threaded kernel's module as the
    git revision has it (here the checked-out one; at a revision before primforge.sim,
    examples/coba.py), loaded as a module of its own, and its two-thread kernel run as a
    fifth way."""
    if not (ROOT / ".git").exists():
        pytest.skip("needs the repository's git history (a copy of the files has none)")

    def git(*args):
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                              check=True).stdout

    path = "primforge/sim/coba/numba_threaded.py"
    other = bench.example_at("HEAD", tmp_path / "head")
    assert other is not numba_threaded and other.__name__ == "coba_at_rev.numba_threaded"
    assert pathlib.Path(other.__file__).read_text() == git("show", f"HEAD:{path}").replace(
        "primforge.sim.coba", "coba_at_rev")
    assert other._numba_jitc_loop_threaded is not numba_threaded._numba_jitc_loop_threaded
    # before the package, the example script was the kernels' home
    first = git("log", "--diff-filter=A", "--format=%H", "--", path).split()[-1]
    older = bench.example_at(f"{first}~1", tmp_path / "older")
    assert pathlib.Path(older.__file__).read_text() == git("show", f"{first}~1:examples/coba.py")
    assert older._THREAD_BLOCK == numba_threaded._THREAD_BLOCK
    # Compiling the revision's threaded kernel takes as long as the present one's (about a
    # minute): the fifth way is checked with the present module's kernel, the one compiled
    # above, passed in as the revision's.
    ran = []

    class Revision:
        _THREAD_BLOCK = other._THREAD_BLOCK

        @staticmethod
        def _numba_jitc_loop_threaded(prob):
            ran.append(prob)
            return numba_threaded._numba_jitc_loop_threaded(prob)

    settled, outputs, ways = bench.runners(jitc_net, 300, Revision)
    assert tuple(ways) == bench.WAYS + ("two threads at REV",)
    one, earlier = outputs(30), outputs(30)
    ways["one thread"]([x.copy() for x in settled], one)
    ways["two threads at REV"]([x.copy() for x in settled], earlier)
    assert ran == [jitc_net.w_exc.prob]
    for got, want in zip(earlier, one):
        np.testing.assert_array_equal(got, want)


def test_the_benchmark_names_the_revision_before_it_runs(monkeypatch, tmp_path, bench):
    """``--against HEAD`` loads, and records, the commit HEAD names when the run starts, so
    that a commit made during a long run changes neither (the kernels are not compiled
    here: loading and measuring are replaced by recorders)."""
    if not (ROOT / ".git").exists():
        pytest.skip("needs the repository's git history (a copy of the files has none)")
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()
    loaded = []
    monkeypatch.setattr(bench, "example_at", lambda rev, folder: loaded.append(rev) or rev)

    def measure(scale, steps, reps, settle, other, per_call):
        assert other == head  # the module of the named commit
        return {"scale": scale, "fired_per_step": 1.0,
                "one thread": {"us_per_step": 2.0, "q1": 1.0, "q3": 3.0, "ratio": 1.0}}

    monkeypatch.setattr(bench, "measure", measure)
    result = bench.main(["--against", "HEAD", "--out", str(tmp_path / "r.json")])
    assert loaded == [head] and result["against"] == head
