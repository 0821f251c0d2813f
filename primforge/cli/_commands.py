"""The subcommands that read and run kernels: ``list``, ``info``, ``bench`` and ``check``.

Each ``_cmd_*`` takes the parsed arguments and the selected kernels and returns the exit
status; kernels are read only through their public API and the benchmark runner.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
import warnings

from primforge.backends._common import install_hint
from primforge.bench import BenchmarkMismatchWarning, BenchmarkResult, benchmark_kernel
from primforge.cli._common import (
    _err,
    _out,
    _platform,
    _Report,
    _table,
    kernel_summary,
    plain_text,
)
from primforge.cli._parser import _split


def _cmd_list(args, kernels) -> int:
    summaries = [kernel_summary(k) for k in kernels]
    if args.json:
        _out(json.dumps(summaries, indent=2))
        return 0
    if not summaries:
        _out("(no kernels)")
        return 0
    rows = []
    for s in summaries:
        platforms = list(s["backends"]) or ["-"]
        for i, p in enumerate(platforms):
            backends = s["backends"].get(p, [])
            default = s["defaults"].get(p)
            shown = [b + ("*" if b == default else "") for b in backends]
            rows.append([
                s["name"] if i == 0 else "",
                ",".join(s["tags"]) if i == 0 else "",
                p,
                default or "-",
                " ".join(shown) or "-",
                s["tuned"].get(p, "-"),
            ])
    _out(_table(["NAME", "TAGS", "PLATFORM", "DEFAULT", "BACKENDS (*default)", "TUNED"], rows))
    return 0


def _cmd_info(args, kernels) -> int:
    s = kernel_summary(kernels[0])
    if args.json:
        _out(json.dumps(s, indent=2))
        return 0
    _out(f"{s['name']}")
    if s["doc"]:
        _out(textwrap.indent(plain_text(s["doc"]), "  "))
    _out(f"  tags: {', '.join(s['tags']) or '(none)'}")
    for p, backends in s["backends"].items():
        tuned = s["tuned"].get(p)
        extra = f" (autotuned: {tuned})" if tuned else ""
        _out(f"  {p}: backends {', '.join(backends)}; default {s['defaults'].get(p)}{extra}")
    if not s["backends"]:
        _out("  no backends registered")
    _out(f"  call function: {'yes' if s['has_call'] else 'no (def_call)'}")
    _out(f"  benchmark data: {'yes' if s['has_benchmark_data'] else 'no (def_benchmark_data)'}")
    return 0


def _runnable(kernel, platform: str, wanted: list[str]) -> tuple[list[str] | None, str | None]:
    """Backends to run for ``kernel``, or a reason to skip it."""
    if not kernel.has_benchmark_data():
        return None, "no benchmark data (def_benchmark_data)"
    if not kernel.has_call():
        return None, "no call function (def_call)"
    available = kernel.available_backends(platform)
    if not available:
        return None, f"no backend on {platform}"
    if not wanted:
        return available, None
    chosen = [b for b in wanted if b in available]
    if not chosen:
        return None, f"none of the backends {wanted} (has {available})"
    return chosen, None



def _run_all(args, kernels, *, n_warmup, n_runs, n_batch, progress, verb="benchmarking"):
    platform = _platform(args.platform)
    wanted = _split(args.backends)
    results, skipped = [], []
    plan = []
    for kernel in kernels:
        backends, why = _runnable(kernel, platform, wanted)
        if backends is None:
            skipped.append((kernel.name, why))
        else:
            plan.append((kernel, backends))
    report = _Report(len(plan), not args.quiet, verb)
    for kernel, backends in plan:
        report.kernel(kernel.name, f"{', '.join(backends)} on {platform}")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", BenchmarkMismatchWarning)
            results.append(
                benchmark_kernel(
                    kernel, platform=platform, n_warmup=n_warmup, n_runs=n_runs,
                    n_batch_per_run=n_batch, rtol=args.rtol, atol=args.atol,
                    backends=backends, progress=progress,
                )
            )
    report.finish()
    return BenchmarkResult.merge(results), skipped, platform


def _check_speedup_against(args, kernels) -> str | None:
    """Why ``--speedup-against`` cannot be honoured, before anything is timed (or None)."""
    if not args.speedup_against:
        return None
    platform = _platform(args.platform)
    wanted = _split(args.backends)
    runnable = set()
    for k in kernels:
        backends, _ = _runnable(k, platform, wanted)
        runnable.update(backends or ())
        # The reference backend runs even when not asked for, and its records are kept
        # only when selected: it is a valid baseline only if it is among the backends.
    if args.speedup_against not in runnable:
        return (f"--speedup-against {args.speedup_against!r}: not a backend that will run on "
                f"{platform}; expected one of {sorted(runnable) or '(none)'}")
    return None


def _cmd_bench(args, kernels) -> int:
    for name, value in (("--output", args.output), ("--plot", args.plot)):
        if value is None:
            continue
        ext = os.path.splitext(value)[1].lower()
        allowed = (".json", ".csv") if name == "--output" else (".png",)
        if ext not in allowed:
            _err(f"{name} {value!r}: expected a file ending in {' or '.join(allowed)}")
            return 2
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            _err(f"--plot needs matplotlib: {install_hint('plot')}")
            return 2
    why = _check_speedup_against(args, kernels)
    if why:
        _err(why)
        return 2
    result, skipped, _ = _run_all(
        args, kernels, n_warmup=args.n_warmup, n_runs=args.n_runs,
        n_batch=args.n_batch_per_run, progress=False if args.quiet else None,
    )
    for name, why in skipped:
        _err(f"skipped {name}: {why}")
    if not len(result):
        _err("nothing to benchmark")
        return 1
    _out(result.table(stat=args.stat, speedup_against=args.speedup_against,
                      color=sys.stdout.isatty()))
    if args.output:
        _out(f"saved {result.save(args.output)}")
    if args.plot:
        _out(f"plotted {result.plot(args.plot, stat=args.stat)}")
    bad = result.failures() + result.mismatches()
    if bad:
        _err(f"{len(bad)} record(s) failed or disagree with their reference; see status")
    return 0


def _cmd_check(args, kernels) -> int:
    result, skipped, platform = _run_all(args, kernels, n_warmup=0, n_runs=1, n_batch=1,
                                         progress=False, verb="checking")
    for name, why in skipped:
        _out(f"SKIP  {name}: {why}")
    n_bad = 0
    for kernel in result.kernels:
        recs = result.filter(kernel=kernel)
        bad = [r for r in recs if not r.ok]
        refs = {r.reference for r in recs if r.reference}
        against = f" against {', '.join(sorted(refs))}" if refs else ""
        if not bad:
            _out(f"PASS  {kernel}: {len(recs.backends)} backend(s) x {len(recs.configs)} "
                 f"config(s){against}")
            continue
        n_bad += len(bad)
        _out(f"FAIL  {kernel}")
        for r in bad:
            why = r.error if not r.success else f"differs from {r.reference}: {r.mismatch}"
            _out(f"        [{r.config}] {r.backend}: {why}")
    total = len(result.kernels)
    _out(f"{total - len({r.kernel for r in result if not r.ok})} of {total} kernel(s) passed "
         f"on {platform}" + (f"; {len(skipped)} skipped" if skipped else ""))
    return 1 if n_bad else 0

