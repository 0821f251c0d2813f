"""ops.csr_row_blocks: row blocks of equal array shapes, and the shard_map recipe on 4 devices."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse as sp

from primforge import ops

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("num_blocks,homo", [(1, False), (3, False), (4, True), (13, False)])
def test_blocks_hold_the_matrix_rows(num_blocks, homo):
    rng = np.random.default_rng(num_blocks)
    m, n = 11, 7
    dense = np.where(rng.random((m, n)) < 0.4, rng.normal(size=(m, n)), 0).astype(np.float32)
    dense[4] = 0  # an empty row
    if homo:
        dense = np.where(dense != 0, np.float32(0.5), np.float32(0))
    W = ops.CSR.from_dense(dense, homogeneous=homo)
    blocks = ops.csr_row_blocks(W, num_blocks)
    r = -(-m // num_blocks)
    assert blocks.block_shape == (r, n) and blocks.indptr.shape == (num_blocks, r + 1)
    assert blocks.indices.shape == (num_blocks, blocks.indices.shape[1])
    padded = np.zeros((num_blocks * r, n), np.float32)
    padded[:m] = dense
    for b in range(num_blocks):
        ptr, idx = blocks.indptr[b], blocks.indices[b]
        nnz = ptr[-1]
        vals = np.broadcast_to(blocks.data[b], idx.shape)[:nnz]
        got = sp.csr_matrix((vals, idx[:nnz], ptr), shape=(r, n)).toarray()
        np.testing.assert_array_equal(got, padded[b * r:(b + 1) * r])
        if not homo:
            assert not blocks.data[b, nnz:].any()
        x = rng.normal(size=n).astype(np.float32)  # the product on the padded block
        np.testing.assert_allclose(
            np.asarray(ops.csrmv(blocks.data[b], idx, ptr, x, shape=blocks.block_shape)),
            padded[b * r:(b + 1) * r] @ x, rtol=1e-5, atol=1e-5)


def test_bad_arguments_are_named():
    W = ops.CSR.from_dense(np.eye(3, dtype=np.float32))
    with pytest.raises(ValueError, match="'num_blocks' must be a positive integer"):
        ops.csr_row_blocks(W, 0)
    with pytest.raises(TypeError, match="'W' must be a CSR"):
        ops.csr_row_blocks(np.eye(3), 2)


def test_shard_map_recipe_on_four_devices():
    """examples/csr_row_blocks.py on 4 simulated devices: W @ x and x @ W split by row
    blocks equal NumPy and the one-device product, and the compiled programs gather no
    matrix array (the example asserts each)."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT),
               XLA_FLAGS="--xla_force_host_platform_device_count=4")
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "csr_row_blocks.py")],
                         capture_output=True, text=True, timeout=300, cwd=ROOT, env=env,
                         check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "process 0 of 1: 4 devices, 13 rows each" in out.stdout
    assert "match NumPy; no all-gather" in out.stdout


# Two processes: tests/test_distributed_launch.py and tests/test_sharding.py run the
# launcher and one global mesh over processes in the default tier.
@pytest.mark.exhaustive
def test_shard_map_recipe_on_two_processes_of_two_devices():
    """The same example started by the launcher as 2 processes x 2 CPU devices: every
    process checks its own rows of W @ x and its copy of x @ W against NumPy and the
    one-device product, with no all-gather (bounded: the launcher stops both at its
    timeout)."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
    for name in ("XLA_FLAGS", "JAX_COORDINATOR_ADDRESS", "PRIMFORGE_NUM_PROCESSES",
                 "PRIMFORGE_PROCESS_ID", "SLURM_JOB_ID", "OMPI_COMM_WORLD_SIZE"):
        env.pop(name, None)
    argv = [sys.executable, "-m", "primforge.distributed", "-n", "2", "--devices-per-process",
            "2", "--timeout", "120", str(ROOT / "examples" / "csr_row_blocks.py")]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=180, cwd=ROOT, env=env,
                         check=False)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    for rank in (0, 1):
        assert (f"process {rank} of 2: 4 devices, 13 rows each, " in text
                and text.count("match NumPy; no all-gather") == 2), text[-3000:]


def test_grad_of_the_recipe_with_a_whole_input():
    """grad inside shard_map of a kernel bound on varying blocks and a whole (P()) x: the
    whole operand is cast to varying at the call, so its cotangent is summed over the
    devices instead of failing as mistyped; compared with NumPy's gradients."""
    from functools import partial

    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    rng = np.random.default_rng(5)
    dense = np.where(rng.random((6, 5)) < 0.5, rng.normal(size=(6, 5)), 0).astype(np.float32)
    W = ops.CSR.from_dense(dense)
    nb = jax.device_count()
    blocks = ops.csr_row_blocks(W, nb)
    mesh = jax.make_mesh((nb,), ("rows",))
    data, indices, indptr = (jax.device_put(a, NamedSharding(mesh, P("rows")))
                             for a in blocks[:3])
    c = rng.normal(size=nb * blocks.block_shape[0]).astype(np.float32)
    c[6:] = 0

    @partial(jax.shard_map, mesh=mesh, in_specs=(P("rows"),) * 3 + (P(),), out_specs=P("rows"))
    def matvec(data, indices, indptr, x):
        return ops.csrmv(data[0], indices[0], indptr[0], x, shape=blocks.block_shape)

    def loss(d, x):
        return jnp.sum(matvec(d, indices, indptr, x) * c)

    x = rng.normal(size=5).astype(np.float32)
    g_data, g_x = jax.jit(jax.grad(loss, argnums=(0, 1)))(data, x)
    rows = np.repeat(np.arange(6), np.diff(np.asarray(W.indptr)))
    want = ops.csr_row_blocks(W.with_data(c[rows] * x[np.asarray(W.indices)]), nb).data
    np.testing.assert_allclose(g_data, want, rtol=1e-6)
    np.testing.assert_allclose(g_x, dense.T @ c[:6], rtol=1e-5, atol=1e-6)
