"""Multi-device sharding checks, run in a subprocess with simulated CPU devices.

Usage: python multidevice.py OUT.json [NUM_DEVICES]. Sets XLA_FLAGS before JAX starts,
runs every check, and writes {name: {"ok": bool, "detail": str}}. Each check compares
against NumPy / plain jax.numpy references, never against the code under test.
"""

from __future__ import annotations

import json
import os
import sys
import traceback

N_DEV = int(sys.argv[2]) if len(sys.argv) > 2 else 8
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={N_DEV}"
)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _hooks
import jax
import jax.numpy as jnp
import kernels
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

_hooks.install()

RESULTS: dict[str, dict] = {}


def check(fn):
    try:
        detail = fn()
        RESULTS[fn.__name__] = {"ok": True, "detail": str(detail or "")}
    except Exception as e:  # noqa: BLE001 - reported to pytest, which fails the check
        RESULTS[fn.__name__] = {
            "ok": False,
            "detail": f"{type(e).__name__}: {e}\n{traceback.format_exc()[-3000:]}",
        }
    return fn


def compiled_text(f, *args) -> str:
    return jax.jit(f).lower(*args).compile().as_text()


def assert_no_all_gather(text: str, what: str):
    if "all-gather" in text:
        lines = [ln.strip() for ln in text.splitlines() if "all-gather" in ln]
        raise AssertionError(f"{what}: compiled HLO gathers: {lines[:3]}")


def auto_mesh(shape, names):
    return jax.make_mesh(shape, names, axis_types=(jax.sharding.AxisType.Auto,) * len(shape))


MESH = auto_mesh((N_DEV,), ("x",))
MESH2 = auto_mesh((2, N_DEV // 2), ("a", "b"))
RNG = np.random.default_rng(0)
X_NP = RNG.standard_normal((2 * N_DEV, 6)).astype(np.float32)
X = jax.device_put(X_NP, NamedSharding(MESH, P("x")))

EW = kernels.affine("sh_ew_jax", "jax", rule="elementwise")
EW_NUMBA = kernels.affine("sh_ew_numba", "numba", rule="elementwise")
EW_NUMBA_NORULE = kernels.affine("sh_ew_numba_norule", "numba", rule=None)


def ew(k, x):
    return k(x, outs=jax.ShapeDtypeStruct(x.shape, x.dtype))


@check
def elementwise_row_sharded():
    f = lambda x: ew(EW, x)
    y = jax.jit(f)(X)
    np.testing.assert_allclose(np.asarray(y), 2 * X_NP + 1, rtol=1e-6)
    assert y.sharding.spec[0] == "x", y.sharding
    assert_no_all_gather(compiled_text(f, X), "elementwise kernel")


@check
def elementwise_2d_mesh():
    x_np = RNG.standard_normal((4, 2 * N_DEV)).astype(np.float32)
    x = jax.device_put(x_np, NamedSharding(MESH2, P("a", "b")))
    f = lambda x: ew(EW, x)
    y = jax.jit(f)(x)
    np.testing.assert_allclose(np.asarray(y), 2 * x_np + 1, rtol=1e-6)
    assert tuple(y.sharding.spec) == ("a", "b"), y.sharding
    assert_no_all_gather(compiled_text(f, x), "elementwise kernel on a 2-D mesh")


@check
def elementwise_uneven_shards_replicate():
    # 10 rows over N_DEV devices do not split evenly: the rule keeps them whole (correct).
    x_np = RNG.standard_normal((10, 3)).astype(np.float32)
    x = jax.device_put(x_np, NamedSharding(MESH, P()))
    y = jax.jit(lambda x: ew(EW, x), out_shardings=NamedSharding(MESH, P()))(x)
    np.testing.assert_allclose(np.asarray(y), 2 * x_np + 1, rtol=1e-6)


@check
def numba_with_rule_does_not_gather():
    f = lambda x: ew(EW_NUMBA, x)
    y = jax.jit(f)(X)
    np.testing.assert_allclose(np.asarray(y), 2 * X_NP + 1, rtol=1e-6)
    assert_no_all_gather(compiled_text(f, X), "numba kernel with a rule")


@check
def numba_without_rule_gathers():
    # The control: an opaque kernel without a rule is gathered, so the HLO check can fail.
    f = lambda x: ew(EW_NUMBA_NORULE, x)
    y = jax.jit(f)(X)
    np.testing.assert_allclose(np.asarray(y), 2 * X_NP + 1, rtol=1e-6)
    assert "all-gather" in compiled_text(f, X), "expected an all-gather without a rule"


@check
def elementwise_grad_and_jvp():
    w_np = RNG.standard_normal(X_NP.shape).astype(np.float32)
    w = jax.device_put(w_np, NamedSharding(MESH, P("x")))
    loss = lambda x, w: jnp.sum(ew(EW_NUMBA, x) ** 2 * w)
    g = jax.jit(jax.grad(loss))(X, w)
    np.testing.assert_allclose(np.asarray(g), 4 * (2 * X_NP + 1) * w_np, rtol=1e-5)
    assert_no_all_gather(compiled_text(jax.grad(loss), X, w), "grad of the elementwise kernel")
    _, t = jax.jit(lambda x, t: jax.jvp(lambda x: ew(EW_NUMBA, x), (x,), (t,)))(X, w)
    np.testing.assert_allclose(np.asarray(t), 2 * w_np, rtol=1e-6)


@check
def vmap_native_batch_is_a_factor():
    # vmap adds a native batch level; sharding the batch axis must not gather.
    xb_np = RNG.standard_normal((N_DEV, 5)).astype(np.float32)
    xb = jax.device_put(xb_np, NamedSharding(MESH, P("x")))
    f = jax.vmap(lambda x: ew(EW_NUMBA, x))
    y = jax.jit(f)(xb)
    np.testing.assert_allclose(np.asarray(y), 2 * xb_np + 1, rtol=1e-6)
    assert_no_all_gather(compiled_text(f, xb), "vmapped numba kernel")


# ---------------------------------------------------------------------- CSR matvec
CSR = kernels.blocked_csr_matvec("sh_csrmv")
BLOCKS = kernels.random_blocked_csr(RNG, n_blocks=N_DEV, rows=4, n_cols=12, density=0.4)
DENSE = kernels.blocked_to_dense(*BLOCKS, n_cols=12)
V_NP = RNG.standard_normal(12).astype(np.float32)


def _csr_args():
    indptr, indices, data = BLOCKS
    rows = NamedSharding(MESH, P("x"))
    return (
        jax.device_put(indptr, rows),
        jax.device_put(indices, rows),
        jax.device_put(data, rows),
        jax.device_put(V_NP, NamedSharding(MESH, P())),
    )


def csrmv(indptr, indices, data, v):
    out = jax.ShapeDtypeStruct((indptr.shape[0], indptr.shape[1] - 1), data.dtype)
    return CSR(indptr, indices, data, v, outs=[out])[0]


@check
def csr_row_sharded_matvec():
    args = _csr_args()
    y = jax.jit(csrmv)(*args)
    np.testing.assert_allclose(np.asarray(y).reshape(-1), DENSE @ V_NP, rtol=1e-5, atol=1e-6)
    assert y.sharding.spec[0] == "x", y.sharding
    assert_no_all_gather(compiled_text(csrmv, *args), "row-sharded CSR matvec")


@check
def csr_grad_through_partitioned_kernel():
    indptr, indices, data, v = _csr_args()
    w_np = RNG.standard_normal(DENSE.shape[0]).astype(np.float32)
    w = jnp.asarray(w_np.reshape(N_DEV, -1))

    def loss(data, v):
        return jnp.sum(csrmv(indptr, indices, data, v) * w)

    g_data, g_v = jax.jit(jax.grad(loss, argnums=(0, 1)))(data, v)
    np.testing.assert_allclose(np.asarray(g_v), DENSE.T @ w_np, rtol=1e-5, atol=1e-5)
    # d loss / d data[p, k] = w[row(p, k)] * v[col(p, k)] for stored entries, 0 for padding
    ref = kernels.blocked_data_grad(*BLOCKS, w_np, V_NP)
    np.testing.assert_allclose(np.asarray(g_data), ref, rtol=1e-5, atol=1e-6)
    text = compiled_text(jax.grad(loss, argnums=(0, 1)), data, v)
    # Nothing row-partitioned is gathered; the vector's cotangent is summed (all-reduce).
    assert_no_all_gather(text, "grad of the row-sharded CSR matvec")
    assert "all-reduce" in text, "the transposed kernel should sum partial cotangents"


@check
def dense_matvec_reduction_factor():
    mv = kernels.dense_matvec("sh_dense_mv")
    a_np = RNG.standard_normal((6, 2 * N_DEV)).astype(np.float32)
    a = jax.device_put(a_np, NamedSharding(MESH, P(None, "x")))
    v = jax.device_put(V_NP[:1].repeat(2 * N_DEV) * np.arange(2 * N_DEV, dtype=np.float32),
                       NamedSharding(MESH, P("x")))
    f = lambda a, v: mv(a, v, outs=jax.ShapeDtypeStruct((6,), jnp.float32))
    y = jax.jit(f)(a, v)
    np.testing.assert_allclose(np.asarray(y), a_np @ np.asarray(v), rtol=1e-5, atol=1e-5)
    text = compiled_text(f, a, v)
    assert_no_all_gather(text, "contraction-sharded matvec")
    assert "all-reduce" in text


# ---------------------------------------------------------------------- shard_map, explicit
@check
def kernel_inside_shard_map():
    def body(x):
        return ew(EW_NUMBA_NORULE, x) + ew(EW, x)

    f = jax.shard_map(body, mesh=MESH, in_specs=P("x"), out_specs=P("x"))
    y = jax.jit(f)(X)
    np.testing.assert_allclose(np.asarray(y), 2 * (2 * X_NP + 1), rtol=1e-6)
    g = jax.jit(jax.grad(lambda x: jnp.sum(f(x))))(X)
    np.testing.assert_allclose(np.asarray(g), np.full(X_NP.shape, 4.0), rtol=1e-6)
    assert_no_all_gather(compiled_text(f, X), "kernel inside shard_map")


@check
def register_primitive_partitions():
    from primforge.primitive import register_primitive

    prim = register_primitive("sh_sq_plus_one", lambda x: x * x + 1.0)
    y = jax.jit(prim.bind)(X)
    np.testing.assert_allclose(np.asarray(y), X_NP * X_NP + 1, rtol=1e-6)
    assert_no_all_gather(compiled_text(prim.bind, X), "register_primitive under jit")
    f = jax.shard_map(prim.bind, mesh=MESH, in_specs=P("x"), out_specs=P("x"))
    np.testing.assert_allclose(np.asarray(jax.jit(f)(X)), X_NP * X_NP + 1, rtol=1e-6)
    g = jax.jit(jax.grad(lambda x: jnp.sum(f(x))))(X)
    np.testing.assert_allclose(np.asarray(g), 2 * X_NP, rtol=1e-6)


@check
def explicit_mesh_types_and_grad():
    mesh = jax.make_mesh((N_DEV,), ("x",), axis_types=(jax.sharding.AxisType.Explicit,))
    with jax.set_mesh(mesh):
        x = jax.device_put(X_NP, NamedSharding(mesh, P("x")))
        f = lambda x: ew(EW_NUMBA, x)
        out_type = jax.jit(f).trace(x).out_info
        assert tuple(out_type.sharding.spec)[:1] == ("x",), out_type
        y = jax.jit(f)(x)
        np.testing.assert_allclose(np.asarray(y), 2 * X_NP + 1, rtol=1e-6)
        g = jax.jit(jax.grad(lambda x: jnp.sum(f(x) * x)))(x)
        np.testing.assert_allclose(np.asarray(g), 4 * X_NP + 1, rtol=1e-5)
        assert_no_all_gather(compiled_text(f, x), "explicit-mesh kernel")


@check
def bad_rule_raises_at_trace_time():
    k = kernels.affine("sh_bad_rule", "jax", rule="i j, j -> i")  # one operand, not two
    try:
        jax.jit(lambda x: ew(k, x)).trace(X)
    except ValueError as e:
        assert "sh_bad_rule" in str(e) and "1 input" in str(e), str(e)
        return str(e)
    raise AssertionError("a rule that does not fit the call was accepted")


@check
def ops_csrmv_under_sharding():
    try:
        from primforge.ops import csrmv as ops_csrmv
    except ImportError as e:
        return f"skipped: primforge.ops.csrmv not importable ({e})"
    import scipy.sparse as sp

    a = sp.random(16, 12, density=0.3, random_state=1, format="csr", dtype=np.float32)
    v = jax.device_put(V_NP, NamedSharding(MESH, P()))
    f = lambda v: ops_csrmv(
        jnp.asarray(a.data), jnp.asarray(a.indices), jnp.asarray(a.indptr), v, shape=a.shape
    )
    np.testing.assert_allclose(np.asarray(jax.jit(f)(v)), a @ V_NP, rtol=1e-5, atol=1e-6)
    return "correct under jit with a replicated NamedSharding input"


if __name__ == "__main__":
    with open(sys.argv[1], "w") as fh:
        json.dump({"n_devices": jax.device_count(), "checks": RESULTS}, fh, indent=1)
