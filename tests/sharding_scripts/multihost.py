"""One process of a two-process (multi-host) run on loopback, 2 CPU devices per process.

Usage: python -m primforge.distributed -n 2 --devices-per-process 2 multihost.py OUT_DIR

Every process runs the same program (SPMD): it joins the others with
``primforge.distributed.initialize`` (``jax.distributed`` underneath), builds a global
row-sharded array from its local rows, calls a kernel with an elementwise sharding rule
and a row-sharded blocked-CSR matvec under ``jax.jit``, and checks its own shards against
NumPy. Results go to OUT_DIR/p<process>.json.
"""

from __future__ import annotations

import json
import os
import sys
import traceback

PID = int(os.environ["PRIMFORGE_PROCESS_ID"])
OUT = os.path.join(sys.argv[1], f"p{PID}.json")
LOCAL = 2
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax

import primforge.distributed

result: dict = {"process": PID}
try:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    primforge.distributed.initialize(local_device_ids=list(range(LOCAL)),
                                     initialization_timeout=60)
    import _hooks
    import jax.numpy as jnp
    import kernels
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    _hooks.install()
    result["devices"] = [jax.device_count(), jax.local_device_count()]
    n_dev = jax.device_count()
    mesh = jax.make_mesh((n_dev,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))
    rows = NamedSharding(mesh, P("x"))

    def global_array(full: np.ndarray, sharding):
        # Each process holds only the rows of its own devices.
        return jax.make_array_from_callback(full.shape, sharding, lambda idx: full[idx])

    def check_local(arr, expected, what):
        for shard in arr.addressable_shards:
            np.testing.assert_allclose(np.asarray(shard.data), expected[shard.index],
                                       rtol=1e-5, atol=1e-6, err_msg=what)

    x_np = np.arange(4 * n_dev * 3, dtype=np.float32).reshape(4 * n_dev, 3) / 7
    x = global_array(x_np, rows)
    ew = kernels.affine("mh_ew", "numba", rule="elementwise")
    f = jax.jit(lambda x: ew(x, outs=jax.ShapeDtypeStruct(x.shape, x.dtype)))
    y = f(x)
    check_local(y, 2 * x_np + 1, "elementwise")
    result["ew_no_all_gather"] = "all-gather" not in f.lower(x).compile().as_text()
    g = jax.jit(jax.grad(lambda x: jnp.sum(ew(x, outs=jax.ShapeDtypeStruct(x.shape, x.dtype))
                                           * x)))(x)
    check_local(g, 4 * x_np + 1, "grad")

    rng = np.random.default_rng(3)  # same seed in every process: same global matrix
    indptr, indices, data = kernels.random_blocked_csr(rng, n_blocks=n_dev, rows=3,
                                                       n_cols=10, density=0.4)
    dense = kernels.blocked_to_dense(indptr, indices, data, n_cols=10)
    v_np = rng.standard_normal(10).astype(np.float32)
    csr = kernels.blocked_csr_matvec("mh_csr")

    def csrmv(ip, ix, d, v):
        out = jax.ShapeDtypeStruct((ip.shape[0], ip.shape[1] - 1), d.dtype)
        return csr(ip, ix, d, v, outs=[out])[0]

    args = (global_array(indptr, rows), global_array(indices, rows),
            global_array(data, rows), global_array(v_np, NamedSharding(mesh, P())))
    ycsr = jax.jit(csrmv)(*args)
    check_local(ycsr, (dense @ v_np).reshape(n_dev, -1), "csr matvec")
    result["csr_no_all_gather"] = (
        "all-gather" not in jax.jit(csrmv).lower(*args).compile().as_text()
    )
    result["ok"] = True
except Exception as e:  # noqa: BLE001 - reported to the parent test
    result["ok"] = False
    result["error"] = f"{type(e).__name__}: {e}\n{traceback.format_exc()[-3000:]}"
finally:
    with open(OUT, "w") as fh:
        json.dump(result, fh)
    import contextlib

    with contextlib.suppress(Exception):
        jax.distributed.shutdown()
