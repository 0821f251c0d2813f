"""First call of the sparse matrices' array helpers on a new shape: XLA compiles and time.

Each helper (building a matrix, ``todense``, ``with_column_index``, ``pack_events``,
``unpack``, ``csr_slice_rows``, ``diag_add``, ``csr_to_csc_index``) runs outside ``jit``
once on a shape the process has not seen, in a fresh interpreter per repeat; the row gives
the number of XLA compiles it caused (JAX's backend-compile event, counted with
``jax.monitoring``) and the median wall time of that first call (result ready included).
The helpers run in the order of the table, each on its own matrix, so an earlier row's
programs serve no later one. Usage::

    python benchmarks/matrix_helpers.py --repeats 5 --label after
    cd /path/to/other/checkout && python /path/to/benchmarks/matrix_helpers.py --label before
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import json, time
import jax.monitoring, numpy as np
events = []
jax.monitoring.register_event_duration_secs_listener(lambda n, s, **k: events.append(n))
from primforge import ops
jax.numpy.ones(3).block_until_ready()  # JAX's own start-up, paid alike by every row

def first(f):
    i = len(events)
    t = time.perf_counter()
    out = f()
    jax.block_until_ready(jax.tree_util.tree_leaves(out))
    dt = time.perf_counter() - t
    return sum(e.endswith("backend_compile_duration") for e in events[i:]), dt

rng = np.random.default_rng(0)
def dense(m, n):
    return np.where(rng.random((m, n)) < 0.05, rng.standard_normal((m, n)), 0).astype(np.float32)
def fixed(m, n, k):
    return ops.FixedNum.from_indices(rng.integers(0, n, (m, k)).astype(np.int32),
                                     np.ones((m, k), np.float32), shape=(m, n), per="pre")
rows = {}
d = dense(301, 401)
rows["CSR.from_dense"] = first(lambda: ops.CSR.from_dense(d))
W, C = ops.CSR.from_dense(dense(302, 402)), ops.CSC.from_dense(dense(303, 403))
rows["CSR.todense"] = first(W.todense)
rows["CSC.todense"] = first(C.todense)
W2 = ops.CSR.from_dense(dense(304, 404))
rows["with_column_index(CSR)"] = first(lambda: ops.with_column_index(W2))
F, F2 = fixed(305, 405, 20), fixed(306, 406, 21)
rows["FixedNum.todense"] = first(F.todense)
rows["with_column_index(FixedNum)"] = first(lambda: ops.with_column_index(F2))
x = rng.random(307) < 0.1
rows["pack_events"] = first(lambda: ops.pack_events(x).words)
P = ops.pack_events(rng.random(308) < 0.1)
rows["PackedEvents.unpack"] = first(P.unpack)
S = ops.CSR.from_dense(dense(309, 409))
rows["csr_slice_rows"] = first(lambda: ops.csr_slice_rows(
    S.data, S.indices, S.indptr, np.arange(0, 309, 7), shape=S.shape))
D = ops.CSR.from_dense(dense(310, 310))
rows["diag_add"] = first(lambda: ops.diag_add(D.data, D.indices, D.indptr,
                                              np.ones(310, np.float32), shape=D.shape))
X = ops.CSR.from_dense(dense(311, 411))
rows["csr_to_csc_index(jax arrays)"] = first(lambda: ops.csr_to_csc_index(
    X.indptr, X.indices, shape=X.shape))
print(json.dumps(rows))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--label", default="this checkout")
    ap.add_argument("--json", default=None, help="write the table here as JSON")
    args = ap.parse_args()
    env = dict(os.environ, JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH")]))
    runs = []
    for _ in range(args.repeats):
        r = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True,
                           text=True, check=True)
        runs.append(json.loads(r.stdout.strip().splitlines()[-1]))
    table = {name: {"compiles": runs[0][name][0],
                    "first_call_ms": 1e3 * statistics.median(r[name][1] for r in runs)}
             for name in runs[0]}
    print(f"{args.label}: first call on a new shape, median of {args.repeats} processes")
    print(f"{'helper':30s} {'XLA compiles':>12s} {'first call ms':>14s}")
    for name, row in table.items():
        print(f"{name:30s} {row['compiles']:12d} {row['first_call_ms']:14.1f}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"label": args.label, "repeats": args.repeats, "rows": table}, f,
                      indent=2)


if __name__ == "__main__":
    main()
