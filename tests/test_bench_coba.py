"""benchmarks/coba.py: how runs are summarized and how disturbance is computed."""

import pytest
from _scripts import load_script


@pytest.fixture(scope="module")
def bench():
    return load_script("benchmarks/coba.py", "coba_bench")


def _row(name, seed, wall, cpu, other, attempt=0, rate=18.0):
    return {"scale": 1, "contender": name, "seed": seed, "attempt": attempt,
            "rate_exc_hz": rate, "rate_inh_hz": rate, "s_per_sim_s": wall,
            "cpu_s_per_sim_s": cpu, "other_cpu_cores": other, "load_avg_1m": 1.0,
            "disturbed": other > 0.3, "peak_rss_mib": 100.0}


def test_interval_subtracts_the_runs_own_cpu_from_the_machines_busy_time(bench):
    ns = {}
    exec(bench._PROBE, ns)  # noqa: S102 - the code the children run, defined as text
    # 2 s of wall time, 2 calls; the machine was busy 3.5 CPU s, 1.5 of them this process's.
    got = ns["_interval"]((10.0, 100.0, 5.0), (12.0, 103.5, 6.5), 2)
    assert got == pytest.approx({"run_s": 1.0, "cpu_s": 0.75, "reps": 2,
                                 "other_cpu_cores": 1.0})


def test_summary_keeps_the_last_attempt_and_the_undisturbed_runs(bench):
    rows = [_row("primforge plain", 0, 9.0, 9.0, 1.2),  # disturbed, rerun below
            _row("primforge plain", 0, 1.0, 1.0, 0.1, attempt=1),
            _row("primforge plain", 1, 5.0, 5.0, 0.9),  # disturbed, kept (no rerun)
            _row("primforge plain", 2, 2.0, 2.0, 0.0),
            _row("brainevent", 0, 7.0, 6.0, 1.0), _row("brainevent", 1, 8.0, 7.0, 1.0)]
    plain, be = bench.summarize(rows)
    assert (plain["runs"], plain["disturbed_runs"]) == (3, 1)
    assert plain["s_per_sim_s"] == 1.5  # median of the undisturbed runs 1.0 and 2.0
    assert (be["runs"], be["disturbed_runs"], be["cpu_s_per_sim_s"]) == (2, 2, 6.5)
    assert be["rates_agree"] and "rates_agree" not in plain


def test_contender_options(bench):
    assert bench._jax_options("primforge fused x10 2t", 1) == {
        "kind": "primforge", "fused": True, "k": 10, "threads": 2, "conn": "jitc",
        "choosing": False}
    assert bench._jax_options("primforge fused x10 auto xla1", 10) == {
        "kind": "primforge", "fused": True, "k": 10, "threads": 2, "conn": "jitc",
        "choosing": True}
    assert bench._jax_options("primforge fused x100 xla1", 1) == {
        "kind": "primforge", "fused": True, "k": 100, "threads": 1, "conn": "csr",
        "choosing": False}
    assert bench._jax_options("primforge fused x100 2t xla1", 100) == {
        "kind": "primforge", "fused": True, "k": 100, "threads": 2, "conn": "jitc",
        "choosing": False}
    assert bench._jax_options("primforge fused x100 auto", 100)["k"] == 100
    assert {"primforge fused x100 2t xla1", "primforge fused x100 auto xla1"} <= set(bench.ALL)
    assert bench._jax_options("primforge plain pinned", 100)["conn"] == "jitc"
    assert bench._jax_options("primforge fused x10 stored pinned", 100)["conn"] == "csr"
    assert bench._jax_options("brainevent pinned", 100) == {
        "kind": "brainevent", "fused": False, "k": 1, "threads": 1, "conn": "csr",
        "choosing": False}


def test_brian2_contenders_name_their_target_and_threads(bench):
    assert bench._brian_target("brian2 cpp_standalone 2t") == ("cpp_standalone", 2)
    assert bench._brian_target("brian2 cpp_standalone") == ("cpp_standalone", 1)
    assert bench._brian_target("brian2 cython") == ("cython", 1)
    assert "brian2 cpp_standalone 2t" in bench.ALL


def test_xla1_contenders_run_with_one_xla_thread_and_no_others_do(bench, monkeypatch, tmp_path):
    seen = {}
    monkeypatch.setattr(bench, "_child", lambda cmd, env: seen.setdefault(cmd[-1], env) and {})
    monkeypatch.setenv("PJRT_NPROC", "7")  # the caller's own setting reaches no contender
    for name in ("primforge plain", "primforge plain xla1", "primforge fused x10 xla1",
                 "brainevent xla1", "primforge plain pinned"):
        assert name in bench.ALL
        seen.clear()
        bench.run_one(name, 1, 0, 0.01, None, "python", str(tmp_path))
        (env,) = seen.values()
        assert env.get("PJRT_NPROC") == ("1" if name.endswith("xla1") else None), name
        assert bench._jax_options(name, 10) == bench._jax_options(bench.base_name(name), 10)
