"""The opt-in Pallas kernels of the dense event products, interpreted on the CPU, against NumPy.

Covered: the four products x both directions x vector and matrix inputs, bool / int8 /
float32 events, float32 and float64 weights, sizes that are not multiples of the blocks
(rows and output columns longer than one chunk, more input columns than one block),
all-zero and all-active inputs, degenerate sizes, a clear error for other weight dtypes,
and that the backend is opt-in. The op matrix (test_ops_matrix.py) runs the same kernels
under jit, grad, jvp and vmap; their XLA:GPU compiles are in test_ops_dense_gpu_compile.py.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import primforge
from primforge import ops
from primforge.ops.dense_event import pallas as _pallas_dense_event

FUNCS = {
    (False, False): ops.densemv,
    (True, False): ops.binary_densemv,
    (False, True): ops.densemm,
    (True, True): ops.binary_densemm,
}


def make_input(rng, rows, cols, binary, events="bool", rate=0.3):
    shape = (rows, cols) if cols else (rows,)
    active = rng.random(shape) < rate
    if binary:
        return active.astype(events)
    return np.where(active, rng.normal(size=shape), 0.0).astype(np.float32)


def reference(w, x, binary, transpose):
    ev = (x != 0).astype(np.float64) if binary else x.astype(np.float64)
    return (w.T if transpose else w).astype(np.float64) @ ev


@pytest.mark.parametrize("transpose", [False, True], ids=["Wx", "xW"])
@pytest.mark.parametrize("kind", list(FUNCS), ids=lambda k: "-".join(
    (["binary"] if k[0] else []) + ["mm" if k[1] else "mv"]))
@pytest.mark.parametrize("m,n,cols", [(5, 7, 3), (70, 300, 37), (1, 1, 1), (129, 33, 64)])
def test_matches_numpy(kind, transpose, m, n, cols):
    binary, matrix = kind
    rng = np.random.default_rng([m, n, cols, binary, matrix, transpose])
    w = rng.normal(size=(m, n)).astype(np.float32)
    x = make_input(rng, m if transpose else n, cols if matrix else 0, binary)
    got = FUNCS[kind](w, x, transpose=transpose, backend="pallas")
    assert got.shape == ((n if transpose else m),) + ((cols,) if matrix else ())
    np.testing.assert_allclose(np.asarray(got), reference(w, x, binary, transpose),
                               rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("transpose", [False, True], ids=["Wx", "xW"])
@pytest.mark.parametrize("matrix", [False, True], ids=["mv", "mm"])
def test_event_dtypes_and_float64(matrix, transpose):
    rng = np.random.default_rng([matrix, transpose])
    m, n, cols = 40, 150, 5
    w = rng.normal(size=(m, n))
    fn = FUNCS[(True, matrix)]
    for events in ("bool", "int8", "float32"):
        x = make_input(rng, m if transpose else n, cols if matrix else 0, True, events)
        if events == "float32":
            x = x * rng.uniform(0.5, 2.0, x.shape).astype(np.float32)  # non-zero: active
        got = fn(w.astype(np.float32), x, transpose=transpose, backend="pallas")
        np.testing.assert_allclose(np.asarray(got), reference(w, x, True, transpose),
                                   rtol=1e-5, atol=1e-4, err_msg=events)
    with jax.enable_x64():
        x = make_input(rng, m if transpose else n, cols if matrix else 0, False)
        got = FUNCS[(False, matrix)](jnp.asarray(w), jnp.asarray(x, jnp.float64),
                                     transpose=transpose, backend="pallas")
        assert got.dtype == jnp.float64
        np.testing.assert_allclose(np.asarray(got), reference(w, x, False, transpose),
                                   rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("transpose", [False, True], ids=["Wx", "xW"])
def test_no_events_and_all_events(transpose):
    rng = np.random.default_rng(3)
    m, n = 33, 140
    w = rng.normal(size=(m, n)).astype(np.float32)
    rows = m if transpose else n
    for kind, x in itertools.product(FUNCS, (0, 1)):
        binary, matrix = kind
        xs = np.full((rows, 4) if matrix else (rows,), x, np.float32)
        got = FUNCS[kind](w, xs.astype(bool) if binary else xs, transpose=transpose,
                          backend="pallas")
        np.testing.assert_allclose(np.asarray(got), reference(w, xs, binary, transpose),
                                   rtol=1e-5, atol=1e-4, err_msg=str((kind, x)))


def test_blocks_are_smaller_than_the_tested_sizes():
    """The sizes above cross every block boundary of the kernels."""
    assert _pallas_dense_event.BLOCK_N < 300 and _pallas_dense_event.BLOCK_M < 70
    assert _pallas_dense_event.BLOCK_COLS < 37


def test_degenerate_sizes_use_the_reference():
    for kind, transpose in itertools.product(FUNCS, (False, True)):
        binary, matrix = kind
        w = np.ones((0, 3), np.float32)
        rows = 0 if transpose else 3
        x = np.ones((rows, 2) if matrix else (rows,), bool if binary else np.float32)
        got = FUNCS[kind](w, x, transpose=transpose, backend="pallas")
        assert got.shape == ((3 if transpose else 0),) + ((2,) if matrix else ())
        assert float(np.abs(np.asarray(got)).sum()) == 0.0


def test_other_weight_dtypes_are_a_clear_error():
    w = jnp.ones((3, 4), jnp.float16)
    with pytest.raises(primforge.KernelError,
                       match="binary_densemv: backend 'pallas' supports float32 or float64 "
                             "'weights', got float16"):
        ops.binary_densemv(w, jnp.ones(4, bool), backend="pallas")


def test_pallas_is_opt_in_and_the_defaults_stay():
    for kernel in (ops.densemv_p, ops.binary_densemv_p, ops.densemm_p, ops.binary_densemm_p):
        assert kernel.defaults["cpu"] == "numba" and kernel.defaults["gpu"] == "jax"
        assert "pallas" in kernel.available_backends("gpu")
        assert "pallas" in kernel.available_backends("cpu")
