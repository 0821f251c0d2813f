"""A CSR matrix split by rows over a mesh axis: W @ x and x @ W inside jax.shard_map.

Run on 4 simulated CPU devices:
    XLA_FLAGS=--xla_force_host_platform_device_count=4 python examples/csr_row_blocks.py
Each device holds only its block of rows; x @ W sums the blocks' partial outputs with one
psum. The script checks both products against NumPy and the one-device product, and that
the compiled programs gather no matrix array.
"""

from __future__ import annotations

from functools import partial

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from primforge import ops

B = jax.device_count()
m, n = 50, 37
rng = np.random.default_rng(0)
dense = np.where(rng.random((m, n)) < 0.2, rng.normal(size=(m, n)), 0).astype(np.float32)
W = ops.CSR.from_dense(dense)

blocks = ops.csr_row_blocks(W, B)
r = blocks.block_shape[0]
mesh = jax.make_mesh((B,), ("rows",))
split = NamedSharding(mesh, P("rows"))
data, indices, indptr = (jax.device_put(a, split) for a in blocks[:3])


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
spikes_padded = jax.device_put(np.pad(spikes, (0, B * r - m)), split)

y = np.asarray(matvec(data, indices, indptr, x))[:m]
z = np.asarray(vecmat(data, indices, indptr, spikes_padded))
np.testing.assert_allclose(y, dense @ x, rtol=1e-5, atol=1e-5)
np.testing.assert_allclose(z, spikes @ dense, rtol=1e-5, atol=1e-5)
np.testing.assert_allclose(y, np.asarray(W @ x), rtol=1e-5, atol=1e-5)
np.testing.assert_allclose(z, np.asarray(spikes @ W), rtol=1e-5, atol=1e-5)

for f, v in ((matvec, x), (vecmat, spikes_padded)):
    hlo = f.lower(data, indices, indptr, v).compile().as_text()
    assert "all-gather" not in hlo, "a matrix array was gathered"
    assert ("all-reduce" in hlo) == (f is vecmat), "x @ W sums its blocks with one psum"
print(f"{B} devices, {r} rows each, {blocks.data.shape[1]} entries per block: "
      f"W @ x and x @ W match NumPy; no all-gather")
