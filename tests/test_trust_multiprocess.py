"""Compiled-code caches, tried from several fresh processes: never other code than the one called.

Every test runs its kernels in child processes (:mod:`subproc_utils`) that share one cache
folder, as separate runs of a user's program would, and checks each result against NumPy
arithmetic written out here. Kernel code lives in files, as in a real program (a kernel
without a source file can't be cached by Numba at all). A child that crashes, or prints
a heap-corruption message, fails the test with its output quoted.

Only public names are used (``XLACustomKernel``, ``def_numba_kernel``, ``numba_kernel``,
``load_cpp_inline``, ``jax.export``, and the numba backend's ``prepare`` for an export
called in a fresh process), so these tests hold whatever a backend keeps on disk and how.
The tests of damaged, planted and untrusted cache folders run for both backends that may
keep files there: Numba kernels and C++ libraries (``load_cpp_inline``). A full or
read-only file system is a small tmpfs, which needs root with the right to mount (else
those two scenarios skip, saying so); a read-only folder can't be had with ``chmod`` as
root, so a path below a regular file stands for an unwritable one everywhere.

The default tier runs one test of each kind of trust: an edit between processes (and the
same-size edit dated in the past), damaged, planted and linked entries of a Numba cache, and
a planted library; the other scenarios (constants across processes, folders that can't be
trusted or written, hash seeds, bounds checking across processes, the C++ backend's damaged
cache) are marked ``exhaustive``.
"""

from __future__ import annotations

import os
import pickle
import shutil
import stat
import subprocess

import numpy as np
import pytest
from subproc_utils import check, child_env, edit_file, run_concurrently, run_python, write_script

pytest.importorskip("numba", reason="the numba backend needs primforge[cpu]")

X = np.arange(1.0, 6.0)  # what the scripts call their kernels on (jnp.arange(1.0, 6.0))

# The README's generator, verbatim apart from the loop over factors given on the command line.
README_GEN = """
import sys

import jax
import jax.numpy as jnp
import numba
import primforge

scale = primforge.XLACustomKernel("scale")

def numba_gen(factor, **_):             # CPU: a Numba kernel, outputs written in place
    @numba.njit
    def kernel(x, out):
        for i in range(x.size):
            out[i] = factor * x[i]
    return kernel

scale.def_numba_kernel(numba_gen)                                          # CPU default
scale.def_kernel("jax", "cpu", lambda factor, **_: lambda x: factor * x)   # reference

x = jnp.arange(1.0, 6.0)
for f in sys.argv[1:]:
    emit("factor=" + f, scale(x, outs=jax.ShapeDtypeStruct(x.shape, x.dtype), factor=float(f)))
"""

# The same closure handed to numba_kernel directly.
DIRECT_CLOSURE = """
import sys

import jax
import jax.numpy as jnp
import numba
import primforge

def make(factor):
    @numba.njit
    def kernel(x, out):
        for i in range(x.size):
            out[i] = factor * x[i]
    return kernel

x = jnp.arange(1.0, 6.0)
for f in sys.argv[1:]:
    k = primforge.numba_kernel(make(float(f)), jax.ShapeDtypeStruct(x.shape, x.dtype))
    emit("factor=" + f, k(x))
"""

# Two generators per process: one whose only constant is its param (the processes share those
# values, each in another order) and one that also holds this process's own constant C; a
# direct closure kernel with C; each called twice, and once under jit.
FOUR = """
import sys

import jax
import jax.numpy as jnp
import numba
import primforge

C = float(sys.argv[1])
FACTORS = [float(f) for f in sys.argv[2:]]

def shared_gen(factor, **_):
    @numba.njit
    def kernel(x, out):
        for i in range(x.size):
            out[i] = factor * x[i]
    return kernel

def make_gen(c):
    def gen(factor, **_):
        @numba.njit
        def kernel(x, out):
            for i in range(x.size):
                out[i] = factor * x[i] + c
        return kernel
    return gen

def make_kernel(c):
    @numba.njit
    def kernel(x, out):
        for i in range(x.size):
            out[i] = x[i] - c
    return kernel

shared = primforge.XLACustomKernel("shared")
shared.def_numba_kernel(shared_gen)
own = primforge.XLACustomKernel("own")
own.def_numba_kernel(make_gen(C))
x = jnp.arange(1.0, 6.0)
spec = jax.ShapeDtypeStruct(x.shape, x.dtype)
direct = primforge.numba_kernel(make_kernel(C), spec)
for rep in range(2):
    for f in FACTORS:
        emit(f"shared factor={f} rep={rep}", shared(x, outs=spec, factor=f))
    emit(f"own factor={FACTORS[0]} rep={rep}", own(x, outs=spec, factor=FACTORS[0]))
    emit(f"direct rep={rep}", direct(x))
emit("jit", jax.jit(lambda v: own(v, outs=spec, factor=FACTORS[0]) + direct(v))(x))
"""

# A generator, a module-level kernel through numba_kernel, jit and vmap (a batched handler).
MIXED = """
import jax
import jax.numpy as jnp
import numba
import primforge

scale = primforge.XLACustomKernel("scale_mixed")

def numba_gen(factor, **_):
    @numba.njit
    def kernel(x, out):
        for i in range(x.size):
            out[i] = factor * x[i]
    return kernel

scale.def_numba_kernel(numba_gen)

@numba.njit
def axpy(x, y, out):
    for i in range(x.size):
        out[i] = 2.0 * x[i] + y[i]

x = jnp.arange(1.0, 6.0)
spec = jax.ShapeDtypeStruct(x.shape, x.dtype)
emit("scale2", scale(x, outs=spec, factor=2.0))
emit("scale2_jit", jax.jit(lambda v: scale(v, outs=spec, factor=2.0))(x))
k = primforge.numba_kernel(axpy, spec)
emit("axpy", k(x, 10 * x))
xs = jnp.stack([x, x + 1, x + 2])
emit("axpy_vmap", jax.vmap(k)(xs, xs))
"""


def _mixed_expected():
    xs = np.stack([X, X + 1, X + 2])
    return {"scale2": 2 * X, "scale2_jit": 2 * X, "axpy": 12 * X, "axpy_vmap": 3 * xs}


# --------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------


def _src(tmp_path):
    d = tmp_path / "src"
    d.mkdir(exist_ok=True)
    return d


def _run(script, cache, *args, extra=None, hashseed=0, label="", pythonpath=()):
    env = child_env(
        None if cache is None else str(cache),
        hashseed=hashseed,
        pythonpath=[os.path.dirname(str(script)), *map(str, pythonpath)],
        extra=extra,
    )
    return run_python(
        str(script), args=args, env=env, cwd=os.path.dirname(str(script)), label=label
    )


def _expect(proc, tag, want, what, rtol=1e-6):
    """``proc`` emitted ``tag`` and it equals ``want``; else fail naming the process."""
    res = proc.results()
    if tag not in res:
        pytest.fail(f"{what}: no result {tag!r} from the child\n{proc.describe()}", pytrace=False)
    got = np.asarray(res[tag])
    want = np.asarray(want)
    if got.shape != want.shape or not np.allclose(got, want, rtol=rtol, atol=0):
        pytest.fail(
            f"WRONG VALUE: {what}: {tag} gave {got.tolist()}, expected {want.tolist()}",
            pytrace=False,
        )


def _files(root):
    """Every path under ``root`` (files, links, folders), relative, without following links."""
    out = set()
    if not os.path.lexists(root):
        return out
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for n in dirnames + filenames:
            out.add(os.path.relpath(os.path.join(dirpath, n), root))
    return out


def _numba_cache_files(folder):
    """Numba's own on-disk cache files (index and data) anywhere under ``folder``."""
    return sorted(f for f in _files(folder) if f.endswith((".nbi", ".nbc")))


def _cache_warnings(proc, cache_root):
    return [
        w
        for w in proc.warnings()
        if "Cache" in w["category"] or str(cache_root) in w["message"]
    ]


# --------------------------------------------------------------------------------------
# closures: a kernel's constants are part of its code
# --------------------------------------------------------------------------------------


@pytest.mark.exhaustive
@pytest.mark.parametrize(
    "script", [README_GEN, DIRECT_CLOSURE], ids=["def_numba_kernel", "numba_kernel"]
)
def test_closure_constant_second_process_other_order(tmp_path, script):
    """Process 1 caches factor=3; process 2 runs factor=2 first, then factor=3: 3x, not 2x."""
    src, cache = _src(tmp_path), tmp_path / "cache"
    path = write_script(str(src), "gen.py", script)
    p1 = check(_run(path, cache, "3", label="process 1"), "process 1")
    _expect(p1, "factor=3", 3 * X, "process 1")
    p2 = check(_run(path, cache, "2", "3", label="process 2"), "process 2")
    _expect(p2, "factor=2", 2 * X, "process 2")
    _expect(p2, "factor=3", 3 * X, "process 2 (factor=3 cached by process 1)")


@pytest.mark.exhaustive
def test_four_processes_share_one_cache_each_its_own_constants(tmp_path):
    """Four processes started together, one cache folder, different closure constants."""
    src, cache = _src(tmp_path), tmp_path / "cache"
    path = write_script(str(src), "four.py", FOUR)
    consts = [0.25, 10.5, 100.75, 1000.125]
    base = [1.0, 2.0, 3.0, 4.0]
    # Each process's second param is another's first: by the time it gets there, that
    # process may have cached it.
    orders = [[base[i], base[(i + 1) % 4]] for i in range(4)]
    jobs = []
    for i, (c, fs) in enumerate(zip(consts, orders)):
        env = child_env(str(cache), pythonpath=[str(src)])
        jobs.append(
            {
                "script": path,
                "args": [str(c), *map(str, fs)],
                "env": env,
                "cwd": str(src),
                "label": f"process {i}",
            }
        )
    procs = run_concurrently(jobs)
    for p in procs:
        check(p, p.label)
    for p, c, fs in zip(procs, consts, orders):
        for rep in range(2):
            for f in fs:
                _expect(p, f"shared factor={f} rep={rep}", f * X, p.label)
            _expect(p, f"own factor={fs[0]} rep={rep}", fs[0] * X + c, f"{p.label} (C={c})")
            _expect(p, f"direct rep={rep}", X - c, f"{p.label} (C={c})")
        _expect(p, "jit", fs[0] * X + c + X - c, f"{p.label} (C={c})")


# --------------------------------------------------------------------------------------
# edits between runs
# --------------------------------------------------------------------------------------

HELPERS = """
import numba

@numba.njit
def h(v):
    return v * 2.0
"""
HELPERS_EDITED = """
import numba

@numba.njit
def h(v):
    return v * 5.0 + 0.5
"""
CFG = "C = 3.0\n"
CFG_EDITED = "C = 7.25  # edited\n"
KERN_EDIT = """
import numba

import cfg
from cfg import C
from helpers import h

@numba.njit
def k_helper(x, out):
    for i in range(x.size):
        out[i] = h(x[i])

@numba.njit
def k_attr(x, out):
    for i in range(x.size):
        out[i] = x[i] * cfg.C

@numba.njit
def k_from(x, out):
    for i in range(x.size):
        out[i] = x[i] * C
"""
RUN_EDIT = """
import jax
import jax.numpy as jnp
import numpy as np
import primforge

import kern_edit

x = jnp.arange(1.0, 6.0)
spec = jax.ShapeDtypeStruct(x.shape, x.dtype)
for name in ("k_helper", "k_attr", "k_from"):
    fn = getattr(kern_edit, name)
    op = primforge.XLACustomKernel("edit_" + name)
    op.def_numba_kernel(lambda fn=fn, **_: fn)
    emit(name + " op", op(x, outs=spec))
    emit(name + " direct", primforge.numba_kernel(fn, spec)(x))
"""

# A second edit of the same files that keeps their sizes, with the modification time set
# back to 1970: a (size, mtime) stamp of the sources would not tell these versions apart.
HELPERS_SAME_SIZE = HELPERS_EDITED.replace("v * 5.0", "v * 6.0")
CFG_SAME_SIZE = CFG_EDITED.replace("7.25", "8.25")

EDIT_CASES = {
    # kernel: (expected before the edit, after it, after the same-size edit)
    "k_helper": (2.0 * X, 5.0 * X + 0.5, 6.0 * X + 0.5),
    "k_attr": (3.0 * X, 7.25 * X, 8.25 * X),
    "k_from": (3.0 * X, 7.25 * X, 8.25 * X),
}


@pytest.fixture(scope="module")
def edited_runs(tmp_path_factory):
    """Process 1 with the original files; edit helper and constant; process 2, same cache."""
    tmp = tmp_path_factory.mktemp("edits")
    src, cache = _src(tmp), tmp / "cache"
    for name, text in (("helpers.py", HELPERS), ("cfg.py", CFG), ("kern_edit.py", KERN_EDIT)):
        (src / name).write_text(text.lstrip())
    path = write_script(str(src), "run_edit.py", RUN_EDIT)
    p1 = _run(path, cache, label="process 1 (before the edits)")
    nb_after_p1 = _numba_cache_files(str(src))
    edit_file(str(src / "helpers.py"), HELPERS_EDITED.lstrip())
    edit_file(str(src / "cfg.py"), CFG_EDITED)
    p2 = _run(path, cache, label="process 2 (after the edits)")
    for name, text in (("helpers.py", HELPERS_SAME_SIZE), ("cfg.py", CFG_SAME_SIZE)):
        f = src / name
        assert len(text.lstrip()) == f.stat().st_size
        f.write_text(text.lstrip())
        os.utime(f, (1, 1))
    p3 = _run(path, cache, label="process 3 (after same-size edits dated 1970)")
    return {"p1": p1, "p2": p2, "p3": p3, "nb_after_p1": nb_after_p1, "src": str(src)}


@pytest.mark.parametrize(
    "kernel",
    list(EDIT_CASES),
    ids=[
        "njit_helper_in_other_module",
        "constant_as_module_attribute",
        "constant_imported_by_name",
    ],
)
def test_edit_between_processes_is_seen(edited_runs, kernel):
    """An edit to code or a constant the kernel uses, between two runs, changes the result."""
    before, after, _ = EDIT_CASES[kernel]
    p1 = check(edited_runs["p1"], "process 1")
    for how in ("op", "direct"):
        _expect(p1, f"{kernel} {how}", before, "process 1 (original files)")
    p2 = check(edited_runs["p2"], "process 2")
    for how in ("op", "direct"):
        _expect(p2, f"{kernel} {how}", after, "process 2 (files edited after process 1)")


@pytest.mark.parametrize(
    "kernel",
    list(EDIT_CASES),
    ids=[
        "njit_helper_in_other_module",
        "constant_as_module_attribute",
        "constant_imported_by_name",
    ],
)
def test_same_size_edit_dated_in_the_past_is_seen(edited_runs, kernel):
    """A third run after edits that keep each file's size and set its time back: new code."""
    after_same_size = EDIT_CASES[kernel][2]
    p3 = check(edited_runs["p3"], "process 3")
    for how in ("op", "direct"):
        _expect(p3, f"{kernel} {how}", after_same_size, "process 3 (same-size edits, old mtime)")


def test_numba_disk_cache_not_switched_on_for_user_functions(edited_runs):
    """The user's @njit functions lack cache=True: primforge must not make Numba cache them."""
    check(edited_runs["p1"], "process 1")
    found = edited_runs["nb_after_p1"]
    assert not found, (
        "Numba cache files appeared next to the user's sources (none of the user's @njit "
        f"functions asked for cache=True): {found} under {edited_runs['src']}"
    )


KERN_D = """
import numba

@numba.njit
def k(x, out):
    for i in range(x.size):
        out[i] = x[i] * 2.0
"""
KERN_D_NEW = """
import numba

@numba.njit
def k(x, out):
    for i in range(x.size):
        out[i] = x[i] * 7.0   # saved while the first process was running
"""
RUN_D = """
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import primforge

import kern_d

if sys.argv[1:] == ["rewrite"]:
    # The user saves the kernel's file after it was imported, before the first call.
    path = kern_d.__file__
    old = os.stat(path).st_mtime
    with open(path, "w") as f:
        f.write(NEW_SOURCE)
    os.utime(path, (old + 2, old + 2))

x = jnp.arange(1.0, 6.0)
spec = jax.ShapeDtypeStruct(x.shape, x.dtype)
ref = np.zeros(5)
kern_d.k.py_func(np.asarray(x), ref)      # the imported function, run as plain Python
emit("python", ref)
op = primforge.XLACustomKernel("saved_between")
op.def_numba_kernel(lambda **_: kern_d.k)
emit("op", op(x, outs=spec))
emit("direct", primforge.numba_kernel(kern_d.k, spec)(x))
"""


@pytest.mark.exhaustive
def test_kernel_file_saved_between_import_and_first_call(tmp_path):
    """The code that runs is the code Python imported, in this process and in the next.

    Process 1 imports the kernel (``2 x``), then its file is rewritten (``7 x``: the same
    bytecode, another constant), then it calls the kernel: the result must be what the
    imported function computes as plain Python (``kernel.py_func`` on NumPy arrays), i.e.
    ``2 x``. Process 2 imports the new file: it must compute ``7 x``, whatever process 1
    left in the cache.
    """
    src, cache = _src(tmp_path), tmp_path / "cache"
    (src / "kern_d.py").write_text(KERN_D.lstrip())
    path = write_script(str(src), "run_d.py", f"NEW_SOURCE = {KERN_D_NEW.lstrip()!r}\n" + RUN_D)
    p1 = check(_run(path, cache, "rewrite", label="process 1 (file saved before first call)"))
    _expect(p1, "python", 2.0 * X, "process 1, plain Python reference")
    for how in ("op", "direct"):
        _expect(p1, how, 2.0 * X, "process 1 (runs the imported code)")
    p2 = check(_run(path, cache, label="process 2 (imports the saved file)"))
    _expect(p2, "python", 7.0 * X, "process 2, plain Python reference")
    for how in ("op", "direct"):
        _expect(p2, how, 7.0 * X, "process 2 (runs the new file's code)")


# --------------------------------------------------------------------------------------
# compilation flags
# --------------------------------------------------------------------------------------

POKE = """
import sys

import jax
import jax.numpy as jnp
import numba
import numpy as np
import primforge

@numba.njit
def poke(idx, x, out):
    for i in range(x.size):
        out[i] = x[i]
    out[idx[0]] = -1.0

op = primforge.XLACustomKernel("poke")
op.def_numba_kernel(lambda **_: poke)
x = jnp.arange(1.0, 9.0)
where = int(sys.argv[1])
try:
    spec = jax.ShapeDtypeStruct(x.shape, x.dtype)
    y = np.asarray(op(jnp.array([where], jnp.int32), x, outs=spec))
except Exception as e:
    emit("raised", f"{type(e).__name__}: {e}")
else:
    emit("value", y)
"""


def _expect_oob_raises(proc, what):
    check(proc, what)
    res = proc.results()
    if "raised" not in res:
        got = res.get("value")
        pytest.fail(
            f"NO ERROR: {what}: an out-of-bounds write (index 8 of 8 elements) under "
            f"NUMBA_BOUNDSCHECK=1 returned normally with {got if got is None else got.tolist()}",
            pytrace=False,
        )
    raised = res["raised"]
    assert "IndexError" in raised and "poke" in raised, f"{what}: {raised}"


@pytest.mark.exhaustive
def test_boundscheck_env_fresh_cache_raises(tmp_path):
    """Control: with NUMBA_BOUNDSCHECK=1 and an empty cache an out-of-bounds write raises."""
    src = _src(tmp_path)
    path = write_script(str(src), "poke.py", POKE)
    p = _run(path, tmp_path / "cache", "8", extra={"NUMBA_BOUNDSCHECK": "1"}, label="boundscheck")
    _expect_oob_raises(p, "fresh cache, NUMBA_BOUNDSCHECK=1")


@pytest.mark.exhaustive
def test_boundscheck_env_after_kernel_cached_without_it(tmp_path):
    """Process 1 (no bounds checks) caches the kernel; process 2 sets NUMBA_BOUNDSCHECK=1."""
    src, cache = _src(tmp_path), tmp_path / "cache"
    path = write_script(str(src), "poke.py", POKE)
    p1 = check(_run(path, cache, "2", label="process 1 (in bounds, no checks)"))
    want = np.arange(1.0, 9.0)
    want[2] = -1.0
    _expect(p1, "value", want, "process 1")
    p2 = _run(path, cache, "8", extra={"NUMBA_BOUNDSCHECK": "1"}, label="process 2 (boundscheck)")
    _expect_oob_raises(p2, "process 2, NUMBA_BOUNDSCHECK=1 after a cache filled without it")


# --------------------------------------------------------------------------------------
# deterministic target names
# --------------------------------------------------------------------------------------

SEEDED = """
import re
import sys

import jax
import jax.numpy as jnp
import numba
import primforge

# argv: "first" BLOB (write the export to BLOB), "fresh" BLOB (call BLOB's export before and
# after building the kernels here), or "first" "-" (no serialization available).
MODE, BLOB = sys.argv[1], sys.argv[2]
x = jnp.arange(1.0, 6.0)
if MODE == "fresh":
    with open(BLOB, "rb") as fh:
        imported = jax.export.deserialize(bytearray(fh.read()))
    try:  # nothing built in this process yet: a clear error, not a crash
        emit("before", imported.call(x))
    except Exception as e:
        emit("before", f"{type(e).__name__}: {e}")

def make(tags, names, use_tags=False, mode="gamma"):
    @numba.njit
    def kernel(x, out):
        s = 0
        for n in names:
            s += len(n)
        if use_tags:          # pruned by Numba: the frozenset is only held, never typed
            s += len(tags)
        # a set constant in the code itself: its iteration order follows the hash seed
        w = 1.0 if mode in {"alpha", "beta", "gamma", "delta", "epsilon"} else 0.0
        for i in range(x.size):
            out[i] = x[i] * s * w
    return kernel

NAMES = ("ab", "cde", "fghi")
op = primforge.XLACustomKernel("seeded")
op.def_numba_kernel(lambda tags, **_: make(tags, NAMES))
spec = jax.ShapeDtypeStruct(x.shape, x.dtype)
held = frozenset({"alpha", "beta", "gamma", "delta", "epsilon", "zeta"})
direct = primforge.numba_kernel(make(held, NAMES), spec)

def f(v):
    return op(v, outs=spec, tags=frozenset({"red", "green", "blue", "cyan"})) + direct(v)

if MODE == "fresh":
    # Registering the export's targets here, before anything is called or lowered, is the
    # job of the numba backend's prepare().
    from primforge.backends import numba as nb

    emit("prepared", sorted(nb.prepare(f, x)))
    emit("imported", imported.call(x))
emit("value", f(x))
text = jax.jit(f).lower(x).as_text()
targets = sorted(set(re.findall(r'custom_call @"?([A-Za-z0-9_.$-]+)', text)))
emit("targets", targets)
checks = [jax.export.DisabledSafetyCheck.custom_call(t) for t in targets]
exported = jax.export.export(jax.jit(f), disabled_checks=checks)(x)
emit("stablehlo", exported.mlir_module())
if MODE == "first" and BLOB != "-":
    with open(BLOB, "wb") as fh:
        fh.write(exported.serialize())
"""


@pytest.fixture(scope="module")
def seeded_runs(tmp_path_factory):
    """Process 1 (PYTHONHASHSEED=1) exports and, when it can, serializes the export;
    process 2 (PYTHONHASHSEED=2) calls that export before and after building the kernels."""
    import importlib.util

    tmp = tmp_path_factory.mktemp("seeded")
    src = _src(tmp)
    path = write_script(str(src), "seeded.py", SEEDED)
    # jax.export serialization needs flatbuffers; without it process 2 only re-exports.
    blob = str(tmp / "exported.bin") if importlib.util.find_spec("flatbuffers") else None
    runs = {}
    for seed, mode in ((1, "first"), (2, "fresh" if blob else "first")):
        runs[seed] = _run(
            path, tmp / f"cache{seed}", mode, blob or "-", hashseed=seed,
            label=f"PYTHONHASHSEED={seed}",
        )
    return runs, blob


@pytest.mark.exhaustive
def test_export_is_identical_across_hash_seeds(seeded_runs):
    """Two processes, different PYTHONHASHSEED: byte-identical exported StableHLO."""
    (runs, _) = seeded_runs
    p1, p2 = (check(runs[seed], runs[seed].label) for seed in (1, 2))
    for p in (p1, p2):
        _expect(p, "value", 9.0 * X + 9.0 * X, p.label)
    t1, t2 = p1.results()["targets"], p2.results()["targets"]
    assert t1, f"no custom call found in the lowered text\n{p1.describe()}"
    assert t1 == t2, f"FFI target names depend on the hash seed: {t1} vs {t2}"
    assert p1.results()["stablehlo"] == p2.results()["stablehlo"], (
        "exported StableHLO differs between PYTHONHASHSEED=1 and 2"
    )


@pytest.mark.exhaustive
def test_exported_kernels_run_in_a_fresh_process(seeded_runs):
    """The serialized export, called in a fresh process: before the kernels are built there
    it fails naming a target (no crash); once the numba backend's ``prepare`` has
    registered their targets (nothing called or lowered yet) it computes the right values."""
    runs, blob = seeded_runs
    if blob is None:
        pytest.skip("jax.export serialization needs flatbuffers")
    p1, p2 = (check(runs[seed], runs[seed].label) for seed in (1, 2))
    targets = p1.results()["targets"]
    before = p2.results().get("before")
    assert isinstance(before, str), f"the export ran with nothing built: {before}"
    assert any(t in before for t in targets), before
    assert p2.results()["prepared"] == targets
    _expect(p2, "imported", 9.0 * X + 9.0 * X, "process 2 (the imported export)")


# --------------------------------------------------------------------------------------
# damaged, planted and untrusted cache folders
# --------------------------------------------------------------------------------------


# A C++ kernel (load_cpp_inline), whose compiled library the C++ backend keeps on disk. It
# reads its frame through XLA's C API (c_api.h) alone, which compiles in a fraction of the
# time ffi.h's templates take (ffi.h handlers are covered by test_backend_cuda.py).
CPP = """
import sys

import jax
import jax.numpy as jnp
import primforge

EXPR = {"good": "2 * x[i] + 1", "other": "x[i] - 100"}[sys.argv[1] if sys.argv[1:] else "good"]
SOURCE = r'''
#include <cstdint>
#include "xla/ffi/api/c_api.h"
extern "C" XLA_FFI_Error* Affine(XLA_FFI_CallFrame* frame) {
  auto* ext = frame->extension_start;  // the struct's name differs by jaxlib release
  if (ext != nullptr && ext->type == XLA_FFI_Extension_Metadata) {  // XLA asks the version
    XLA_FFI_Metadata* meta = reinterpret_cast<XLA_FFI_Metadata_Extension*>(ext)->metadata;
    meta->api_version = XLA_FFI_Api_Version{XLA_FFI_Api_Version_STRUCT_SIZE, nullptr,
                                            XLA_FFI_API_MAJOR, XLA_FFI_API_MINOR};
    meta->traits = 0;
#ifdef XLA_FFI_UNKNOWN_TYPE_ID
    meta->state_type_id = XLA_FFI_UNKNOWN_TYPE_ID;
#endif
    return nullptr;
  }
  auto* xb = static_cast<XLA_FFI_Buffer*>(frame->args.args[0]);
  auto* yb = static_cast<XLA_FFI_Buffer*>(frame->rets.rets[0]);
  int64_t n = 1;
  for (int64_t d = 0; d < xb->rank; ++d) n *= xb->dims[d];
  const float* x = static_cast<const float*>(xb->data);
  float* y = static_cast<float*>(yb->data);
  for (int64_t i = 0; i < n; ++i) y[i] = EXPR;
  return nullptr;
}
'''.replace("EXPR", EXPR)
module = primforge.load_cpp_inline(SOURCE, name="trust_affine", flags=["-O0"],
                                   handlers=["Affine"])
x = jnp.arange(1.0, 6.0)
emit("affine", module.call("Affine", x, outs=jax.ShapeDtypeStruct(x.shape, x.dtype)))
"""

BACKENDS = {
    "numba": (MIXED, _mixed_expected),
    "cpp": (CPP, lambda: {"affine": 2 * X + 1}),
}


def _write_backend_script(folder, backend):
    return write_script(str(folder), f"{backend}_script.py", BACKENDS[backend][0])


def _expect_backend(proc, backend, what):
    check(proc, what)
    for tag, want in BACKENDS[backend][1]().items():
        _expect(proc, tag, want, what)


class _Planted:
    """Unpickling this creates a marker folder: proof that a planted pickle was executed."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.makedirs, (self.marker, 0o777, True))


@pytest.fixture(scope="module", params=[pytest.param(b, marks=pytest.mark.exhaustive)
                                        if b == "cpp" else b for b in BACKENDS])
def filled_cache(request, tmp_path_factory):
    """A cache folder filled by one run of a backend's script (tests damage copies of it)."""
    backend = request.param
    tmp = tmp_path_factory.mktemp(f"filled-{backend}")
    src, cache = _src(tmp), tmp / "cache"
    path = _write_backend_script(src, backend)
    p1 = _run(path, cache, label=f"process 1 (fills the cache, {backend})")
    return {"p1": p1, "cache": cache, "backend": backend}


def _damaged_copy(filled_cache, tmp_path):
    backend = filled_cache["backend"]
    _expect_backend(filled_cache["p1"], backend, "process 1 (fills the cache)")
    cache = tmp_path / "cache"
    if filled_cache["cache"].exists():
        shutil.copytree(filled_cache["cache"], cache, symlinks=True, copy_function=shutil.copy2)
    else:  # nothing was cached at all: still plant the traps in a private root
        cache.mkdir(mode=0o700)
    return _write_backend_script(_src(tmp_path), backend), cache, backend


def _cache_files(cache):
    """Regular files under ``cache`` (sorted; links not followed)."""
    return sorted(
        os.path.join(d, n)
        for d, _, names in os.walk(cache, followlinks=False)
        for n in names
        if not os.path.islink(os.path.join(d, n))
    )


def _folders(cache):
    return sorted(d for d, _, _ in os.walk(cache, followlinks=False))


def _expect_right_and_few_warnings(proc, backend, problems, what):
    _expect_backend(proc, backend, what)
    warned = [(w["category"], w["message"]) for w in proc.warnings()]
    dupes = sorted({w for w in warned if warned.count(w) > 1})
    assert not dupes, f"{what}: the same warning was given more than once: {dupes}"
    assert len(warned) <= problems, (
        f"{what}: {len(warned)} warnings for {problems} damaged or planted files: {warned}"
    )


def test_damaged_cache_entries_are_rebuilt(filled_cache, tmp_path):
    """Every cached file truncated, garbled or made non-UTF-8: right results, no crash, and
    the next run finds the cache repaired (no warning again)."""
    path, cache, backend = _damaged_copy(filled_cache, tmp_path)
    files = _cache_files(cache)
    for i, f in enumerate(files):
        with open(f, "rb") as fh:
            orig = fh.read()
        data = [
            b"",  # truncated to nothing
            b"\xff\xfe\x00\x80 not utf-8 \xc3\x28",  # non-UTF-8 garbage
            orig[: len(orig) // 2],  # truncated to half
            bytes(b ^ 0x5A for b in orig) or b"\x00",  # same size, every byte changed
        ][i % 4]
        os.chmod(f, stat.S_IRUSR | stat.S_IWUSR)
        with open(f, "wb") as fh:
            fh.write(data)
    p2 = _run(path, cache, label="process 2 (damaged cache)")
    _expect_right_and_few_warnings(p2, backend, len(files), "process 2 (damaged cache)")
    p3 = _run(path, cache, label="process 3 (after the rebuild)")
    _expect_right_and_few_warnings(p3, backend, 0, "process 3 (cache rebuilt by process 2)")


def test_planted_pickles_are_never_unpickled(filled_cache, tmp_path):
    """Every binary cached file (index, object code, pickle, library: whatever is not text)
    and a few likely names replaced by a pickle that runs code when loaded: right results,
    and the code never runs. Text files (sources, digests) are left as they are, so that
    whatever reads them goes on to the binary entries."""
    path, cache, backend = _damaged_copy(filled_cache, tmp_path)
    marker = tmp_path / "PLANTED-PICKLE-RAN"
    evil = pickle.dumps(_Planted(str(marker)), protocol=2)

    def is_text(f):
        with open(f, "rb") as fh:
            data = fh.read()
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            return False
        return b"\x00" not in data

    targets = [f for f in _cache_files(cache) if not is_text(f)]
    for d in _folders(cache):
        targets += [os.path.join(d, n) for n in ("index.pkl", "index.nbi")]
    for f in targets:
        if os.path.exists(f):
            os.chmod(f, stat.S_IRUSR | stat.S_IWUSR)
        with open(f, "wb") as fh:
            fh.write(evil)
    p2 = _run(path, cache, label="process 2 (planted pickles)")
    assert not marker.exists(), (
        f"a pickle planted in the cache folder was unpickled (its code ran)\n{p2.describe()}"
    )
    _expect_right_and_few_warnings(p2, backend, len(targets), "process 2 (planted pickles)")


def test_symlinks_in_cache_are_not_followed(filled_cache, tmp_path):
    """Every cached file, and a probe name in every folder, replaced by a link to a file
    outside the cache: right results, and that file is left exactly as it was."""
    path, cache, backend = _damaged_copy(filled_cache, tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious data\n")
    links = _cache_files(cache)
    for d in _folders(cache):
        links += [os.path.join(d, n) for n in (".write-test", ".probe")]
    for f in links:
        if os.path.lexists(f):
            os.unlink(f)
        os.symlink(victim, f)
    p2 = _run(path, cache, label="process 2 (links to a file outside)")
    assert victim.read_text() == "precious data\n", (
        "a file outside the cache, linked from inside it, was changed: "
        f"{victim.read_text()!r}\n{p2.describe()}"
    )
    _expect_right_and_few_warnings(p2, backend, len(links), "process 2 (links to a file outside)")
    assert victim.read_text() == "precious data\n"


def _elf_files(root):
    out = []
    for f in _cache_files(root):
        with open(f, "rb") as fh:
            if fh.read(4) == b"\x7fELF":
                out.append(f)
    return out


def test_planted_library_is_not_loaded(tmp_path):
    """A working shared library of another C++ kernel, copied over the cached one: the next
    process must not load it (it computes ``x - 100``), so it still computes ``2 x + 1``."""
    src = _src(tmp_path)
    path = _write_backend_script(src, "cpp")
    cache, other = tmp_path / "cache", tmp_path / "other-cache"
    common = {"script": path, "cwd": str(src)}
    p_good, p_other = run_concurrently(
        [
            dict(common, env=child_env(str(cache), pythonpath=[str(src)]), label="process 1"),
            dict(common, args=["other"], env=child_env(str(other), pythonpath=[str(src)]),
                 label="another program, its own cache"),
        ]
    )
    _expect_backend(p_good, "cpp", "process 1")
    check(p_other, "another program")
    _expect(p_other, "affine", X - 100, "another program")
    others = _elf_files(other)
    assert others, f"the other program left no shared library: {sorted(_files(str(other)))}"
    with open(others[0], "rb") as fh:
        planted = fh.read()
    replaced = _elf_files(cache)
    for f in replaced:
        os.chmod(f, stat.S_IRUSR | stat.S_IWUSR)
        with open(f, "wb") as fh:
            fh.write(planted)
    p2 = _run(path, cache, label="process 2 (a planted library in the cache)")
    _expect_right_and_few_warnings(p2, "cpp", len(replaced), "process 2 (planted library)")


def _mount_tmpfs(path, size):
    """Mount a small private tmpfs at ``path`` (root with mount rights only); True if done."""
    try:
        r = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
            capture_output=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return r.returncode == 0


def _prepare_scenario(scenario, tmp, mounts):
    """The cache path (and extra environment) for one scenario; None when it can't be set up."""
    cache = tmp / "cache"
    if scenario == "cache_off":
        return cache, {"PRIMFORGE_CACHE": "0"}
    if scenario == "under_a_file":
        (tmp / "a-file").write_text("not a folder\n")
        return tmp / "a-file" / "cache", None
    if scenario == "world_writable":
        cache.mkdir()
        os.chmod(cache, 0o777)
        return cache, None
    if scenario == "other_owner":
        if not hasattr(os, "geteuid") or os.geteuid() != 0:
            return None
        cache.mkdir()
        os.chown(cache, 65534, 65534)  # nobody
        os.chmod(cache, 0o755)
        return cache, None
    # A real full disk or read-only file system: a tiny tmpfs (needs root with mount rights).
    disk = tmp / "disk"
    disk.mkdir()
    if not _mount_tmpfs(disk, "256k"):
        return None
    mounts.append(disk)
    cache = disk / "cache"
    cache.mkdir(mode=0o700)
    if scenario == "disk_full":
        fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            while os.write(fd, b"\0" * 4096):
                pass
        except OSError:  # ENOSPC: the file system is full
            pass
        finally:
            os.close(fd)
    else:  # read_only
        r = subprocess.run(["mount", "-o", "remount,ro", str(disk)], capture_output=True,
                           check=False)
        if r.returncode != 0:
            return None
    return cache, None


# Single-process runs against unusual cache folders, all started together (they are
# independent), one per (scenario, backend); each test below checks one of them.
FOLDER_SCENARIOS = [
    "cache_off",
    "under_a_file",
    "world_writable",
    "other_owner",
    "disk_full",
    "read_only",
]


@pytest.fixture(scope="module")
def folder_runs(tmp_path_factory):
    runs, jobs, mounts = {}, [], []
    try:
        for scenario in FOLDER_SCENARIOS:
            for backend in BACKENDS:
                tmp = tmp_path_factory.mktemp(f"{scenario}-{backend}")
                src = _src(tmp)
                prepared = _prepare_scenario(scenario, tmp, mounts)
                if prepared is None:
                    continue
                cache, extra = prepared
                path = _write_backend_script(src, backend)
                env = child_env(str(cache), pythonpath=[str(src)], extra=extra)
                runs[(scenario, backend)] = {"tmp": tmp, "src": src, "cache": cache}
                label = f"{scenario}, {backend}"
                jobs.append({"script": path, "env": env, "cwd": str(src), "label": label})
        for key, proc in zip(list(runs), run_concurrently(jobs)):
            runs[key]["proc"] = proc
            runs[key]["files"] = sorted(_files(str(runs[key]["cache"])))
        yield runs
    finally:
        for disk in mounts:
            subprocess.run(["umount", "-l", str(disk)], capture_output=True, check=False)


@pytest.mark.exhaustive
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_cache_off_writes_nothing(folder_runs, backend):
    """PRIMFORGE_CACHE=0: correct results and not one file under the cache folder."""
    run = folder_runs[("cache_off", backend)]
    _expect_backend(run["proc"], backend, "PRIMFORGE_CACHE=0")
    src = str(run["src"])
    assert not run["files"], f"files written with caching off: {run['files']}"
    assert not _numba_cache_files(src), (
        f"Numba cache files written with caching off: {_numba_cache_files(src)}"
    )


@pytest.mark.exhaustive
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_unusable_cache_path_runs_uncached(folder_runs, backend):
    """A cache path that can't be a folder (under a regular file: ENOTDIR) -> uncached, right.

    (A read-only folder can't be simulated with chmod when the tests run as root, who may
    write anyway; a path below a regular file fails every write the same way on any system.)
    """
    run = folder_runs[("under_a_file", backend)]
    _expect_backend(run["proc"], backend, "cache path under a regular file")
    assert (run["tmp"] / "a-file").read_text() == "not a folder\n"
    warned = _cache_warnings(run["proc"], run["cache"])
    assert len(warned) <= 1, f"more than one warning about the unusable cache: {warned}"


@pytest.mark.exhaustive
@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize("how", ["world_writable", "other_owner"])
def test_untrusted_cache_folder_is_refused(folder_runs, how, backend):
    """A cache root writable by others, or owned by another user: run uncached, write nothing
    there, and say so once (the C++ backend keeps its libraries there, so it must warn; the
    Numba backend may keep nothing on disk, and then has nothing to warn about)."""
    if (how, backend) not in folder_runs:
        pytest.skip("giving a folder to another user needs root")
    run = folder_runs[(how, backend)]
    _expect_backend(run["proc"], backend, f"{how} cache folder")
    written = run["files"]
    warned = _cache_warnings(run["proc"], run["cache"])
    problems = []
    if written:
        problems.append(f"files were written into the {how} cache: {written}")
    if len(warned) > 1 or (backend == "cpp" and len(warned) != 1):
        problems.append(f"expected exactly one warning about the {how} cache, got {warned}")
    assert not problems, "; ".join(problems)


@pytest.mark.exhaustive
@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize("how", ["disk_full", "read_only"])
def test_full_or_read_only_disk_runs_uncached(folder_runs, how, backend):
    """The cache on a full (ENOSPC) or read-only (EROFS) file system: right results, no
    error, at most one warning."""
    if (how, backend) not in folder_runs:
        pytest.skip("a full or read-only file system is simulated with a tmpfs: needs root "
                    "with the right to mount")
    run = folder_runs[(how, backend)]
    _expect_backend(run["proc"], backend, f"cache on a {how.replace('_', ' ')} file system")
    warned = _cache_warnings(run["proc"], run["cache"])
    assert len(warned) <= 1, f"more than one warning about the {how} cache: {warned}"
