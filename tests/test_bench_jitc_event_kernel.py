"""benchmarks/jitc_event_kernel.py: its table's timings and its bitwise agreement check."""

import numpy as np
import pytest
from _scripts import load_script

from primforge.ops import binary_jitc_matvec
from primforge.ops.jitconn import numba as jitc_numba

bench = load_script("benchmarks/jitc_event_kernel.py", "bench_jitc_event_kernel")


def test_the_kernel_it_times_is_the_product_s_kernel():
    rows = []

    def recording(*variant):
        fn = jitc_numba.kernel(*variant)

        def call(theta, seed, table, x, out):
            fn(theta, seed, table, x, out)
            rows.append((x.copy(), out.copy(), float(theta[0]), int(seed[0])))
        return call

    row = bench.measure({"a": recording, "b": jitc_numba.kernel}, scale=1, fire=0.01, reps=2,
                        pool=2)
    assert row["neurons"] == 4000 and row["a"] > 0 and row["b"] > 0
    x, out, w, seed = rows[-1]
    want = binary_jitc_matvec(w, seed, x, shape=(3200, 4000), prob=0.02, transpose=True,
                              backend="jax")
    np.testing.assert_allclose(out, np.asarray(want), rtol=1e-6)


def test_kernels_that_disagree_stop_it():
    def off_by_one(*variant):
        fn = jitc_numba.kernel(*variant)

        def call(theta, seed, table, x, out):
            fn(theta, seed, table, x, out)
            out[0] += 1.0
        return call

    with pytest.raises(AssertionError, match="differs"):
        bench.measure({"a": jitc_numba.kernel, "b": off_by_one}, scale=1, fire=0.01, reps=1,
                      pool=1)
