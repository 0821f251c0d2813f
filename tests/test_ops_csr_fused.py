"""CSR kernels with the structure check folded into the hot pass, and the opt-in parallel one.

* ``numba_parallel`` (rows spread over Numba's threads) against dense NumPy, every variant;
  concurrent calls from many threads in a subprocess (a crash would kill only it); refusal
  of Numba's ``workqueue`` layer, which is not safe for concurrent calls.
* The per-synapse weight gradient (one numba pass) against the NumPy formula, and NaN
  everywhere, never garbage, for malformed structure (negative, too large or any index
  with zero columns, broken ``indptr``).
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
from test_ops_csr import FUNCS, K, M, N, make_input, random_csr

from primforge import ops
from primforge.ops.csr import grad as _csr_grad

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VARIANTS = list(itertools.product([False, True], [False, True], [False, True], [False, True]))


@pytest.mark.parametrize("binary,matrix,homo,transpose", VARIANTS)
def test_parallel_backend_matches_dense_numpy(binary, matrix, homo, transpose):
    rng = np.random.default_rng(hash((binary, matrix, homo, transpose, 7)) % 2**32)
    data, indices, indptr, dense = random_csr(rng, homo=homo)
    a = dense.T if transpose else dense
    x = make_input(rng, a.shape[1], matrix, binary)
    got = FUNCS[(binary, matrix)](data, indices, indptr, x, shape=(M, N), transpose=transpose,
                                  backend="numba_parallel")
    np.testing.assert_allclose(np.asarray(got), a @ x.astype(np.float32), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("matrix", [False, True])
def test_parallel_backend_poisons_malformed_structure(matrix):
    data, indices, indptr, _ = random_csr(np.random.default_rng(3))
    x = np.ones((N, K) if matrix else (N,), bool)
    f = jax.jit(lambda i, p: FUNCS[(True, matrix)](data, i, p, x, shape=(M, N),
                                                   backend="numba_parallel"))
    for k, bad in ((3, 10_000_000), (5, -1)):
        idx = indices.copy()
        idx[k] = bad
        assert np.all(np.isnan(np.asarray(f(idx, indptr))))
    ptr = indptr.copy()
    ptr[4] = 10_000_000
    assert np.all(np.isnan(np.asarray(f(indices, ptr))))
    assert not np.any(np.isnan(np.asarray(f(indices, indptr))))


_CONCURRENT = textwrap.dedent("""
    import sys, threading
    import numpy as np, jax, jax.numpy as jnp
    from primforge import ops
    m, n = 3000, 2000
    W = ops.fixed_prob(m, n, 0.05, weight=0.1, seed=0)
    W = W.with_data(jnp.asarray(np.random.default_rng(0).random(W.nnz), jnp.float32))
    dense = np.asarray(W.todense())
    fns = [jax.jit(lambda W, x: W.matmul(x, backend="numba_parallel")),
           jax.jit(lambda W, x: W.matmul(x > 0, backend="numba_parallel")),
           jax.jit(lambda W, x: jax.vmap(lambda v: W.matmul(v, backend="numba_parallel"))(
               jnp.stack([x, -x])))]
    # Two independent products inside one program: XLA may run them at once.
    both = jax.jit(lambda W, x: (W.matmul(x, backend="numba_parallel"),
                                 W.matmul(x > 0, backend="numba_parallel")))
    errors = []
    def work(t):
        rng = np.random.default_rng(t)
        try:
            for r in range(10):  # 8 threads x 10 rounds x 5 products at once
                x = rng.standard_normal(n).astype(np.float32)
                dx = dense @ x
                want = [dx, dense @ (x > 0), np.stack([dx, -dx])]
                got = [f(W, x) for f in fns]
                a, b = both(W, x)
                for g, w in zip(got + [a, b], want + want[:2]):
                    np.testing.assert_allclose(np.asarray(g), w, rtol=1e-4, atol=1e-3)
        except Exception as e:
            errors.append(repr(e))
    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for t in threads: t.start()
    for t in threads: t.join()
    import numba
    print("layer", numba.threading_layer(), "errors", len(errors))
    sys.exit(1 if errors else 0)
""")


def _run(code, **env):
    full = dict(os.environ, JAX_PLATFORMS="cpu", NUMBA_NUM_THREADS="2", **env)
    full["PYTHONPATH"] = ROOT + os.pathsep + full.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-c", code], check=False, capture_output=True,
                          text=True, env=full, timeout=600, cwd=ROOT)


def test_parallel_backend_survives_concurrent_calls_in_a_subprocess():
    res = _run(_CONCURRENT)
    assert res.returncode == 0, (res.returncode, res.stdout, res.stderr[-3000:])
    assert "errors 0" in res.stdout


def test_parallel_backend_refuses_the_workqueue_layer():
    code = textwrap.dedent("""
        import numpy as np
        from primforge import ops
        W = ops.CSR.from_dense(np.eye(3, dtype=np.float32))
        try:
            W.matmul(np.ones(3, np.float32), backend="numba_parallel")
        except Exception as e:
            print("refused:", e)
        else:
            print("ran")
    """)
    res = _run(code, NUMBA_THREADING_LAYER="workqueue")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "refused:" in res.stdout and "threading layer" in res.stdout, res.stdout


def _numpy_weight_grad(binary, matrix, transpose, ct, x, indices, indptr):
    ev = (x != 0).astype(np.float64) if binary else x.astype(np.float64)
    rows = np.repeat(np.arange(indptr.size - 1), np.diff(indptr))
    a, b = (ev[rows], ct[indices]) if transpose else (ct[rows], ev[indices])
    return (a * b).sum(-1) if matrix else a * b


@pytest.mark.parametrize("backend", ["jax", "numba"])
@pytest.mark.parametrize("binary,matrix,transpose",
                         list(itertools.product([False, True], repeat=3)))
def test_weight_grad_matches_numpy_and_poisons_malformed(backend, binary, matrix, transpose):
    rng = np.random.default_rng(hash((binary, matrix, transpose, 11)) % 2**32)
    _, indices, indptr, _ = random_csr(rng)
    rows_in, rows_out = (M, N) if transpose else (N, M)
    x = make_input(rng, rows_in, matrix, binary)
    ct = rng.normal(size=(rows_out, K) if matrix else (rows_out,)).astype(np.float32)
    f = jax.jit(lambda i, p: _csr_grad.weight_grad(binary, matrix, ct, x, i, p,
                                                   transpose=transpose, dtype="float32",
                                                   backend=backend))
    want = _numpy_weight_grad(binary, matrix, transpose, ct, x, indices, indptr)
    np.testing.assert_allclose(np.asarray(f(indices, indptr)), want, rtol=1e-5, atol=1e-5)
    # Entries of active source rows: the event-driven kernel (W.T @ x, vector x) checks
    # only the rows it visits, as the product itself does.
    rows = np.repeat(np.arange(M), np.diff(indptr))
    live = np.flatnonzero(np.asarray(x).reshape(M, -1).any(1)[rows]) if transpose else \
        np.arange(indices.size)
    for k, bad in ((live[0], -1), (live[len(live) // 2], 10_000_000), (live[-1], max(M, N))):
        idx = indices.copy()
        idx[k] = bad
        assert np.all(np.isnan(np.asarray(f(idx, indptr)))), (k, bad)
    for k, bad in ((0, 1), (4, 10_000_000), (M, indices.size + 1)):
        ptr = indptr.copy()
        ptr[k] = bad
        assert np.all(np.isnan(np.asarray(f(indices, ptr)))), (k, bad)


@pytest.mark.parametrize("backend", ["jax", "numba"])
def test_weight_gradient_of_malformed_matrix_is_nan(backend):
    data, indices, indptr, _ = random_csr(np.random.default_rng(5))
    v = np.ones(N, np.float32)
    bad = indices.copy()
    bad[2] = -3

    @jax.jit
    def g(d, i):
        return jax.grad(lambda d: jnp.sum(ops.csrmv(d, i, indptr, v, shape=(M, N),
                                                     backend=backend)))(d)

    assert np.all(np.isnan(np.asarray(g(data, bad))))
    assert not np.any(np.isnan(np.asarray(g(data, indices))))
