"""Debug mode against seeded kernel bugs: every registration path, every transformation.

One kernel, ``o0 = 2 * x`` and ``o1 = x + 1``, whose per-element work is an ``@njit``
helper. Each bug lives in the helper (so bounds checking must reach helpers) and the
helper is reached through a global, a closure cell or a module attribute depending on the
path. Each seeded bug must be reported under eager, ``jit``, ``vmap`` and ``grad``, on the
first line of the error the user sees, naming the kernel, the output and the index (an
out-of-bounds access is Numba's ``IndexError``, naming the kernel). Kernels are built
once per (path, bug) and reused by every transformation.

Out-of-bounds writes run in a child process: without bounds checking they corrupt memory.
"""

from __future__ import annotations

import re
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import primforge

numba = pytest.importorskip("numba")

N = 8
S = jax.ShapeDtypeStruct((N,), jnp.float32)


# ----------------------------------------------------------------- the seeded helpers
@numba.njit
def _elem_ok(x, o0, o1, i):
    o0[i] = 2 * x[i]
    o1[i] = x[i] + 1


@numba.njit
def _elem_oob_read(x, o0, o1, i):
    o0[i] = 2 * x[i + 2]  # reads two past the end for the last two elements
    o1[i] = x[i] + 1


@numba.njit
def _elem_oob_write(x, o0, o1, i):
    o0[i] = 2 * x[i]
    o1[i] = x[i] + 1
    if i == x.size - 1:
        o0[x.size + 3] = 0.0


@numba.njit
def _elem_oob_second(x, o0, o1, i):
    o0[i] = 2 * x[i]
    o1[i] = x[i] + 1
    if i == x.size - 1:
        o1[x.size + 1] = 0.0  # the second output, one past its end


@numba.njit
def _elem_unwritten(x, o0, o1, i):
    if i != x.size - 1:
        o0[i] = 2 * x[i]
    o1[i] = x[i] + 1


@numba.njit
def _elem_accumulate(x, o0, o1, i):
    o0[i] += 2 * x[i]  # assumes a zeroed buffer
    o1[i] = x[i] + 1


@numba.njit
def _elem_wrong(x, o0, o1, i):
    o0[i] = 2 * x[i] + (1.0 if i == 4 else 0.0)
    o1[i] = x[i] + 1


@numba.njit
def _elem_second(x, o0, o1, i):
    o0[i] = 2 * x[i]
    o1[i] = x[i] + (3.0 if i == 5 else 1.0)


HELPERS = {
    "ok": _elem_ok, "oob_read": _elem_oob_read, "oob_write": _elem_oob_write,
    "oob_second": _elem_oob_second,
    "unwritten": _elem_unwritten, "accumulate": _elem_accumulate, "wrong": _elem_wrong,
    "second": _elem_second,
}

# What each bug's report says (unbatched index; under vmap batch index 0 comes first).
EXPECTED = {
    "oob_read": r"primforge numba kernel '{name}' \(.*\) raised BoundsCheckIndexError: index "
                r"8 is out of bounds for axis 0 with size 8 of array 'x' \(argument of "
                r"_elem_oob_read\)",
    "oob_write": r"primforge numba kernel '{name}' \(.*\) raised BoundsCheckIndexError: index "
                 r"11 is out of bounds for axis 0 with size 8 of array 'o0' \(argument of "
                 r"_elem_oob_write\)",
    "oob_second": r"primforge numba kernel '{name}' \(.*\) raised BoundsCheckIndexError: "
                  r"index 9 is out of bounds for axis 0 with size 8 of array 'o1' \(argument "
                  r"of _elem_oob_second\)",
    "unwritten": r"kernel '{name}' \(backend '{backend}'\), debug mode: output 0 "
                 r"\(float32\[{shape}\]\) element \({idx}\) was never written",
    "accumulate": r"kernel '{name}' \(backend '{backend}'\), debug mode: output 0 "
                  r"\(float32\[{shape}\]\) element \({idx}\) was never written",
    "wrong": r"kernel '{name}' \(backend '{backend}'\), debug mode: output 0 "
             r"\(float32\[{shape}\]\) differs from the 'jax' reference backend; first "
             r"differing index \({idx}\): got 11\.0, reference 10\.0",
    "second": r"kernel '{name}' \(backend '{backend}'\), debug mode: output 1 "
              r"\(float32\[{shape}\]\) differs from the 'jax' reference backend; first "
              r"differing index \({idx}\): got 9\.0, reference 7\.0",
}

# The first bad element of output 0 (output 1 for "second") per bug.
ELEMENT = {"oob_read": 0, "oob_write": 0, "oob_second": 0, "unwritten": 7, "accumulate": 0,
           "wrong": 4, "second": 5}

_LOOP = "def kernel(x, o0, o1):\n    for i in {loop}(x.size):\n        elem(x, o0, o1, i)\n"


def _global_kernel(elem, parallel=False):
    """An njit kernel reaching ``elem`` as a global."""
    ns = {"numba": numba, "elem": elem, "__name__": __name__}
    exec(_LOOP.format(loop="numba.prange" if parallel else "range"), ns)  # noqa: S102
    return numba.njit(parallel=parallel)(ns["kernel"])


def _closure_kernel(elem):
    """A plain Python kernel reaching ``elem`` through a closure cell (jitted by primforge)."""
    def kernel(x, o0, o1):
        for i in range(x.size):
            elem(x, o0, o1, i)
    return kernel


def _module_kernel(elem):
    """An njit kernel reaching ``elem`` as an attribute of a module global."""
    helpers = types.ModuleType("seeded_helpers")
    helpers.elem = elem
    ns = {"numba": numba, "helpers": helpers, "__name__": __name__}
    src = ("def kernel(x, o0, o1):\n    for i in range(x.size):\n"
           "        helpers.elem(x, o0, o1, i)\n")
    exec(src, ns)  # noqa: S102
    return numba.njit(ns["kernel"])


PATHS = ("def_numba_kernel", "numba_kernel", "generated", "module_attr", "numba_parallel")


def make(path: str, bug: str):
    """An XLACustomKernel with the seeded kernel on ``path``, a 'jax' reference, a JVP."""
    from primforge.backends.numba import numba_kernel

    elem = HELPERS[bug]
    k = primforge.XLACustomKernel(f"seeded_{path}_{bug}")
    if path == "def_numba_kernel":
        kern = _global_kernel(elem)
        k.def_numba_kernel(lambda **kw: kern)
    elif path == "numba_kernel":
        kern = _global_kernel(elem)
        k.def_numba_kernel(lambda *, outs, **kw: numba_kernel(kern, outs=list(outs)))
    elif path == "generated":  # a new plain-function kernel per signature
        k.def_numba_kernel(lambda **kw: _closure_kernel(elem))
    elif path == "module_attr":
        kern = _module_kernel(elem)
        k.def_numba_kernel(lambda **kw: kern)
    else:
        kern = _global_kernel(elem, parallel=True)
        k.def_kernel("numba_parallel", "cpu",
                     lambda *, outs, **kw: numba_kernel(kern, outs=list(outs)))
    k.def_kernel("jax", "cpu", lambda **kw: lambda x: (2 * x, x + 1))
    k.def_jvp_rule2(lambda t, x, **kw: [2 * t, t])
    backend = "numba_parallel" if path == "numba_parallel" else "numba"
    return k, backend


def run(k, backend: str, transform: str):
    """Call ``k`` in debug mode under ``transform``; the error the user sees, or None."""
    call = lambda x: k(x, outs=[S, S], backend=backend)
    x = jnp.arange(1.0, N + 1, dtype=jnp.float32)
    with primforge.debug_mode():
        try:
            if transform == "eager":
                out = call(x)
            elif transform == "jit":
                out = jax.jit(call)(x)
            elif transform == "vmap":
                out = jax.vmap(call)(jnp.stack([x, x + 1]))
            else:
                out = jax.grad(lambda v: call(v)[0].sum() + call(v)[1].sum())(x)
            jax.block_until_ready(out)
        except Exception as e:  # noqa: BLE001 - the error is what is checked
            return e
    return out


def expected(path: str, bug: str, transform: str) -> str:
    """The pattern of the first line of the error ``bug`` gives under ``transform``."""
    element = ELEMENT[bug]
    backend = "numba_parallel" if path == "numba_parallel" else "numba"
    batched = transform == "vmap"
    return EXPECTED[bug].format(name=f"seeded_{path}_{bug}", backend=backend,
                                shape=f"2, {N}" if batched else str(N),
                                idx=f"0, {element}" if batched else f"{element},")


def first_line(error: BaseException) -> str:
    text = str(error)
    return text.removeprefix("INTERNAL: ").splitlines()[0] if text else ""


@pytest.fixture(scope="module")
def kernels():
    built = {}

    def get(path, bug):
        if (path, bug) not in built:
            built[path, bug] = make(path, bug)
        return built[path, bug]

    return get


TRANSFORMS = ("eager", "jit", "vmap", "grad")


# Whether a bug is caught depends on the path for bounds checks (the helper must be
# reached) and output coverage (the product must be recognised as a Numba kernel); the
# reference comparison does not: every path gets those two bugs, one path gets them all.
CASES = [(path, bug) for path in PATHS for bug in ("oob_read", "unwritten")] + [
    ("def_numba_kernel", bug) for bug in ("accumulate", "wrong", "second")]


@pytest.mark.parametrize("path, bug", CASES)
def test_seeded_bug_is_reported_on_the_first_line(kernels, path, bug):
    k, backend = kernels(path, bug)
    for transform in TRANSFORMS:
        err = run(k, backend, transform)
        assert isinstance(err, Exception), f"{transform}: no error, returned {err}"
        pattern = expected(path, bug, transform)
        assert re.match(pattern, first_line(err)), (
            f"{transform}: first line {first_line(err)!r} does not match {pattern!r}\n"
            f"full error: {err}")


@pytest.mark.parametrize("path", PATHS)
def test_correct_kernel_passes_on_every_path(kernels, path):
    k, backend = kernels(path, "ok")
    x = np.arange(1.0, N + 1, dtype=np.float32)
    for transform in TRANSFORMS:
        out = run(k, backend, transform)
        assert not isinstance(out, Exception), f"{transform}: {out}"
        if transform == "vmap":
            np.testing.assert_array_equal(out[0], 2 * np.stack([x, x + 1]))
            np.testing.assert_array_equal(out[1], np.stack([x, x + 1]) + 1)
        elif transform == "grad":
            np.testing.assert_array_equal(out, np.full(N, 3.0))
        else:
            np.testing.assert_array_equal(out[0], 2 * x)
            np.testing.assert_array_equal(out[1], x + 1)


def test_reports_name_the_users_kernel_function(kernels):
    k, backend = kernels("def_numba_kernel", "oob_read")
    line = first_line(run(k, backend, "eager"))
    assert f"({__name__}.kernel)" in line and "None." not in line, line


# ----------------------------------------------------------------- out-of-bounds writes
_CHILD = """
import os, sys
sys.path.insert(0, os.path.join({root!r}, "tests"))
import jax, jax.numpy as jnp, numba, primforge
import test_debug_seeded as T

for path in T.PATHS:
    k, backend = T.make(path, "oob_write")
    for transform in T.TRANSFORMS:
        emit(f"{{path}}/{{transform}}", T.first_line(T.run(k, backend, transform)))

k, backend = T.make("def_numba_kernel", "oob_second")
for transform in T.TRANSFORMS:
    emit(f"second/{{transform}}", T.first_line(T.run(k, backend, transform)))

# outs smaller than what the kernel writes, no 'jax' reference to check the shape against
@numba.njit
def too_long(x, out):
    for i in range(x.size):
        out[i] = x[i]
small = primforge.XLACustomKernel("seeded_small_outs")
small.def_numba_kernel(lambda **kw: too_long)
x = jnp.ones(4096, jnp.float32)
with primforge.debug_mode():
    for transform, f in [("eager", lambda x: small(x, outs=jax.ShapeDtypeStruct((8,), x.dtype))),
                         ("jit", jax.jit(lambda x: small(x, outs=jax.ShapeDtypeStruct(
                             (8,), x.dtype))))]:
        try:
            jax.block_until_ready(f(x))
            emit(f"small/{{transform}}", "no error")
        except Exception as e:
            emit(f"small/{{transform}}", T.first_line(e))
emit("done", True)
"""


def test_out_of_bounds_writes_are_caught_in_debug_mode(tmp_path):
    from subproc_utils import ROOT, check, child_env, run_python, write_script

    script = write_script(str(tmp_path), "oob_write.py", _CHILD.format(root=ROOT))
    got = check(run_python(script, env=child_env(None), timeout=600),
                "out-of-bounds writes in debug mode").results()
    assert got.get("done")
    for path in PATHS:
        for transform in TRANSFORMS:
            line = got[f"{path}/{transform}"]
            assert re.match(expected(path, "oob_write", transform), line), \
                f"{path}/{transform}: {line}"
    for transform in TRANSFORMS:
        line = got[f"second/{transform}"]
        assert re.match(expected("def_numba_kernel", "oob_second", transform), line), line
    for transform in ("eager", "jit"):
        assert re.match(r"primforge numba kernel 'seeded_small_outs' \(.*too_long\) raised "
                        r"BoundsCheckIndexError: index 8 is out of bounds for axis 0 with size 8 "
                        r"of array 'out' \(argument of too_long\)",
                        got[f"small/{transform}"]), got[f"small/{transform}"]


def test_the_report_names_the_array_in_the_kernel_itself():
    """Indexing in the kernel's own body: an input read and a local array."""

    @numba.njit
    def reads_past(x, out):
        for i in range(x.size):
            out[i] = x[i] + x[(i + 1) if i < x.size - 1 else x.size]

    @numba.njit
    def local_past(x, out):
        tmp = np.zeros(2, np.float32)
        for i in range(x.size):
            tmp[i % 3] = x[i]
            out[i] = tmp[0]

    x = jnp.arange(1.0, N + 1, dtype=jnp.float32)
    for fn, array, where, index, size in [
            (reads_past, "x", "argument of", N, N), (local_past, "tmp", "in", 2, 2)]:
        k = primforge.XLACustomKernel(f"named_{fn.__name__}")
        k.def_numba_kernel(lambda fn=fn, **kw: fn)
        with primforge.debug_mode(), pytest.raises(Exception) as info:
            jax.block_until_ready(jax.jit(lambda v, k=k: k(v, outs=S))(x))
        line = first_line(info.value)
        pattern = (rf"primforge numba kernel 'named_{fn.__name__}' .* raised "
                   rf"BoundsCheckIndexError: index {index} is out of bounds for axis 0 with size "
                   rf"{size} of array '{array}' \({where} .*{fn.__name__}\)$")
        assert re.match(pattern, line), line


def _reachable(dispatcher, seen):
    """Every njit dispatcher reachable from ``dispatcher`` (globals, closure cells)."""
    from primforge.backends.numba._boundscheck import _global_names

    if id(dispatcher) in seen:
        return
    seen[id(dispatcher)] = dispatcher
    py = dispatcher.py_func
    values = [py.__globals__.get(n) for n in _global_names(py.__code__)]
    values += [c.cell_contents for c in py.__closure__ or ()]
    for v in values:
        if isinstance(v, numba.core.registry.CPUDispatcher):
            _reachable(v, seen)


def test_the_ops_kernels_and_their_helpers_are_bounds_checked_in_debug_mode():
    import primforge.ops
    from primforge.backends.numba import _boundscheck

    dense = jnp.array([[1.0, 0.0, 2.0], [0.0, 3.0, 0.0]], jnp.float32)
    w = primforge.ops.CSR.from_dense(dense)
    x = jnp.array([1.0, 2.0, 3.0], jnp.float32)
    _boundscheck.forget()
    with primforge.debug_mode():
        np.testing.assert_allclose(w @ x, dense @ x, rtol=1e-6)
        np.testing.assert_allclose(w.T @ jnp.ones(2), dense.T @ jnp.ones(2), rtol=1e-6)
    copies = list(_boundscheck._COPIES.values())
    assert copies
    seen = {}
    for c in copies:
        _reachable(c, seen)
    assert len(seen) > 1  # helpers reached too
    assert all(d.targetoptions.get("boundscheck") is True for d in seen.values()), [
        d.py_func.__qualname__ for d in seen.values() if not d.targetoptions.get("boundscheck")]


# ----------------------------------------------------------------- helpers Numba builds
@numba.extending.register_jitable
def _jitable_past(a, i):
    return a[i + 2]


def _overloaded_past(a, i):  # only its @overload implementation runs
    raise NotImplementedError


@numba.extending.overload(_overloaded_past)
def _overload_past_impl(a, i):
    def impl(a, i):
        return a[i + 2]
    return impl


@numba.extending.overload_method(numba.types.Array, "primforge_test_past")
def _method_past_impl(a, i):
    def impl(a, i):
        return a[i + 2]
    return impl


@numba.njit
def _njit_past(a, i):
    return a[i + 2]


_IN_TUPLE = (_njit_past,)


def _helper_kernel(path):
    """A kernel reading two past the end through a helper reached by ``path``."""
    if path == "overload":
        @numba.njit
        def kernel(x, out):
            for i in range(x.size):
                out[i] = _overloaded_past(x, i)
        return kernel
    if path == "overload_method":
        @numba.njit
        def kernel(x, out):
            for i in range(x.size):
                out[i] = x.primforge_test_past(i)
        return kernel
    if path == "tuple_global":
        @numba.njit
        def kernel(x, out):
            for i in range(x.size):
                out[i] = _IN_TUPLE[0](x, i)
        return kernel
    held = (_njit_past,)  # a tuple in a closure cell

    @numba.njit
    def kernel(x, out):
        for i in range(x.size):
            out[i] = held[0](x, i)
    return kernel


@pytest.mark.filterwarnings("ignore:.*First-class function type feature is experimental")
@pytest.mark.parametrize("path, where", [
    ("register_jitable", "_jitable_past"), ("overload", "_overload_past_impl.<locals>.impl"),
    ("overload_method", "_method_past_impl.<locals>.impl"),
    ("tuple_global", "_njit_past"), ("tuple_closure", "_njit_past")])
def test_helpers_numba_builds_or_holds_in_tuples_are_bounds_checked(path, where):
    if path == "register_jitable":  # reached as a global of the kernel itself
        @numba.njit
        def kernel(x, out):
            for i in range(x.size):
                out[i] = _jitable_past(x, i)
    else:
        kernel = _helper_kernel(path)
    k = primforge.XLACustomKernel(f"helper_{path}")
    k.def_numba_kernel(lambda **kw: kernel)
    x = jnp.arange(1.0, N + 1, dtype=jnp.float32)
    pattern = (rf"primforge numba kernel 'helper_{path}' .* raised BoundsCheckIndexError: index "
               rf"{N} is out of bounds for axis 0 with size {N} of array 'a' \(argument of "
               rf"{re.escape(where)}\)$")
    for transform in ("eager", "jit"):
        call = (lambda v: k(v, outs=S)) if transform == "eager" else jax.jit(
            lambda v: k(v, outs=S))
        with primforge.debug_mode(), pytest.raises(Exception) as info:
            jax.block_until_ready(call(x))
        assert re.match(pattern, first_line(info.value)), (transform, first_line(info.value))
