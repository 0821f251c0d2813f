"""A CSR matrix split by rows over a mesh axis: W @ x and x @ W inside jax.shard_map.

Run on 4 simulated CPU devices, or as 2 processes of 2 devices each:
    XLA_FLAGS=--xla_force_host_platform_device_count=4 python examples/csr_row_blocks.py
    python -m primforge.distributed -n 2 --devices-per-process 2 examples/csr_row_blocks.py
Each device holds only its block of rows; x @ W sums the blocks' partial outputs with one
psum. Every process checks its part of both products against NumPy and the one-device
product, and that the compiled programs gather no matrix array.
"""

from __future__ import annotations

import primforge.distributed

primforge.distributed.initialize()  # first: before any other JAX call

from functools import partial

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from primforge import ops

B = jax.device_count()  # every device of every process
m, n = 50, 37
rng = np.random.default_rng(0)  # the same matrix and inputs in every process
dense = np.where(rng.random((m, n)) < 0.2, rng.normal(size=(m, n)), 0).astype(np.float32)
W = ops.CSR.from_dense(dense)

blocks = ops.csr_row_blocks(W, B)
r = blocks.block_shape[0]
mesh = jax.make_mesh((B,), ("rows",))
split, whole = NamedSharding(mesh, P("rows")), NamedSharding(mesh, P())


def put(a, sharding):
    """A global array of which this process supplies only its own devices' blocks."""
    return jax.make_array_from_callback(a.shape, sharding, lambda idx: a[idx])


data, indices, indptr = (put(a, split) for a in blocks[:3])


@jax.jit
@partial(jax.shard_map, mesh=mesh, in_specs=(P("rows"),) * 3 + (P(),), out_specs=P("rows"))
def matvec(data, indices, indptr, x):  # W @ x: each device computes its block's rows
    return ops.csrmv(data[0], indices[0], indptr[0], x, shape=blocks.block_shape)


@jax.jit
@partial(jax.shard_map, mesh=mesh, in_specs=(P("rows"),) * 4, out_specs=P())
def vecmat(data, indices, indptr, x):  # x @ W: x split like the rows, partial sums added
    y = ops.csrmv(data[0], indices[0], indptr[0], x, shape=blocks.block_shape,
                  transpose=True)
    return jax.lax.psum(y, "rows")


x = rng.normal(size=n).astype(np.float32)
spikes = rng.random(m) < 0.3  # binary events of the rows, padded to B * r rows
x_whole, spikes_split = put(x, whole), put(np.pad(spikes, (0, B * r - m)), split)
y = matvec(data, indices, indptr, x_whole)
z = vecmat(data, indices, indptr, spikes_split)

# This process's rows of W @ x (padding rows past m are zero) and its copy of x @ W.
want_y = np.pad(dense @ x, (0, B * r - m))
one_device_y = np.pad(np.asarray(W @ x), (0, B * r - m))
for shard in y.addressable_shards:
    np.testing.assert_allclose(np.asarray(shard.data), want_y[shard.index], rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_allclose(np.asarray(shard.data), one_device_y[shard.index], rtol=1e-5,
                               atol=1e-5)
z_local = np.asarray(z.addressable_shards[0].data)
np.testing.assert_allclose(z_local, spikes @ dense, rtol=1e-5, atol=1e-5)
np.testing.assert_allclose(z_local, np.asarray(spikes @ W), rtol=1e-5, atol=1e-5)

for f, v in ((matvec, x_whole), (vecmat, spikes_split)):
    hlo = f.lower(data, indices, indptr, v).compile().as_text()
    assert "all-gather" not in hlo, "a matrix array was gathered"
    assert ("all-reduce" in hlo) == (f is vecmat), "x @ W sums its blocks with one psum"
print(f"process {jax.process_index()} of {jax.process_count()}: {B} devices, {r} rows "
      f"each, {blocks.data.shape[1]} entries per block: W @ x and x @ W match NumPy; "
      f"no all-gather")
