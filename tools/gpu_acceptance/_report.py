"""Turns each step's records into its result, and the results into report.json, report.md
and the summary printed last."""

from __future__ import annotations

import collections
import datetime
import pathlib

SCHEMA = 1
_STEP_TITLES = {
    "env": "Environment and backends",
    "gpu_tests": "GPU tests of the suite",
    "kernels": "Kernels of primforge.ops against their jax reference",
    "bench": "Benchmarks",
    "cpu_suite": "The suite's CPU core on this machine's JAX",
}


def platform_of(env_result: dict | None) -> str:
    """'gpu' when the environment step saw a GPU through JAX, else 'cpu'."""
    return (env_result or {}).get("platform") or "cpu"


def _base(step, records: list[dict]) -> dict:
    return {"status": None, "seconds": round(step.seconds or 0.0, 1),
            "budget_s": round(step.budget, 1), "timed_out": step.timed_out,
            "exit_code": step.proc.returncode, "records": len(records)}


def _finish(result: dict, step, failed: bool, empty: bool) -> dict:
    if step.timed_out:
        result["status"] = "timeout"
        result["reason"] = (f"stopped at its budget of {step.budget:.0f} s; the results "
                            f"above are those finished by then")
    elif empty and step.proc.returncode not in (0, None):
        result["status"] = "error"
        result["reason"] = f"the step's process exited with {step.proc.returncode}"
    else:
        result["status"] = "failed" if failed else "passed"
    if result["status"] != "passed":
        result["log_tail"] = step.tail()
    return result


def _env(step, records):
    r = _base(step, records)
    env = next((x for x in records if x.get("kind") == "env"), None)
    plat = next((x for x in records if x.get("kind") == "platform"), {})
    r["platform"] = plat.get("platform")
    r["info"] = {k: v for k, v in (env or {}).items() if k != "kind"}
    r["backends"] = [{k: v for k, v in x.items() if k != "kind"} for x in records
                     if x.get("kind") == "backend"]
    failed = any(b.get("ran") is False for b in r["backends"])
    return _finish(r, step, failed, env is None)


def _pytest(step, records, name):
    r = _base(step, records)
    tests = [x for x in records if x.get("kind") == "test"]
    counts = collections.Counter(t["outcome"] for t in tests)
    collect_errors = [x for x in records if x.get("kind") == "collect_error"]
    collected = max((x["n"] for x in records if x.get("kind") == "collected"), default=None)
    r["counts"] = dict(counts, collected=collected, collect_errors=len(collect_errors))
    r["failures"] = [t for t in tests if t["outcome"] in ("failed", "error")] + collect_errors
    skips = collections.Counter(t.get("message", "?") for t in tests
                                if t["outcome"] == "skipped")
    r["skip_reasons"] = dict(skips.most_common(20))
    if name == "gpu_tests":
        r["tests"] = tests
    failed = bool(r["failures"])
    _finish(r, step, failed, not tests and not collect_errors)
    if (r["status"] == "passed" and tests and counts.get("skipped") == len(tests)):
        r["status"] = "skipped"
        r["reason"] = (f"all {len(tests)} selected tests skipped: "
                       f"{'; '.join(list(skips)[:2])}")
    if r["status"] == "passed" and not tests and step.proc.returncode == 5:
        r["status"], r["reason"] = "skipped", "no test selected"
    return r


def _kernels(step, records):
    r = _base(step, records)
    checks = [x for x in records if x.get("kind") == "kernel"]
    r["counts"] = dict(collections.Counter(c["status"] for c in checks))
    r["plan"] = next((x for x in records if x.get("kind") == "kernel_plan"), None)
    r["not_checked"] = [x for x in records if x.get("kind") == "kernel_skip"]
    r["checks"] = checks
    failed = any(c["status"] in ("fail", "error") for c in checks)
    return _finish(r, step, failed, not checks and not r["not_checked"])


def _bench(step, records):
    r = _base(step, records)
    rows = [x for x in records if x.get("kind") == "bench"]
    r["rows"] = rows
    failed = any("error" in x for x in rows)
    return _finish(r, step, failed, not rows)


def summarize(name: str, records: list[dict], step) -> dict:
    """The result of step ``name`` from its records and its process."""
    if name == "env":
        return _env(step, records)
    if name in ("gpu_tests", "cpu_suite"):
        return _pytest(step, records, name)
    if name == "kernels":
        return _kernels(step, records)
    return _bench(step, records)


def build(results: dict, *, steps: tuple, rehearse: bool, platform: str, seconds: float,
          argv, xdist: bool, total: float) -> dict:
    """The whole report (what report.json holds): every step in ``steps``, with a status."""
    return {
        "schema": SCHEMA, "created": datetime.datetime.now(datetime.UTC).isoformat(),
        "mode": "rehearsal" if rehearse else "gpu", "platform": platform,
        "seconds": round(seconds, 1), "total_budget_s": total, "argv": list(argv or []),
        "pytest_xdist": xdist,
        "steps": {name: results.get(name, {"status": "skipped", "reason": "not run"})
                  for name in steps},
    }


# ----------------------------------------------------------------------------- text
def _fmt_t(t: float | None) -> str:
    if t is None:
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if t >= scale:
            return f"{t / scale:.3g} {unit}"
    return f"{t * 1e9:.3g} ns"


def _headline(name: str, r: dict) -> str:
    """One line of what a step found."""
    if r.get("status") == "skipped" and "counts" not in r and "backends" not in r:
        return r.get("reason", "")
    if name == "env":
        bs = r.get("backends", [])
        ran = [b["name"] for b in bs if b.get("ran")]
        return f"{len(bs)} backends probed; ran a kernel: {', '.join(ran) or 'none'}"
    if name in ("gpu_tests", "cpu_suite"):
        c = r.get("counts", {})
        text = (f"{c.get('passed', 0)} passed, {c.get('failed', 0)} failed, "
                f"{c.get('error', 0)} errors, {c.get('skipped', 0)} skipped"
                f" of {c.get('collected') if c.get('collected') is not None else '?'}")
        if c.get("collect_errors"):
            text += f", {c['collect_errors']} collection errors"
        return text
    if name == "kernels":
        c = r.get("counts", {})
        pairs = (r.get("plan") or {}).get("pairs", "?")
        return (f"{pairs} kernel/backend pairs: {c.get('pass', 0)} pass, "
                f"{c.get('fail', 0)} fail, {c.get('error', 0)} errors, {c.get('n/a', 0)} n/a; "
                f"{len(r.get('not_checked', []))} not checked")
    rows = r.get("rows", [])
    ew = {x["contender"]: x for x in rows if x["group"] == "elementwise" and "gbps" in x}
    parts = [f"{k} {v['gbps']:.0f} GB/s" for k, v in ew.items()]
    errors = sum("error" in x for x in rows)
    return (", ".join(parts[:6]) or "no elementwise result") + (
        f"; {errors} errors" if errors else "")


def _backend_line(b: dict) -> str:
    if b.get("ran"):
        return f"{b['name']}: ran"
    if b.get("ran") is False:
        return f"{b['name']}: FAILED ({(b.get('reason') or '')[:60]})"
    return f"{b['name']}: no ({(b.get('reason') or '')[:60]})"


def summary(report: dict, out: pathlib.Path) -> str:
    """The one-screen summary printed at the end of a run."""
    steps = report["steps"]
    env = steps.get("env", {})
    info = env.get("info", {})
    v = info.get("versions", {})
    gpus = info.get("nvidia_smi") or []
    gpu = (f"{gpus[0]['name']} (driver {gpus[0]['driver']}, CUDA "
           f"{info.get('cuda_driver_version')})" if gpus else "no GPU")
    plugin = v.get("jax-cuda13-plugin") or v.get("jax-cuda12-plugin") or "none"
    mode = ("GPU run" if report["mode"] == "gpu" else
            "REHEARSAL on CPU (CPU runners, small sizes)")
    lines = [
        (f"primforge GPU acceptance: {mode}, {report['seconds']:.0f} s "
        f"of {report['total_budget_s']:.0f} s"),
        f"machine: {gpu}; {info.get('cpus', '?')} cores; python {info.get('python', '?')}",
        (f"jax {v.get('jax')} / jaxlib {v.get('jaxlib')} / cuda plugin {plugin}; triton "
        f"{v.get('triton')}; numba-cuda {v.get('numba-cuda')}"),
    ]
    if info.get("missing"):
        lines.append("missing: " + ", ".join(sorted(info["missing"])))
    if env.get("backends"):
        lines.append("backends: " + " | ".join(_backend_line(b) for b in env["backends"]))
    lines.append(f"{'step':10s} {'status':8s} {'time':>7s} {'budget':>7s}  result")
    for name, r in steps.items():
        t = f"{r['seconds']:.0f}s" if "seconds" in r else "-"
        b = f"{r['budget_s']:.0f}s" if "budget_s" in r else "-"
        lines.append(f"{name:10s} {r.get('status', '?'):8s} {t:>7s} {b:>7s}  "
                     f"{_headline(name, r)[:110]}")
    shown = 0
    for name, r in steps.items():
        for f in r.get("failures", [])[:3]:
            if shown < 6:
                lines.append(f"  {name} FAIL {f.get('id')}")
                shown += 1
        for c in r.get("checks", []):
            if c["status"] in ("fail", "error") and shown < 6:
                lines.append(f"  kernels {c['status'].upper()} {c['kernel']} {c['backend']} "
                             f"{c['check']} [{c['case']}]: {(c.get('message') or '')[:80]}")
                shown += 1
    lines.append(f"report: {out / 'report.md'} (and report.json, logs/)")
    return "\n".join(lines)


def _table(header: list[str], rows: list[list]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c).replace("|", "/").replace("\n", " ") for c in row) + " |"
            for row in rows]
    return out + [""]


def markdown(report: dict) -> str:
    """report.md: the summary table, then one section per step."""
    lines = [f"# primforge GPU acceptance ({report['mode']})", "",
             (f"Created {report['created']}; {report['seconds']} s of "
             f"{report['total_budget_s']} s."), ""]
    steps = report["steps"]
    lines += _table(["step", "status", "seconds", "budget", "result"], [
        [n, r.get("status"), r.get("seconds", "-"), r.get("budget_s", "-"), _headline(n, r)]
        for n, r in steps.items()])
    for name, r in steps.items():
        lines += [f"## {name}: {_STEP_TITLES[name]}", "", f"Status: **{r.get('status')}**"
                  + (f" ({r['reason']})" if r.get("reason") else ""), ""]
        if name == "env" and r.get("info"):
            info = r["info"]
            lines += _table(["package", "version"],
                            [[k, v or "missing"] for k, v in info.get("versions", {}).items()])
            lines += _table(["GPU", "driver", "memory", "compute capability"],
                            [[g["name"], g["driver"], g["memory"], g["compute_capability"]]
                             for g in info.get("nvidia_smi", [])] or [["none", "", "", ""]])
            lines += [f"JAX devices: {info.get('jax_devices')}", "",
                      f"Tools: {info.get('tools')}; nvcc: {info.get('nvcc')}", ""]
            lines += _table(["backend", "platform", "available", "ran 2x+1", "reason"],
                            [[b["name"], b["platform"], b["available"], b.get("ran"),
                              b.get("reason") or ""] for b in r.get("backends", [])])
        if name in ("gpu_tests", "cpu_suite"):
            lines += [_headline(name, r), ""]
            lines += _table(["test", "outcome", "message"], [
                [f.get("id"), f.get("outcome", "collection error"),
                 (f.get("message") or "")[-300:]] for f in r.get("failures", [])])
            lines += _table(["skip reason", "tests"],
                            [[k[:150], v] for k, v in r.get("skip_reasons", {}).items()])
        if name == "kernels":
            lines += [_headline(name, r), ""]
            lines += _table(["kernel", "backend", "check", "case", "status", "max diff",
                             "message"],
                            [[c["kernel"], c["backend"], c["check"], c["case"], c["status"],
                              c.get("max_diff"), (c.get("message") or "")[:200]]
                             for c in r.get("checks", [])])
            lines += _table(["kernel", "backend", "not checked because"],
                            [[x["kernel"], x.get("backend") or "-", x["reason"]]
                             for x in r.get("not_checked", [])])
        if name == "bench":
            rows = r.get("rows", [])
            lines += _table(["group", "case", "contender", "time", "GB/s", "s / sim. s",
                             "anchor", "error"],
                            [[x["group"], x["case"], x["contender"], _fmt_t(x.get("time_s")),
                              f"{x['gbps']:.0f}" if "gbps" in x else "",
                              f"{x['s_per_sim_s']:.3g}" if "s_per_sim_s" in x else "",
                              x.get("anchor_s_per_sim_s") or "", (x.get("error") or "")[:200]]
                             for x in rows])
        if r.get("log_tail"):
            lines += ["Last lines of the step's output:", "", "```", r["log_tail"][-2000:],
                      "```", ""]
    return "\n".join(lines) + "\n"
