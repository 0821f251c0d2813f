"""The numba backend runs the code that is called: across processes, edits, hash seeds.

Each multi-process test runs small scripts in fresh interpreters that share one
``PRIMFORGE_CACHE_DIR`` and compares their results with NumPy arithmetic written here.
"""

import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import primforge

numba = pytest.importorskip("numba", reason="the numba backend needs primforge[cpu]")
from primforge.kernel.backends import numba as nb

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(primforge.__file__)))
S = jax.ShapeDtypeStruct


def _env(cache, **extra):
    env = dict(os.environ)
    env["JAX_PLATFORMS"] = "cpu"
    env["PRIMFORGE_CACHE_DIR"] = str(cache)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    env.pop("NUMBA_BOUNDSCHECK", None)
    env.pop("PRIMFORGE_DEBUG", None)
    env.update(extra)
    return env


def _run(script, *args, cache, cwd=None, **extra):
    out = subprocess.run(
        [sys.executable, str(script), *map(str, args)],
        capture_output=True,
        text=True,
        env=_env(cache, **extra),
        cwd=cwd,
        timeout=180,
        check=False,
    )
    assert out.returncode == 0, f"exit {out.returncode}\n{out.stderr[-4000:]}"
    return json.loads(out.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------------------
# Closures: the README's generator, in several processes sharing one cache
# --------------------------------------------------------------------------------------

_GENERATOR = textwrap.dedent("""
    import json, sys
    import jax, jax.numpy as jnp, numba, numpy as np, primforge

    scale = primforge.XLACustomKernel("scale")

    def numba_gen(factor, **_):
        @numba.njit
        def kernel(x, out):
            for i in range(x.size):
                out[i] = factor * x[i]
        return kernel

    scale.def_numba_kernel(numba_gen)
    x = jnp.arange(1.0, 6.0)
    res = []
    for f in map(float, sys.argv[1:]):
        y = scale(x, outs=jax.ShapeDtypeStruct(x.shape, x.dtype), factor=f)
        res.append(np.asarray(y).tolist())
    print(json.dumps(res))
""")

_X = np.arange(1.0, 6.0)


def test_closure_generator_in_a_second_process_runs_its_own_constant(tmp_path):
    script = tmp_path / "gen.py"
    script.write_text(_GENERATOR)
    cache = tmp_path / "cache"
    (a,) = _run(script, 3, cache=cache)
    np.testing.assert_allclose(a, 3 * _X)
    b2, b3 = _run(script, 2, 3, cache=cache)
    np.testing.assert_allclose(b2, 2 * _X)
    np.testing.assert_allclose(b3, 3 * _X)


def test_four_concurrent_processes_with_different_constants(tmp_path):
    script = tmp_path / "gen.py"
    script.write_text(_GENERATOR)
    cache = tmp_path / "cache"
    factors = [(2, 3), (3, 5), (5, 7), (7, 2)]
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), *map(str, fs)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(cache),
        )
        for fs in factors
    ]
    for fs, p in zip(factors, procs):
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, f"factors {fs}: exit {p.returncode}\n{err[-4000:]}"
        got = json.loads(out.strip().splitlines()[-1])
        for f, y in zip(fs, got):
            np.testing.assert_allclose(y, f * _X, err_msg=f"factor {f} in process {fs}")


# --------------------------------------------------------------------------------------
# Edits between processes: a helper in another module, module constants, the kernel file
# --------------------------------------------------------------------------------------

_KERN = textwrap.dedent("""
    import numba
    import cfg
    import helper
    from cfg import C

    @numba.njit
    def via_helper(x, out):
        for i in range(x.size):
            out[i] = helper.h(x[i])

    @numba.njit
    def via_attribute(x, out):
        for i in range(x.size):
            out[i] = x[i] + cfg.C

    @numba.njit
    def via_from_import(x, out):
        for i in range(x.size):
            out[i] = x[i] + C
""")

_LATE = textwrap.dedent("""
    import numba

    @numba.njit
    def late(x, out):
        for i in range(x.size):
            out[i] = x[i] + {value}
""")

_EDITS = textwrap.dedent("""
    import json, os, sys
    sys.path.insert(0, os.getcwd())
    import jax, jax.numpy as jnp, numpy as np
    from primforge.kernel.backends import numba as nb
    import kern, late

    # The kernel's file is saved between import and first call: this process keeps the
    # code it imported (Numba compiles the imported function); the next one sees the new.
    with open("late.py") as f:
        text = f.read()
    with open("late.py", "w") as f:
        f.write(text.replace(sys.argv[1], sys.argv[2]))

    x = jnp.arange(1.0, 5.0, dtype=jnp.float32)
    spec = jax.ShapeDtypeStruct(x.shape, x.dtype)
    res = {}
    for k in (kern.via_helper, kern.via_attribute, kern.via_from_import, late.late):
        res[k.py_func.__name__] = np.asarray(nb.numba_kernel(k, spec)(x)).tolist()
    print(json.dumps(res))
""")


def test_edits_between_processes_run_the_new_code(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    cache = tmp_path / "cache"
    (work / "kern.py").write_text(_KERN)
    (work / "late.py").write_text(_LATE.format(value="100.0"))
    (work / "run.py").write_text(_EDITS)
    x = np.arange(1.0, 5.0)

    def write_deps(scale, c):
        (work / "helper.py").write_text(
            f"import numba\n\n@numba.njit\ndef h(v):\n    return v * {scale}\n"
        )
        (work / "cfg.py").write_text(f"C = {c}\n")

    write_deps("10.0", "1.0")
    first = _run(work / "run.py", "100.0", "200.0", cache=cache, cwd=work)
    np.testing.assert_allclose(first["via_helper"], 10 * x)
    np.testing.assert_allclose(first["via_attribute"], x + 1)
    np.testing.assert_allclose(first["via_from_import"], x + 1)
    np.testing.assert_allclose(first["late"], x + 100)  # what this process imported

    write_deps("20.0", "2.0")  # same sizes: a stamp of (size, mtime) at one-second
    os.utime(work / "helper.py", (1, 1))  # granularity would not see these edits either
    second = _run(work / "run.py", "200.0", "300.0", cache=cache, cwd=work)
    np.testing.assert_allclose(second["via_helper"], 20 * x)
    np.testing.assert_allclose(second["via_attribute"], x + 2)
    np.testing.assert_allclose(second["via_from_import"], x + 2)
    np.testing.assert_allclose(second["late"], x + 200)


# --------------------------------------------------------------------------------------
# Determinism across hash seeds, and export to a fresh process
# --------------------------------------------------------------------------------------

_EXPORT_KERNELS = textwrap.dedent("""
    import jax, jax.numpy as jnp, numba

    from primforge.kernel.backends import numba as nb

    def make(factor, mode):
        @numba.njit
        def kern(x, out):
            # a frozenset constant of strings: its iteration order follows the hash seed
            w = factor if mode in {"alpha", "beta", "gamma", "delta", "epsilon"} else 1.0
            for i in range(x.size):
                out[i] = w * x[i] if i not in (1, 4) else 0.0
        return kern

    SPEC = jax.ShapeDtypeStruct((6,), jnp.float32)
    KERNEL = nb.numba_kernel(make(3.0, "gamma"), SPEC, name="exported")

    def f(x):
        return KERNEL(x) + 1.0
""")

_EXPORT_SCRIPT = textwrap.dedent("""
    import json, sys
    import jax, jax.numpy as jnp, numpy as np
    from jax import export
    from primforge.kernel.backends import numba as nb

    mode, blob = sys.argv[1], sys.argv[2]
    out = {}
    if mode == "fresh":
        with open(blob, "rb") as fh:
            imported = export.deserialize(bytearray(fh.read()))
        x = jnp.arange(6.0, dtype=jnp.float32)
        try:  # nothing registered yet: a clear error, not a crash
            np.asarray(imported.call(x))
            out["before"] = None
        except Exception as e:
            out["before"] = f"{type(e).__name__}: {e}"
    import kernels  # the same kernels, built here
    if hasattr(nb, "prepare"):
        targets = nb.prepare(kernels.f, kernels.SPEC)
        checks = nb.disabled_checks(targets)
    else:  # a primforge without the export helpers: register by calling, allow by hand
        kernels.f(jnp.zeros(6, jnp.float32))
        targets = sorted(nb.registered_targets())
        checks = [export.DisabledSafetyCheck.custom_call(t) for t in targets]
    exp = export.export(jax.jit(kernels.f), disabled_checks=checks)(kernels.SPEC)
    out["targets"], out["mlir"] = list(targets), exp.mlir_module()
    if mode == "first":
        with open(blob, "wb") as fh:
            fh.write(exp.serialize())
    else:
        out["y"] = np.asarray(imported.call(x)).tolist()
    print(json.dumps(out))
""")


def test_export_is_identical_across_hash_seeds_and_runs_in_a_fresh_process(tmp_path):
    pytest.importorskip("flatbuffers", reason="jax.export serialization needs flatbuffers")
    (tmp_path / "kernels.py").write_text(_EXPORT_KERNELS)
    (tmp_path / "export_it.py").write_text(_EXPORT_SCRIPT)
    blob, script = tmp_path / "exp.bin", tmp_path / "export_it.py"
    first = _run(script, "first", blob, cache=tmp_path / "c1", cwd=tmp_path, PYTHONHASHSEED="1")
    got = _run(script, "fresh", blob, cache=tmp_path / "c2", cwd=tmp_path, PYTHONHASHSEED="2")
    targets = first["targets"]
    assert len(targets) == 1 and got["targets"] == targets
    assert got["mlir"] == first["mlir"], "StableHLO differs between hash seeds"
    assert got["before"] is not None and targets[0] in got["before"], got["before"]
    x = np.arange(6.0)
    want = np.where(np.isin(np.arange(6), [1, 4]), 0.0, 3 * x) + 1
    np.testing.assert_allclose(got["y"], want)


def test_target_names_do_not_depend_on_set_order():
    from primforge.kernel.backends._numba_identity import _digest_of

    a = frozenset(f"s{i}" for i in range(40))
    b = frozenset(sorted(a, reverse=True))  # equal set, built in another order
    assert _digest_of(a, set()) == _digest_of(b, set())
    assert _digest_of({"k": 1, "j": 2}, set()) == _digest_of({"j": 2, "k": 1}, set())
    assert _digest_of(a, set()) != _digest_of(a | {"x"}, set())


def test_two_live_kernels_never_share_a_target():
    def make():
        @numba.njit
        def same(x, out):
            for i in range(x.size):
                out[i] = x[i] + 1

        return same

    spec = S((3,), jnp.float32)
    x = jnp.zeros(3, jnp.float32)
    ka, kb = make(), make()  # identical code and constants, two dispatchers
    (ta,) = nb.prepare(nb.numba_kernel(ka, spec, name="twins"), x)
    (tb,) = nb.prepare(nb.numba_kernel(kb, spec, name="twins"), x)
    assert ta != tb and tb.startswith(ta)
    (again,) = nb.prepare(nb.numba_kernel(ka, spec, name="twins"), x)
    assert again == ta


# --------------------------------------------------------------------------------------
# Failures reach Python with the kernel's own words
# --------------------------------------------------------------------------------------


@numba.njit
def _must_be_positive(x, out):
    for i in range(x.size):
        if x[i] <= 0:
            raise ValueError("x must be positive")
        out[i] = np.sqrt(x[i])


@numba.njit
def _says_where(x, out):
    for i in range(x.size):
        if x[i] <= 0:
            raise IndexError("bad entry", i)
        out[i] = x[i]


@numba.njit
def _status(x, out):
    out[0] = x[0]
    return 7 if x[0] < 0 else 0


def test_kernel_exception_text_reaches_python():
    spec = S((3,), jnp.float32)
    k = nb.numba_kernel(_must_be_positive, spec, name="positive")
    with pytest.raises(Exception, match="ValueError: x must be positive") as info:
        jax.block_until_ready(jax.jit(k)(jnp.array([1.0, -1.0, 4.0])))
    assert "positive" in str(info.value) and "_must_be_positive" in str(info.value)
    np.testing.assert_allclose(jax.jit(k)(jnp.array([1.0, 4.0, 9.0])), [1.0, 2.0, 3.0])
    # a message built from run-time values
    k2 = nb.numba_kernel(_says_where, spec, name="where")
    with pytest.raises(Exception, match=r"IndexError: \('bad entry', 2\)"):
        jax.block_until_ready(k2(jnp.array([1.0, 2.0, 0.0])))
    k3 = nb.numba_kernel(_status, S((1,), jnp.float32), name="status")
    with pytest.raises(Exception, match="'status'.*non-zero status 7"):
        jax.block_until_ready(k3(jnp.array([-1.0])))


def test_exception_text_through_xla_custom_kernel_and_vmap():
    kern = primforge.XLACustomKernel("trust_raises")
    kern.def_numba_kernel(lambda **kw: _must_be_positive)
    x = jnp.array([[1.0, 2.0, 3.0], [1.0, -2.0, 3.0]])
    f = jax.vmap(lambda v: kern(v, outs=S((3,), v.dtype)))
    with pytest.raises(Exception, match="trust_raises.*ValueError: x must be positive"):
        jax.block_until_ready(f(x))
    np.testing.assert_allclose(f(jnp.abs(x)), np.sqrt(np.abs(np.asarray(x))), rtol=1e-6)


# --------------------------------------------------------------------------------------
# Bounds checking: NUMBA_BOUNDSCHECK and debug mode
# --------------------------------------------------------------------------------------

_BOUNDS = textwrap.dedent("""
    import json, sys
    import jax, jax.numpy as jnp, numba, numpy as np
    from primforge.kernel.backends import numba as nb

    @numba.njit
    def fill(n, out):
        for i in range(n[0]):
            out[i] = 1.0

    k = nb.numba_kernel(fill, jax.ShapeDtypeStruct((4,), jnp.float32), name="fill")
    n = int(sys.argv[1])
    try:
        res = np.asarray(k(jnp.array([n], jnp.int32))).tolist()
    except Exception as e:
        res = f"{type(e).__name__}: {e}"
    print(json.dumps(res))
""")


def test_numba_boundscheck_env_takes_effect_after_an_unchecked_run(tmp_path):
    script = tmp_path / "bounds.py"
    script.write_text(_BOUNDS)
    cache = tmp_path / "cache"
    assert _run(script, 4, cache=cache) == [1.0] * 4  # in bounds, without the check
    got = _run(script, 5, cache=cache, NUMBA_BOUNDSCHECK="1")
    assert isinstance(got, str) and "IndexError" in got and "fill" in got, got


@numba.njit
def _fill_n(n, out):
    for i in range(n[0]):
        out[i] = 1.0


def test_debug_mode_checks_bounds_under_its_own_target():
    spec = S((4,), jnp.float32)
    k = nb.numba_kernel(_fill_n, spec, name="fill_dbg")
    n_ok = jnp.array([4], jnp.int32)
    (plain,) = nb.prepare(k, n_ok)
    with primforge.debug_mode():
        (checked,) = nb.prepare(k, n_ok)
        np.testing.assert_allclose(k(n_ok), np.ones(4))
        with pytest.raises(Exception, match="IndexError"):
            jax.block_until_ready(k(jnp.array([5], jnp.int32)))
    assert checked != plain
    np.testing.assert_allclose(k(n_ok), np.ones(4))


# --------------------------------------------------------------------------------------
# Memory: the in-memory bound and clear()
# --------------------------------------------------------------------------------------


def _adder(c):
    @numba.njit
    def add(x, out):
        for i in range(x.size):
            out[i] = x[i] + c

    return add


def test_lru_bound_and_clear_never_break_compiled_functions(monkeypatch):
    monkeypatch.setenv(nb.ENV_MAX_KERNELS, "2")
    spec = S((3,), jnp.float32)
    x = jnp.arange(3.0, dtype=jnp.float32)
    kernels = [_adder(float(c)) for c in range(5)]
    fs = [jax.jit(nb.numba_kernel(k, spec, name="lru")) for k in kernels]
    for c, f in enumerate(fs):
        np.testing.assert_allclose(f(x), np.arange(3.0) + c)
        assert len([t for t in nb.held_kernels() if "_lru_" in t]) <= 2
    for c, f in enumerate(fs):  # evicted entries are rebuilt on their next call
        np.testing.assert_allclose(f(x), np.arange(3.0) + c)
    assert nb.clear(kernels[4]) == 1
    np.testing.assert_allclose(fs[4](x), np.arange(3.0) + 4)
    nb.clear()
    assert not [t for t in nb.held_kernels() if "_lru_" in t]
    for c, f in enumerate(fs):
        np.testing.assert_allclose(f(x), np.arange(3.0) + c)


def test_a_dropped_kernel_that_no_longer_exists_fails_cleanly():
    import gc
    import weakref

    spec = S((3,), jnp.float32)
    k = _adder(41.0)
    ref = weakref.ref(k)
    f = jax.jit(nb.make_callable(k, ins=(spec,), outs=(spec,), platform="cpu", name="gone"))
    np.testing.assert_allclose(f(jnp.ones(3))[0], np.full(3, 42.0))
    nb.clear(k)
    del k
    gc.collect()
    if ref() is not None:
        pytest.skip("Numba still holds the dispatcher; the rebuild path is tested above")
    with pytest.raises(Exception, match="gone.*dropped"):
        jax.block_until_ready(f(jnp.ones(3)))


def test_max_kernels_env_is_validated(monkeypatch):
    monkeypatch.setenv(nb.ENV_MAX_KERNELS, "zero")
    with pytest.raises(ValueError, match=nb.ENV_MAX_KERNELS):
        nb.max_kernels()
    monkeypatch.setenv(nb.ENV_MAX_KERNELS, "0")
    with pytest.raises(ValueError, match="positive"):
        nb.max_kernels()


# --------------------------------------------------------------------------------------
# The calling convention: what Numba compiled is called the way Numba would call it
# --------------------------------------------------------------------------------------


def test_numba_disk_cache_is_not_switched_on_for_a_users_kernel():
    from numba.core.caching import NullCache

    @numba.njit
    def plain(x, out):
        for i in range(x.size):
            out[i] = x[i] * 2

    nb.numba_kernel(plain, S((2,), jnp.float32))(jnp.ones(2, jnp.float32))
    assert isinstance(plain._cache, NullCache)


@numba.njit("void(float32[:], float32[:])")
def _explicit_any_layout(x, out):
    for i in range(x.size):
        out[i] = x[i] - 1


@numba.njit
def _bool_status(x, out):
    out[0] = x[0]
    return x[0] < 0


@numba.njit
def _int8_status(x, out):
    out[0] = x[0]
    return np.int8(-3) if x[0] < 0 else np.int8(0)


def test_explicit_signatures_and_narrow_status_types():
    spec = S((3,), jnp.float32)
    np.testing.assert_allclose(
        nb.numba_kernel(_explicit_any_layout, spec)(jnp.arange(3.0)), np.arange(3.0) - 1
    )
    one = S((1,), jnp.float32)
    np.testing.assert_allclose(nb.numba_kernel(_bool_status, one)(jnp.ones(1)), [1.0])
    with pytest.raises(Exception, match="non-zero status 1"):
        jax.block_until_ready(nb.numba_kernel(_bool_status, one)(-jnp.ones(1)))
    with pytest.raises(Exception, match="non-zero status -3"):
        jax.block_until_ready(nb.numba_kernel(_int8_status, one)(-jnp.ones(1)))
