"""Event-driven products split by rows across processes, on one global mesh.

A population of ``n_post`` neurons receives the spikes of ``n_pre`` neurons through two
connection matrices: a fixed-number one (``k`` partners per post neuron) and a dense one.
Both products are split by rows (post neurons) over every device of every process: each
device holds only its rows of the connectivity and computes only its neurons' input, with
no communication (the spike vector is replicated).

Run as two processes of two CPU devices each, or as one process:

    python -m primforge.distributed -n 2 --devices-per-process 2 examples/distributed_events.py
    python examples/distributed_events.py

With ``--out DIR`` each process also saves the inputs and its own rows of the results to
``DIR/rank<process>.npz``.
"""

import argparse
import os
import re

import primforge.distributed

primforge.distributed.initialize()  # first: before any other JAX call

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from primforge import ops

parser = argparse.ArgumentParser()
parser.add_argument("--out", default=None, help="folder for rank<process>.npz")
parser.add_argument("--seed", type=int, default=0)
cli = parser.parse_args()

rank, n_dev = jax.process_index(), jax.device_count()
mesh = jax.make_mesh((n_dev,), ("x",))  # every device of every process
rows, whole = NamedSharding(mesh, P("x")), NamedSharding(mesh, P())

# Every process draws the same global data from the same seed, then keeps its own rows.
n_pre, n_post, k = 200, 128, 10  # n_post: a multiple of the device count
rng = np.random.default_rng(cli.seed)
spikes = rng.random(n_pre) < 0.1
indices = rng.integers(0, n_pre, size=(n_post, k)).astype(np.int32)
weights = rng.standard_normal((n_post, k)).astype(np.float32)
dense = (rng.standard_normal((n_post, n_pre)) * (rng.random((n_post, n_pre)) < 0.2))
dense = dense.astype(np.float32)


def put(a, sharding):
    """A global array of which this process supplies only its own devices' blocks."""
    return jax.make_array_from_callback(a.shape, sharding, lambda idx: a[idx])


@jax.jit
def input_current(weights, indices, dense, spikes):
    fixed = ops.binary_fixed_num_mv(weights, indices, spikes, shape=(n_post, n_pre))
    return fixed, ops.binary_densemv(dense, spikes)


args = (put(weights, rows), put(indices, rows), put(dense, rows), put(spikes, whole))
fixed, dense_out = input_current(*args)
hlo = input_current.lower(*args).compile().as_text()
collectives = sorted(set(re.findall(r"\b(all-gather|all-reduce|all-to-all|collective-permute)"
                                    r"(?:-start)?\(", hlo)))

held = np.zeros(n_post, bool)
mine = {"fixed": np.full(n_post, np.nan, np.float32),
        "dense": np.full(n_post, np.nan, np.float32)}
for name, out in (("fixed", fixed), ("dense", dense_out)):
    for shard in out.addressable_shards:
        mine[name][shard.index] = np.asarray(shard.data)
        held[shard.index] = True
lo, hi = np.flatnonzero(held)[[0, -1]]
print(f"process {rank} of {jax.process_count()}: {jax.local_device_count()} of {n_dev} "
      f"devices, rows {lo}..{hi} of {n_post}, collectives: {collectives or 'none'}")

if cli.out:
    os.makedirs(cli.out, exist_ok=True)
    np.savez(os.path.join(cli.out, f"rank{rank}.npz"), spikes=spikes, indices=indices,
             weights=weights, dense=dense, held=held, fixed=mine["fixed"],
             dense_out=mine["dense"], n_processes=jax.process_count(), n_devices=n_dev,
             collectives=np.array(collectives, dtype=str))
