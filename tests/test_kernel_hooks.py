"""The kernel's event hook and the public methods the layers above read kernels through."""

import jax
import jax.numpy as jnp
import pytest

import primforge
from primforge import autotune, registry
from primforge.bench import BenchmarkConfig
from primforge.kernel import hooks


@pytest.fixture
def events():
    seen = []

    def record(event):
        seen.append(event)

    hooks.on_kernel_event(record)
    yield seen
    hooks.off_kernel_event(record)


def test_kernel_and_backend_events_in_order(events):
    k = primforge.XLACustomKernel("hk_t_order", replace=True)
    try:
        k.def_kernel("jax", "cuda", lambda **kw: lambda x: x)  # alias: announced as 'gpu'
        k.def_kernel("alt", "cpu", lambda **kw: lambda x: x)
        mine = [(e.kind, e.platform, e.backend) for e in events if e.kernel is k]
        assert mine == [
            ("kernel_defined", None, None),
            ("backend_defined", "gpu", "jax"),
            ("backend_defined", "cpu", "alt"),
        ]
        # kernel_defined comes after registration: a subscriber can look the kernel up.
        assert registry.get_kernel("hk_t_order") is k
    finally:
        registry.unregister_kernel("hk_t_order")


def test_subscribing_twice_runs_once_and_off_stops(events):
    calls = []

    def cb(event):
        calls.append(event.kind)

    hooks.on_kernel_event(cb)
    hooks.on_kernel_event(cb)
    k = primforge.XLACustomKernel("hk_t_once", replace=True)
    hooks.off_kernel_event(cb)
    hooks.off_kernel_event(cb)  # not subscribed any more: no error
    k.def_kernel("jax", "cpu", lambda **kw: lambda x: x)
    registry.unregister_kernel("hk_t_once")
    assert calls == ["kernel_defined"]


def test_a_failing_subscriber_propagates():
    def boom(event):
        raise RuntimeError("subscriber failed")

    hooks.on_kernel_event(boom)
    try:
        with pytest.raises(RuntimeError, match="subscriber failed"):
            primforge.XLACustomKernel("hk_t_boom", replace=True)
    finally:
        hooks.off_kernel_event(boom)
        registry.unregister_kernel("hk_t_boom")


def test_bad_arguments_are_named():
    with pytest.raises(TypeError, match="'callback' must be callable"):
        hooks.on_kernel_event("not callable")
    with pytest.raises(ValueError, match="unknown event 'nope'"):
        hooks.emit("nope", None)


def test_autotune_is_subscribed_and_registry_is_not():
    """Stored choices reach kernels through the hook, not through the registry."""
    assert autotune._on_kernel_event in hooks._SUBSCRIBERS
    assert not hasattr(registry, "autotune")  # tests/test_layering.py checks every import


def test_pending_choice_applied_through_the_hook(monkeypatch):
    monkeypatch.setattr(autotune, "_PENDING", {"hk_t_tuned": {"cpu": "alt"}})
    monkeypatch.setattr(autotune, "_APPLIED", {})
    k = primforge.XLACustomKernel("hk_t_tuned", replace=True)
    try:
        k.def_kernel("jax", "cpu", lambda **kw: lambda x: x)
        assert k.get_default("cpu") == "jax"
        k.def_kernel("alt", "cpu", lambda **kw: lambda x: x + 1)
        assert k.get_default("cpu") == "alt"
        out = k(jnp.zeros(2), outs=jax.ShapeDtypeStruct((2,), jnp.float32))
        assert out.tolist() == [1.0, 1.0]  # the tuned backend runs
        assert autotune.applied() == {"hk_t_tuned": {"cpu": "alt"}}
    finally:
        registry.unregister_kernel("hk_t_tuned")


def test_public_call_and_benchmark_data_accessors():
    k = primforge.XLACustomKernel("hk_t_public", replace=True)
    try:
        assert not k.has_call() and not k.has_benchmark_data()
        with pytest.raises(ValueError, match="no call function.*def_call"):
            k.call_signature()
        with pytest.raises(ValueError, match="no benchmark data.*def_benchmark_data"):
            k.benchmark_data(platform="cpu")
        k.def_call(lambda x, *, backend=None: x)
        platforms = []

        def data(*, platform):
            platforms.append(platform)
            return (BenchmarkConfig(args=(jnp.ones(3),), n=3),)

        k.def_benchmark_data(data)
        assert k.has_call() and k.has_benchmark_data()
        assert list(k.call_signature().parameters) == ["x", "backend"]
        configs = k.benchmark_data(platform="cpu")
        assert isinstance(configs, list) and [c.name for c in configs] == ["n=3"]
        assert platforms == ["cpu"]
        s = registry.kernel_summary(k)
        assert s["has_call"] and s["has_benchmark_data"] and s["tuned"] == {}
        assert registry.kernel_summary(k, {"cpu": "jax"})["tuned"] == {"cpu": "jax"}
    finally:
        registry.unregister_kernel("hk_t_public")
