"""The COBA network (primforge.sim.coba, just-in-time connectivity) split by neurons across
the devices of one global mesh, in one process or several.

Each device owns a contiguous block of neurons (a multiple of 32) and, every step:

1. integrates its neurons and detects their spikes (the arithmetic of the plain step);
2. packs its spikes 32 to a uint32 word; ONE collective, an ``all_gather`` of the words,
   gives every device the spikes of all neurons (N / 8 bytes);
3. adds the inputs its neurons receive: ``binary_jitc_matvec(..., transpose=True,
   cols=(c0, width))`` regenerates the rows of the neurons that fired from the global seed
   and keeps the columns of its own block (c0 from ``jax.lax.axis_index``), so the
   connectivity is the same whatever the split and each device draws only what it needs.

The spike trains are those of one process, bit for bit (``--check`` compares them with
primforge.sim.coba's plain step run here on one device).

Run:  python examples/coba_distributed.py [--scale 1] [--duration 0.02] [--check] [--json]
      python -m primforge.distributed -n 2 --devices-per-process 2 \\
          examples/coba_distributed.py --check
"""

from __future__ import annotations

import primforge.distributed

primforge.distributed.initialize()  # first: before any other JAX call

import argparse
import json
import resource
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from primforge.ops import PackedEvents, binary_jitc_matvec, pack_events
from primforge.sim import coba  # the network and the neurons' step

AXIS = "neurons"


def layout(n: int, devices: int) -> tuple[int, int]:
    """``(width, padded)``: neurons per device (a multiple of 32) and ``devices * width``."""
    width = -(-n // (32 * devices)) * 32
    return width, width * devices


def distributed_run(net: coba.Network, n_steps: int, mesh, *, record: bool = False,
                    replay: bool = False):
    """A jitted ``run(v, ge, gi) -> dict`` over the mesh's devices (``v``, ``ge``, ``gi``
    padded to ``devices * width`` and split along the mesh axis).

    The result: ``counts`` (steps, 2) spikes of each population per step, ``v`` the final
    potentials (split), ``per_neuron`` spikes per neuron (split) and with ``record`` the
    gathered spike words of every step (steps, padded / 32). With ``replay``, ``run(v, ge,
    gi, words)`` reads each step's spikes from recorded ``words`` (replicated) instead of
    gathering them: the same work without the collective, for timing.
    """
    n, ne = net.n, net.n_exc
    width, padded = layout(n, mesh.size)
    we, wi = net.w_exc, net.w_inh

    def local(v, ge, gi, recorded=None):  # one device's block of neurons
        c0 = jax.lax.axis_index(AXIS) * width
        valid = jnp.arange(width) + c0 < n  # the padding neurons never fire

        def body(carry, words):
            v, ge, gi, ref, per_neuron = carry
            v, spike, ref = coba.neuron_update(v, ge, gi, ref)
            spike = spike & valid
            if words is None:  # the step's one collective
                words = jax.lax.all_gather(pack_events(spike).words, AXIS, tiled=True)
            spikes = PackedEvents(words, padded).unpack()[:n]  # every neuron's spike
            ge = ge * coba.DECAY_E + binary_jitc_matvec(
                we.weight, we.seed, spikes[:ne], shape=we.shape, prob=we.prob, transpose=True,
                cols=(c0, width))
            gi = gi * coba.DECAY_I + binary_jitc_matvec(
                wi.weight, wi.seed, spikes[ne:], shape=wi.shape, prob=wi.prob, transpose=True,
                cols=(c0, width))
            v = jnp.where(spike, coba.F32(coba.VR), v)
            counts = jnp.stack([jnp.sum(spikes[:ne], dtype=jnp.int32),
                                jnp.sum(spikes[ne:], dtype=jnp.int32)])
            per_neuron = per_neuron + spike.astype(jnp.int32)
            return (v, ge, gi, ref, per_neuron), (counts, words if record else None)

        zero = jnp.zeros(width, jnp.int32)
        (v, _, _, _, per_neuron), (counts, words) = jax.lax.scan(
            body, (v, ge, gi, zero, zero), recorded, length=n_steps)
        return counts, v, per_neuron, words

    split = P(AXIS)
    sim = jax.shard_map(local, mesh=mesh, in_specs=(split,) * 3 + ((P(),) if replay else ()),
                        out_specs=(P(), split, split, P() if record else None),
                        check_vma=False)

    @jax.jit
    def run(v, ge, gi, *recorded):
        counts, v, per_neuron, words = sim(v, ge, gi, *recorded)
        return {"counts": counts, "v": v, "per_neuron": per_neuron, "words": words}

    return run


def exchange_only(n: int, n_steps: int, mesh):
    """A jitted scan of ``n_steps`` all_gathers of the same words as the simulation (the
    collective alone, for timing); each step's words depend on the previous result."""
    width, _ = layout(n, mesh.size)
    w32 = width // 32

    def local(words):
        i = jax.lax.axis_index(AXIS)

        def body(words, _):
            every = jax.lax.all_gather(words, AXIS, tiled=True)
            return jax.lax.dynamic_slice(every, (i * w32,), (w32,)) + jnp.uint32(1), None

        return jax.lax.scan(body, words, None, length=n_steps)[0]

    sim = jax.shard_map(local, mesh=mesh, in_specs=P(AXIS), out_specs=P(AXIS),
                        check_vma=False)
    return jax.jit(sim)


def reference_words(net: coba.Network, n_steps: int, padded: int):
    """The one-process simulation (primforge.sim.coba's plain step on one device): its
    packed spikes per step and final potentials."""
    step = coba.plain_step(net.w_exc, net.w_inh)

    @jax.jit
    def run(v, ge, gi):
        def body(state, _):
            state, spike = step(state)
            return state, pack_events(jnp.pad(spike, (0, padded - net.n))).words

        ref = jnp.zeros(v.shape, jnp.int32)
        state, words = jax.lax.scan(body, (v, ge, gi, ref), None, length=n_steps)
        return words, state[0]

    return run(net.v0, net.ge0, net.gi0)


def best_ms(f, *args, repeats: int = 2):
    """``(result, ms)``: the last result of ``repeats`` calls after one warm-up call, and
    the fastest call's wall time in milliseconds."""
    out = jax.block_until_ready(f(*args))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = jax.block_until_ready(f(*args))
        times.append(1e3 * (time.perf_counter() - t0))
    return out, min(times)


def peak_rss_mib() -> float:
    """Peak resident memory of this process (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", type=int, default=1,
                    help="4,000 x scale neurons, 80 inputs each (1000: 4 million neurons)")
    ap.add_argument("--duration", type=float, default=0.02, help="simulated seconds")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check", action="store_true",
                    help="compare the spike trains with one process's, bit for bit")
    ap.add_argument("--time-exchange", action="store_true",
                    help="also time the steps without the collective (replaying the recorded "
                    "spikes) and a scan of the all_gathers alone")
    ap.add_argument("--repeats", type=int, default=1,
                    help="timed runs after a warm-up run (the fastest is reported)")
    ap.add_argument("--json", action="store_true", help="print one JSON line per process")
    args = ap.parse_args(argv)

    net = coba.scaled(args.scale, args.seed, conn="jitc")
    n_steps = round(args.duration * 1000.0 / coba.DT)
    devices = jax.device_count()
    padded = layout(net.n, devices)[1]
    mesh = jax.make_mesh((devices,), (AXIS,))
    split = NamedSharding(mesh, P(AXIS))

    def put(a):  # this process supplies only its own devices' blocks
        a = np.pad(np.asarray(a), (0, padded - net.n))
        return jax.make_array_from_callback(a.shape, split, lambda idx: a[idx])

    state = tuple(put(a) for a in (net.v0, net.ge0, net.gi0))
    run = distributed_run(net, n_steps, mesh, record=args.check)
    t0 = time.perf_counter()
    compiled = run.lower(*state).compile()
    compile_s = time.perf_counter() - t0
    out, run_ms = best_ms(compiled, *state, repeats=args.repeats)
    counts = np.asarray(out["counts"])
    summary = {
        "process": jax.process_index(), "processes": jax.process_count(),
        "devices": devices, "neurons": net.n, "synapses": net.w_exc.nnz + net.w_inh.nnz,
        "steps": n_steps, "duration_s": args.duration,
        "spikes": [int(counts[:, 0].sum()), int(counts[:, 1].sum())],
        "rate_exc_hz": float(counts[:, 0].sum() / net.n_exc / args.duration),
        "rate_inh_hz": float(counts[:, 1].sum() / net.n_inh / args.duration),
        "compile_s": compile_s, "step_ms": run_ms / n_steps,
        "bytes_per_step": padded // 8,  # the gathered words, on every device
        "peak_rss_mib": peak_rss_mib(),  # before the timing runs below (they record spikes)
    }
    if args.time_exchange:
        # the same steps reading the recorded spikes: the local work alone
        record = distributed_run(net, n_steps, mesh, record=True)(*state)
        recorded = np.asarray(record["words"].addressable_shards[0].data)
        del record
        whole = NamedSharding(mesh, P())
        recorded = jax.make_array_from_callback(recorded.shape, whole,
                                                lambda idx: recorded[idx])
        replay = distributed_run(net, n_steps, mesh, replay=True).lower(
            *state, recorded).compile()
        again, ms = best_ms(replay, *state, recorded, repeats=args.repeats)
        summary["compute_ms"] = ms / n_steps
        if not np.array_equal(np.asarray(again["counts"]), counts):
            raise AssertionError("the replayed steps gave other spikes")
        del recorded, again
        exchange = exchange_only(net.n, n_steps, mesh)
        words = jax.make_array_from_callback(
            (padded // 32,), split, lambda idx: np.zeros(padded // 32, np.uint32)[idx])
        compiled_x = exchange.lower(words).compile()
        summary["exchange_ms"] = best_ms(compiled_x, words, repeats=args.repeats)[1] / n_steps
    if args.check:
        want_words, want_v = reference_words(net, n_steps, padded)
        got = np.asarray(out["words"].addressable_shards[0].data)
        np.testing.assert_array_equal(got, np.asarray(want_words))
        want_v = np.pad(np.asarray(want_v), (0, padded - net.n), constant_values=np.nan)
        for shard in out["v"].addressable_shards:  # this process's neurons (not the padding)
            mine = ~np.isnan(want_v[shard.index])
            np.testing.assert_array_equal(np.asarray(shard.data)[mine], want_v[shard.index][mine])
        summary["check"] = "same spike trains and potentials as one process"
    if args.json:
        print(json.dumps(summary), flush=True)
    else:
        print(f"process {summary['process']} of {summary['processes']}, {devices} devices: "
              f"{net.n} neurons, {summary['synapses']} synapses, {n_steps} steps; "
              f"spikes E {summary['spikes'][0]} I {summary['spikes'][1]} "
              f"({summary['rate_exc_hz']:.2f} / {summary['rate_inh_hz']:.2f} Hz); "
              f"{summary['step_ms']:.3f} ms/step; {summary.get('check', 'not checked')}",
              flush=True)
    return summary


if __name__ == "__main__":
    main(sys.argv[1:])
