"""Every family of primforge.ops that splits across devices, on one global mesh.

Run as 2 processes of 2 CPU devices each (or as one process of any device count):
    python -m primforge.distributed -n 2 --devices-per-process 2 ops_processes.py
Each process checks its own shards of every result against NumPy and against the same
call on one device (bitwise where the summation order is the same; a sum across devices
adds in another order: tolerance), and that no compiled program gathers a matrix array
(an all-gather or all-to-all whose result has a matrix array's size). It prints one line
per process, "process P of N: C checks ...", and exits non-zero on the first mismatch.
"""

from __future__ import annotations

import primforge.distributed

primforge.distributed.initialize()  # first: before any other JAX call

import math
import re
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import primforge
from primforge import ops

B = jax.device_count()  # every device of every process
mesh = jax.make_mesh((B,), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
SPLIT, WHOLE = NamedSharding(mesh, P("d")), NamedSharding(mesh, P())
one = jax.local_devices()[0]  # the one-device program runs here, unsharded
rng = np.random.default_rng(0)  # the same matrices and inputs in every process

# Sizes: every matrix array's size differs from every vector's, so the gather check below
# cannot mistake a vector for a matrix.
M, N = 12 * B, 10  # rows (split) and columns of the fixed-number, dense and CSR matrices
K = 3  # entries per fixed-number row
CHECKS: list[str] = []
MATRIX_SIZES: set[int] = set()


def put(a, sharding=SPLIT):
    """A global array of which this process supplies only its own devices' blocks."""
    a = np.asarray(a)
    return jax.make_array_from_callback(a.shape, sharding, lambda idx: a[idx])


def matrix(a, sharding=SPLIT):
    """``put`` for a matrix array: its size joins the sizes no collective may gather."""
    MATRIX_SIZES.add(int(np.size(a)))
    return put(a, sharding)


def on_one(f, *args):
    """``f`` on one device of this process, on whole (unsharded) inputs."""
    args = jax.device_put(jax.tree.map(np.asarray, args), one)
    return jax.tree.map(np.asarray, jax.jit(f)(*args))


def check(name, got, want, single, *, bitwise):
    """This process's shards of ``got`` against NumPy's ``want`` and one device's ``single``."""
    for shard in got.addressable_shards:
        g, idx = np.asarray(shard.data), shard.index
        np.testing.assert_allclose(g, want[idx], rtol=1e-5, atol=1e-5, err_msg=name)
        if bitwise:
            np.testing.assert_array_equal(g, single[idx], err_msg=f"{name}: not bitwise")
        else:
            np.testing.assert_allclose(g, single[idx], rtol=1e-6, atol=1e-6, err_msg=name)
    CHECKS.append(name)


_COLLECTIVE = re.compile(r"=\s*(.*?)\s(all-gather|all-to-all)(?:-start)?\(")


def gathered(f, *args) -> list[str]:
    """The collectives of ``f``'s compiled program whose result has a matrix array's size."""
    hlo = jax.jit(f).lower(*args).compile().as_text()
    bad = []
    for line in hlo.splitlines():
        hit = _COLLECTIVE.search(line)
        if hit is None:
            continue
        sizes = {math.prod(int(d) for d in dims.split(",") if d)
                 for dims in re.findall(r"\w+\[([\d,]*)\]", hit.group(1))}
        if sizes & MATRIX_SIZES:
            bad.append(line.strip()[:160])
    return bad


def no_gather(name, f, *args):
    bad = gathered(f, *args)
    assert not bad, f"{name}: a matrix array is gathered: {bad}"


# ----------------------------------------------------------------- CSR: row blocks
dense = np.where(rng.random((M, N)) < 0.3, rng.normal(size=(M, N)), 0).astype(np.float32)
dense[3] = 0  # an empty row
W = ops.CSR.from_dense(dense)
blocks = ops.csr_row_blocks(W, B)
R = blocks.block_shape[0] * B  # the rows of the blocks (M here: B divides M)
data, indices, indptr = (matrix(a) for a in blocks[:3])
row_of = np.repeat(np.arange(M), np.diff(np.asarray(W.indptr)))  # each stored entry's row
col_of = np.asarray(W.indices)
as_blocks = lambda d: ops.csr_row_blocks(W.with_data(d), B).data
CSR_IN = (P("d"),) * 3


@partial(jax.shard_map, mesh=mesh, in_specs=CSR_IN + (P(),), out_specs=P("d"))
def csr_matvec(data, indices, indptr, x):  # W @ x: each device its own rows
    return ops.csrmv(data[0], indices[0], indptr[0], x, shape=blocks.block_shape)


@partial(jax.shard_map, mesh=mesh, in_specs=CSR_IN + (P("d"),), out_specs=P())
def csr_vecmat(data, indices, indptr, x):  # x @ W: partial sums of the blocks added
    y = ops.csrmv(data[0], indices[0], indptr[0], x, shape=blocks.block_shape,
                  transpose=True)
    return jax.lax.psum(y, "d")


@partial(jax.shard_map, mesh=mesh, in_specs=CSR_IN + (P("d"), P()), out_specs=P("d"))
def csr_on_pre(data, indices, indptr, pre_spikes, post_trace):
    block = ops.CSR(data[0], indices[0], indptr[0], shape=blocks.block_shape)
    return ops.update_on_pre(block, pre_spikes, post_trace, w_max=0.8).data[None]


@partial(jax.shard_map, mesh=mesh, in_specs=CSR_IN + (P(), P("d")), out_specs=P("d"))
def csr_on_post(data, indices, indptr, post_spikes, pre_trace):
    block = ops.CSR(data[0], indices[0], indptr[0], shape=blocks.block_shape)
    return ops.update_on_post(block, post_spikes, pre_trace, w_min=-0.8).data[None]


x = rng.normal(size=N).astype(np.float32)
spikes = rng.random(M) < 0.4
check("csr W @ x", jax.jit(csr_matvec)(data, indices, indptr, put(x, WHOLE)), dense @ x,
      on_one(lambda x: W @ x, x), bitwise=True)
check("csr x @ W", jax.jit(csr_vecmat)(data, indices, indptr, put(spikes)), spikes @ dense,
      on_one(lambda s: s @ W, spikes), bitwise=False)
no_gather("csr W @ x", csr_matvec, data, indices, indptr, put(x, WHOLE))
no_gather("csr x @ W", csr_vecmat, data, indices, indptr, put(spikes))

# Plasticity on the row blocks: the one-device update, cut into the same blocks.
post_trace = rng.normal(size=N).astype(np.float32)
pre_trace = rng.normal(size=M).astype(np.float32)
post_spikes = rng.random(N) < 0.4
w = np.asarray(W.data)
on_pre_np = np.where(spikes[row_of], np.minimum(w + post_trace[col_of], 0.8), w)
on_post_np = np.where(post_spikes[col_of], np.maximum(w + pre_trace[row_of], -0.8), w)
for name, f, args, want, single in (
        ("csr update_on_pre (row blocks)", csr_on_pre, (put(spikes), put(post_trace, WHOLE)),
         on_pre_np, lambda s, t: ops.update_on_pre(W, s, t, w_max=0.8)),
        ("csr update_on_post (row blocks)", csr_on_post,
         (put(post_spikes, WHOLE), put(pre_trace)), on_post_np,
         lambda s, t: ops.update_on_post(W, s, t, w_min=-0.8))):
    host = tuple(np.asarray(a) for a in ((spikes, post_trace) if "pre" in name
                                         else (post_spikes, pre_trace)))
    check(name, jax.jit(f)(data, indices, indptr, *args), as_blocks(want),
          as_blocks(on_one(single, *host).data), bitwise=True)
    no_gather(name, f, data, indices, indptr, *args)

# grad (data and x) and vmap (a batch of x) of the recipe.
c = rng.normal(size=M).astype(np.float32)


def csr_loss(d, i, p, x):
    return jnp.sum(csr_matvec(d, i, p, x) * c)


csr_grad = jax.grad(csr_loss, argnums=(0, 3))
g_data, g_x = jax.jit(csr_grad)(data, indices, indptr, put(x, WHOLE))
one_data, one_x = on_one(jax.grad(lambda d, x: jnp.sum((W.with_data(d) @ x) * c),
                                  argnums=(0, 1)), W.data, x)
check("csr grad data", g_data, as_blocks(c[row_of] * x[col_of]), as_blocks(one_data),
      bitwise=True)
check("csr grad x", g_x, dense.T @ c, one_x, bitwise=False)
no_gather("csr grad", csr_grad, data, indices, indptr, put(x, WHOLE))
xs = rng.normal(size=(5, N)).astype(np.float32)
batched = jax.vmap(csr_matvec, in_axes=(None, None, None, 0))
check("csr vmap W @ x", jax.jit(batched)(data, indices, indptr, put(xs, WHOLE)),
      xs @ dense.T, on_one(jax.vmap(lambda x: W @ x), xs), bitwise=False)
no_gather("csr vmap", batched, data, indices, indptr, put(xs, WHOLE))

# ----------------------------------------------------------------- fixed number: rules
fn_idx = rng.integers(0, N, size=(M, K)).astype(np.int32)
fn_w = rng.normal(size=(M, K)).astype(np.float32)
F = ops.FixedNum(fn_w, fn_idx, shape=(M, N))
fn_dense = np.asarray(F.todense())
fw, fi = matrix(fn_w), matrix(fn_idx)


def fixed(w, i):
    return ops.FixedNum(w, i, shape=(M, N))


def fn_matvec(w, i, x):
    return fixed(w, i) @ x


def fn_vecmat(w, i, s):
    return s @ fixed(w, i)


check("fixed number A @ x", jax.jit(fn_matvec)(fw, fi, put(x, WHOLE)), fn_dense @ x,
      on_one(fn_matvec, fn_w, fn_idx, x), bitwise=True)
check("fixed number A.T @ x", jax.jit(fn_vecmat)(fw, fi, put(spikes)), spikes @ fn_dense,
      on_one(fn_vecmat, fn_w, fn_idx, spikes), bitwise=False)
no_gather("fixed number A @ x", fn_matvec, fw, fi, put(x, WHOLE))
no_gather("fixed number A.T @ x", fn_vecmat, fw, fi, put(spikes))

fn_grad = jax.grad(lambda w, i, x: jnp.sum(fn_matvec(w, i, x) * c), argnums=(0, 2))
g_w, g_x = jax.jit(fn_grad)(fw, fi, put(x, WHOLE))
one_w, one_x = on_one(fn_grad, fn_w, fn_idx, x)
check("fixed number grad weights", g_w, c[:, None] * x[fn_idx], one_w, bitwise=True)
check("fixed number grad x", g_x, fn_dense.T @ c, one_x, bitwise=False)
no_gather("fixed number grad", fn_grad, fw, fi, put(x, WHOLE))
fn_batched = jax.vmap(fn_matvec, in_axes=(None, None, 0))
check("fixed number vmap A @ x", jax.jit(fn_batched)(fw, fi, put(xs, WHOLE)),
      xs @ fn_dense.T, on_one(fn_batched, fn_w, fn_idx, xs), bitwise=True)
no_gather("fixed number vmap", fn_batched, fw, fi, put(xs, WHOLE))


# Fixed-number plasticity: the (m, k) rows shard by the kernel's rule.
def fn_on_pre(w, i, s, t):
    return ops.update_on_pre(fixed(w, i), s, t, w_max=0.8).weights


def fn_on_post(w, i, s, t):
    return ops.update_on_post(fixed(w, i), s, t, w_min=-0.8).weights


for name, f, host, sharded, want in (
        ("fixed number update_on_pre", fn_on_pre, (spikes, post_trace),
         (put(spikes), put(post_trace, WHOLE)),
         np.where(spikes[:, None], np.minimum(fn_w + post_trace[fn_idx], 0.8), fn_w)),
        ("fixed number update_on_post", fn_on_post, (post_spikes, pre_trace),
         (put(post_spikes, WHOLE), put(pre_trace)),
         np.where(post_spikes[fn_idx], np.maximum(fn_w + pre_trace[:, None], -0.8), fn_w))):
    check(name, jax.jit(f)(fw, fi, *sharded), want, on_one(f, fn_w, fn_idx, *host),
          bitwise=True)
    no_gather(name, f, fw, fi, *sharded)

# ----------------------------------------------------------------- dense: rules
Wd = rng.normal(size=(M, N)).astype(np.float32)
Wds = matrix(Wd)
check("dense W @ x", jax.jit(ops.densemv)(Wds, put(x, WHOLE)), Wd @ x,
      on_one(ops.densemv, Wd, x), bitwise=True)
check("dense events x @ W", jax.jit(partial(ops.binary_densemv, transpose=True))(
    Wds, put(spikes)), spikes @ Wd, on_one(partial(ops.binary_densemv, transpose=True), Wd,
                                           spikes), bitwise=False)
no_gather("dense W @ x", ops.densemv, Wds, put(x, WHOLE))
no_gather("dense events x @ W", partial(ops.binary_densemv, transpose=True), Wds, put(spikes))
check("dense update_on_pre", jax.jit(ops.update_on_pre)(Wds, put(spikes), put(post_trace,
                                                                              WHOLE)),
      np.where(spikes[:, None], Wd + post_trace, Wd),
      on_one(ops.update_on_pre, Wd, spikes, post_trace), bitwise=True)
no_gather("dense update_on_pre", ops.update_on_pre, Wds, put(spikes), put(post_trace, WHOLE))

# ----------------------------------------------------------------- a user kernel
def _leak_kernel():
    import numba

    @numba.njit
    def leak(v, current, out):
        for i in range(v.shape[0]):
            out[i] = 0.875 * v[i] + current[i]

    return leak


leak = primforge.XLACustomKernel("ops_processes_leak", replace=True)
leak.def_kernel("numba", "cpu", lambda **_: _leak_kernel())
leak.def_sharding_rule("n, n -> n")


def step(v, current):
    return leak(v, current, outs=jax.ShapeDtypeStruct(v.shape, v.dtype))


v, cur = rng.normal(size=M).astype(np.float32), rng.normal(size=M).astype(np.float32)
check("user kernel (its own rule)", jax.jit(step)(put(v), put(cur)), 0.875 * v + cur,
      on_one(step, v, cur), bitwise=True)
no_gather("user kernel", step, put(v), put(cur))

# ----------------------------------------------------------------- the check checks
assert not MATRIX_SIZES & {M, N, 5 * M, 5 * N}, "a vector has a matrix array's size"
# A CSR update on whole-matrix operands keeps them whole: its row-sharded data is gathered,
# which the check above must see.
MATRIX_SIZES.add(W.nnz)
gathers = gathered(lambda d, s, t: ops.update_on_pre(ops.CSR(d, W.indices, W.indptr,
                                                             shape=W.shape), s, t).data,
                   put(W.data), put(spikes, WHOLE), put(post_trace, WHOLE))
assert gathers, "the gather check missed a gathered matrix array"

print(f"process {jax.process_index()} of {jax.process_count()}: {len(CHECKS)} checks match "
      f"NumPy and one device; no matrix array gathered", flush=True)
