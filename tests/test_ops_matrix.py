"""The op matrix of docs/ops.md: every supported cell is a test case of this file.

``CASES`` is the one source of truth. Each case is one operator family on one backend,
one variant (float or binary input, vector or matrix, ``W @ x`` or ``x @ W``), one event
dtype and one transformation; :func:`test_cell` runs it on the CPU against a dense
reference built here with NumPy / ``jax.numpy`` (never with the code under test).
:func:`render_table` derives the table from ``CASES`` (and from ``GPU_EVIDENCE``: the
GPU-compile tests, whose node ids a test collects), and
:func:`test_docs_table_is_the_rendered_matrix` checks that docs/ops.md holds exactly that
table, so the page cannot claim a cell that no test runs. The plasticity updates have a
table of their own, derived the same way from ``P_CASES`` and ``P_GPU_EVIDENCE``
(:func:`render_update_table`). After changing cases or evidence, regenerate both tables
with ``PYTHONPATH=. python tests/test_ops_matrix.py`` from the repository root.
"""

from __future__ import annotations

import itertools
import pathlib
import re
import subprocess
import sys
import zlib
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from primforge import ops

ROOT = pathlib.Path(__file__).resolve().parent.parent
M, N, K, C, B = 6, 5, 3, 2, 3  # W is (M, N); K entries per fixed-number row; C columns; batch
TOL = {"rtol": 2e-4, "atol": 2e-4}


# ----------------------------------------------------------------------------- families
@dataclass(frozen=True)
class Instance:
    """One random matrix: weights, structure, and a differentiable dense builder."""

    weights: np.ndarray
    structure: tuple
    dense: object  # weights (jnp) -> dense (M, N) jnp array, written here independently


def _csr(rng):
    mask = rng.random((M, N)) < 0.5
    rows, cols = np.nonzero(mask)
    indptr = np.concatenate([[0], np.cumsum(mask.sum(axis=1))]).astype(np.int32)
    w = rng.normal(size=rows.size).astype(np.float32)
    dense = lambda w: jnp.zeros((M, N), w.dtype).at[rows, cols].add(w)
    return Instance(w, (cols.astype(np.int32), indptr), dense)


def _fixed(rng):
    ind = rng.integers(0, N, size=(M, K)).astype(np.int32)
    rows = np.repeat(np.arange(M), K).reshape(M, K)
    w = rng.normal(size=(M, K)).astype(np.float32)
    dense = lambda w: jnp.zeros((M, N), w.dtype).at[rows, ind].add(w)
    return Instance(w, (ind,), dense)


def _jitc(rng):
    seed = int(rng.integers(0, 1000))
    pattern = ops.jitc_todense(seed, (M, N), 0.5, 1.0)  # a NumPy loop over the generator
    dense = lambda w: w[0] * jnp.asarray(pattern, w.dtype)  # linear in the one weight
    return Instance(np.array([0.7], np.float32), (seed,), dense)


def _dense(rng):
    return Instance(rng.normal(size=(M, N)).astype(np.float32), (), lambda w: w)


# family -> (label, builder, {(binary, matrix): public call}, extra kwargs, CPU backends)
FAMILIES = {
    "csr": ("CSR / CSC", _csr,
            {(False, False): ops.csrmv, (True, False): ops.binary_csrmv,
             (False, True): ops.csrmm, (True, True): ops.binary_csrmm},
            {"shape": (M, N)}, ("jax", "numba", "pallas", "cuda_raw")),
    "fixed_num": ("fixed number", _fixed,
                  {(False, False): ops.fixed_num_mv, (True, False): ops.binary_fixed_num_mv,
                   (False, True): ops.fixed_num_mm, (True, True): ops.binary_fixed_num_mm},
                  {"shape": (M, N)}, ("jax", "numba", "pallas")),
    "jitconn": ("just-in-time", _jitc,
                {(False, False): ops.jitc_matvec, (True, False): ops.binary_jitc_matvec,
                 (False, True): ops.jitc_matmat, (True, True): ops.binary_jitc_matmat},
                {"shape": (M, N), "prob": 0.5}, ("jax", "numba", "pallas")),
    "dense": ("dense", _dense,
              {(False, False): ops.densemv, (True, False): ops.binary_densemv,
               (False, True): ops.densemm, (True, True): ops.binary_densemm},
              {}, ("jax", "numba", "pallas")),
}


# ----------------------------------------------------------------------------- the cases
@dataclass(frozen=True)
class Case:
    family: str
    backend: str
    transform: str  # 'jit', 'grad_w', 'grad_x', 'jvp', 'vmap_x', 'vmap_w'
    binary: bool
    matrix: bool
    transpose: bool
    events: str  # input dtype

    @property
    def id(self) -> str:
        kind = ("binary_" if self.binary else "") + ("mm" if self.matrix else "mv")
        return "-".join([self.family, self.backend, self.transform, kind,
                         "xW" if self.transpose else "Wx", self.events])


def _cases_of(family: str, backend: str):
    for binary, matrix, transpose in itertools.product([False, True], repeat=3):
        yield Case(family, backend, "jit", binary, matrix, transpose,
                   "bool" if binary else "float32")
    for events in ("int8", "float32"):  # events that are not bool: active when non-zero
        yield Case(family, backend, "jit", True, False, True, events)
    for binary, transpose in itertools.product([False, True], repeat=2):
        yield Case(family, backend, "grad_w", binary, False, transpose,
                   "bool" if binary else "float32")
    for transpose in (False, True):
        yield Case(family, backend, "grad_x", False, False, transpose, "float32")
        yield Case(family, backend, "jvp", False, False, transpose, "float32")
    for binary in (False, True):
        yield Case(family, backend, "vmap_x", binary, False, True,
                   "bool" if binary else "float32")
    yield Case(family, backend, "vmap_w", False, False, False, "float32")


CASES = [c for f, spec in FAMILIES.items() for b in spec[4] for c in _cases_of(f, b)]


def _input(rng, case: Case, batch: tuple = ()):
    rows = M if case.transpose else N
    shape = batch + ((rows, C) if case.matrix else (rows,))
    active = rng.random(shape) < 0.5
    active[(slice(None),) * len(batch) + (0,)] = True  # never an all-zero input
    if case.binary:
        return active.astype(case.events)
    return np.where(active, rng.normal(size=shape), 0.0).astype(np.float32)


def _reference(dense_w, x, case: Case):
    ev = (x != 0).astype(dense_w.dtype) if case.binary else x.astype(dense_w.dtype)
    return (dense_w.T if case.transpose else dense_w) @ ev


def _loss(y):
    return jnp.sum(jnp.sin(y))


def run_case(case: Case):
    """``(got, want)``: the op under the case's transformation, and the dense reference."""
    _label, build, funcs, extra, _ = FAMILIES[case.family]
    rng = np.random.default_rng(zlib.crc32(case.id.encode()))
    inst = build(rng)
    fn = funcs[(case.binary, case.matrix)]

    def f(w, x):
        return fn(w, *inst.structure, x, transpose=case.transpose, backend=case.backend, **extra)

    def ref(w, x):
        return _reference(inst.dense(jnp.asarray(w)), jnp.asarray(x), case)

    w = jnp.asarray(inst.weights)
    if case.transform == "vmap_w":
        ws = jnp.stack([w * (i + 1) for i in range(B)])
        x = _input(rng, case)
        got = jax.jit(jax.vmap(f, in_axes=(0, None)))(ws, x)
        want = np.stack([np.asarray(ref(wi, x)) for wi in ws])
    elif case.transform == "vmap_x":
        xs = _input(rng, case, (B,))
        got = jax.jit(jax.vmap(f, in_axes=(None, 0)))(w, xs)
        want = np.stack([np.asarray(ref(w, xi)) for xi in xs])
    else:
        x = _input(rng, case)
        if case.transform == "jit":
            got, want = jax.jit(f)(w, x), np.asarray(ref(w, x))
        elif case.transform == "grad_w":
            got = jax.jit(jax.grad(lambda w: _loss(f(w, x))))(w)
            want = jax.grad(lambda w: _loss(ref(w, x)))(w)
        elif case.transform == "grad_x":
            got = jax.jit(jax.grad(lambda x: _loss(f(w, x))))(jnp.asarray(x))
            want = jax.grad(lambda x: _loss(ref(w, x)))(jnp.asarray(x))
        else:  # jvp in the weights and the input at once
            dw, dx = jnp.ones_like(w) * 0.3, jnp.asarray(_input(rng, case))
            got = jax.jit(lambda w, x: jax.jvp(f, (w, x), (dw, dx)))(w, jnp.asarray(x))
            want = jax.jvp(ref, (w, jnp.asarray(x)), (dw, dx))
            np.testing.assert_allclose(np.asarray(got[0]), np.asarray(want[0]), **TOL)
            got, want = got[1], want[1]
    return np.asarray(got), np.asarray(want)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_cell(case: Case):
    got, want = run_case(case)
    assert np.abs(want).sum() > 0, "a reference of zeros checks nothing"
    np.testing.assert_allclose(got, want, **TOL)


# ----------------------------------------------------------------------------- plasticity
# The weight updates (``ops.update_on_pre`` / ``ops.update_on_post``) have their own table:
# an update has a side (which spikes drive it) instead of a direction, events instead of a
# float input, and derivatives in the weights and the trace. Each case is checked against a
# per-synapse reference written here (NumPy for values, jax.numpy for derivatives).
LO, HI = 0.0, 1.0  # every case updates with both bounds, so that some synapses clip


@dataclass(frozen=True)
class Storage:
    """Stored weights of one random matrix with the neurons each weight connects."""

    weights: np.ndarray
    pre: np.ndarray  # presynaptic neuron of every stored weight (the weights' shape)
    post: np.ndarray  # postsynaptic neuron of every stored weight
    wrap: object  # weights -> the matrix handed to the update
    unwrap: object  # the update's result -> its weights


def _uniform(rng, shape):
    return rng.uniform(0.05, 0.95, size=shape).astype(np.float32)


def _p_compressed(rng, csc: bool):
    mask = rng.random((M, N)) < 0.5
    stored = mask.T if csc else mask  # a CSC stores the rows of the transpose
    rows, cols = np.nonzero(stored)
    indptr = np.concatenate([[0], np.cumsum(stored.sum(axis=1))]).astype(np.int32)
    w = _uniform(rng, rows.size)
    W = (ops.CSC if csc else ops.CSR)(jnp.asarray(w), jnp.asarray(cols.astype(np.int32)),
                                      jnp.asarray(indptr), shape=(M, N))
    pre, post = (cols, rows) if csc else (rows, cols)
    return Storage(w, pre, post, W.with_data, lambda W: W.data)


def _p_fixed(rng, per: str):
    rows, cols = (M, N) if per == "pre" else (N, M)
    ind = rng.integers(0, cols, size=(rows, K)).astype(np.int32)
    own = np.repeat(np.arange(rows), K).reshape(rows, K)
    w = _uniform(rng, (rows, K))
    W = ops.FixedNum(jnp.asarray(w), jnp.asarray(ind), shape=(M, N), per=per)
    pre, post = (own, ind) if per == "pre" else (ind, own)
    return Storage(w, pre, post, W.with_data, lambda W: W.weights)


def _p_indexed(st: Storage) -> Storage:
    """The same storage with a column index (``ops.with_column_index``)."""
    X = ops.with_column_index(st.wrap(jnp.asarray(st.weights)))
    return Storage(st.weights, st.pre, st.post, X.with_data,
                   lambda X: st.unwrap(X.matrix))


def _p_dense(rng):
    pre, post = np.meshgrid(np.arange(M), np.arange(N), indexing="ij")
    return Storage(_uniform(rng, (M, N)), pre, post, lambda w: w, lambda W: W)


# format -> (label, builder, backends)
P_FORMATS = {
    "csr": ("CSR", lambda rng: _p_compressed(rng, False), ("jax", "numba", "pallas")),
    "csc": ("CSC", lambda rng: _p_compressed(rng, True), ("jax", "numba", "pallas")),
    "fixed_pre": ("fixed number, per pre", lambda rng: _p_fixed(rng, "pre"),
                  ("jax", "numba", "pallas")),
    "fixed_post": ("fixed number, per post", lambda rng: _p_fixed(rng, "post"),
                   ("jax", "numba", "pallas")),
    "csr_indexed": ("CSR, column-indexed", lambda rng: _p_indexed(_p_compressed(rng, False)),
                    ("jax", "numba", "pallas")),
    "fixed_pre_indexed": ("fixed number, per pre, column-indexed",
                          lambda rng: _p_indexed(_p_fixed(rng, "pre")),
                          ("jax", "numba", "pallas")),
    "dense": ("dense", _p_dense, ("jax", "numba")),
}
P_EVENTS = ("bool", "int8", "float32", "packed")  # packed: ops.pack_events of the bools


@dataclass(frozen=True)
class PCase:
    fmt: str
    backend: str
    transform: str  # 'jit', 'grad_w', 'grad_trace', 'jvp', 'vmap_events', 'vmap_w'
    side: str  # 'pre': update_on_pre, 'post': update_on_post
    events: str

    @property
    def id(self) -> str:
        return "-".join(["update", self.fmt, self.backend, self.transform, "on_" + self.side,
                         self.events])


def _p_cases_of(fmt: str, backend: str):
    for side in ("pre", "post"):
        for events in P_EVENTS:
            yield PCase(fmt, backend, "jit", side, events)
        for transform in ("grad_w", "grad_trace", "jvp", "vmap_events"):
            yield PCase(fmt, backend, transform, side, "bool")
    yield PCase(fmt, backend, "vmap_w", "pre", "bool")


P_CASES = [c for f, spec in P_FORMATS.items() for b in spec[2] for c in _p_cases_of(f, b)]


def _p_spikes(rng, case: PCase, batch: tuple = ()):
    active = rng.random(batch + ((M,) if case.side == "pre" else (N,))) < 0.5
    active[..., 0] = True  # never an update that changes nothing
    if case.events == "float32":
        return active, np.where(active, rng.uniform(0.5, 1.5, active.shape), 0).astype(np.float32)
    if case.events == "packed":
        return active, ops.pack_events(jnp.asarray(active))
    return active, active.astype(case.events)


def _p_trace(rng, case: PCase, batch: tuple = ()):
    return (0.25 * rng.normal(size=batch + ((N,) if case.side == "pre" else (M,)))).astype(
        np.float32)


def _p_reference(xp, st: Storage, w, active, trace, side: str):
    """New stored weights, synapse by synapse: ``w + trace`` (clipped) where the side fired."""
    fires = active[st.pre] if side == "pre" else active[st.post]
    add = trace[st.post] if side == "pre" else trace[st.pre]
    return xp.where(fires, xp.clip(w + add, LO, HI), w)


def run_p_case(case: PCase):
    """``(got, want)`` for one plasticity case."""
    rng = np.random.default_rng(zlib.crc32(case.id.encode()))
    st = P_FORMATS[case.fmt][1](rng)
    fn = ops.update_on_pre if case.side == "pre" else ops.update_on_post

    def f(w, spikes, trace):
        new = fn(st.wrap(w), spikes, trace, w_min=LO, w_max=HI, backend=case.backend)
        return st.unwrap(new)

    w = jnp.asarray(st.weights)
    if case.transform == "vmap_w":
        ws = np.stack([st.weights * s for s in (1.0, 0.5, 1.5)]).astype(np.float32)
        active, spikes = _p_spikes(rng, case)
        trace = _p_trace(rng, case)
        got = jax.jit(jax.vmap(f, in_axes=(0, None, None)))(ws, spikes, trace)
        want = np.stack([_p_reference(np, st, wi, active, trace, case.side) for wi in ws])
    elif case.transform == "vmap_events":
        active, spikes = _p_spikes(rng, case, (B,))
        trace = _p_trace(rng, case, (B,))
        got = jax.jit(jax.vmap(f, in_axes=(None, 0, 0)))(w, spikes, trace)
        want = np.stack([_p_reference(np, st, st.weights, a, t, case.side)
                         for a, t in zip(active, trace)])
    else:
        active, spikes = _p_spikes(rng, case)
        trace = jnp.asarray(_p_trace(rng, case))
        ref = lambda w, t: _p_reference(jnp, st, w, jnp.asarray(active), t, case.side)
        if case.transform == "jit":
            got = jax.jit(f)(w, spikes, trace)
            want = _p_reference(np, st, st.weights, active, np.asarray(trace), case.side)
        elif case.transform in ("grad_w", "grad_trace"):
            arg = 0 if case.transform == "grad_w" else 1
            got = jax.jit(jax.grad(lambda w, t: _loss(f(w, spikes, t)), argnums=arg))(w, trace)
            want = jax.grad(lambda w, t: _loss(ref(w, t)), argnums=arg)(w, trace)
        else:  # jvp in the weights and the trace at once
            dw = jnp.asarray(rng.normal(size=w.shape).astype(np.float32))
            dt = jnp.asarray(rng.normal(size=trace.shape).astype(np.float32))
            got = jax.jit(lambda w, t: jax.jvp(lambda w, t: f(w, spikes, t), (w, t),
                                               (dw, dt)))(w, trace)
            want = jax.jvp(ref, (w, trace), (dw, dt))
            np.testing.assert_allclose(np.asarray(got[0]), np.asarray(want[0]), **TOL)
            got, want = got[1], want[1]
    return np.asarray(got), np.asarray(want)


@pytest.mark.parametrize("case", P_CASES, ids=lambda c: c.id)
def test_update_cell(case: PCase):
    got, want = run_p_case(case)
    assert np.abs(want).sum() > 0, "a reference of zeros checks nothing"
    np.testing.assert_allclose(got, want, **TOL)


# ----------------------------------------------------------------------------- GPU and sharding
# Cells that need hardware this suite does not have: the tests that stand behind them,
# as pytest node ids (a test below checks that each one is collected).
_GC = "tests/test_ops_gpu_compile.py::"
_GPU_CSR = {
    "`W @ x`": ("sm_80, sm_90", [_GC + "test_every_variant_compiles"]),
    "`x @ W`": ("sm_80, sm_90", [_GC + "test_every_variant_compiles"]),
    "matrix `x`": ("sm_80, sm_90", [_GC + "test_every_variant_compiles"]),
    "binary events": ("bool, int8, float32", [_GC + "test_every_variant_compiles",
                                              _GC + "test_float_and_integer_events_compile"]),
    "jit": ("sm_80, sm_90", [_GC + "test_every_variant_compiles"]),
    "grad w": ("sm_80, sm_90", [_GC + "test_grad_compiles"]),
    "grad x": ("sm_80, sm_90", [_GC + "test_grad_compiles"]),
    "jvp": ("sm_80, sm_90", [_GC + "test_jvp_compiles"]),
    "vmap": ("x, w (sm_80, sm_90)", [_GC + "test_vmap_compiles"]),
}
_FN_GPU = "tests/test_ops_fixed_num_gpu_compile.py::"
_JC_GPU = "tests/test_ops_jitconn.py::test_every_pallas_variant_compiles_for_h100_and_a100"
_DG = "tests/test_ops_dense_gpu_compile.py::"
_JC_MORE = "tests/test_ops_jitconn_gpu_compile.py::test_jvp_vmap_and_events_compile"
GPU_EVIDENCE = {  # (family, backend) -> {column: (cell text, node ids)}
    ("csr", "pallas"): _GPU_CSR,
    ("csr", "cuda_raw"): _GPU_CSR,
    ("fixed_num", "pallas"): {
        **{col: ("sm_80, sm_90", [_FN_GPU + "test_every_variant_compiles"])
           for col in ("`W @ x`", "`x @ W`", "matrix `x`", "jit")},
        "binary events": ("bool, int8, float32",
                          [_FN_GPU + "test_every_variant_compiles",
                           _FN_GPU + "test_integer_and_float_events_compile"]),
        **{col: ("sm_80, sm_90", [_FN_GPU + "test_grad_jvp_and_vmap_compile"])
           for col in ("grad w", "grad x", "jvp")},
        "vmap": ("x, w (sm_80, sm_90)", [_FN_GPU + "test_grad_jvp_and_vmap_compile"]),
    },
    ("jitconn", "pallas"): {
        "`W @ x`": ("sm_80, sm_90", [_JC_GPU]), "`x @ W`": ("sm_80, sm_90", [_JC_GPU]),
        "matrix `x`": ("sm_80, sm_90", [_JC_GPU]),
        "binary events": ("bool, int8, float32", [_JC_GPU, _JC_MORE]),
        "jit": ("sm_80, sm_90", [_JC_GPU]),
        "grad w": ("sm_80, sm_90", [_JC_GPU]), "grad x": ("sm_80, sm_90", [_JC_GPU]),
        "jvp": ("sm_80, sm_90", [_JC_MORE]),
        "vmap": ("x, w (sm_80, sm_90)", [_JC_GPU, _JC_MORE]),
    },
    ("dense", "pallas"): {
        **{col: ("sm_80, sm_90", [_DG + "test_every_variant_compiles"])
           for col in ("`W @ x`", "`x @ W`", "matrix `x`", "jit")},
        "binary events": ("bool, int8, float32", [_DG + "test_every_variant_compiles",
                                                  _DG + "test_integer_and_float_events_compile"]),
        **{col: ("sm_80, sm_90", [_DG + "test_grad_jvp_and_vmap_compile"])
           for col in ("grad w", "grad x", "jvp")},
        "vmap": ("x, w (sm_80, sm_90)", [_DG + "test_grad_jvp_and_vmap_compile"]),
    },
}
_SH = "tests/test_ops_sharding.py::test_partitioned[{}]"
_SH_BACKENDS = _SH.format("other_backends_partitioned")
_SHARDS = {  # family -> (what shards, the checks behind it on the default backend)
    "csr": ("columns of x", ["csr_matmat_columns_sharded", "csr_vmap_over_a_sharded_batch",
                             "csr_grad_columns_sharded"]),
    "fixed_num": ("rows of the indices, columns of x", [
        "fixed_num_gather_rows_sharded", "fixed_num_scatter_rows_reduced",
        "fixed_num_matmat_columns_sharded"]),
    "jitconn": ("columns of x", ["jitc_matmat_columns_sharded", "jitc_vmap_over_a_sharded_batch"]),
    "dense": ("both dimensions of W, columns of x", [
        "dense_kept_dimension_sharded", "dense_contracted_dimension_reduced",
        "dense_matmat_columns_and_rows_on_a_2d_mesh"]),
}
# (family, backend) -> (cell text, node ids): multi-device checks on 4 simulated CPU devices.
SHARDING_EVIDENCE = {
    (family, backend): (text, [_SH.format(c) for c in checks] if backend == "numba"
                        else [_SH_BACKENDS])
    for family, (text, checks) in _SHARDS.items() for backend in FAMILIES[family][4]
}


_PG = "tests/test_ops_plasticity_gpu_compile.py::test_every_format_side_and_transformation_compiles"
_P_GPU = {col: ("sm_80, sm_90", [_PG]) for col in
          ("`update_on_pre`", "`update_on_post`", "jit", "grad w", "grad trace", "jvp")}
_P_GPU["events"] = ("bool, int8, float32, packed", [_PG])
_P_GPU["vmap"] = ("events, w (sm_80, sm_90)", [_PG])
P_GPU_EVIDENCE = {(fmt, "pallas"): _P_GPU for fmt in ("csr", "csc", "fixed_pre", "fixed_post")}


# ----------------------------------------------------------------------------- the table
COLUMNS = ["format", "backend", "`W @ x`", "`x @ W`", "matrix `x`", "binary events", "jit",
           "grad w", "grad x", "jvp", "vmap", "sharding"]
START, END = "<!-- op-matrix:start -->", "<!-- op-matrix:end -->"


def _cpu_row(family: str, backend: str) -> list[str]:
    mine = [c for c in CASES if c.family == family and c.backend == backend]
    has = lambda **kw: any(all(getattr(c, k) == v for k, v in kw.items()) for c in mine)
    mark = lambda ok: "✓" if ok else "—"
    events = sorted({c.events for c in mine if c.binary and c.transform == "jit"})
    vmap = [w for w, t in (("x", "vmap_x"), ("w", "vmap_w")) if has(transform=t)]
    shard = (f"✓ ({SHARDING_EVIDENCE[(family, backend)][0]})"
             if (family, backend) in SHARDING_EVIDENCE else "—")
    return [FAMILIES[family][0], backend, mark(has(transform="jit", transpose=False)),
            mark(has(transform="jit", transpose=True)), mark(has(transform="jit", matrix=True)),
            ", ".join(events) or "—", mark(has(transform="jit")),
            mark(has(transform="grad_w")), mark(has(transform="grad_x")),
            mark(has(transform="jvp")), ", ".join(vmap) or "—", shard]


def _gpu_row(family: str, backend: str) -> list[str]:
    ev = GPU_EVIDENCE[(family, backend)]
    return [FAMILIES[family][0], f"{backend} (GPU)"] + [
        ev[col][0] if col in ev else "—" for col in COLUMNS[2:]]


def render_table() -> str:
    """The Markdown table of docs/ops.md, from ``CASES`` and ``GPU_EVIDENCE``."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + " --- |" * len(COLUMNS)]
    for family, spec in FAMILIES.items():
        for backend in spec[4]:
            lines.append("| " + " | ".join(_cpu_row(family, backend)) + " |")
        for fam, backend in GPU_EVIDENCE:
            if fam == family:
                lines.append("| " + " | ".join(_gpu_row(family, backend)) + " |")
    return "\n".join(lines)


P_COLUMNS = ["format", "backend", "`update_on_pre`", "`update_on_post`", "events", "jit",
             "grad w", "grad trace", "jvp", "vmap"]
P_START, P_END = "<!-- update-matrix:start -->", "<!-- update-matrix:end -->"


def _p_cpu_row(fmt: str, backend: str) -> list[str]:
    mine = [c for c in P_CASES if c.fmt == fmt and c.backend == backend]
    has = lambda **kw: any(all(getattr(c, k) == v for k, v in kw.items()) for c in mine)
    mark = lambda ok: "✓" if ok else "—"
    events = [e for e in P_EVENTS if has(transform="jit", events=e)]
    vmap = [w for w, t in (("events", "vmap_events"), ("w", "vmap_w")) if has(transform=t)]
    return [P_FORMATS[fmt][0], backend, mark(has(transform="jit", side="pre")),
            mark(has(transform="jit", side="post")), ", ".join(events) or "—",
            mark(has(transform="jit")), mark(has(transform="grad_w")),
            mark(has(transform="grad_trace")), mark(has(transform="jvp")),
            ", ".join(vmap) or "—"]


def render_update_table() -> str:
    """The plasticity table of docs/ops.md, from ``P_CASES`` and ``P_GPU_EVIDENCE``."""
    lines = ["| " + " | ".join(P_COLUMNS) + " |", "|" + " --- |" * len(P_COLUMNS)]
    for fmt, spec in P_FORMATS.items():
        for backend in spec[2]:
            lines.append("| " + " | ".join(_p_cpu_row(fmt, backend)) + " |")
        for (f, backend), ev in P_GPU_EVIDENCE.items():
            if f == fmt:
                lines.append("| " + " | ".join([spec[0], f"{backend} (GPU)"] + [
                    ev[col][0] if col in ev else "—" for col in P_COLUMNS[2:]]) + " |")
    return "\n".join(lines)


TABLES = ((START, END, render_table), (P_START, P_END, render_update_table))


def write_tables(path: pathlib.Path = ROOT / "docs" / "ops.md") -> None:
    """Regenerate the tables in docs/ops.md (``python tests/test_ops_matrix.py``)."""
    text = path.read_text(encoding="utf-8")
    for start, end, render in TABLES:
        head, rest = text.split(start, 1)
        text = head + start + "\n" + render() + "\n" + end + rest.split(end, 1)[1]
    path.write_text(text, encoding="utf-8")


@pytest.mark.parametrize("start,end,render", TABLES, ids=["products", "updates"])
def test_docs_table_is_the_rendered_matrix(start, end, render):
    text = (ROOT / "docs" / "ops.md").read_text(encoding="utf-8")
    assert start in text and end in text, f"docs/ops.md lost the markers {start} / {end}"
    table = text.split(start, 1)[1].split(end, 1)[0].strip()
    want = render()
    assert table == want, f"docs/ops.md's table is stale; it should read:\n{want}"


def test_every_cell_is_backed_by_a_case():
    """Every mark the table makes comes from at least one case of test_cell."""
    for line in render_table().splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        family = next(f for f, spec in FAMILIES.items() if spec[0] == cells[0])
        backend = cells[1].split(" ")[0]
        if cells[1].endswith("(GPU)"):
            assert (family, backend) in GPU_EVIDENCE
        else:
            assert any(c.family == family and c.backend == backend for c in CASES), cells
    for line in render_update_table().splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        fmt = next(f for f, spec in P_FORMATS.items() if spec[0] == cells[0])
        backend = cells[1].split(" ")[0]
        if cells[1].endswith("(GPU)"):
            assert (fmt, backend) in P_GPU_EVIDENCE
        else:
            assert any(c.fmt == fmt and c.backend == backend for c in P_CASES), cells


def test_the_gpu_and_sharding_evidence_is_collected():
    """The node ids behind the GPU and sharding cells exist (collected, not run here)."""
    named = {i for ev in GPU_EVIDENCE.values() for _, ids in ev.values() for i in ids}
    named |= {i for ev in P_GPU_EVIDENCE.values() for _, ids in ev.values() for i in ids}
    named |= {i for _, ids in SHARDING_EVIDENCE.values() for i in ids}
    files = sorted({i.split("::")[0] for i in named})
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                          "-m", "exhaustive or not exhaustive",  # both tiers
                          "-p", "no:cacheprovider", *files], cwd=ROOT, capture_output=True,
                         text=True, timeout=600, check=False)
    collected = set(re.findall(r"^(tests/\S+::\S+)$", out.stdout, re.MULTILINE))
    assert collected, out.stdout[-3000:] + out.stderr[-3000:]
    missing = [i for i in named
               if i not in collected and not any(c.startswith(i + "[") for c in collected)]
    assert not missing, f"cells name tests that are not collected: {missing}"


if __name__ == "__main__":
    write_tables()
