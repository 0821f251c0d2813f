"""Benchmarking: records per config x backend, reference checks, errors, files, plots."""

import json
import math
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import primforge
from primforge.bench import (
    BenchmarkConfig,
    BenchmarkDataFnNotProvidedError,
    BenchmarkMismatchWarning,
    BenchmarkRecord,
    BenchmarkResult,
    benchmark_kernel,
    compare_outputs,
    format_seconds,
)

_counter = iter(range(10**6))


def make_kernel(backends, *, data=True, call=True, sizes=(8, 64)):
    """A kernel with the given {backend: fn} on cpu, a call function and benchmark data."""
    k = primforge.XLACustomKernel(f"test_bench_{next(_counter)}")
    for name, fn in backends.items():
        k.def_kernel(name, "cpu", lambda f=fn, **kw: f)
    if call:
        k.def_call(lambda x, backend=None: k(
            x, outs=jax.ShapeDtypeStruct(x.shape, x.dtype), backend=backend))
    if data:
        k.def_benchmark_data(lambda *, platform: [
            BenchmarkConfig(args=(jnp.arange(n, dtype=jnp.float32),), n=n) for n in sizes])
    return k


def test_one_record_per_config_and_backend_with_consistent_stats():
    k = make_kernel({"jax": lambda x: 2 * x, "alt": lambda x: x + x})
    res = benchmark_kernel(k, platform="cpu", n_warmup=1, n_runs=4)
    assert [(r.config, r.backend) for r in res] == [
        ("n=8", "jax"), ("n=8", "alt"), ("n=64", "jax"), ("n=64", "alt")]
    for r in res:
        t = np.asarray(r.times)
        assert r.success and r.n_runs == 4 and r.params["n"] in (8, 64)
        assert r.median == pytest.approx(float(np.median(t)))
        assert r.min == pytest.approx(float(t.min()))
        assert r.p90 == pytest.approx(float(np.percentile(t, 90)))
        assert r.std == pytest.approx(float(t.std()))
        assert r.compile_time is not None and r.compile_time > 0
        assert r.reference == "jax"
    assert [r.matches_reference for r in res if r.backend == "alt"] == [True, True]


def test_wrong_backend_is_caught_and_stored():
    k = make_kernel({"jax": lambda x: x + 1, "wrong": lambda x: x + 2})
    with pytest.warns(BenchmarkMismatchWarning, match="'wrong' disagrees with reference 'jax'"):
        res = benchmark_kernel(k, platform="cpu", n_warmup=0, n_runs=1)
    bad = res.mismatches()
    assert [(r.config, r.backend) for r in bad] == [("n=8", "wrong"), ("n=64", "wrong")]
    assert all(r.max_abs_diff == pytest.approx(1.0) and "differ" in r.mismatch for r in bad)
    assert all(not r.ok for r in bad)
    assert "MISMATCH vs jax" in res.table()
    # the wrong backend never counts as the best
    assert set(res.best().values()) == {"jax"}
    assert res.fastest_backend() == "jax"


def test_tolerances_decide_a_mismatch():
    k = make_kernel({"jax": lambda x: x, "near": lambda x: x + 1e-4}, sizes=(8,))
    assert benchmark_kernel(k, platform="cpu", n_warmup=0, n_runs=1)[1].matches_reference
    with pytest.warns(BenchmarkMismatchWarning):
        r = benchmark_kernel(k, platform="cpu", n_warmup=0, n_runs=1, atol=1e-6, rtol=0)[1]
    assert r.matches_reference is False


def test_reference_defaults_and_choice():
    k = make_kernel({"fast": lambda x: x * 3, "other": lambda x: x + 2 * x})
    res = benchmark_kernel(k, platform="cpu", n_warmup=0, n_runs=1)
    assert {r.reference for r in res} == {"fast"}  # no 'jax': the default backend
    res = benchmark_kernel(k, platform="cpu", n_warmup=0, n_runs=1, reference="other")
    assert [r.backend for r in res][:2] == ["other", "fast"]
    res = benchmark_kernel(k, platform="cpu", n_warmup=0, n_runs=1, compare_results=False)
    assert all(r.reference is None and r.matches_reference is None for r in res)


def test_backends_subset_is_still_compared_with_reference():
    k = make_kernel({"jax": lambda x: x + 1, "wrong": lambda x: x + 2})
    with pytest.warns(BenchmarkMismatchWarning):
        res = benchmark_kernel(k, platform="cpu", n_warmup=0, n_runs=1, backends=["wrong"])
    assert res.backends == ["wrong"]
    assert all(r.matches_reference is False for r in res)


def test_failing_backend_is_recorded_or_raised():
    k = make_kernel({"jax": lambda x: x})

    def broken(**kw):
        raise RuntimeError("no such luck")

    k.def_kernel("broken", "cpu", broken)
    res = benchmark_kernel(k, platform="cpu", n_warmup=0, n_runs=1)
    failed = res.failures()
    assert [r.backend for r in failed] == ["broken", "broken"]
    assert all("no such luck" in r.error and r.times == () for r in failed)
    assert math.isnan(failed[0].median)
    assert "FAILED" in res.table()
    with pytest.raises(Exception, match="no such luck"):
        benchmark_kernel(k, platform="cpu", n_warmup=0, n_runs=1, catch_errors=False)


def test_every_timed_call_really_executes():
    """n_warmup + n_runs * n_batch_per_run executions per backend: nothing is skipped."""
    calls = []
    k = primforge.XLACustomKernel(f"test_bench_count_{next(_counter)}")
    k.def_kernel("jax", "cpu", lambda **kw: lambda x: x * 2)

    def call(x, backend=None):
        y = k(x, outs=jax.ShapeDtypeStruct(x.shape, x.dtype), backend=backend)
        jax.debug.callback(lambda v: calls.append(1), y[0], ordered=True)
        return y

    k.def_call(call)
    k.def_benchmark_data(lambda *, platform: [BenchmarkConfig(args=(jnp.ones(4),), n=4)])
    benchmark_kernel(k, platform="cpu", n_warmup=2, n_runs=3, n_batch_per_run=4)
    jax.effects_barrier()
    assert len(calls) == 2 + 3 * 4


def test_untraceable_call_function_is_timed_eagerly():
    k = primforge.XLACustomKernel(f"test_bench_eager_{next(_counter)}")
    k.def_kernel("jax", "cpu", lambda **kw: lambda x: x + 1)
    k.def_kernel("alt", "cpu", lambda **kw: lambda x: 1 + x)

    def call(x, n_used, backend=None):
        m = int(n_used.sum())  # needs a concrete value
        return k(x[:m], outs=jax.ShapeDtypeStruct((m,), x.dtype), backend=backend)

    k.def_call(call)
    k.def_benchmark_data(lambda *, platform: [
        BenchmarkConfig(args=(jnp.ones(6), jnp.ones(3)), n=6)])
    res = benchmark_kernel(k, platform="cpu", n_warmup=1, n_runs=2)
    assert all(r.success for r in res), [r.error for r in res]
    assert res[1].matches_reference is True


def test_config_kwargs_and_static_args_reach_the_call():
    k = primforge.XLACustomKernel(f"test_bench_kwargs_{next(_counter)}")
    k.def_kernel("jax", "cpu", lambda scale, **kw: lambda x: x * scale)
    k.def_kernel("alt", "cpu", lambda scale, **kw: lambda x: scale * x)
    k.def_call(lambda x, scale, backend=None: k(
        x, outs=jax.ShapeDtypeStruct(x.shape, x.dtype), backend=backend, scale=scale))
    k.def_benchmark_data(lambda *, platform: [
        BenchmarkConfig("s3", (jnp.ones(3),), {"scale": 3.0})])
    res = benchmark_kernel(k, platform="cpu", n_warmup=0, n_runs=1)
    assert [r.config for r in res] == ["s3", "s3"] and res[1].matches_reference


def test_missing_pieces_raise_clear_errors():
    with pytest.raises(BenchmarkDataFnNotProvidedError, match="def_benchmark_data"):
        benchmark_kernel(make_kernel({"jax": lambda x: x}, data=False), platform="cpu")
    with pytest.raises(ValueError, match="def_call"):
        benchmark_kernel(make_kernel({"jax": lambda x: x}, call=False), platform="cpu")
    k = make_kernel({"jax": lambda x: x})
    with pytest.raises(ValueError, match="no backend registered for platform 'tpu'"):
        benchmark_kernel(k, platform="tpu")
    with pytest.raises(ValueError, match=r"\['nope'\] are not registered.*\['jax'\]"):
        benchmark_kernel(k, platform="cpu", backends=["nope"])
    with pytest.raises(ValueError, match="'n_runs' must be an int >= 1"):
        benchmark_kernel(k, platform="cpu", n_runs=0)
    with pytest.raises(ValueError, match="reference='zz'"):
        benchmark_kernel(k, platform="cpu", reference="zz")
    bad = make_kernel({"jax": lambda x: x}, data=False)
    bad.def_benchmark_data(lambda *, platform: [(jnp.ones(2),)])
    with pytest.raises(TypeError, match="BenchmarkConfig objects; item 0 is tuple"):
        benchmark_kernel(bad, platform="cpu")


def test_benchmark_method_on_the_kernel(monkeypatch):
    def benchmark(self, *, platform, **kwargs):
        return benchmark_kernel(self, platform=platform, **kwargs)

    monkeypatch.setattr(primforge.XLACustomKernel, "benchmark", benchmark, raising=False)
    k = make_kernel({"jax": lambda x: -x}, sizes=(4,))
    res = k.benchmark(platform="cpu", n_warmup=0, n_runs=2)
    assert isinstance(res, BenchmarkResult) and res[0].n_runs == 2


def test_verbose_and_progress_output(capsys):
    k = make_kernel({"jax": lambda x: x, "alt": lambda x: x * 1}, sizes=(4,))
    benchmark_kernel(k, platform="cpu", n_warmup=0, n_runs=1, verbose=True, progress=True)
    out, err = capsys.readouterr()
    assert out.count("median") == 2 and "[n=4] alt" in out
    assert "1/2" in err and "#" in err
    benchmark_kernel(k, platform="cpu", n_warmup=0, n_runs=1)  # not a terminal: silent
    assert capsys.readouterr() == ("", "")


def test_config_names_params_and_validation():
    c = BenchmarkConfig(args=[jnp.ones(2)], params={"n": 2}, density=0.5)
    assert c.name == "n=2,density=0.5" and c.params == {"n": 2, "density": 0.5}
    assert BenchmarkConfig().name == "default"
    with pytest.raises(TypeError, match="'args' must be a tuple or list"):
        BenchmarkConfig("x", jnp.ones(2))
    with pytest.raises(TypeError, match="'kwargs' must be a mapping"):
        BenchmarkConfig("x", (), [1])


def test_compare_outputs_against_numpy():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(5, 3)).astype(np.float32)
    b = a.copy()
    b[2, 1] += 0.5
    ok, diff, why = compare_outputs((a, a), (a, b), rtol=0, atol=1e-3)
    assert not ok and diff == pytest.approx(float(np.abs(a - b).max()))
    assert why.startswith("output 1: 1 of 15 elements differ")
    assert compare_outputs(a, a.astype(np.float64))[2].startswith("output 0: dtype float64")
    nan = np.array([np.nan, np.inf, 1.0])
    assert compare_outputs(nan, nan.copy()) == (True, 0.0, None)
    assert compare_outputs(np.array([1, 2]), np.array([1, 2])) == (True, 0.0, None)


# ---------------------------------------------------------------------- results
def _records():
    return [
        BenchmarkRecord("k", "n=8", "jax", "cpu", {"n": 8}, times=(4e-6, 5e-6, 6e-6),
                        compile_time=0.1, n_warmup=1, reference="jax"),
        BenchmarkRecord("k", "n=8", "fast", "cpu", {"n": 8}, times=(1e-6, 2e-6, 3e-6),
                        compile_time=0.2, n_warmup=1, reference="jax",
                        matches_reference=True, max_abs_diff=0.0),
        BenchmarkRecord("k", "n=8", "wrong", "cpu", {"n": 8}, times=(1e-7,), reference="jax",
                        matches_reference=False, max_abs_diff=1.0, mismatch="output 0 differs"),
        BenchmarkRecord("k", "n=8", "broken", "cpu", {"n": 8}, success=False,
                        error="RuntimeError: boom, \"quoted\"\nsecond line"),
    ]


def test_table_marks_best_and_speedup():
    text = BenchmarkResult(_records()).table()
    rows = {line.split()[2]: line for line in text.splitlines()[1:]}
    assert "speedup" in text.splitlines()[0]
    assert "2 µs *" in rows["fast"] and "*" not in rows["jax"] and "*" not in rows["wrong"]
    assert "2.50x" in rows["fast"] and "1.00x" in rows["jax"]
    assert "MISMATCH vs jax" in rows["wrong"] and "FAILED: RuntimeError" in rows["broken"]
    # columns are aligned: every row starts the backend column at the same offset
    offsets = {line.index(b) for b, line in rows.items()}
    assert len(offsets) == 1
    assert "speedup" not in BenchmarkResult(_records()).table(speedup_against="")
    with pytest.raises(ValueError, match="not a backend of this result"):
        BenchmarkResult(_records()).table(speedup_against="nope")
    assert "\033[1m" in BenchmarkResult(_records()).table(color=True)


def test_fastest_backend_ignores_incorrect_and_incomplete_backends():
    recs = _records() + [
        BenchmarkRecord("k", "n=64", "jax", "cpu", times=(8e-6,)),
        BenchmarkRecord("k", "n=64", "fast", "cpu", times=(1e-5,)),
    ]
    res = BenchmarkResult(recs)
    # geometric means of medians: jax sqrt(5e-6 * 8e-6) ~ 6.3e-6, fast sqrt(2e-6 * 1e-5) ~ 4.5e-6
    assert res.fastest_backend("k") == "fast"
    assert res.best() == {("k", "n=8"): "fast", ("k", "n=64"): "jax"}
    assert BenchmarkResult([r for r in recs if r.backend == "wrong"]).fastest_backend() is None


@pytest.mark.parametrize("ext", ["json", "csv"])
def test_file_round_trip(tmp_path, ext):
    res = BenchmarkResult(_records(), meta={"host": "x"})
    path = res.save(tmp_path / "sub" / f"bench.{ext}")
    back = BenchmarkResult.load(path)
    assert back.records == res.records
    assert back.platform == "cpu"
    assert [r.median for r in back][:2] == pytest.approx([5e-6, 2e-6])
    if ext == "json":
        data = json.loads((tmp_path / "sub" / "bench.json").read_text())
        assert data["records"][1]["median"] == pytest.approx(2e-6)
        assert back.meta == {"host": "x"}


def test_bad_files_are_rejected(tmp_path):
    with pytest.raises(ValueError, match=r"\.json or \.csv"):
        BenchmarkResult(_records()).save(tmp_path / "b.txt")
    (tmp_path / "x.json").write_text('{"format": "other", "records": []}')
    with pytest.raises(ValueError, match="not a primforge benchmark file"):
        BenchmarkResult.load(tmp_path / "x.json")
    (tmp_path / "x.csv").write_text("kernel,config\nk,c\n")
    with pytest.raises(ValueError, match="row 1 is malformed"):
        BenchmarkResult.load(tmp_path / "x.csv")


def test_plot_writes_a_png(tmp_path):
    path = BenchmarkResult(_records()).plot(tmp_path / "p.png")
    data = Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000


def test_plot_without_matplotlib_names_the_extra(tmp_path, monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match=r'pip install -e "\.\[plot\]"'):
        BenchmarkResult(_records()).plot(tmp_path / "p.png")


def test_merge_and_filter():
    a = BenchmarkResult(_records()[:2])
    b = BenchmarkResult([BenchmarkRecord("k2", "c", "jax", "cpu", times=(1e-6,))])
    both = a + b
    assert both.kernels == ["k", "k2"] and len(both) == 3
    assert [r.backend for r in both.filter(kernel="k", backend="fast")] == ["fast"]


def test_format_seconds_units():
    assert format_seconds(3.2e-9) == "3.2 ns"
    assert format_seconds(float("nan")) == "-"
