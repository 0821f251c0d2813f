"""Autotune: the fastest correct backend is chosen, cached, and restored in a new process."""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

import primforge
from primforge import autotune, registry
from primforge.bench import BenchmarkConfig

TESTS = Path(__file__).parent


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))
    monkeypatch.setenv("PRIMFORGE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("PRIMFORGE_AUTOTUNE", raising=False)
    monkeypatch.setattr(autotune, "_PENDING", {})
    monkeypatch.setattr(autotune, "_APPLIED", {})
    return tmp_path / "cache"


def _kernel(name):
    """Default 'broken' fails to build, 'wrong' disagrees, 'jax' is the only good one."""
    k = primforge.XLACustomKernel(name, replace=True)

    def broken(**kw):
        raise RuntimeError("broken on purpose")

    k.def_kernel("broken", "cpu", broken)
    k.def_kernel("wrong", "cpu", lambda **kw: lambda x: x * 3)
    k.def_kernel("jax", "cpu", lambda **kw: lambda x: x * 2)
    k.def_call(lambda x, backend=None: k(
        x, outs=jax.ShapeDtypeStruct(x.shape, x.dtype), backend=backend))
    k.def_benchmark_data(lambda *, platform: [BenchmarkConfig(args=(jnp.ones(8),), n=8)])
    return k


def test_cache_path_honours_env(cache_dir, monkeypatch):
    assert autotune.cache_path() == cache_dir / "autotune.json"
    monkeypatch.delenv("PRIMFORGE_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", "/xdg")
    assert autotune.cache_path() == Path("/xdg/primforge/autotune.json")


def test_tune_picks_only_a_correct_backend_and_stores_it(cache_dir):
    k = _kernel("at_t_pick")
    try:
        assert k.get_default("cpu") == "broken"
        out = autotune.tune([k], platform="cpu", n_warmup=0, n_runs=2)
        assert out["at_t_pick"]["backend"] == "jax"
        assert k.get_default("cpu") == "jax"  # applied in this process
        assert autotune.applied() == {"at_t_pick": {"cpu": "jax"}}
        data = json.loads((cache_dir / "autotune.json").read_text())
        entry = data["kernels"]["at_t_pick"]["cpu"]
        assert entry["backend"] == "jax" and entry["jax_version"] == jax.__version__
        assert entry["median_s"] > 0 and entry["device"]
        assert autotune.choices() == {"at_t_pick": {"cpu": "jax"}}
    finally:
        registry.unregister_kernel("at_t_pick")


def test_tune_skips_kernels_it_cannot_benchmark():
    k = primforge.XLACustomKernel("at_t_single", replace=True)
    try:
        k.def_kernel("jax", "cpu", lambda **kw: lambda x: x)
        assert autotune.tune([k], platform="cpu") == {}
        assert autotune.choices() == {}
    finally:
        registry.unregister_kernel("at_t_single")


def test_load_applies_now_and_to_kernels_defined_later(cache_dir):
    cache_dir.mkdir()
    here = {"device": jax.devices("cpu")[0].device_kind, "jax_version": jax.__version__}
    (cache_dir / "autotune.json").write_text(json.dumps(
        {"kernels": {"at_t_now": {"cpu": {"backend": "alt", **here}},
                     "at_t_later": {"cpu": {"backend": "alt", **here}}}}))
    now = primforge.XLACustomKernel("at_t_now", replace=True)
    try:
        now.def_kernel("jax", "cpu", lambda **kw: lambda x: x)
        now.def_kernel("alt", "cpu", lambda **kw: lambda x: x)
        assert autotune.load() == {"at_t_now": {"cpu": "alt"}}
        assert now.get_default("cpu") == "alt"
        later = primforge.XLACustomKernel("at_t_later", replace=True)
        later.def_kernel("jax", "cpu", lambda **kw: lambda x: x)
        assert later.get_default("cpu") == "jax"  # tuned backend not defined yet
        later.def_kernel("alt", "cpu", lambda **kw: lambda x: x)
        assert later.get_default("cpu") == "alt"
        later.def_kernel("third", "cpu", lambda **kw: lambda x: x, asdefault=True)
        assert later.get_default("cpu") == "alt"  # the tuned choice stays
        later.set_default("cpu", "third")  # an explicit choice afterwards wins
        assert later.get_default("cpu") == "third"
    finally:
        registry.unregister_kernel("at_t_now")
        registry.unregister_kernel("at_t_later")


def test_choices_measured_elsewhere_are_skipped_with_one_warning(cache_dir):
    cache_dir.mkdir()
    kind = jax.devices("cpu")[0].device_kind
    entries = {
        "at_t_ok": {"backend": "alt", "device": kind, "jax_version": jax.__version__},
        "at_t_dev": {"backend": "alt", "device": "Some Other GPU", "jax_version": jax.__version__},
        "at_t_ver": {"backend": "alt", "device": kind, "jax_version": "0.0.1"},
        "at_t_none": {"backend": "alt"},
    }
    (cache_dir / "autotune.json").write_text(json.dumps(
        {"kernels": {name: {"cpu": e} for name, e in entries.items()}}))
    ks = {}
    try:
        for name in entries:
            ks[name] = primforge.XLACustomKernel(name, replace=True)
            ks[name].def_kernel("jax", "cpu", lambda **kw: lambda x: x)
            ks[name].def_kernel("alt", "cpu", lambda **kw: lambda x: x)
        with pytest.warns(autotune.AutotuneMismatchWarning) as record:
            assert autotune.load() == {"at_t_ok": {"cpu": "alt"}}
        assert len(record) == 1
        msg = str(record[0].message)
        assert "Some Other GPU" in msg and "0.0.1" in msg and "at_t_none/cpu" in msg
        assert [k.get_default("cpu") for k in ks.values()] == ["alt", "jax", "jax", "jax"]
    finally:
        for name in ks:
            registry.unregister_kernel(name)


def test_clear_and_damaged_cache(cache_dir):
    cache_dir.mkdir()
    f = cache_dir / "autotune.json"
    f.write_text(json.dumps({"kernels": {"a": {"cpu": {"backend": "x"}},
                                         "b": {"cpu": {"backend": "y"}}}}))
    autotune.clear(kernels=["a"])
    assert autotune.choices() == {"b": {"cpu": "y"}}
    autotune.clear()
    assert not f.exists() and autotune.choices() == {}
    f.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON.*--clear"):
        autotune.load()


def _run(code, cache_dir, **env):
    full = {k: v for k, v in os.environ.items() if k != "PRIMFORGE_AUTOTUNE"}
    full.update(PYTHONPATH=str(TESTS), PRIMFORGE_CACHE_DIR=str(cache_dir),
                JAX_PLATFORMS="cpu", **env)
    proc = subprocess.run([sys.executable, "-c", code], env=full, capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()[-1]


def test_choice_survives_into_a_new_process(cache_dir):
    import pf_cli_demo

    assert pf_cli_demo.flaky.get_default("cpu") == "broken"
    try:
        out = autotune.tune([pf_cli_demo.flaky], platform="cpu", n_warmup=0, n_runs=2,
                            apply=False)
        assert out["pf_demo_flaky"]["backend"] == "jax"
        assert pf_cli_demo.flaky.get_default("cpu") == "broken"  # apply=False
        # opt-in by call
        code = ("import primforge.autotune as a, pf_cli_demo; a.load(); "
                "print(pf_cli_demo.flaky.get_default('cpu'))")
        assert _run(code, cache_dir) == "jax"
        # not opted in: the registration default
        code = "import pf_cli_demo; print(pf_cli_demo.flaky.get_default('cpu'))"
        assert _run(code, cache_dir) == "broken"
        # opt-in by environment variable, honoured as the kernel is defined
        assert _run(code, cache_dir, PRIMFORGE_AUTOTUNE="1") == "jax"
    finally:
        pf_cli_demo.flaky.set_default("cpu", "broken")


def test_enabled_reads_the_env(monkeypatch):
    assert not autotune.enabled()
    monkeypatch.setenv("PRIMFORGE_AUTOTUNE", "1")
    assert autotune.enabled()
    monkeypatch.setenv("PRIMFORGE_AUTOTUNE", "0")
    assert not autotune.enabled()
