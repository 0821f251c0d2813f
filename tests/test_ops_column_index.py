"""Column-indexed matrices: the index against NumPy, and the column-side plasticity update
with the index against a NumPy loop and against the same update without the index.

Covered: CSR, CSC and FixedNum (per='pre'/'post', masked slots) x on_pre/on_post x bounds
x the jax, numba and pallas (interpreted) backends; random shapes, float64, float events,
empty matrices and no/all spiking columns; jit (building the index too), lax.scan, vmap (one
batched call), grad/jvp by finite differences; bad construction; malformed hand-made
indices give NaN, never an out-of-bounds access (checked in a subprocess with Numba's
bounds checking on), and debug mode catches one that files entries under the wrong column.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _jaxpr import eqn_names
from jax.test_util import check_grads

from primforge import ops
from primforge.ops._operator import eqn_name
from primforge.ops.plasticity import api as plasticity
from tests.test_ops_plasticity import numpy_update

BACKENDS = ["jax", "numba", "pallas"]


def numpy_index(indices, indptr, n):
    """colptr/perm/rows by a plain loop over columns (independent of the jax.numpy build);
    entries with an out-of-range column come last."""
    indices, indptr = np.asarray(indices), np.asarray(indptr)
    row_of = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))
    perm = [np.flatnonzero(indices == j) for j in range(n)]
    colptr = np.concatenate([[0], np.cumsum([len(p) for p in perm])]).astype(np.int32)
    outside = np.flatnonzero((indices < 0) | (indices >= n))  # listed last, past colptr[n]
    flat = np.concatenate(perm + [outside]).astype(np.int32)
    return colptr, flat, row_of[flat].astype(np.int32)


def random_matrix(fmt, seed, m, n, *, p=0.4, dtype=np.float32):
    rs = np.random.RandomState(seed)
    mask = rs.random_sample((m, n)) < p
    dense = np.where(mask, 0.1 + 0.5 * rs.random_sample((m, n)), 0).astype(dtype)
    W = ops.CSR.from_dense(dense) if fmt == "csr" else ops.CSC.from_dense(dense)
    return W, dense, mask


def random_fixed_num(seed, n_pre, n_post, k, per, dtype=np.float32):
    rs = np.random.RandomState(seed)
    rows, cols = (n_pre, n_post) if per == "pre" else (n_post, n_pre)
    ind = np.stack([rs.choice(cols, k, replace=False) for _ in range(rows)]).astype(np.int32)
    ind[rs.random_sample(ind.shape) < 0.2] = cols + 2  # masked slots
    weights = (0.1 + 0.5 * rs.random_sample((rows, k))).astype(dtype)
    W = ops.FixedNum(jnp.asarray(weights), jnp.asarray(ind), shape=(n_pre, n_post), per=per)
    dense = np.zeros((n_pre, n_post), dtype)
    mask = np.zeros((n_pre, n_post), bool)
    for r, s in itertools.product(range(rows), range(k)):
        c = ind[r, s]
        if c < cols:
            i, j = (r, c) if per == "pre" else (c, r)
            dense[i, j], mask[i, j] = weights[r, s], True
    return W, dense, mask


def events(rs, size, rate, float_events, dtype=np.float32):
    fire = rs.random_sample(size) < rate
    return np.where(fire, rs.random_sample(size) + 0.5, 0).astype(dtype) if float_events else fire


# ----------------------------------------------------------------------------- the index
@pytest.mark.parametrize("fmt", ["csr", "csc", "fixed_pre", "fixed_post"])
def test_index_matches_a_numpy_loop(fmt):
    for seed in range(3):
        rs = np.random.RandomState(seed)
        m, n = rs.randint(1, 25, size=2)
        if fmt.startswith("fixed"):
            W, _, _ = random_fixed_num(seed, m, n, min(3, m, n), fmt[6:])
            indices, (rows, k) = np.asarray(W.indices).ravel(), W.indices.shape
            indptr, cols = np.arange(rows + 1) * k, W._stored_shape[1]
        else:
            W, _, _ = random_matrix(fmt, seed, m, n)
            indices, indptr, cols = W.indices, W.indptr, W._csr_shape[1]
        for built in (ops.with_column_index(W), jax.jit(ops.with_column_index)(W)):
            want = numpy_index(indices, indptr, cols)
            for name, got, ref in zip(("colptr", "perm", "rows"), built.index, want):
                assert got.dtype == jnp.int32, name
                np.testing.assert_array_equal(np.asarray(got), ref, err_msg=name)


def test_construction_checks_the_index_against_the_matrix():
    W = ops.CSR.from_dense(np.array([[1., 0., 2.], [0., 3., 4.]], np.float32))
    idx = ops.with_column_index(W)
    again = ops.ColumnIndexed(W, *idx.index)  # the right arrays pass
    assert np.array_equal(np.asarray(again.perm), np.asarray(idx.perm))
    other = ops.CSR.from_dense(np.array([[0., 3., 4.], [1., 0., 2.]], np.float32))
    with pytest.raises(ValueError, match="'perm' is not the column index of this matrix"):
        ops.ColumnIndexed(W, *ops.with_column_index(other).index)
    with pytest.raises(ValueError, match="'colptr' is not the column index"):
        ops.ColumnIndexed(W, idx.colptr[:-1], idx.perm, idx.rows)
    with pytest.raises(TypeError, match="build it with ops.with_column_index"):
        jax.jit(lambda W, a, b, c: ops.ColumnIndexed(W, a, b, c).perm)(W, *idx.index)
    with pytest.raises(TypeError, match="'matrix' must be a CSR, CSC or FixedNum"):
        ops.ColumnIndexed(jnp.ones((2, 2)), *idx.index)
    with pytest.raises(TypeError, match="with_column_index: 'W' must be a CSR, CSC or FixedNum"):
        ops.with_column_index(jnp.ones((2, 2)))
    assert ops.with_column_index(idx) is idx


def test_it_behaves_as_its_matrix():
    W, dense, _ = random_matrix("csr", 3, 9, 7)
    X = ops.with_column_index(W)
    rs = np.random.RandomState(0)
    v, s = rs.standard_normal(7).astype(np.float32), rs.random_sample(9) < 0.5
    np.testing.assert_allclose(np.asarray(X @ v), dense @ v, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(s @ X), s.astype(np.float32) @ dense, rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(X.T.todense()), dense.T)
    assert X.shape == (9, 7) and X.dtype == jnp.float32 and not X.homogeneous
    assert isinstance(X.T, ops.ColumnIndexed) and isinstance(X.T.matrix, ops.CSC)
    Y = X.with_data(jnp.ones(W.nnz))
    assert isinstance(Y, ops.ColumnIndexed) and Y.perm is X.perm
    np.testing.assert_array_equal(np.asarray(Y.todense()), (dense != 0).astype(np.float32))


# ----------------------------------------------------------------------------- the update
def _case(fmt, seed, m, n, dtype=np.float32):
    if fmt in ("csr", "csc"):
        return random_matrix(fmt, seed, m, n, dtype=dtype)
    return random_fixed_num(seed, m, n, min(4, m, n), fmt[6:], dtype=dtype)


def _weights(W):
    return np.asarray(W.weights if isinstance(W, ops.FixedNum) else W.data)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt", ["csr", "csc", "fixed_pre", "fixed_post"])
@pytest.mark.parametrize("pre", [True, False], ids=["on_pre", "on_post"])
def test_update_matches_numpy_and_the_unindexed_update(backend, fmt, pre):
    fn = ops.update_on_pre if pre else ops.update_on_post
    for seed, (lo, hi) in enumerate([(None, None), (0.05, 0.55), (None, 0.4)]):
        rs = np.random.RandomState(10 + seed)
        m, n = rs.randint(1, 30, size=2)
        W, dense, mask = _case(fmt, seed, m, n)
        spikes = rs.random_sample(m if pre else n) < 0.3
        trace = (0.2 * rs.standard_normal(n if pre else m)).astype(np.float32)
        X = ops.with_column_index(W)
        got = fn(X, spikes, trace, w_min=lo, w_max=hi, backend=backend)
        assert isinstance(got, ops.ColumnIndexed) and type(got.matrix) is type(W)
        assert got.perm is X.perm and got.colptr is X.colptr and got.rows is X.rows
        want = numpy_update(dense, mask, spikes, trace, pre=pre, lo=lo, hi=hi)
        np.testing.assert_array_equal(np.asarray(got.todense()), want)
        plain = fn(W, spikes, trace, w_min=lo, w_max=hi, backend=backend)
        np.testing.assert_array_equal(_weights(got.matrix), _weights(plain))


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("fmt", ["csr", "csc", "fixed_pre", "fixed_post"])
def test_random_shapes_dtypes_and_spike_counts(fmt, seed):
    """float32/float64, bool/float events, from no spiking column to all of them."""
    rs = np.random.RandomState(100 + seed)
    m, n = rs.randint(1, 40, size=2)
    dtype = np.float64 if seed % 2 else np.float32
    rate = [0.0, 0.05, 0.5, 1.0, 0.3, 0.9][seed]
    with jax.enable_x64(dtype == np.float64):
        W, dense, mask = _case(fmt, seed, m, n, dtype=dtype)
        X = ops.with_column_index(W)
        for pre, float_events in itertools.product((True, False), (False, True)):
            spikes = events(rs, m if pre else n, rate, float_events, dtype)
            trace = (0.3 * rs.standard_normal(n if pre else m)).astype(dtype)
            fn = ops.update_on_pre if pre else ops.update_on_post
            got = fn(X, spikes, trace, w_min=0.0, w_max=0.6, backend="numba")
            assert got.dtype == dtype
            want = numpy_update(dense, mask, spikes != 0, trace, pre=pre, lo=0.0, hi=0.6)
            np.testing.assert_array_equal(np.asarray(got.todense()), want,
                                          err_msg=f"seed={seed} pre={pre}")


@pytest.mark.parametrize("backend", ["jax", "numba"])
def test_empty_matrices(backend):
    for m, n in [(3, 4), (0, 4), (3, 0)]:
        W = ops.CSR.from_dense(np.zeros((m, n), np.float32))
        X = ops.with_column_index(W)
        out = ops.update_on_post(X, jnp.ones(n, bool), jnp.ones(m), backend=backend)
        assert out.matrix.nnz == 0 and out.todense().shape == (m, n)


@pytest.mark.parametrize("backend", ["jax", "numba"])
def test_stdp_under_scan_with_the_index_built_in_jit(backend):
    """Pair-based STDP for 30 steps: the indexed run equals a NumPy simulation."""
    rs = np.random.RandomState(8)
    n_pre, n_post, steps = 20, 15, 30
    W, dense, mask = random_matrix("csr", 8, n_pre, n_post, p=0.3)
    pre_spk = rs.random_sample((steps, n_pre)) < 0.15
    post_spk = rs.random_sample((steps, n_post)) < 0.15
    decay, a_plus, a_minus = np.float32(0.9), np.float32(0.01), np.float32(-0.012)

    @jax.jit
    def run(W):
        X = ops.with_column_index(W)

        def body(carry, spk):
            X, x_pre, x_post = carry
            s_pre, s_post = spk
            x_pre, x_post = x_pre * decay + s_pre, x_post * decay + s_post
            X = ops.update_on_pre(X, s_pre, a_plus * x_post, w_min=0., w_max=1., backend=backend)
            X = ops.update_on_post(X, s_post, a_minus * x_pre, w_min=0., w_max=1.,
                                   backend=backend)
            return (X, x_pre, x_post), None

        init = (X, jnp.zeros(n_pre), jnp.zeros(n_post))
        return jax.lax.scan(body, init, (pre_spk, post_spk))[0][0].todense()

    w, x_pre, x_post = dense.copy(), np.zeros(n_pre, np.float32), np.zeros(n_post, np.float32)
    for t in range(steps):
        x_pre, x_post = x_pre * decay + pre_spk[t], x_post * decay + post_spk[t]
        w = numpy_update(w, mask, pre_spk[t], a_plus * x_post, pre=True, lo=0.0, hi=1.0)
        w = numpy_update(w, mask, post_spk[t], a_minus * x_pre, pre=False, lo=0.0, hi=1.0)
    np.testing.assert_allclose(np.asarray(run(W)), w, rtol=0, atol=1e-6)


@pytest.mark.parametrize("backend", ["jax", "numba"])
def test_vmap_is_one_batched_call(backend):
    W, dense, mask = random_matrix("csr", 5, 12, 10)
    X = ops.with_column_index(W)
    rs = np.random.RandomState(6)
    spikes = rs.random_sample((4, 10)) < 0.4
    traces = rs.standard_normal((4, 12)).astype(np.float32)

    def step(data, s, t):
        return ops.update_on_post(X.with_data(data), s, t, w_min=0.0, backend=backend).matrix.data

    got = jax.jit(jax.vmap(step, in_axes=(None, 0, 0)))(W.data, spikes, traces)
    for b in range(4):
        want = numpy_update(dense, mask, spikes[b], traces[b], pre=False, lo=0.0, hi=None)
        np.testing.assert_array_equal(np.asarray(W.with_data(got[b]).todense()), want)
    names = eqn_names(jax.make_jaxpr(jax.vmap(step, in_axes=(None, 0, 0)))(W.data, spikes,
                                                                          traces).jaxpr)
    assert names.count("primforge.ops.compressed_update") == 1
    assert "scan" not in names and "while" not in names


@pytest.mark.parametrize("backend", ["jax", "numba"])
def test_grad_and_jvp_by_finite_differences(backend):
    rs = np.random.RandomState(7)
    with jax.enable_x64():
        W, _, _ = random_matrix("csr", 7, 6, 5, p=0.6, dtype=np.float64)
        X = ops.with_column_index(W)
        spikes = rs.random_sample(5) < 0.6
        trace = 0.05 * rs.standard_normal(6)

        def f(w, t):
            return ops.update_on_post(X.with_data(w), spikes, t, w_min=0.0, w_max=1.0,
                                      backend=backend).matrix.data

        check_grads(f, (W.data, jnp.asarray(trace)), order=1, modes=("fwd", "rev"), eps=1e-4)


# ----------------------------------------------------------------------------- bad input
def _call(W, index, spikes, trace, backend, masked=False):
    return plasticity._compressed_call(W.data, W.indices, W.indptr, spikes, trace, *index,
                                       shape=W._csr_shape, on_rows=False, masked=masked,
                                       backend=backend)


def test_kernel_argument_errors_are_named():
    W, _, _ = random_matrix("csr", 1, 5, 4)
    colptr, perm, rows = ops.with_column_index(W).index
    s, t = jnp.ones(4, bool), jnp.ones(5)
    with pytest.raises(ValueError, match=r"'colptr' must have shape \(5,\)"):
        _call(W, (colptr[:-1], perm, rows), s, t, "numba")
    with pytest.raises(TypeError, match="'perm' must be int32"):
        _call(W, (colptr, perm.astype(jnp.int16), rows), s, t, "numba")
    with pytest.raises(ValueError, match="three operands"):
        _call(W, (colptr, perm), s, t, "numba")
    with pytest.raises(ValueError, match="serves the update on columns only"):
        plasticity._compressed_call(W.data, W.indices, W.indptr, jnp.ones(5, bool),
                                    jnp.ones(4), colptr, perm, rows, shape=(5, 4),
                                    on_rows=True)


@pytest.mark.parametrize("backend", ["jax", "numba"])
def test_an_unvalidated_out_of_range_column_poisons_as_without_the_index(backend):
    data = jnp.array([0.1, 0.2, 0.3], jnp.float32)
    W = ops.CSR._unchecked(data, jnp.array([0, 9, 1]), jnp.array([0, 2, 3]), (2, 2))
    X = jax.jit(ops.with_column_index)(W)
    fired = ops.update_on_post(X, jnp.array([True, False]), jnp.ones(2), backend=backend)
    assert np.isnan(np.asarray(fired.matrix.data)).all()
    quiet = ops.update_on_post(X, jnp.array([False, False]), jnp.ones(2), backend=backend)
    np.testing.assert_array_equal(np.asarray(quiet.matrix.data), np.asarray(data))


_FUZZ = textwrap.dedent("""
    import numpy as np, jax.numpy as jnp
    from primforge import ops
    from primforge.ops.plasticity import api as plasticity
    rs = np.random.RandomState(0)
    dense = np.where(rs.random_sample((30, 25)) < 0.3, 0.5, 0).astype(np.float32)
    W = ops.CSR.from_dense(dense)
    other = ops.CSR.from_dense(np.where(rs.random_sample((30, 25)) < 0.3, 0.5, 0)
                               .astype(np.float32))
    good = [np.asarray(a) for a in ops.with_column_index(W).index]
    nnz = W.nnz
    spikes = jnp.ones(25, bool)
    trace = jnp.ones(30)

    def run(index):
        return np.asarray(plasticity._compressed_call(
            W.data, W.indices, W.indptr, spikes, trace, *map(jnp.asarray, index),
            shape=(30, 25), on_rows=False, backend="numba"))

    ref = run(good)
    assert np.isfinite(ref).all()
    cases = {}
    for name, (arr, k, value) in {
            "perm_past_nnz": (1, 3, nnz + 5), "perm_negative": (1, 0, -7),
            "perm_huge": (1, 2, 2**31 - 1), "rows_past_m": (2, 4, 30),
            "rows_negative": (2, 1, -1), "rows_wrong": (2, 0, 7),
            "colptr_past_nnz": (0, 25, nnz + 3), "colptr_decreasing": (0, 5, 0),
            "colptr_negative": (0, 0, -4), "colptr_huge": (0, 12, 2**31 - 1)}.items():
        index = [a.copy() for a in good]
        index[arr][k] = value
        cases[name] = index
    index = [a.copy() for a in good]
    q = int(np.flatnonzero(np.diff(index[0]) >= 2)[0])  # a column with two entries or more
    k = index[0][q]
    index[1][[k, k + 1]] = index[1][[k + 1, k]]  # out of order within the column
    index[2][[k, k + 1]] = index[2][[k + 1, k]]
    cases["unordered_column"] = index
    o = [np.asarray(a) for a in ops.with_column_index(other).index]
    if o[1].shape == good[1].shape:
        cases["other_matrix"] = o  # its rows disagree with this indptr
    for name, index in cases.items():
        assert np.isnan(run(index)).all(), name
    # Random corruption of any entry of any array: NaN or the right answer, never another
    # answer, never out of bounds.
    nan = 0
    for trial in range(300):
        index = [a.copy() for a in good]
        arr = rs.randint(3)
        k = rs.randint(index[arr].size)
        index[arr][k] = rs.choice([rs.randint(-3, nnz + 3), rs.randint(-2**31, 2**31)])
        out = run(index)
        assert np.isnan(out).all() or np.array_equal(out, ref), (trial, arr, k)
        nan += bool(np.isnan(out).all())
    assert nan > 150, nan
    print("FUZZ-OK", len(cases))
""")


def test_debug_mode_catches_an_index_with_entries_in_the_wrong_column():
    """An index that files an entry under another column of the same row: ColumnIndexed
    refuses it, the kernel gives NaN for it, and debug mode compares with the reference
    and raises."""
    import primforge

    W = ops.CSR.from_dense(np.array([[1., 2.], [0., 3.]], np.float32))
    colptr, perm, rows = (np.asarray(a) for a in ops.with_column_index(W).index)
    assert perm.tolist() == [0, 1, 2] and rows.tolist() == [0, 0, 1]
    wrong = (jnp.asarray(colptr), jnp.asarray(perm[[1, 0, 2]]), jnp.asarray(rows))
    with pytest.raises(ValueError, match="'perm' is not the column index"):
        ops.ColumnIndexed(W, *wrong)
    spikes, trace = jnp.array([True, False]), jnp.array([10.0, 20.0])
    right = _call(W, ops.with_column_index(W).index, spikes, trace, "numba")
    np.testing.assert_array_equal(np.asarray(right), [11.0, 2.0, 3.0])
    with primforge.debug_mode(), pytest.raises(Exception, match="reference"):
        jax.block_until_ready(_call(W, wrong, spikes, trace, "numba"))


def test_a_wrong_index_gives_nan_and_never_reads_out_of_bounds(tmp_path):
    """Under NUMBA_BOUNDSCHECK=1 an out-of-bounds access raises: none may happen."""
    env = dict(os.environ, NUMBA_BOUNDSCHECK="1", PRIMFORGE_CACHE_DIR=str(tmp_path),
               JAX_PLATFORMS="cpu")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-c", _FUZZ], check=False, cwd=root, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "FUZZ-OK" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.parametrize("fmt,pre,indexed", [("csr", False, True), ("csr", True, False),
                                             ("csc", True, True), ("csc", False, False),
                                             ("fixed_pre", False, True),
                                             ("fixed_post", True, True),
                                             ("fixed_post", False, False)])
def test_only_the_column_side_hands_the_index_to_the_kernel(fmt, pre, indexed):
    W, _, _ = _case(fmt, 0, 6, 5)
    X = ops.with_column_index(W)
    fn = ops.update_on_pre if pre else ops.update_on_post
    spikes, trace = jnp.ones(6 if pre else 5, bool), jnp.ones(5 if pre else 6)
    jaxpr = jax.make_jaxpr(lambda X: fn(X, spikes, trace))(X).jaxpr
    (eqn,) = [e for e in jaxpr.eqns if eqn_name(e) == "primforge.ops.compressed_update"]
    # unindexed: (data, indices, indptr, spikes, trace), or a FixedNum's rows
    # (weights, indices, spikes, trace); indexed: the flat form and the three index arrays
    assert len(eqn.invars) == (8 if indexed else 4 if fmt.startswith("fixed") else 5)


# ----------------------------------------------------------------------------- stale index
def _stale_pair(fmt, seed, m, n):
    """``(A, B, dense of B, mask of B)``: ``B`` is ``A`` with, in about half of its stored
    rows, one synapse moved to a free column of the same row (same ``indptr`` and nnz).
    ``A``'s index is then a stale index for ``B`` in which the column that gained a synapse
    lists only part of its synapses, and every entry it does list reads back right."""
    rs = np.random.RandomState(seed)
    A, _, _ = _case(fmt, seed, m, n)
    per = "post" if fmt in ("csc", "fixed_post") else "pre"
    cols = n if per == "pre" else m
    if fmt.startswith("fixed"):
        ind = np.asarray(A.indices).copy()
        weights = np.asarray(A.weights)
        for r in range(ind.shape[0]):
            free = np.setdiff1d(np.arange(cols), ind[r])
            if free.size and rs.random_sample() < 0.5:
                ind[r, rs.randint(ind.shape[1])] = rs.choice(free)
        B = ops.FixedNum(jnp.asarray(weights), jnp.asarray(ind), shape=(m, n), per=per)
        dense, mask = np.zeros((m, n), np.float32), np.zeros((m, n), bool)
        for r, k in itertools.product(range(ind.shape[0]), range(ind.shape[1])):
            if ind[r, k] < cols:
                i, j = (r, ind[r, k]) if per == "pre" else (ind[r, k], r)
                dense[i, j], mask[i, j] = weights[r, k], True
        return A, B, dense, mask
    stored = np.array(A.todense() if per == "pre" else A.todense().T)
    for r in range(stored.shape[0]):
        full, free = np.flatnonzero(stored[r]), np.flatnonzero(stored[r] == 0)
        if full.size and free.size and rs.random_sample() < 0.5:
            src, dst = rs.choice(full), rs.choice(free)
            stored[r, dst], stored[r, src] = stored[r, src], 0
    dense = stored if per == "pre" else stored.T
    B = (ops.CSR if fmt == "csr" else ops.CSC).from_dense(dense)
    return A, B, dense, dense != 0


def test_the_stale_index_example_gives_nan_not_a_wrong_update():
    ptr = np.array([0, 2, 4, 6], np.int32)
    d = np.arange(1, 7, dtype=np.float32)
    A = ops.CSR(d, np.array([0, 1, 1, 2, 0, 2], np.int32), ptr, shape=(3, 4))
    B = ops.CSR(d, np.array([2, 3, 0, 3, 1, 3], np.int32), ptr, shape=(3, 4))
    leaves, tdef = jax.tree.flatten(ops.with_column_index(A))
    stale = jax.tree.unflatten(tdef, jax.tree.leaves(B) + leaves[3:])
    spikes, trace = np.array([1, 0, 0, 0], bool), np.array([10., 20., 30.], np.float32)
    out = ops.update_on_post(stale, spikes, trace, backend="numba").matrix.data
    assert np.isnan(np.asarray(out)).all()
    right = ops.update_on_post(B, spikes, trace, backend="numba").todense()
    np.testing.assert_array_equal(np.asarray(right), [[0, 0, 1, 2], [23, 0, 0, 4], [0, 5, 0, 6]])


@pytest.mark.parametrize("seeds", [range(4), range(4, 8), range(8, 12), range(12, 16)],
                         ids=["seeds0to3", "seeds4to7", "seeds8to11", "seeds12to15"])
@pytest.mark.parametrize("fmt", ["csr", "csc", "fixed_pre", "fixed_post"])
def test_a_stale_index_from_another_matrix_never_gives_a_wrong_update(fmt, seeds):
    """Pytree surgery pairs the index of A with the structure of B (same shapes, same row
    lengths, so every per-entry check can pass while a firing column's list holds only part
    of its synapses): the update is B's right update or all NaN, never another finite
    answer. Surgery happens outside ``jit`` (even seeds) or inside it, on tracers."""
    pre = fmt in ("csc", "fixed_post")  # the update on the stored columns
    fn = ops.update_on_pre if pre else ops.update_on_post

    def update(b_leaves, index, spikes, trace):
        stale = jax.tree.unflatten(tdef, [*b_leaves, *index])
        return _weights_of(fn(stale, spikes, trace, w_min=0.0, backend="numba"))

    nan = 0
    for seed in seeds:
        rs = np.random.RandomState(50 + seed)
        m, n = rs.randint(3, 12, size=2)
        A, B, dense, mask = _stale_pair(fmt, seed, m, n)
        leaves, tdef = jax.tree.flatten(ops.with_column_index(A))
        b_leaves = jax.tree.leaves(B)
        assert [x.shape for x in b_leaves] == [x.shape for x in leaves[:len(b_leaves)]]
        spikes = rs.random_sample(m if pre else n) < 0.2
        if seed % 4 >= 2:  # only the columns that gained a synapse fire: the subset case
            was = np.asarray(A.todense()) != 0
            gained = (mask & ~was).any(axis=1 if pre else 0)
            spikes = gained & ~(was & ~mask).any(axis=1 if pre else 0)
        trace = (0.3 * rs.standard_normal(n if pre else m)).astype(np.float32)
        call = jax.jit(update) if seed % 2 else update
        got = np.asarray(call(b_leaves, leaves[len(b_leaves):], spikes, trace))
        if np.isnan(got).all() and got.size:
            nan += 1
            continue
        want = numpy_update(dense, mask, spikes, trace, pre=pre, lo=0.0, hi=None)
        np.testing.assert_array_equal(np.asarray(B.with_data(got).todense()), want,
                                      err_msg=f"seed={seed}")
    assert nan >= 1, nan  # the stale pairings are detected, not merely harmless


def _weights_of(W):
    return W.matrix.weights if isinstance(W.matrix, ops.FixedNum) else W.matrix.data
