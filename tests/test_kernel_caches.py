"""The kernel layer's per-signature caches are bounded, and a kernel can be dropped."""

import jax
import jax.numpy as jnp
import numba
import numpy as np
import pytest

import primforge
from primforge.kernel import _lru


def _kernel(name):
    k = primforge.XLACustomKernel(name)

    def gen(**_):
        @numba.njit
        def double(x, out):
            xf = x.reshape(-1)
            of = out.reshape(-1)
            for i in range(xf.size):
                of[i] = 2 * xf[i]

        return double

    k.def_numba_kernel(gen)
    k.def_kernel("jax", "cpu", lambda **_: lambda x: 2 * x)
    return k


def _call(k, x, backend="numba"):
    return k(x, outs=jax.ShapeDtypeStruct(x.shape, x.dtype), backend=backend)


@pytest.mark.parametrize("backend", ["numba", "jax"])
def test_caches_keep_at_most_the_configured_number_of_signatures(monkeypatch, backend):
    monkeypatch.setenv(_lru.ENV_SIZE, "3")
    k = _kernel(f"test_caches_bounded_{backend}")
    for n in range(1, 11):
        x = jnp.arange(n, dtype=jnp.float32)
        np.testing.assert_array_equal(np.asarray(_call(k, x, backend)), 2 * np.arange(n))
    for cache in (k._build_cache, k._impl_cache, k._ref_cache, k._product_cache):
        assert len(cache) <= 3
    # an evicted signature is rebuilt, not wrong
    np.testing.assert_array_equal(np.asarray(_call(k, jnp.ones(1), backend)), [2.0])


def test_bad_cache_size_is_an_error_naming_the_variable(monkeypatch):
    monkeypatch.setenv(_lru.ENV_SIZE, "zero")
    with pytest.raises(ValueError, match=_lru.ENV_SIZE):
        _lru.max_entries()


def test_clear_cache_drops_compiled_code_and_calls_still_work():
    k = _kernel("test_clear_cache_numba")
    x = jnp.arange(5.0)
    f = jax.jit(lambda v: _call(k, v) + 1)
    np.testing.assert_array_equal(np.asarray(f(x)), 2 * np.arange(5.0) + 1)
    from primforge.backends import numba as pnumba

    held = len(pnumba.held_kernels())
    k.clear_cache()
    assert len(pnumba.held_kernels()) < held
    assert not k._build_cache and not k._product_cache
    # both a function jitted before the drop and a fresh call give the right answer
    np.testing.assert_array_equal(np.asarray(f(x)), 2 * np.arange(5.0) + 1)
    np.testing.assert_array_equal(np.asarray(_call(k, x)), 2 * np.arange(5.0))


def test_scratch_folders_of_killed_processes_are_removed(tmp_path, monkeypatch):
    import os
    import tempfile

    from subproc_utils import child_env, run_python

    from primforge.backends import _common

    code = ("import os, signal\nfrom primforge.backends import _common\n"
            "print(_common.scratch_dir('primforge-cuda-'), flush=True)\n"
            "os.kill(os.getpid(), signal.SIGKILL)\n")
    killed = run_python(code=code, env=child_env(None, extra={"TMPDIR": str(tmp_path)}))
    assert killed.signal_name == "SIGKILL", killed.describe()
    stale = killed.stdout.strip()
    assert os.path.isdir(stale) and os.path.dirname(stale) == str(tmp_path)
    live = tmp_path / f"primforge-cuda-{os.getppid()}-keep"  # a live process's folder
    other = tmp_path / "primforge-cuda-keep"  # no process id in the name: not ours to judge
    live.mkdir()
    other.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(_common, "_SCRATCH", {})
    mine = _common.scratch_dir("primforge-cuda-")
    assert os.path.basename(mine).startswith(f"primforge-cuda-{os.getpid()}-")
    assert not os.path.exists(stale)
    assert live.is_dir() and other.is_dir() and os.path.isdir(mine)
