"""primforge's non-CSR operators against brainevent's, serial and multi-threaded.

Covers every operator family brainevent has besides its CSR products:

* ``fixed``: fixed-number connectivity (``binary_fixed_num_mv`` / ``fixed_num_mv`` vs
  ``binary_fcnmv`` / ``fcnmv``), ``N x N`` with ``k`` partners per row: both directions
  (``A.T @ v`` scatter, ``A @ v`` gather), bool events, float-typed events and float
  inputs, a shared weight and one weight per synapse; ``jax.grad`` w.r.t. the per-synapse
  weights and w.r.t. a float input (of ``sum(y**2)``, so that the cotangent depends on
  the input and nothing folds to a constant); ``vmap`` over a batch of event vectors;
* ``dense``: dense event products (``binary_densemv`` both sides), bool and float-typed
  events, ``grad`` w.r.t. the weights, ``vmap``;
* ``jitc``: just-in-time connectivity (``binary_jitc_matvec`` / ``jitc_matvec`` vs
  ``binary_jits/u/nmv`` / ``jits/u/nmv``) with homo, uniform and normal weights, both
  directions; ``grad`` w.r.t. the float input, ``vmap``. The two libraries draw different
  matrices from a seed: their results are compared by total input (the ratio must lie in
  0.8-1.25), not entry by entry. brainevent runs in its fast order ``corder=False`` (``be``:
  its ``W @ x`` then draws the matrix column by column, event-driven, and is not the
  matrix its ``x @ W`` uses) and, for the operator cases, with ``corder=True`` (``be_co``:
  one matrix for both directions, as primforge's). The rows "W defined by columns" time
  primforge's counterpart of ``corder=False``'s ``W @ x``: the transpose of a matrix drawn
  by rows (``transpose=True``), which is event-driven in that direction;
* ``plast``: plasticity updates (``update_on_pre`` / ``update_on_post`` on dense, CSR and
  fixed-number weights vs ``update_dense_on_binary_pre/post``, ``update_csr_on_binary_*``,
  ``update_fixed_*``). Updates on the side not stored as rows run with primforge's column
  index (:func:`primforge.ops.with_column_index`, built once outside the timed call) and,
  in the rows marked "(no index)", without it. The "scan" rows update the weights for
  ``BATCH`` steps under ``lax.scan`` (the weights carried from step to step), as a
  simulation does.

Every case runs at two event rates. Contenders: ``pf`` (primforge, backend 'numba'),
``pf_par`` (backend 'numba_parallel' where the kernel has it, else 'numba'), ``be``
(brainevent, Numba serial) and ``be_par`` (brainevent after ``set_numba_parallel(True)``).
Serial and threaded contenders are timed in separate rounds, each interleaved call by call
in a rotating order, every call with the next input of a pool of distinct inputs; medians
are reported. Prints a Markdown table of time ratios (below 1: primforge faster) and writes
JSON + Markdown to benchmarks/results/ops_brainevent*.

    python benchmarks/ops_brainevent.py                   # N = 10k (dense 5k), k = 100
    python benchmarks/ops_brainevent.py --quick           # N = 2k, seconds per family
    python benchmarks/ops_brainevent.py --family jitc     # one family
    python benchmarks/ops_brainevent.py --summary a.json b.json   # spread over runs
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import warnings

import jax
import jax.numpy as jnp
import numba
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("JAX_PLATFORMS", "cpu")
from primforge import ops

try:
    import brainevent
except ImportError:  # pragma: no cover - depends on the environment
    brainevent = None

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
BATCH = 8
FAMILIES = ("fixed", "dense", "jitc", "plast")


def time_interleaved(fns, pool, *, min_time=0.15, max_reps=40, min_reps=5):
    """Median seconds per call of ``fns[name](pool[r])``, contenders interleaved."""
    names = list(fns)
    times = {n: [] for n in names}
    start, r = time.perf_counter(), 0
    while r < min_reps or (r < max_reps and time.perf_counter() - start < min_time * len(names)):
        for name in names[r % len(names):] + names[: r % len(names)]:
            x = pool[(r + names.index(name)) % len(pool)]
            t0 = time.perf_counter()
            jax.block_until_ready(fns[name](x))
            times[name].append(time.perf_counter() - t0)
        r += 1
    return {n: statistics.median(t) for n, t in times.items()}


def inputs(n, rate, kind, size, seed):
    """A pool of distinct inputs: 'bool' events, 'fev' float-typed 0/1 events, 'float'
    values on a fraction ``rate`` of the entries, 'batch' (BATCH, n) bool events."""
    rng = np.random.default_rng(seed)
    if kind == "batch":
        return [jnp.asarray(rng.random((BATCH, n)) < rate) for _ in range(size)]
    pool = [rng.random(n) < rate for _ in range(size)]
    if kind == "fev":
        pool = [s.astype(np.float32) for s in pool]
    elif kind == "float":
        pool = [np.where(s, rng.uniform(0.5, 1.5, n), 0.0).astype(np.float32) for s in pool]
    return [jnp.asarray(s) for s in pool]


# ----------------------------------------------------------------------------- cases
# Each case: name -> (pf(backend) -> fn(x), be fn(x) or None, input kind, compare)
# compare: 'exact' (same matrix: entries must agree) or 'total' (another random matrix).

def fixed_cases(n, k, seed=0):
    rng = np.random.default_rng(seed)
    ind = jnp.asarray(rng.integers(0, n, size=(n, k)).astype(np.int32))
    wh = jnp.asarray(rng.uniform(0.05, 0.15, (n, k)).astype(np.float32))
    ws = jnp.asarray([0.1], jnp.float32)
    c = jnp.asarray(rng.standard_normal(n).astype(np.float32))
    kw = {"shape": (n, n)}
    out = {}
    for t, d in ((True, "s@W"), (False, "W@s")):
        for wname, w in (("shared", ws), ("hetero", wh)):
            for kind in ("bool", "fev", "float"):
                pf_op = ops.fixed_num_mv if kind == "float" else ops.binary_fixed_num_mv
                be_op = None
                if brainevent is not None:
                    be_op = brainevent.fcnmv if kind == "float" else brainevent.binary_fcnmv
                out[f"fixed {d} {kind} {wname}"] = (
                    lambda b, w=w, t=t, f=pf_op: (lambda x: f(w, ind, x, transpose=t,
                                                              backend=b, **kw)),
                    (lambda x, w=w, t=t, f=be_op: f(w, ind, x, transpose=t, **kw))
                    if be_op else None, kind, "exact")

        def pf_gw(b, t=t):
            return lambda x: jax.grad(lambda v: jnp.sum(c * ops.binary_fixed_num_mv(
                v, ind, x, transpose=t, backend=b, **kw)))(wh)

        def be_gw(x, t=t):
            return jax.grad(lambda v: jnp.sum(c * brainevent.binary_fcnmv(
                v, ind, x, transpose=t, **kw)))(wh)

        out[f"fixed {d} grad-w bool hetero"] = (pf_gw, be_gw if brainevent else None,
                                                "bool", "exact")

        def pf_gx(b, t=t):
            return lambda x: jax.grad(lambda v: jnp.sum(jnp.square(ops.fixed_num_mv(
                wh, ind, v, transpose=t, backend=b, **kw))))(x)

        def be_gx(x, t=t):
            return jax.grad(lambda v: jnp.sum(jnp.square(brainevent.fcnmv(
                wh, ind, v, transpose=t, **kw))))(x)

        out[f"fixed {d} grad-x float hetero"] = (pf_gx, be_gx if brainevent else None,
                                                 "float", "exact")
        out[f"fixed {d} vmap bool hetero"] = (
            lambda b, t=t: jax.vmap(lambda x: ops.binary_fixed_num_mv(
                wh, ind, x, transpose=t, backend=b, **kw)),
            (lambda xs, t=t: jax.vmap(lambda x: brainevent.binary_fcnmv(
                wh, ind, x, transpose=t, **kw))(xs)) if brainevent else None, "batch", "exact")
    return out


def dense_cases(n, seed=1):
    rng = np.random.default_rng(seed)
    W = jnp.asarray(rng.standard_normal((n, n)).astype(np.float32))
    c = jnp.asarray(rng.standard_normal(n).astype(np.float32))
    out = {}
    for t, d in ((True, "s@W"), (False, "W@s")):
        for kind in ("bool", "fev"):
            out[f"dense {d} {kind}"] = (
                lambda b, t=t: (lambda x: ops.binary_densemv(W, x, transpose=t, backend=b)),
                (lambda x, t=t: brainevent.binary_densemv(W, x, transpose=t))
                if brainevent else None, kind, "exact")

        def pf_gw(b, t=t):
            return lambda x: jax.grad(lambda w: jnp.sum(c * ops.binary_densemv(
                w, x, transpose=t, backend=b)))(W)

        def be_gw(x, t=t):
            return jax.grad(lambda w: jnp.sum(c * brainevent.binary_densemv(
                w, x, transpose=t)))(W)

        out[f"dense {d} grad-w bool"] = (pf_gw, be_gw if brainevent else None, "bool", "exact")
        out[f"dense {d} vmap bool"] = (
            lambda b, t=t: jax.vmap(lambda x: ops.binary_densemv(W, x, transpose=t,
                                                                 backend=b)),
            (lambda xs, t=t: jax.vmap(lambda x: brainevent.binary_densemv(
                W, x, transpose=t))(xs)) if brainevent else None, "batch", "exact")
    return out


JITC_WEIGHTS = {"homo": (0.5,), "uniform": (0.25, 0.75), "normal": (0.5, 0.1)}


def jitc_cases(n, p, seed=7):
    c = jnp.asarray(np.random.default_rng(3).uniform(0.5, 1.5, n).astype(np.float32))
    out = {}
    be = brainevent
    for wk, theta in JITC_WEIGHTS.items():
        letter = wk[0] if wk != "homo" else "s"
        weight = theta[0] if wk == "homo" else theta
        for t, d in ((True, "s@W"), (False, "W@s")):
            for kind in ("bool", "float"):
                binary = kind == "bool"
                pf_op = ops.binary_jitc_matvec if binary else ops.jitc_matvec
                be_op = (getattr(be, f"{'binary_' if binary else ''}jit{letter}mv")
                         if be else None)
                out[f"jitc {d} {kind} {wk}"] = (
                    lambda b, t=t, f=pf_op, w=weight, wk=wk: (
                        lambda x: f(w, seed, x, shape=(n, n), prob=p, transpose=t,
                                    weight_kind=wk, backend=b)),
                    {co: (lambda x, t=t, f=be_op, th=theta, c=(co == "be_co"): f(
                        *th, p, x, seed, shape=(n, n), transpose=t, corder=c))
                     for co in ("be", "be_co")} if be_op else None,
                    kind, "total")
                if not t:
                    # brainevent's corder=False W @ x draws W column by column (only the
                    # columns of non-zero inputs). primforge's counterpart is a matrix
                    # defined by its columns: W = A.T for A drawn by rows, whose W @ x is
                    # A's event-driven direction.
                    out[f"jitc W@s {kind} {wk}, W defined by columns"] = (
                        lambda b, f=pf_op, w=weight, wk=wk: (
                            lambda x: f(w, seed, x, shape=(n, n), prob=p, transpose=True,
                                        weight_kind=wk, backend=b)),
                        {"be": (lambda x, f=be_op, th=theta: f(
                            *th, p, x, seed, shape=(n, n), transpose=False, corder=False))}
                        if be_op else None,
                        kind, "total")
        if wk != "homo":
            continue

        for t, d in ((True, "s@W"), (False, "W@s")):
            def pf_gx(b, t=t):
                return lambda x: jax.grad(lambda v: jnp.sum(jnp.square(ops.jitc_matvec(
                    0.5, seed, v, shape=(n, n), prob=p, transpose=t, backend=b))))(x)

            def be_gx(x, t=t):
                return jax.grad(lambda v: jnp.sum(jnp.square(be.jitsmv(
                    0.5, p, v, seed, shape=(n, n), transpose=t, corder=False))))(x)

            out[f"jitc {d} grad-x float homo"] = (pf_gx, be_gx if be else None, "float",
                                                  "total")

            def pf_gw(b, t=t):
                return lambda x: jax.grad(lambda w: jnp.sum(c * ops.binary_jitc_matvec(
                    w, seed, x, shape=(n, n), prob=p, transpose=t, backend=b)))(0.5)

            def be_gw(x, t=t):
                return jax.grad(lambda w: jnp.sum(c * be.binary_jitsmv(
                    w, p, x, seed, shape=(n, n), transpose=t, corder=False)))(0.5)

            out[f"jitc {d} grad-w bool homo"] = (pf_gw, be_gw if be else None, "bool",
                                                 "total")
            out[f"jitc {d} vmap bool homo"] = (
                lambda b, t=t: jax.vmap(lambda x: ops.binary_jitc_matvec(
                    0.5, seed, x, shape=(n, n), prob=p, transpose=t, backend=b)),
                (lambda xs, t=t: jax.vmap(lambda x: be.binary_jitsmv(
                    0.5, p, x, seed, shape=(n, n), transpose=t, corder=False))(xs))
                if be else None, "batch", "total")
    return out


def _fixed_weights(W):
    return W.matrix.weights if isinstance(W, ops.ColumnIndexed) else W.weights


def plast_cases(n, n_dense, p, k, seed=5):
    rng = np.random.default_rng(seed)
    out = {}
    be = brainevent
    # dense
    Wd = jnp.asarray(rng.uniform(0, 1, (n_dense, n_dense)).astype(np.float32))
    trd = jnp.asarray(rng.uniform(0, 0.1, n_dense).astype(np.float32))
    out["plast dense on_pre bool"] = (
        lambda b: (lambda s: ops.update_on_pre(Wd, s, trd, w_min=0.0, w_max=1.0, backend=b)),
        (lambda s: be.update_dense_on_binary_pre(Wd, s, trd, 0.0, 1.0)) if be else None,
        "bool@dense", "exact")
    out["plast dense on_post bool"] = (
        lambda b: (lambda s: ops.update_on_post(Wd, s, trd, w_min=0.0, w_max=1.0, backend=b)),
        (lambda s: be.update_dense_on_binary_post(Wd, trd, s, 0.0, 1.0)) if be else None,
        "bool@dense", "exact")
    # CSR
    C = ops.fixed_prob(n, n, p, weight=0.1, seed=seed)
    C = C.with_data(jnp.asarray(rng.uniform(0, 1, C.nnz).astype(np.float32)))
    tr = jnp.asarray(rng.uniform(0, 0.1, n).astype(np.float32))
    out["plast csr on_pre bool"] = (
        lambda b: (lambda s: ops.update_on_pre(C, s, tr, w_min=0.0, w_max=1.0,
                                               backend=b).data),
        (lambda s: be.update_csr_on_binary_pre(C.data, C.indices, C.indptr, s, tr, 0.0, 1.0,
                                               shape=C.shape)) if be else None,
        "bool", "exact")
    csc_ind = csc_ptr = widx = None
    if be is not None:
        # brainevent's post update on CSR walks a CSC view: its column structure and the
        # position of every entry in the CSR data, built once outside the timed call.
        dense_pos = np.zeros(C.shape, np.int64) - 1
        rows = np.repeat(np.arange(n), np.diff(np.asarray(C.indptr)))
        dense_pos[rows, np.asarray(C.indices)] = np.arange(C.nnz)
        order = np.lexsort((rows, np.asarray(C.indices)))
        csc_ind = jnp.asarray(rows[order].astype(np.int32))
        csc_ptr = jnp.asarray(np.concatenate([[0], np.cumsum(np.bincount(
            np.asarray(C.indices), minlength=n))]).astype(np.int32))
        widx = jnp.asarray(order.astype(np.int32))
        be_post = lambda s: be.update_csr_on_binary_post(C.data, csc_ind, csc_ptr, widx, tr, s,
                                                        0.0, 1.0, shape=C.shape)
    # The column side with primforge's column index (built once, outside the timed call, as
    # brainevent's CSC view is), and without it (one pass over the stored column indices).
    CI = ops.with_column_index(C)
    out["plast csr on_post bool"] = (
        lambda b: (lambda s: ops.update_on_post(CI, s, tr, w_min=0.0, w_max=1.0,
                                                backend=b).matrix.data),
        be_post if be else None, "bool", "exact")
    out["plast csr on_post bool (no index)"] = (
        lambda b: (lambda s: ops.update_on_post(C, s, tr, w_min=0.0, w_max=1.0,
                                                backend=b).data),
        be_post if be else None, "bool", "exact")
    # fixed-number: rows presynaptic (per='pre', k targets each) and postsynaptic
    # (per='post', k sources each); brainevent's classes serve the unfavourable sides.
    ind = jnp.asarray(rng.integers(0, n, (n, k)).astype(np.int32))
    wf = jnp.asarray(rng.uniform(0, 1, (n, k)).astype(np.float32))
    for per in ("pre", "post"):
        F = ops.FixedNum(wf, ind, shape=(n, n), per=per)
        cls = (getattr(be, "FixedNumPerPre" if per == "pre" else "FixedNumPerPost")
               if be else None)
        for side in ("pre", "post"):
            pf_up = ops.update_on_pre if side == "pre" else ops.update_on_post
            if be is None:
                be_up = None
            elif side == "pre":
                be_up = (lambda s, cls=cls: cls(wf, ind, shape=(n, n))
                         .update_on_pre(s, tr, 0.0, 1.0).data)
            else:
                be_up = (lambda s, cls=cls: cls(wf, ind, shape=(n, n))
                         .update_on_post(tr, s, 0.0, 1.0).data)
            column_side = (side == "pre") != (per == "pre")
            variants = [(F, "")]
            if column_side:  # with the column index, and without it
                variants = [(ops.with_column_index(F), ""), (F, " (no index)")]
            for W, note in variants:
                out[f"plast fixed(per={per}) on_{side} bool{note}"] = (
                    lambda b, W=W, f=pf_up: (lambda s: _fixed_weights(
                        f(W, s, tr, w_min=0.0, w_max=1.0, backend=b))),
                    be_up, "bool", "exact")
    # A simulation updates its weights every step: BATCH steps under lax.scan, the weights
    # carried from step to step. primforge's numba kernels write into the carried buffer
    # (no copy of the untouched synapses); brainevent's return a new array each step.
    def scan(step, w0):
        def run(spikes):
            return jax.lax.scan(lambda w, s: (step(w, s), None), w0, spikes)[0]
        return run

    steps = {
        "dense on_pre": (lambda b: lambda w, s: ops.update_on_pre(w, s, trd, w_min=0.0,
                                                                  w_max=1.0, backend=b),
                         lambda w, s: be.update_dense_on_binary_pre(w, s, trd, 0.0, 1.0),
                         Wd, "@dense"),
        "dense on_post": (lambda b: lambda w, s: ops.update_on_post(w, s, trd, w_min=0.0,
                                                                    w_max=1.0, backend=b),
                          lambda w, s: be.update_dense_on_binary_post(w, trd, s, 0.0, 1.0),
                          Wd, "@dense"),
        "csr on_pre": (lambda b: lambda w, s: ops.update_on_pre(C.with_data(w), s, tr,
                                                                w_min=0.0, w_max=1.0,
                                                                backend=b).data,
                       lambda w, s: be.update_csr_on_binary_pre(w, C.indices, C.indptr, s, tr,
                                                                0.0, 1.0, shape=C.shape),
                       C.data, ""),
        "csr on_post": (lambda b: lambda w, s: ops.update_on_post(CI.with_data(w), s, tr,
                                                                  w_min=0.0, w_max=1.0,
                                                                  backend=b).matrix.data,
                        lambda w, s: be.update_csr_on_binary_post(w, csc_ind, csc_ptr, widx, tr,
                                                                  s, 0.0, 1.0, shape=C.shape),
                        C.data, ""),
    }
    for name, (pf_step, be_step, w0, size) in steps.items():
        out[f"plast {name} bool, scan of {BATCH} steps"] = (
            lambda b, pf_step=pf_step, w0=w0: scan(pf_step(b), w0),
            scan(be_step, w0) if be else None, "batch" + size, "exact")
    return out


# ----------------------------------------------------------------------------- running
def build_pf(pf, x0):
    """The jitted primforge call with the threaded backend where the kernel has it."""
    fns = {"pf": jax.jit(pf("numba"))}
    jax.block_until_ready(fns["pf"](x0))
    try:
        f = jax.jit(pf("numba_parallel"))
        jax.block_until_ready(f(x0))
        fns["pf_par"], threaded = f, True
    except Exception:  # noqa: BLE001 - no threaded kernel for this op: the serial one
        fns["pf_par"], threaded = fns["pf"], False
    return fns, threaded


def build_be(fn, parallel, x0):
    brainevent.config.set_numba_parallel(parallel)
    try:
        f = jax.jit(fn)
        jax.block_until_ready(f(x0))  # brainevent reads the mode when it builds its kernels
        return f
    finally:
        brainevent.config.set_numba_parallel(False)


def agreement(fns, xs, compare):
    """Max abs error vs pf ('exact'), or the ratio of totals ('total'), per contender."""
    ref = [np.asarray(fns["pf"](x), np.float64) for x in xs]
    out = {}
    for m, f in fns.items():
        got = [np.asarray(f(x), np.float64) for x in xs]
        if compare == "exact":
            out[m] = max(float(np.max(np.abs(g - r), initial=0.0)) for g, r in zip(got, ref))
        else:
            tot = sum(float(np.abs(g).sum()) for g in got)
            want = sum(float(np.abs(r).sum()) for r in ref)
            out[m] = tot / want if want else float("nan")
    return out


def wrong(err, compare, scale):
    if compare == "exact":
        return sorted(m for m, e in err.items() if e > scale)
    return sorted(m for m, e in err.items() if not 0.8 < e < 1.25)


def run_family(family, args, rate):
    n = args.n
    if family == "fixed":
        cases = fixed_cases(n, args.k)
    elif family == "dense":
        cases = dense_cases(args.n_dense)
    elif family == "jitc":
        cases = jitc_cases(n, args.p)
    else:
        cases = plast_cases(n, args.n_dense, args.p, args.k)
    rows = []
    for name, (pf, be, kind, compare) in cases.items():
        if args.only and not any(s in name for s in args.only):
            continue
        size = args.n_dense if kind.endswith("@dense") or family == "dense" else n
        xs = inputs(size, rate, kind.split("@")[0], args.pool, hash((name, rate)) % 2**31)
        fns, threaded = build_pf(pf, xs[0])
        for bname, bfn in ({"be": be} if callable(be) else (be or {})).items():
            fns[bname] = build_be(bfn, False, xs[0])
            fns[bname + "_par"] = build_be(bfn, True, xs[0])
        err = agreement(fns, [xs[0], xs[-1]], compare)
        ref_max = float(np.abs(np.asarray(fns["pf"](xs[0]))).max(initial=0.0))
        bad = wrong(err, compare, 1e-3 * max(1.0, ref_max))
        times = {}
        for group in (("pf", "be", "be_co"), ("pf_par", "be_par", "be_co_par")):
            sub = {m: fns[m] for m in group if m in fns}
            times.update(time_interleaved(sub, xs, min_time=args.min_time))
        row = {"family": family, "op": name, "n": size, "rate": rate, "compare": compare,
               "pf_threaded": threaded, "times": times, "agreement": err, "wrong": bad}
        rows.append(row)
        print(f"  {name} rate={rate}: " + ", ".join(f"{m} {t * 1e3:.3f} ms"
                                                    for m, t in times.items())
              + (f"  WRONG {bad}" if bad else ""), file=sys.stderr, flush=True)
    return rows


def ratio(row, a, b):
    t = row["times"]
    return t[a] / t[b] if a in t and b in t else None


COLUMNS = (("pf/be", "pf", "be"), ("pf_par/be_par", "pf_par", "be_par"),
           ("pf/be_co", "pf", "be_co"), ("pf_par/be_co_par", "pf_par", "be_co_par"))


def table(rows):
    lines = [("| op | N | rate | pf ms | pf/be | pf_par/be_par | pf/be_co | pf_par/be_co_par | "
              "agreement | wrong |"), "|---|---|---|---|---|---|---|---|---|---|"]
    fmt = lambda r: "-" if r is None else f"{r:.2f}"
    for r in rows:
        ag = r["agreement"].get("be")
        ag = "-" if ag is None else (f"{ag:.1e}" if r["compare"] == "exact" else f"x{ag:.2f}")
        par = fmt(ratio(r, "pf_par", "be_par")) + ("" if r["pf_threaded"] else "*")
        lines.append(f"| {r['op']} | {r['n']} | {r['rate']:g} | {r['times']['pf'] * 1e3:.3f} | "
                     f"{fmt(ratio(r, 'pf', 'be'))} | {par} | {fmt(ratio(r, 'pf', 'be_co'))} | "
                f"{fmt(ratio(r, 'pf_par', 'be_co_par'))} | {ag} | "
                     f"{','.join(r['wrong']) or '-'} |")
    lines.append("")
    lines.append("(* primforge has no threaded kernel for this op: its serial kernel is timed "
                 "against brainevent's threaded one)")
    for head, a, b in COLUMNS:
        rs = [x for x in (ratio(r, a, b) for r in rows) if x is not None]
        if rs:
            geo = float(np.exp(np.mean(np.log(rs))))
            lose = sum(x > 1.0 for x in rs)
            lines.append(f"{head}: geometric mean {geo:.2f}, worst {max(rs):.2f}, best "
                         f"{min(rs):.2f}, {lose} of {len(rs)} cases above 1")
    return "\n".join(lines)


def summary(paths):
    """One row per case: the ratios at every rate as 'low-high' over the runs in ``paths``."""
    runs = []
    for path in paths:
        with open(path) as f:
            runs.append(json.load(f)["rows"])
    rates = sorted({r["rate"] for run in runs for r in run})
    cells = {}
    order = []
    for run in runs:
        for r in run:
            if r["op"] not in order:
                order.append(r["op"])
            for head, a, b in COLUMNS:
                x = ratio(r, a, b)
                if x is not None:
                    cells.setdefault((r["op"], r["rate"], head), []).append(x)
    heads = [h for h, _, _ in COLUMNS if any(k[2] == h for k in cells)]
    span = lambda v: "-" if not v else (f"{min(v):.2f}" if len(v) == 1 or f"{min(v):.2f}" ==
                                        f"{max(v):.2f}" else f"{min(v):.2f}-{max(v):.2f}")
    lines = ["| op | " + " | ".join(f"{h} @{rt:g}" for rt in rates for h in heads) + " |",
             "|---|" + "---|" * (len(rates) * len(heads))]
    for op in order:
        lines.append(f"| {op} | " + " | ".join(span(cells.get((op, rt, h), []))
                                               for rt in rates for h in heads) + " |")
    worst = {h: max((max(v) for k, v in cells.items() if k[2] == h), default=None)
             for h in heads}
    lines.append("")
    lines.append(f"{len(runs)} runs; cells give the lowest-highest ratio over the runs; worst: "
                 + ", ".join(f"{h} {w:.2f}" for h, w in worst.items() if w is not None))
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--summary", nargs="+", default=None, metavar="JSON",
                    help="print one table of ratio spreads over earlier runs' JSON files")
    ap.add_argument("--quick", action="store_true", help="N = 2k (dense 1k), short timing")
    ap.add_argument("--family", nargs="*", choices=FAMILIES, default=list(FAMILIES))
    ap.add_argument("--only", nargs="*", default=None, help="substrings of case names to run")
    ap.add_argument("--n", type=int, default=None, help="neurons (default 10k)")
    ap.add_argument("--n-dense", type=int, default=None, help="dense size (default 5k)")
    ap.add_argument("--k", type=int, default=100, help="partners per row (fixed-number)")
    ap.add_argument("--p", type=float, default=0.01, help="connection probability")
    ap.add_argument("--rates", type=float, nargs="*", default=[0.01, 0.1])
    ap.add_argument("--pool", type=int, default=8, help="distinct inputs per case")
    ap.add_argument("--min-time", type=float, default=None, help="seconds per contender")
    ap.add_argument("--tag", default="", help="suffix of the result files")
    ap.add_argument("--out", default=RESULTS, help="results folder")
    args = ap.parse_args(argv)
    if args.summary:
        print(summary(args.summary))
        return
    args.n = args.n or (2_000 if args.quick else 10_000)
    args.n_dense = args.n_dense or (1_000 if args.quick else 5_000)
    if args.quick:
        args.k = min(args.k, 50)
        args.p = max(args.p, 0.02)
    args.min_time = args.min_time or (0.05 if args.quick else 0.15)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    rows = []
    for family in args.family:
        for rate in args.rates:
            rows += run_family(family, args, rate)
    text = table(rows)
    print(text)
    meta = {"jax": jax.__version__, "numba": numba.__version__,
            "brainevent": getattr(brainevent, "__version__", None),
            "numba_threads": numba.get_num_threads(), "platform": platform.platform(),
            "cpu_count": os.cpu_count(), "n": args.n, "n_dense": args.n_dense, "k": args.k,
            "p": args.p, "rates": args.rates, "argv": sys.argv[1:]}
    os.makedirs(args.out, exist_ok=True)
    stem = "ops_brainevent" + ("_quick" if args.quick else "") + args.tag
    with open(os.path.join(args.out, stem + ".json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    with open(os.path.join(args.out, stem + ".md"), "w") as f:
        f.write(text + "\n")
    print(f"results in {args.out}/{stem}.*", file=sys.stderr)


if __name__ == "__main__":
    main()
