"""Every primforge.ops kernel under jit with sharded inputs, on simulated CPU devices.

Usage: python ops_sharding.py OUT.json [NUM_DEVICES] [--only=NAME ...] [--without=NAME ...].
Sets XLA_FLAGS before JAX starts, runs every check (``--only=NAME`` picks those whose name
contains NAME) and writes {"checks": {name: {"ok", "partitioned", "detail"}}, ...}.

Each check first compares the result with a NumPy reference (dense matrices built here,
never by the code under test), then asserts that the call ran partitioned: the output's
sharding, and the collectives in the compiled HLO (no all-gather of the big operand; an
all-reduce exactly where a reduction factor sums partial results). The partition
assertions raise :class:`NotPartitioned`; ``partitioned`` records whether they held.
Then, with ``--without=NAME``, every ops kernel loses its sharding rule and the checks
named run again in the same process (``"without_rules"``; ``--without=`` runs all): the
values must stay right while the partition assertions fail, which shows that they can fail.
``--also-run=SCRIPT`` runs another script written for any number of devices in this
process too, after the checks and before the rules go (``"scripts"``: its output, and
whether it exited cleanly): it reuses the kernels' Numba builds instead of compiling them
in a process of its own.
"""

from __future__ import annotations

import json
import os
import re
import sys
import traceback

ARGS = [a for a in sys.argv[1:] if not a.startswith("--")]
N_DEV = int(ARGS[1]) if len(ARGS) > 1 else 4
ONLY = [a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--only=")]
WITHOUT = [a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--without=")]
ALSO_RUN = [a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--also-run=")]
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={N_DEV}"
)

import warnings

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import primforge
from primforge import ops
from primforge._compat import JAX_VERSION

warnings.simplefilter("error", primforge.BackendUnavailableWarning)  # no silent fallback

KERNELS = [k for k in primforge.registry.list_kernels() if k.name.startswith("primforge.ops.")]

MESH = jax.make_mesh((N_DEV,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))
MESH2 = jax.make_mesh((2, N_DEV // 2), ("a", "b"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
M, N, K, C, B = 4 * N_DEV, 3 * N_DEV, 3, 2 * N_DEV, 2 * N_DEV  # W (M, N), k, columns, batch
TOL = {"rtol": 2e-4, "atol": 2e-4}


class NotPartitioned(AssertionError):
    """The call gave the right values but did not run partitioned as its rule allows."""


DEFINED: dict[str, object] = {}  # every check of this script, in order


def check(fn):
    DEFINED[fn.__name__] = fn
    return fn


def run_checks(names: list[str]) -> dict[str, dict]:
    """The checks whose name contains one of ``names`` (all when it is empty), in order."""
    results = {}
    for name, fn in DEFINED.items():
        if names and not any(o in name for o in names):
            continue
        entry = {"ok": False, "partitioned": False, "detail": ""}
        try:
            entry["detail"] = str(fn() or "")
            entry["ok"] = entry["partitioned"] = True
        except NotPartitioned as e:
            entry["ok"] = True  # the values were right: they are asserted before partitioning
            entry["detail"] = f"not partitioned: {e}"
        except Exception as e:  # noqa: BLE001 - reported to pytest, which fails the check
            entry["detail"] = f"{type(e).__name__}: {e}\n{traceback.format_exc()[-3000:]}"
        results[name] = entry
    return results


# ----------------------------------------------------------------------------- helpers
def put(a, *spec, mesh=None):
    return jax.device_put(np.asarray(a), NamedSharding(mesh or MESH, P(*spec)))


def close(got, want, what):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), err_msg=what, **TOL)


def collectives(f, *args) -> set[str]:
    text = jax.jit(f).lower(*args).compile().as_text()
    found = re.findall(r"\b(all-gather|all-reduce|all-to-all|collective-permute|"
                       r"reduce-scatter)(?:-start)?\(", text)
    return set(found)


def expect_collectives(f, args, want: set[str], what: str):
    got = collectives(f, *args)
    if got != set(want):
        raise NotPartitioned(f"{what}: compiled HLO has collectives {sorted(got)}, expected "
                             f"{sorted(want)}")


def expect_spec(y, spec, what: str):
    got = tuple(y.sharding.spec)
    got = got + (None,) * (y.ndim - len(got))
    want = tuple(spec) + (None,) * (y.ndim - len(spec))
    if got != want:
        raise NotPartitioned(f"{what}: output sharded as {got}, expected {want}")


def events(rng, shape, binary):
    active = rng.random(shape) < 0.5
    if binary:
        return active
    return np.where(active, rng.standard_normal(shape), 0.0).astype(np.float32)


def ref(dense, x, *, binary, transpose):
    ev = (np.asarray(x) != 0).astype(np.float64) if binary else np.asarray(x, np.float64)
    return (dense.T if transpose else dense) @ ev


RNG = np.random.default_rng(0)
VARIANTS = [(b, t) for b in (False, True) for t in (False, True)]  # (binary, transpose)


# ----------------------------------------------------------------------------- CSR / CSC
CSR_DENSE = np.where(RNG.random((M, N)) < 0.4, RNG.standard_normal((M, N)), 0).astype(np.float32)
CSR_W = ops.CSR.from_dense(CSR_DENSE)
CSR_MM = {False: ops.csrmm, True: ops.binary_csrmm}
CSR_MV = {False: ops.csrmv, True: ops.binary_csrmv}


def csr_args(data=None):
    return (put(CSR_W.data if data is None else data), put(CSR_W.indices), put(CSR_W.indptr))


@check
def csr_matmat_columns_sharded():
    for binary, transpose in VARIANTS:
        x = events(RNG, (M if transpose else N, C), binary)
        f = lambda d, i, p, x, binary=binary, transpose=transpose: CSR_MM[binary](
            d, i, p, x, shape=(M, N), transpose=transpose)
        args = (*csr_args(), put(x, None, "x"))
        y = jax.jit(f)(*args)
        close(y, ref(CSR_DENSE, x, binary=binary, transpose=transpose), f"{binary=} {transpose=}")
        expect_spec(y, (None, "x"), "csrmm with sharded columns")
        expect_collectives(f, args, set(), "csrmm with sharded columns")


@check
def csr_homogeneous_matmat_columns_sharded():
    # One shared weight: data has shape (1,), a factor of its own.
    pattern = (CSR_DENSE != 0).astype(np.float32)
    w = ops.CSR.from_dense(pattern * 0.5, homogeneous=True)
    x = events(RNG, (M, C), True)
    args = (put(w.data), put(w.indices), put(w.indptr), put(x, None, "x"))
    f = lambda d, i, p, x: ops.binary_csrmm(d, i, p, x, shape=(M, N), transpose=True)
    y = jax.jit(f)(*args)
    close(y, ref(pattern * 0.5, x, binary=True, transpose=True), "homogeneous binary csrmm")
    expect_spec(y, (None, "x"), "homogeneous csrmm")
    expect_collectives(f, args, set(), "homogeneous csrmm")


@check
def csr_row_sharded_inputs_stay_right():
    # indptr holds global offsets: rows can never be sharded; sharded inputs are gathered.
    for binary, transpose in VARIANTS:
        x = events(RNG, (M if transpose else N,), binary)
        f = lambda d, i, p, x, binary=binary, transpose=transpose: CSR_MV[binary](
            d, i, p, x, shape=(M, N), transpose=transpose)
        args = (put(CSR_W.data, "x"), put(CSR_W.indices, "x"), put(CSR_W.indptr), put(x, "x"))
        if CSR_W.nnz % N_DEV:
            args = (*csr_args(), put(x, "x"))
        close(jax.jit(f)(*args), ref(CSR_DENSE, x, binary=binary, transpose=transpose),
              f"csrmv {binary=} {transpose=}")
        xm = events(RNG, (M if transpose else N, C), binary)
        g = lambda d, i, p, x, binary=binary, transpose=transpose: CSR_MM[binary](
            d, i, p, x, shape=(M, N), transpose=transpose)
        close(jax.jit(g)(*csr_args(), put(xm, "x")),
              ref(CSR_DENSE, xm, binary=binary, transpose=transpose), f"csrmm rows {binary=}")
    return "values only: no partitioning to assert"


@check
def spike_list_sharded_inputs_stay_right():
    # Spike lists and their product are kept whole: sharded inputs are gathered.
    x = RNG.random(M) < 0.4
    f = lambda d, i, p, x: ops.binary_csrmv_spikes(
        d, i, p, *ops.spike_list(x, M), shape=(M, N), transpose=True)
    close(jax.jit(f)(*csr_args(), put(x, "x")), ref(CSR_DENSE, x, binary=True, transpose=True),
          "spike list")
    return "values only: no partitioning to assert"


@check
def csr_vmap_over_a_sharded_batch():
    # vmap over the input alone becomes one csrmm whose columns are the (sharded) batch.
    for binary, transpose in VARIANTS:
        xs = events(RNG, (B, M if transpose else N), binary)
        f = jax.vmap(lambda x, binary=binary, transpose=transpose: (x @ CSR_W) if transpose
                     else (CSR_W @ x))
        args = (put(xs, "x"),)
        y = jax.jit(f)(*args)
        close(y, ref(CSR_DENSE, xs.T, binary=binary, transpose=transpose).T, f"vmap {binary=}")
        expect_spec(y, ("x",), "vmapped CSR product")
        expect_collectives(f, args, set(), "vmapped CSR product")


@check
def csr_grad_columns_sharded():
    # The cotangent of the weights sums over the columns (csr_weight_grad's reduction factor).
    x = events(RNG, (N, C), False)
    ct = np.cos(CSR_DENSE.astype(np.float64) @ x)  # d loss / d y for loss = sum(sin(y))
    rows = np.repeat(np.arange(M), np.diff(np.asarray(CSR_W.indptr)))
    cols = np.asarray(CSR_W.indices)

    def loss(data, x):
        return jnp.sum(jnp.sin(ops.csrmm(data, CSR_W.indices, CSR_W.indptr, x, shape=(M, N))))

    args = (put(CSR_W.data), put(x, None, "x"))
    grad = jax.grad(loss, argnums=(0, 1))  # one function: its compiled HLO is reused below
    g_data, g_x = jax.jit(grad)(*args)
    close(g_data, np.einsum("ec,ec->e", ct[rows], x[cols]), "d/d data")
    close(g_x, CSR_DENSE.T @ ct, "d/d x")
    expect_spec(g_x, (None, "x"), "the input's cotangent")
    expect_collectives(grad, args, {"all-reduce"},
                       "grad of csrmm with sharded columns")


# ----------------------------------------------------------------------------- fixed number
FN_IND = RNG.integers(0, N, size=(M, K)).astype(np.int32)
FN_W = RNG.standard_normal((M, K)).astype(np.float32)
FN_MV = {False: ops.fixed_num_mv, True: ops.binary_fixed_num_mv}
FN_MM = {False: ops.fixed_num_mm, True: ops.binary_fixed_num_mm}


def fn_dense(w, ind, m=M, n=N):
    a = np.zeros((m, n))
    for i in range(m):
        for j in range(ind.shape[1]):
            a[i, ind[i, j]] += w[i, j] if np.ndim(w) == 2 else w[0]
    return a


@check
def fixed_num_gather_rows_sharded():
    # A @ x: each device owns rows of indices/weights and computes its rows of the output.
    for binary in (False, True):
        for shared in (False, True):
            w = np.array([0.5], np.float32) if shared else FN_W
            for matrix in (False, True):
                x = events(RNG, (N, C) if matrix else (N,), binary)
                fn = (FN_MM if matrix else FN_MV)[binary]
                f = lambda w, i, x, fn=fn: fn(w, i, x, shape=(M, N))
                args = (put(w) if shared else put(w, "x"), put(FN_IND, "x"), put(x))
                y = jax.jit(f)(*args)
                what = f"fixed_num gather {binary=} {shared=} {matrix=}"
                close(y, ref(fn_dense(w, FN_IND), x, binary=binary, transpose=False), what)
                expect_spec(y, ("x",), what)
                expect_collectives(f, args, set(), what)


@check
def fixed_num_scatter_rows_reduced():
    # A.T @ x: each device scatters its rows into a whole output; the outputs are summed.
    for binary in (False, True):
        for shared in (False, True):
            w = np.array([0.5], np.float32) if shared else FN_W
            for matrix in (False, True):
                x = events(RNG, (M, C) if matrix else (M,), binary)
                fn = (FN_MM if matrix else FN_MV)[binary]
                f = lambda w, i, x, fn=fn: fn(w, i, x, shape=(M, N), transpose=True)
                args = (put(w) if shared else put(w, "x"), put(FN_IND, "x"), put(x, "x"))
                y = jax.jit(f)(*args)
                what = f"fixed_num scatter {binary=} {shared=} {matrix=}"
                close(y, ref(fn_dense(w, FN_IND), x, binary=binary, transpose=True), what)
                expect_collectives(f, args, {"all-reduce"}, what)


@check
def fixed_num_entries_per_row_reduced():
    # The k entries of a row are summed in both directions: sharding k needs no gather.
    ind = RNG.integers(0, N, size=(M, N_DEV)).astype(np.int32)
    w = RNG.standard_normal((M, N_DEV)).astype(np.float32)
    for transpose in (False, True):
        x = events(RNG, (M if transpose else N,), False)
        f = lambda w, i, x, t=transpose: ops.fixed_num_mv(w, i, x, shape=(M, N), transpose=t)
        args = (put(w, None, "x"), put(ind, None, "x"), put(x))
        close(jax.jit(f)(*args), ref(fn_dense(w, ind), x, binary=False, transpose=transpose),
              f"k sharded {transpose=}")
        expect_collectives(f, args, {"all-reduce"}, f"fixed_num k sharded {transpose=}")


@check
def fixed_num_matmat_columns_sharded():
    for binary, transpose in VARIANTS:
        x = events(RNG, (M if transpose else N, C), binary)
        f = lambda w, i, x, b=binary, t=transpose: FN_MM[b](w, i, x, shape=(M, N), transpose=t)
        args = (put(FN_W), put(FN_IND), put(x, None, "x"))
        y = jax.jit(f)(*args)
        what = f"fixed_num_mm columns {binary=} {transpose=}"
        close(y, ref(fn_dense(FN_W, FN_IND), x, binary=binary, transpose=transpose), what)
        expect_spec(y, (None, "x"), what)
        expect_collectives(f, args, set(), what)


@check
def fixed_num_grad_rows_sharded():
    # grad through the gather with sharded rows: the transposed call is the scatter
    # (rows reduced), the weights' cotangent stays row-sharded.
    x = events(RNG, (N,), False)
    ct = np.cos(fn_dense(FN_W, FN_IND) @ x)  # d loss / d y for loss = sum(sin(y))
    indices = put(FN_IND, "x")

    def loss(w, x):
        return jnp.sum(jnp.sin(ops.fixed_num_mv(w, indices, x, shape=(M, N))))

    args = (put(FN_W, "x"), put(x))
    grad = jax.grad(loss, argnums=(0, 1))  # one function: its compiled HLO is reused below
    g_w, g_x = jax.jit(grad)(*args)
    close(g_w, ct[:, None] * x[FN_IND], "d/d weights")
    close(g_x, fn_dense(FN_W, FN_IND).T @ ct, "d/d x")
    expect_spec(g_w, ("x",), "the weights' cotangent")
    expect_collectives(grad, args, {"all-reduce"},
                       "grad of the row-sharded gather")


@check
def fixed_num_weight_grad_of_the_scatter_matmat():
    # The per-entry weight gradient of A.T @ X (matrix X, rows sharded): each row of the
    # gradient reads its own rows of X; the batch columns are summed.
    x = events(RNG, (M, C), False)
    dense = fn_dense(FN_W, FN_IND)
    ct = np.cos(dense.T @ x)  # (N, C): d loss / d y for loss = sum(sin(y))
    indices = put(FN_IND, "x")

    def loss(w, x):
        return jnp.sum(jnp.sin(ops.fixed_num_mm(w, indices, x, shape=(M, N), transpose=True)))

    args = (put(FN_W, "x"), put(x, "x"))
    grad = jax.grad(loss)  # one function: its compiled HLO is reused below
    g_w = jax.jit(grad)(*args)
    close(g_w, np.einsum("mc,mkc->mk", x, ct[FN_IND]), "d/d weights")
    expect_spec(g_w, ("x",), "the weights' cotangent")
    expect_collectives(grad, args, {"all-reduce"},
                       "weight grad of the row-sharded scatter matmat")


@check
def fixed_num_vmap_over_a_sharded_batch():
    ws = ops.FixedNum.from_indices(FN_IND, FN_W, shape=(M, N))
    xs = events(RNG, (B, M), True)
    f = jax.vmap(lambda s: s @ ws)
    y = jax.jit(f)(put(xs, "x"))
    close(y, ref(fn_dense(FN_W, FN_IND), xs.T, binary=True, transpose=True).T, "vmap")
    expect_spec(y, ("x",), "vmapped fixed-number product")
    expect_collectives(f, (put(xs, "x"),), set(), "vmapped fixed-number product")


# ----------------------------------------------------------------------------- just in time
JC_SEED, JC_P = 11, 0.3
JC_DENSE = ops.jitc_todense(JC_SEED, (M, N), JC_P, 0.7)  # a NumPy loop over the generator
JC_MM = {False: ops.jitc_matmat, True: ops.binary_jitc_matmat}
JC_MV = {False: ops.jitc_matvec, True: ops.binary_jitc_matvec}


@check
def jitc_matmat_columns_sharded():
    for binary, transpose in VARIANTS:
        x = events(RNG, (M if transpose else N, C), binary)
        f = lambda x, b=binary, t=transpose: JC_MM[b](0.7, JC_SEED, x, shape=(M, N),
                                                       prob=JC_P, transpose=t)
        args = (put(x, None, "x"),)
        y = jax.jit(f)(*args)
        what = f"jitc_matmat columns {binary=} {transpose=}"
        close(y, ref(JC_DENSE, x, binary=binary, transpose=transpose), what)
        expect_spec(y, (None, "x"), what)
        expect_collectives(f, args, set(), what)


@check
def jitc_row_sharded_inputs_stay_right():
    # A shard given rows without their offset would regenerate rows 0.. of W: the rule
    # keeps rows whole, so row-sharded inputs are gathered and the values stay right.
    for binary, transpose in VARIANTS:
        for matrix in (False, True):
            shape = ((M if transpose else N),) + ((C,) if matrix else ())
            x = events(RNG, shape, binary)
            fn = (JC_MM if matrix else JC_MV)[binary]
            f = lambda x, fn=fn, t=transpose: fn(0.7, JC_SEED, x, shape=(M, N), prob=JC_P,
                                                 transpose=t)
            y = jax.jit(f, out_shardings=NamedSharding(MESH, P("x")))(put(x, "x"))
            close(y, ref(JC_DENSE, x, binary=binary, transpose=transpose),
                  f"jitc rows sharded {binary=} {transpose=} {matrix=}")
    return "values only: no partitioning to assert"


@check
def jitc_vmap_over_a_sharded_batch():
    xs = events(RNG, (B, M), True)
    f = jax.vmap(lambda s: ops.binary_jitc_matvec(0.7, JC_SEED, s, shape=(M, N), prob=JC_P,
                                                  transpose=True))
    args = (put(xs, "x"),)
    y = jax.jit(f)(*args)
    close(y, ref(JC_DENSE, xs.T, binary=True, transpose=True).T, "vmap")
    expect_spec(y, ("x",), "vmapped jitc product")
    expect_collectives(f, args, set(), "vmapped jitc product")


@check
def jitc_spike_lists_stay_right():
    # The spike-list products keep everything whole: a sharded list is gathered.
    rng = np.random.default_rng(9)
    lst = lambda x: ops.spike_list(x, M)
    f = lambda x: ops.binary_jitc_mv_spikes(0.7, JC_SEED, *lst(x), shape=(M, N), prob=JC_P)
    x = rng.random(M) < 0.4
    close(jax.jit(f)(put(x, "x")), ref(JC_DENSE, x, binary=True, transpose=True),
          "jitc spike list")
    xs = rng.random((B, M)) < 0.4
    close(jax.jit(jax.vmap(f))(put(xs, "x")),
          np.stack([ref(JC_DENSE, x, binary=True, transpose=True) for x in xs]),
          "jitc spike lists, vmap")
    return "values only: no partitioning to assert"


@check
def jitc_a_row_splitting_rule_would_be_wrong():
    # The control for the rule above: declaring the event rows of x @ W a reduction (as
    # for fixed-number rows) gives wrong values, since each shard regenerates rows 0...
    from primforge.kernel.sharding import ShardingRule

    kernel = ops.binary_jitc_matvec_p
    saved = kernel.sharding_rule
    kernel.def_sharding_rule(ShardingRule("t, s, q, m -> n", reduction_factors=("m",)))
    try:
        x = events(RNG, (M,), True)
        f = lambda x: ops.binary_jitc_matvec(0.7, JC_SEED, x, shape=(M, N), prob=JC_P,
                                             transpose=True)
        y = np.asarray(jax.jit(f)(put(x, "x")))
    finally:
        kernel.def_sharding_rule(saved)
    want = ref(JC_DENSE, x, binary=True, transpose=True)
    if np.allclose(y, want, **TOL):
        raise AssertionError("a rule that splits jitc rows gave the right answer: the "
                             "value checks could not tell a wrong rule")
    return "a row-splitting rule gives wrong values, as expected"


# ----------------------------------------------------------------------------- dense
D_W = RNG.standard_normal((M, N)).astype(np.float32)
D_MV = {False: ops.densemv, True: ops.binary_densemv}
D_MM = {False: ops.densemm, True: ops.binary_densemm}


@check
def csr_packed_events_stay_right():
    # The product reading packed words keeps vectors whole: sharded inputs are gathered.
    rng = np.random.default_rng(8)
    for transpose, size in ((True, M), (False, N)):
        x = rng.random(size) < 0.4
        f = lambda d, i, p, words, t=transpose, size=size: ops.binary_csrmv(
            d, i, p, ops.PackedEvents(words, size), shape=(M, N), transpose=t)
        words = ops.pack_events(x).words
        close(jax.jit(f)(*csr_args(), put(words)), ref(CSR_DENSE, x, binary=True,
                                                       transpose=transpose),
              f"csr packed {transpose=}")
    return "values only: no partitioning to assert"


@check
def fixed_num_packed_events_stay_right():
    # The fixed-number product reading packed words: row-sharded structure, whole words.
    rng = np.random.default_rng(9)
    for transpose, size in ((True, M), (False, N)):
        x = rng.random(size) < 0.4
        f = lambda w, i, words, t=transpose, size=size: ops.binary_fixed_num_mv(
            w, i, ops.PackedEvents(words, size), shape=(M, N), transpose=t)
        words = ops.pack_events(x).words
        close(jax.jit(f)(put(FN_W, "x"), put(FN_IND, "x"), put(words)),
              ref(fn_dense(FN_W, FN_IND), x, binary=True, transpose=transpose),
              f"fixed_num packed {transpose=}")
    return "values only: no partitioning to assert"

@check
def fixed_num_and_dense_spike_lists_stay_right():
    # Their spike-list products keep everything whole: sharded inputs are gathered.
    rng = np.random.default_rng(7)
    x = rng.random(M) < 0.4
    lst = lambda x: ops.spike_list(x, M)
    f = lambda w, i, x: ops.binary_fixed_num_mv_spikes(w, i, *lst(x), shape=(M, N),
                                                       transpose=True)
    close(jax.jit(f)(put(FN_W, "x"), put(FN_IND, "x"), put(x, "x")),
          ref(fn_dense(FN_W, FN_IND), x, binary=True, transpose=True), "fixed_num spike list")
    g = lambda w, x: ops.binary_densemv_spikes(w, *lst(x), transpose=True)
    close(jax.jit(g)(put(D_W, "x"), put(x, "x")), ref(D_W, x, binary=True, transpose=True),
          "dense spike list")
    xs = rng.random((B, M)) < 0.4
    for name, fn, want in (
            ("fixed_num", lambda x: f(FN_W, FN_IND, x), fn_dense(FN_W, FN_IND)),
            ("dense", lambda x: g(D_W, x), D_W)):
        close(jax.jit(jax.vmap(fn))(put(xs, "x")),
              np.stack([ref(want, x, binary=True, transpose=True) for x in xs]),
              f"{name} spike lists, vmap")
    return "values only: no partitioning to assert"


@check
def dense_kept_dimension_sharded():
    # W split along the dimension the output keeps (rows for W @ x, columns for x @ W).
    for binary, transpose in VARIANTS:
        for matrix in (False, True):
            x = events(RNG, ((M if transpose else N),) + ((C,) if matrix else ()), binary)
            fn = (D_MM if matrix else D_MV)[binary]
            f = lambda w, x, fn=fn, t=transpose: fn(w, x, transpose=t)
            args = (put(D_W, None, "x") if transpose else put(D_W, "x"), put(x))
            y = jax.jit(f)(*args)
            what = f"dense kept dim {binary=} {transpose=} {matrix=}"
            close(y, ref(D_W, x, binary=binary, transpose=transpose), what)
            expect_spec(y, ("x",), what)
            expect_collectives(f, args, set(), what)


@check
def dense_contracted_dimension_reduced():
    for binary, transpose in VARIANTS:
        for matrix in (False, True):
            x = events(RNG, ((M if transpose else N),) + ((C,) if matrix else ()), binary)
            fn = (D_MM if matrix else D_MV)[binary]
            f = lambda w, x, fn=fn, t=transpose: fn(w, x, transpose=t)
            args = (put(D_W, "x") if transpose else put(D_W, None, "x"), put(x))
            y = jax.jit(f)(*args)
            what = f"dense contracted dim {binary=} {transpose=} {matrix=}"
            close(y, ref(D_W, x, binary=binary, transpose=transpose), what)
            expect_collectives(f, args, {"all-reduce"}, what)


@check
def dense_matmat_columns_and_rows_on_a_2d_mesh():
    x = events(RNG, (N, C), True)
    f = lambda w, x: ops.binary_densemm(w, x)
    args = (put(D_W, "a", mesh=MESH2), put(x, None, "b", mesh=MESH2))
    y = jax.jit(f)(*args)
    close(y, ref(D_W, x, binary=True, transpose=False), "2-D mesh")
    expect_spec(y, ("a", "b"), "densemm on a 2-D mesh")
    expect_collectives(f, args, set(), "densemm on a 2-D mesh")


@check
def dense_grad_rows_sharded():
    x = events(RNG, (N,), False)
    ct = np.cos(D_W.astype(np.float64) @ x)  # d loss / d y for loss = sum(sin(y))
    loss = lambda w, x: jnp.sum(jnp.sin(ops.densemv(w, x)))
    args = (put(D_W, "x"), put(x))
    grad = jax.grad(loss, argnums=(0, 1))  # one function: its compiled HLO is reused below
    g_w, g_x = jax.jit(grad)(*args)
    close(g_w, np.outer(ct, x), "d/dW")
    close(g_x, D_W.T @ ct, "d/dx")
    expect_spec(g_w, ("x",), "the weights' cotangent")
    expect_collectives(grad, args, {"all-reduce"},
                       "grad of the row-sharded densemv")


@check
def dense_vmap_over_a_sharded_batch():
    xs = events(RNG, (B, M), True)
    f = jax.vmap(lambda s: ops.binary_densemv(D_W, s, transpose=True))
    args = (put(xs, "x"),)
    y = jax.jit(f)(*args)
    close(y, xs.astype(np.float64) @ D_W, "vmap")
    expect_spec(y, ("x",), "vmapped dense product")
    expect_collectives(f, args, set(), "vmapped dense product")


# ----------------------------------------------------------------------------- plasticity
def dense_update_ref(w, spikes, trace, on_rows, lo, hi):
    add = trace[None, :] if on_rows else trace[:, None]
    touched = (spikes != 0)[:, None] if on_rows else (spikes != 0)[None, :]
    return np.where(touched, np.clip(w + add, lo, hi), w)


@check
def dense_update_rows_and_columns_sharded():
    w = RNG.random((M, N)).astype(np.float32)
    for pre in (True, False):
        for spec in (("x",), (None, "x")):
            spikes = RNG.random(M if pre else N) < 0.5
            trace = (RNG.standard_normal(N if pre else M) * 0.3).astype(np.float32)
            upd = ops.update_on_pre if pre else ops.update_on_post
            f = lambda w, s, t, upd=upd: upd(w, s, t, w_min=0.0, w_max=1.0)
            args = (put(w, *spec), put(spikes), put(trace))
            y = jax.jit(f)(*args)
            what = f"dense_update {pre=} {spec=}"
            close(y, dense_update_ref(w, spikes, trace, pre, 0.0, 1.0), what)
            expect_spec(y, spec, what)
            expect_collectives(f, args, set(), what)


@check
def dense_update_vmap_over_a_sharded_batch():
    # Native batching: the batch level is a factor of its own, and shards.
    ws = RNG.random((B, M, N)).astype(np.float32)
    spikes = RNG.random((B, M)) < 0.5
    trace = (RNG.standard_normal(N) * 0.3).astype(np.float32)
    f = jax.vmap(lambda w, s: ops.update_on_pre(w, s, trace, w_max=1.0))
    args = (put(ws, "x"), put(spikes, "x"))
    y = jax.jit(f)(*args)
    want = np.stack([dense_update_ref(ws[i], spikes[i], trace, True, None, 1.0)
                     for i in range(B)])
    close(y, want, "vmap")
    expect_spec(y, ("x",), "vmapped dense_update")
    expect_collectives(f, args, set(), "vmapped dense_update")


@check
def compressed_update_sharded_inputs_stay_right():
    # Compressed storage has global row offsets: kept whole, sharded inputs are gathered.
    w = ops.CSR.from_dense(np.abs(CSR_DENSE))
    spikes = RNG.random(M) < 0.5
    trace = (RNG.standard_normal(N) * 0.3).astype(np.float32)
    data = put(w.data, "x") if w.nnz % N_DEV == 0 else put(w.data)

    def f(data, s, t):
        return ops.update_on_pre(w.with_data(data), s, t, w_min=0.0).data

    y = jax.jit(f)(data, put(spikes, "x"), put(trace, "x"))
    want = dense_update_ref(np.abs(CSR_DENSE), spikes, trace, True, 0.0, None)
    close(y, want[np.abs(CSR_DENSE) != 0], "compressed update")
    fixed = ops.FixedNum.from_indices(FN_IND, np.abs(FN_W), shape=(M, N))
    g = lambda wt, ind, s, t: ops.update_on_post(
        ops.FixedNum(wt, ind, shape=(M, N)), s, t, w_max=1.0).weights
    post = RNG.random(N) < 0.5
    pre_trace = (RNG.standard_normal(M) * 0.3).astype(np.float32)
    y = jax.jit(g)(put(fixed.weights, "x"), put(fixed.indices, "x"), put(post), put(pre_trace))
    want = np.abs(FN_W) + np.where(post[FN_IND], pre_trace[:, None], 0)
    close(y, np.where(post[FN_IND], np.minimum(want, 1.0), np.abs(FN_W)), "fixed update")
    return "values only: no partitioning to assert"


@check
def compressed_update_vmap_over_a_sharded_batch():
    w = ops.CSR.from_dense(np.abs(CSR_DENSE))
    datas = np.stack([np.asarray(w.data) * (i + 1) for i in range(B)])
    spikes = RNG.random((B, M)) < 0.5
    trace = (RNG.standard_normal(N) * 0.3).astype(np.float32)
    f = jax.vmap(lambda d, s: ops.update_on_pre(w.with_data(d), s, trace).data)
    args = (put(datas, "x"), put(spikes, "x"))
    y = jax.jit(f)(*args)
    mask = np.abs(CSR_DENSE) != 0
    want = np.stack([dense_update_ref(np.abs(CSR_DENSE) * (i + 1), spikes[i], trace, True,
                                      None, None)[mask] for i in range(B)])
    close(y, want, "vmap")
    expect_spec(y, ("x",), "vmapped compressed_update")
    expect_collectives(f, args, set(), "vmapped compressed_update")


@check
def compressed_update_with_a_column_index():
    # The column index is three more operands, kept whole like the structure: sharded
    # weights and spikes give the right values, and a sharded batch stays sharded.
    w = ops.with_column_index(ops.CSR.from_dense(np.abs(CSR_DENSE)))
    post = RNG.random(N) < 0.5
    pre_trace = (RNG.standard_normal(M) * 0.3).astype(np.float32)
    mask = np.abs(CSR_DENSE) != 0
    g = lambda d, s: ops.update_on_post(w.with_data(d), s, pre_trace, w_max=1.0).matrix.data
    data = put(w.matrix.data, "x") if w.matrix.nnz % N_DEV == 0 else put(w.matrix.data)
    y = jax.jit(g)(data, put(post, "x"))
    want = dense_update_ref(np.abs(CSR_DENSE), post, pre_trace, False, None, 1.0)
    close(y, want[mask], "column-indexed update")
    datas = np.stack([np.asarray(w.matrix.data) * (i + 1) for i in range(B)])
    posts = RNG.random((B, N)) < 0.5
    f = jax.vmap(g)
    args = (put(datas, "x"), put(posts, "x"))
    y = jax.jit(f)(*args)
    want = np.stack([dense_update_ref(np.abs(CSR_DENSE) * (i + 1), posts[i], pre_trace, False,
                                      None, 1.0)[mask] for i in range(B)])
    close(y, want, "column-indexed vmap")
    expect_spec(y, ("x",), "vmapped column-indexed compressed_update")
    expect_collectives(f, args, set(), "vmapped column-indexed compressed_update")


# ----------------------------------------------------------------------------- explicit axes
@check
def explicit_mesh_types_follow_the_rules():
    # With Explicit mesh axes the result types carry the sharding the rule gives.
    mesh = jax.make_mesh((N_DEV,), ("x",), axis_types=(jax.sharding.AxisType.Explicit,))
    xc = np.ones((N, C), np.float32)
    with jax.set_mesh(mesh):
        cases = [
            ("fixed_num gather", lambda w, i, x: ops.fixed_num_mv(w, i, x, shape=(M, N)),
             (put(FN_W, "x", mesh=mesh), put(FN_IND, "x", mesh=mesh), put(xc[:, 0], mesh=mesh)),
             fn_dense(FN_W, FN_IND) @ xc[:, 0], ("x",)),
            ("densemv contracted", lambda w, x: ops.densemv(w, x),
             (put(D_W, None, "x", mesh=mesh), put(xc[:, 0], "x", mesh=mesh)), D_W @ xc[:, 0],
             (None,)),
            ("csrmm columns", lambda x: CSR_W @ x, (put(xc, None, "x", mesh=mesh),),
             CSR_DENSE @ xc, (None, "x")),
            ("dense_update", lambda w, s, t: ops.update_on_pre(w, s, t),
             (put(D_W, "x", mesh=mesh), put(np.ones(M, bool), mesh=mesh),
              put(xc[:, 0], mesh=mesh)), D_W + 1, ("x", None)),
        ]
        for what, f, args, want, spec in cases:
            try:
                y = jax.jit(f)(*args)
            except Exception as e:
                # The XLA of JAX 0.8 and of 0.11 refuses the all-reduce of a reduction
                # factor on an Explicit mesh (docs/ops.md says so); JAX 0.10's runs it.
                refuses = JAX_VERSION < (0, 10) or JAX_VERSION >= (0, 11)
                if refuses and "Unsupported reduction computation" in str(e):
                    continue
                raise
            close(y, want, what)
            typed = tuple(jax.typeof(y).sharding.spec)
            typed = typed + (None,) * (y.ndim - len(typed))
            if typed != spec:
                raise NotPartitioned(f"{what}: result typed as {typed}, expected {spec}")


# ----------------------------------------------------------------------------- vmap over w
@check
def vmap_over_sharded_weights_stays_right():
    # Batched weights run the kernel once per element (lax.map): correct, not partitioned.
    x = events(RNG, (N,), False)
    ws = np.stack([D_W * (i + 1) for i in range(B)])
    y = jax.jit(jax.vmap(lambda w: ops.densemv(w, x)))(put(ws, "x"))
    close(y, np.stack([(D_W * (i + 1)) @ x for i in range(B)]), "dense vmap over W")
    datas = np.stack([np.asarray(CSR_W.data) * (i + 1) for i in range(B)])
    f = jax.vmap(lambda d: ops.csrmv(d, CSR_W.indices, CSR_W.indptr, x, shape=(M, N)))
    close(jax.jit(f)(put(datas, "x")), np.stack([(CSR_DENSE * (i + 1)) @ x for i in range(B)]),
          "CSR vmap over data")
    thetas = np.arange(1, B + 1, dtype=np.float32)
    f = jax.vmap(lambda w: ops.jitc_matvec(w, JC_SEED, x, shape=(M, N), prob=JC_P))
    close(jax.jit(f)(put(thetas, "x")), np.stack([JC_DENSE / 0.7 * w @ x for w in thetas]),
          "jitc vmap over the weight")
    return "values only: no partitioning to assert"


# ----------------------------------------------------------------------------- backends
def _backend_cases():
    """(what, function, args, reference, output spec, collectives) for the opt-in backends."""
    for backend in ("jax", "pallas", "cuda_raw"):
        for transpose in (False, True):
            xc = events(RNG, (M if transpose else N, C), True)
            f = lambda d, i, p, x, b=backend, t=transpose: ops.binary_csrmm(
                d, i, p, x, shape=(M, N), transpose=t, backend=b)
            yield (f"csrmm {backend} {transpose=}", f, (*csr_args(), put(xc, None, "x")),
                   ref(CSR_DENSE, xc, binary=True, transpose=transpose), (None, "x"), set())
    xg, xs = events(RNG, (N,), False), events(RNG, (M, C), False)
    for backend in ("jax", "pallas"):
        f = lambda w, i, x, b=backend: ops.fixed_num_mv(w, i, x, shape=(M, N), backend=b)
        yield (f"fixed_num gather {backend}", f, (put(FN_W, "x"), put(FN_IND, "x"), put(xg)),
               ref(fn_dense(FN_W, FN_IND), xg, binary=False, transpose=False), ("x",), set())
        f = lambda w, i, x, b=backend: ops.fixed_num_mm(w, i, x, shape=(M, N), transpose=True,
                                                        backend=b)
        yield (f"fixed_num scatter {backend}", f,
               (put(FN_W, "x"), put(FN_IND, "x"), put(xs, "x")),
               ref(fn_dense(FN_W, FN_IND), xs, binary=False, transpose=True), (),
               {"all-reduce"})
        f = lambda w, i, x, b=backend: ops.binary_fixed_num_mm(w, i, x, shape=(M, N), backend=b)
        xm = events(RNG, (N, C), True)
        yield (f"fixed_num_mm gather {backend}", f, (put(FN_W, "x"), put(FN_IND, "x"), put(xm)),
               ref(fn_dense(FN_W, FN_IND), xm, binary=True, transpose=False), ("x",), set())
        f = lambda w, i, x, b=backend: ops.fixed_num_mm(w, i, x, shape=(M, N), transpose=True,
                                                        backend=b)
        yield (f"fixed_num_mm columns {backend}", f, (put(FN_W), put(FN_IND), put(xs, None, "x")),
               ref(fn_dense(FN_W, FN_IND), xs, binary=False, transpose=True), (None, "x"), set())
        for transpose in (False, True):
            xj = events(RNG, (M if transpose else N, C), False)
            f = lambda x, b=backend, t=transpose: ops.jitc_matmat(
                0.7, JC_SEED, x, shape=(M, N), prob=JC_P, transpose=t, backend=b)
            yield (f"jitc_matmat {backend} {transpose=}", f, (put(xj, None, "x"),),
                   ref(JC_DENSE, xj, binary=False, transpose=transpose), (None, "x"), set())
    for backend in ("jax", "pallas"):
        f = lambda w, x, b=backend: ops.binary_densemv(w, x, backend=b)
        yield (f"densemv {backend}", f, (put(D_W, "x"), put(xg != 0)),
               ref(D_W, xg, binary=True, transpose=False), ("x",), set())
        f = lambda w, x, b=backend: ops.densemv(w, x, transpose=True, backend=b)
        yield (f"densemv {backend} contracted", f, (put(D_W, "x"), put(xs[:, 0], "x")),
               ref(D_W, xs[:, 0], binary=False, transpose=True), (), {"all-reduce"})
        f = lambda w, x, b=backend: ops.densemm(w, x, transpose=True, backend=b)
        yield (f"densemm {backend} columns", f, (put(D_W), put(xs, None, "x")),
               ref(D_W, xs, binary=False, transpose=True), (None, "x"), set())
    w = RNG.random((M, N)).astype(np.float32)
    spikes, trace = RNG.random(N) < 0.5, (RNG.standard_normal(M) * 0.3).astype(np.float32)
    f = lambda w, s, t: ops.update_on_post(w, s, t, w_min=0.0, backend="jax")
    yield ("dense_update jax", f, (put(w, None, "x"), put(spikes), put(trace)),
           dense_update_ref(w, spikes, trace, False, 0.0, None), (None, "x"), set())


# ----------------------------------------------------------------------------- delays
DL_D = 5  # rows of the ring buffer


def delayed_ref(delays, x, buf, t):
    """The buffer after adding ``x @ CSR_DENSE`` with per-synapse delays (NumPy; bool ``x``
    adds the weights)."""
    out = np.asarray(buf, np.float64).copy()
    rows, cols = np.nonzero(CSR_DENSE)  # row-major: the CSR's stored order
    for k, (i, j) in enumerate(zip(rows, cols)):
        out[(t + delays[k]) % DL_D, j] += CSR_DENSE[i, j] * float(x[i])
    return out


@check
def delayed_product_sharded_inputs_stay_right():
    # The delayed product is kept whole: sharded inputs and buffer are gathered.
    delays = RNG.integers(0, DL_D, CSR_W.nnz).astype(np.int32)
    buf = RNG.standard_normal((DL_D, N)).astype(np.float32)
    for backend in ("numba", "jax"):
        for binary in (True, False):  # binary_delayed_csrmv, delayed_csrmv
            x = events(RNG, (M,), binary)
            f = lambda d, x, b, backend=backend: ops.delayed_matvec(CSR_W, x, d, b, 3,
                                                                    backend=backend)
            close(jax.jit(f)(put(delays), put(x, "x"), put(buf, None, "x")),
                  delayed_ref(delays, x, buf, 3), f"delayed_matvec {backend} {binary=}")
    # The delayed just-in-time product, against its dense weights and delays.
    w = ops.jitc_todense(11, (M, N), 0.3, 0.5)
    d = ops.jitc_delays_todense(11, (M, N), 0.3, (0, DL_D - 1))
    x = events(RNG, (M,), True)
    want = np.asarray(buf, np.float64).copy()
    for i, j in zip(*np.nonzero(w * (x[:, None] != 0)), strict=True):
        want[(3 + d[i, j]) % DL_D, j] += w[i, j]
    for backend in ("numba", "jax"):
        g = lambda x, b, backend=backend: ops.binary_delayed_jitc_matvec(
            0.5, 11, x, b, 3, shape=(M, N), prob=0.3, delay_range=(0, DL_D - 1),
            backend=backend)
        close(jax.jit(g)(put(x, "x"), put(buf, None, "x")), want,
              f"binary_delayed_jitc_matvec {backend}")
    return "values only: no partitioning to assert"


@check
def delay_read_columns_sharded():
    buf = RNG.standard_normal((DL_D, N)).astype(np.float32)
    for backend in ("numba", "jax"):
        f = lambda b, backend=backend: ops.delay_read(b, 7, backend=backend)
        args = (put(buf, None, "x"),)
        now, new = jax.jit(f)(*args)
        close(now, buf[7 % DL_D], f"delay_read {backend}")
        close(new, np.where(np.arange(DL_D)[:, None] == 7 % DL_D, 0, buf), f"zeroed {backend}")
        expect_spec(now, ("x",), f"delay_read {backend}")
        expect_spec(new, (None, "x"), f"delay_read buffer {backend}")
        expect_collectives(f, args, set(), f"delay_read {backend}")


@check
def other_backends_partitioned():
    for what, f, args, want, spec, coll in _backend_cases():
        y = jax.jit(f)(*args)
        close(y, want, what)
        expect_spec(y, spec, what)
        expect_collectives(f, args, coll, what)


def run_script(path: str) -> dict:
    """Run the script at ``path`` as ``__main__`` in this process: its output, and whether it
    ran to its end."""
    import contextlib
    import io
    import runpy

    out = io.StringIO()
    entry = {"ok": False, "stdout": "", "detail": ""}
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(path, run_name="__main__")
        entry["ok"] = True
    except BaseException as e:  # noqa: BLE001 - reported to pytest (SystemExit included)
        entry["detail"] = f"{type(e).__name__}: {e}\n{traceback.format_exc()[-3000:]}"
    entry["stdout"] = out.getvalue()[-3000:]
    return entry


if __name__ == "__main__":
    report = {"n_devices": jax.device_count(), "defined": list(DEFINED),
              "checks": run_checks(ONLY)}
    report["scripts"] = {path: run_script(path) for path in ALSO_RUN}
    if WITHOUT:
        # The same process, so the kernels' Numba builds are reused; removing a rule makes
        # every jitted caller lower again.
        for _k in KERNELS:
            _k.def_sharding_rule(None)
        assert all(k.sharding_rule is None for k in KERNELS)
        report["without_rules"] = run_checks(WITHOUT)
    with open(ARGS[0], "w") as fh:
        json.dump(report, fh, indent=1)
