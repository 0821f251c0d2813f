"""The weight-gradient kernels of primforge.ops are driven by ``primforge check``/``bench``
like every other ops kernel: a call, benchmark data, and results against NumPy."""

import numpy as np
import pytest

import primforge
import primforge.ops
from primforge.ops.csr import grad as _csr_grad
from primforge.ops.fixed_num import grad as _fixed_num_grad


def test_every_ops_kernel_has_a_call_and_benchmark_data():
    kernels = [k for k in primforge.registry.list_kernels() if k.name.startswith("primforge.ops.")]
    names = {k.name for k in kernels}
    assert {"primforge.ops.csr_weight_grad", "primforge.ops.fixed_num_weight_grad"} <= names
    missing = [k.name for k in kernels if not (k.has_call() and k.has_benchmark_data())]
    assert not missing, missing


# The jax backend of these kernels is what the products' gradients use (with backend="jax"):
# the gradient tests of the products check it; here the default tier runs the Numba kernels.
BACKENDS = ["numba", "numba_parallel", pytest.param("jax", marks=pytest.mark.exhaustive)]


def _events(binary, x):
    return (np.asarray(x) != 0).astype(np.float64) if binary else np.asarray(x, np.float64)


@pytest.mark.parametrize("backend", BACKENDS)
def test_csr_benchmark_cases_match_numpy(backend):
    for cfg in _csr_grad.weight_grad_p.benchmark_data(platform="cpu"):
        indices, indptr, ct, x = cfg.args
        kw = cfg.kwargs
        got = np.asarray(_csr_grad.weight_grad_p.call(*cfg.args, backend=backend, **kw))
        rows = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))
        ev, c = _events(kw["binary"], x), np.asarray(ct, np.float64)
        # W @ x: d/dw[e] = ct[row] . ev[col]; W.T @ x: ev[row] . ct[col]
        a, b = (ev[rows], c[indices]) if kw["transpose"] else (c[rows], ev[indices])
        want = (a * b).sum(axis=-1) if kw["matrix"] else a * b
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=str(cfg.params))


@pytest.mark.parametrize("backend", BACKENDS)
def test_fixed_number_benchmark_cases_match_numpy(backend):
    for cfg in _fixed_num_grad.weight_grad_p.benchmark_data(platform="cpu"):
        indices, ct, x = cfg.args
        kw = cfg.kwargs
        got = np.asarray(_fixed_num_grad.weight_grad_p.call(*cfg.args, backend=backend, **kw))
        ev, c = _events(kw["binary"], x), np.asarray(ct, np.float64)
        by_row, by_col = (ev, c) if kw["transpose"] else (c, ev)
        n = by_col.shape[0]
        valid = (indices >= 0) & (indices < n)
        gathered = by_col[np.where(valid, indices, 0)]
        a = by_row[:, None]
        prod = (a * gathered).sum(axis=-1) if kw["matrix"] else a * gathered
        want = np.where(valid, prod, 0.0)  # masked slots have no gradient
        assert (~valid).any()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=str(cfg.params))
