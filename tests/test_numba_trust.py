"""The numba backend runs the code that is called, in one process: target names, errors
from kernels, bounds checks in debug mode, the in-memory bound, calling conventions.

The same guarantees across processes (closure constants, edits between runs, hash seeds
and export to a fresh process, NUMBA_BOUNDSCHECK after an unchecked run) are tested with
several fresh interpreters sharing one cache in ``test_trust_multiprocess.py``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import primforge

numba = pytest.importorskip("numba", reason="the numba backend needs primforge[cpu]")
from primforge.backends import numba as nb

S = jax.ShapeDtypeStruct


# --------------------------------------------------------------------------------------
# Determinism of target names, one process
# --------------------------------------------------------------------------------------


def test_target_names_do_not_depend_on_set_order():
    from primforge.backends.numba._identity import _digest_of

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
        oob = "IndexError: index 4 is out of bounds for axis 0 with size 4"
        with pytest.raises(Exception, match=oob):
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


def test_a_bad_max_kernels_setting_at_rebuild_is_named(monkeypatch):
    spec = S((3,), jnp.float32)
    k = _adder(7.0)
    f = jax.jit(nb.numba_kernel(k, spec, name="rebuild_env"))
    np.testing.assert_allclose(f(jnp.ones(3)), np.full(3, 8.0))
    nb.clear(k)
    monkeypatch.setenv(nb.ENV_MAX_KERNELS, "zero")
    with pytest.raises(Exception, match=f"rebuild_env.*rebuilding it failed.*{nb.ENV_MAX_KERNELS}"
                                        f" must be a positive integer, got 'zero'") as info:
        jax.block_until_ready(f(jnp.ones(3)))
    assert "no longer exists" not in str(info.value)
    monkeypatch.setenv(nb.ENV_MAX_KERNELS, "4")  # fixed: the next call rebuilds it
    np.testing.assert_allclose(f(jnp.ones(3)), np.full(3, 8.0))


_EXPORT_SCRIPT = """
import sys
import jax, jax.numpy as jnp, numba, numpy as np
import primforge
from primforge.backends import numba as nb

@numba.njit
def triple(x, out):
    for i in range(x.size):
        out[i] = 3 * x[i]

op = primforge.XLACustomKernel("export_modes")
op.def_numba_kernel(lambda **kw: triple)
x = jnp.arange(4.0, dtype=jnp.float32)
f = lambda v: op(v, outs=jax.ShapeDtypeStruct(v.shape, v.dtype))
if sys.argv[1] == "export":
    exp = jax.export.export(jax.jit(f), disabled_checks=nb.disabled_checks(nb.prepare(f, x)))(x)
    open(sys.argv[2], "wb").write(exp.serialize())
else:  # the loader runs in debug mode (PRIMFORGE_DEBUG=1)
    imported = jax.export.deserialize(bytearray(open(sys.argv[2], "rb").read()))
    nb.prepare(f, x)
    emit("value", imported.call(x))
"""


def test_a_debug_mode_loader_runs_an_artifact_exported_in_normal_mode(tmp_path):
    pytest.importorskip("flatbuffers", reason="jax.export serialization needs flatbuffers")
    from subproc_utils import check, child_env, run_python, write_script

    script = write_script(str(tmp_path), "export_modes.py", _EXPORT_SCRIPT)
    blob = str(tmp_path / "exported.bin")
    check(run_python(script, args=["export", blob], env=child_env(None)), "export")
    loaded = check(run_python(script, args=["load", blob],
                              env=child_env(None, extra={"PRIMFORGE_DEBUG": "1"})), "load")
    np.testing.assert_allclose(loaded.results()["value"], 3 * np.arange(4.0))


def test_debug_mode_warns_when_numba_boundscheck_is_off(monkeypatch):
    from numba.core import config

    from primforge.backends.numba import _boundscheck

    @numba.njit
    def copy(x, out):
        for i in range(x.size):
            out[i] = x[i]

    monkeypatch.setattr(config, "BOUNDSCHECK", 0)
    monkeypatch.setattr(_boundscheck, "_warned_env", False)
    with pytest.warns(RuntimeWarning, match="NUMBA_BOUNDSCHECK=0"):
        checked = _boundscheck.bounds_checked(copy)
    assert checked.targetoptions["boundscheck"] is True
