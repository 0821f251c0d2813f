"""The op matrix of docs/ops.md: every supported cell is a test case of this file.

``CASES`` is the one source of truth. Each case is one operator family on one backend,
one variant (float or binary input, vector or matrix, ``W @ x`` or ``x @ W``), one event
dtype and one transformation; :func:`test_cell` runs it on the CPU against a dense
reference built here with NumPy / ``jax.numpy`` (never with the code under test).
:func:`render_table` derives the table from ``CASES`` (and from ``GPU_EVIDENCE``: the
GPU-compile tests, whose node ids a test collects), and
:func:`test_docs_table_is_the_rendered_matrix` checks that docs/ops.md holds exactly that
table, so the page cannot claim a cell that no test runs.
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
              {}, ("jax", "numba")),
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
    "vmap": ("x, w (sm_80, sm_90)", [_GC + "test_vmap_compiles"]),
}
_FN_GPU = "tests/test_ops_fixed_num.py::test_every_pallas_variant_compiles_with_xla_gpu"
_JC_GPU = "tests/test_ops_jitconn.py::test_every_pallas_variant_compiles_for_h100_and_a100"
GPU_EVIDENCE = {  # (family, backend) -> {column: (cell text, node ids)}
    ("csr", "pallas"): _GPU_CSR,
    ("csr", "cuda_raw"): _GPU_CSR,
    ("fixed_num", "pallas"): {
        "`W @ x`": ("sm_90", [_FN_GPU]), "`x @ W`": ("sm_90", [_FN_GPU]),
        "matrix `x`": ("sm_90", [_FN_GPU]), "binary events": ("bool", [_FN_GPU]),
        "jit": ("sm_90", [_FN_GPU]),
    },
    ("jitconn", "pallas"): {
        "`W @ x`": ("sm_80, sm_90", [_JC_GPU]), "`x @ W`": ("sm_80, sm_90", [_JC_GPU]),
        "matrix `x`": ("sm_80, sm_90", [_JC_GPU]), "binary events": ("bool", [_JC_GPU]),
        "jit": ("sm_80, sm_90", [_JC_GPU]),
        "grad w": ("sm_80, sm_90", [_JC_GPU]), "grad x": ("sm_80, sm_90", [_JC_GPU]),
        "vmap": ("x (sm_80, sm_90)", [_JC_GPU]),
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


def test_docs_table_is_the_rendered_matrix():
    text = (ROOT / "docs" / "ops.md").read_text(encoding="utf-8")
    assert START in text and END in text, "docs/ops.md lost the op-matrix markers"
    table = text.split(START, 1)[1].split(END, 1)[0].strip()
    want = render_table()
    assert table == want, f"docs/ops.md's op matrix is stale; it should read:\n{want}"


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


def test_the_gpu_and_sharding_evidence_is_collected():
    """The node ids behind the GPU and sharding cells exist (collected, not run here)."""
    named = {i for ev in GPU_EVIDENCE.values() for _, ids in ev.values() for i in ids}
    named |= {i for _, ids in SHARDING_EVIDENCE.values() for i in ids}
    files = sorted({i.split("::")[0] for i in named})
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                          "-p", "no:cacheprovider", *files], cwd=ROOT, capture_output=True,
                         text=True, timeout=600, check=False)
    collected = set(re.findall(r"^(tests/\S+::\S+)$", out.stdout, re.MULTILINE))
    assert collected, out.stdout[-3000:] + out.stderr[-3000:]
    missing = [i for i in named
               if i not in collected and not any(c.startswith(i + "[") for c in collected)]
    assert not missing, f"cells name tests that are not collected: {missing}"
