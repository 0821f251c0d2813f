"""Small kernels with sharding rules, shared by the sharding tests and the benchmark.

* ``affine``: y = 2x + 1, elementwise ('jax' or 'numba' backend).
* ``blocked_csr_matvec``: a CSR matvec stored as row blocks, one block per device:
  ``indptr`` (P, R+1) with offsets local to the block, ``indices``/``data`` (P, K)
  padded with zeros past each block's nonzeros, vector (n,) replicated; result (P, R).
  Rows are sharded by sharding the leading block axis ``p``. Its transpose
  (``transpose=True``) sums each block's contribution: ``p`` is a reduction factor there.
* ``dense_matvec``: y = A v with the rule "i j, j -> i" and ``j`` a reduction factor.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import primforge
from primforge._compat import Zero, is_undefined_primal
from primforge.kernel.sharding import ShardingRule


def _numba_affine():
    import numba

    @numba.njit
    def affine_kernel(x, out):
        xf = x.reshape(x.size)
        of = out.reshape(out.size)
        for i in range(xf.size):
            of[i] = 2 * xf[i] + 1

    return affine_kernel


def affine(name: str, backend: str, rule=None) -> primforge.XLACustomKernel:
    k = primforge.XLACustomKernel(name, replace=True)
    if backend == "jax":
        k.def_kernel("jax", "cpu", lambda **kw: lambda x: (2 * x + 1,))
    else:
        kern = _numba_affine()
        k.def_kernel("numba", "cpu", lambda **kw: kern)

    def jvp(primals, tangents, *, outs, **kw):
        (x,), (t,) = primals, tangents
        return k(x, outs=list(outs), **kw), [2 * t]

    k.def_jvp_rule(jvp)
    if rule is not None:
        k.def_sharding_rule(rule)
    return k


# ---------------------------------------------------------------------- blocked CSR
def _rows(indptr, k):
    """(P, R+1) block offsets -> (P, K) row of each stored entry (R marks padding)."""
    return jax.vmap(lambda ip: jnp.searchsorted(ip, jnp.arange(k), side="right") - 1)(indptr)


def _csr_generator(transpose=False, outs=(), **kw):
    def matvec(indptr, indices, data, v):
        n_rows = indptr.shape[1] - 1
        rows = _rows(indptr, indices.shape[1])
        contrib = data * v[indices]
        seg = jax.vmap(lambda c, r: jax.ops.segment_sum(c, r, num_segments=n_rows))
        return (seg(contrib, rows),)

    def matvec_t(indptr, indices, data, u):
        n_rows = indptr.shape[1] - 1
        rows = _rows(indptr, indices.shape[1])
        valid = rows < n_rows
        picked = jnp.take_along_axis(u, jnp.minimum(rows, n_rows - 1), axis=1)
        vals = jnp.where(valid, data * picked, 0)
        n = outs[0].shape[0]
        return (jnp.zeros(n, data.dtype).at[indices.reshape(-1)].add(vals.reshape(-1)),)

    return matvec_t if transpose else matvec


def _csr_rule(ins, outs, *, transpose=False, **kw):
    if transpose:
        return ShardingRule("p a, p k, p k, p r -> n", reduction_factors=("p",))
    return "p a, p k, p k, n -> p r"


def blocked_csr_matvec(name: str) -> primforge.XLACustomKernel:
    k = primforge.XLACustomKernel(name, replace=True)
    k.def_kernel("jax", "cpu", _csr_generator)

    def jvp(primals, tangents, *, outs, transpose=False, **kw):
        indptr, indices, data, v = primals
        _, _, t_data, t_v = tangents
        y = k(*primals, outs=list(outs), transpose=transpose, **kw)
        t = jnp.zeros(outs[0].shape, outs[0].dtype)
        if type(t_data) is not Zero:
            t = t + k(indptr, indices, t_data, v, outs=list(outs), transpose=transpose, **kw)[0]
        if type(t_v) is not Zero:
            t = t + k(indptr, indices, data, t_v, outs=list(outs), transpose=transpose, **kw)[0]
        return y, [t]

    def transpose_rule(cts, indptr, indices, data, v, *, outs, transpose=False, **kw):
        if transpose:
            raise NotImplementedError("second-order transpose not needed in these tests")
        (ct,) = cts
        if type(ct) is Zero:
            return [None, None, None, None]
        ct_data = ct_v = None
        if is_undefined_primal(v):
            v_struct = jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype)
            ct_v = k(indptr, indices, data, ct, outs=[v_struct], transpose=True, **kw)[0]
        if is_undefined_primal(data):
            n_rows = indptr.shape[1] - 1
            rows = _rows(indptr, indices.shape[1])
            picked = jnp.take_along_axis(ct, jnp.minimum(rows, n_rows - 1), axis=1)
            ct_data = jnp.where(rows < n_rows, picked * v[indices], 0)
        return [None, None, ct_data, ct_v]

    k.def_jvp_rule(jvp)
    k.def_transpose_rule(transpose_rule)
    k.def_sharding_rule(_csr_rule)
    return k


def random_blocked_csr(rng, *, n_blocks, rows, n_cols, density):
    """Random blocked CSR: (indptr (P, R+1) int32, indices (P, K) int32, data (P, K) f32)."""
    blocks = []
    for _ in range(n_blocks):
        mask = rng.random((rows, n_cols)) < density
        r, c = np.nonzero(mask)
        vals = rng.standard_normal(len(r)).astype(np.float32)
        indptr = np.concatenate([[0], np.cumsum(mask.sum(1))]).astype(np.int32)
        blocks.append((indptr, c.astype(np.int32), vals))
    k = max(1, max(len(b[1]) for b in blocks))
    indptr = np.stack([b[0] for b in blocks])
    indices = np.zeros((n_blocks, k), np.int32)
    data = np.zeros((n_blocks, k), np.float32)
    for p, (_, c, vals) in enumerate(blocks):
        indices[p, : len(c)] = c
        data[p, : len(c)] = vals
    return indptr, indices, data


def blocked_to_dense(indptr, indices, data, *, n_cols):
    n_blocks, r1 = indptr.shape
    rows = r1 - 1
    dense = np.zeros((n_blocks * rows, n_cols), np.float32)
    for p in range(n_blocks):
        for r in range(rows):
            for j in range(indptr[p, r], indptr[p, r + 1]):
                dense[p * rows + r, indices[p, j]] += data[p, j]
    return dense


def blocked_data_grad(indptr, indices, data, w, v):
    n_blocks, r1 = indptr.shape
    rows = r1 - 1
    grad = np.zeros_like(data)
    for p in range(n_blocks):
        for r in range(rows):
            for j in range(indptr[p, r], indptr[p, r + 1]):
                grad[p, j] = w[p * rows + r] * v[indices[p, j]]
    return grad


# ---------------------------------------------------------------------- dense matvec
def dense_matvec(name: str) -> primforge.XLACustomKernel:
    k = primforge.XLACustomKernel(name, replace=True)
    k.def_kernel("jax", "cpu", lambda **kw: lambda a, v: (a @ v,))
    k.def_sharding_rule("i j, j -> i", reduction_factors=("j",))
    return k
