"""The ``primforge`` command: list, inspect, benchmark, check and autotune kernels.

Design: every subcommand first imports the modules that define kernels (the library's
own ``primforge.ops`` when present, plus each ``--import``: a module name, looked for in
the current folder too as ``python -m`` does, or a ``.py`` file), applies autotuned
defaults when ``PRIMFORGE_AUTOTUNE`` asks for them, then selects kernels by name and
``--tags`` (``--match all|any``, the registry's semantics). Usage errors (unknown names,
tags or modules, bad option values) exit with status 2 before anything runs; ``check``
exits 1 when any backend fails or disagrees with its reference; ``bench`` writes
``--output`` (.json/.csv) and ``--plot`` (.png). Long runs report one line per kernel on
stderr unless ``--quiet``.

Example:
    >>> main(['list', '--tags', 'no-such-tag-anywhere'])
    2
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

# The statistics a benchmark record has (primforge.bench.STATS; repeated here so that
# building the parser does not import JAX). A test keeps the two in step.
_STATS = ("mean", "median", "min", "max", "p90", "std")

__all__ = ["build_parser", "main"]


def _split(values: Sequence[str] | None) -> list[str]:
    out: list[str] = []
    for v in values or ():
        out.extend(p.strip() for p in v.split(",") if p.strip())
    return out


def _count(minimum: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {value}")
        return value

    parse.__name__ = f"integer >= {minimum}"
    return parse


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``primforge`` command.

    Example:
        >>> build_parser().parse_args(['bench', '--tags', 'csr,binary', '--n-runs', '5']).n_runs
        5
    """
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--import", dest="imports", action="append", default=[], metavar="MODULE",
        help="import MODULE (a module name, found in the current directory too, or a "
        "path to a .py file) so its kernels are registered (repeatable)",
    )
    quiet = argparse.ArgumentParser(add_help=False)
    quiet.add_argument(
        "-q", "--quiet", "--no-progress", dest="quiet", action="store_true",
        help="no progress report on stderr",
    )
    select = argparse.ArgumentParser(add_help=False)
    select.add_argument("names", nargs="*", metavar="NAME", help="kernel names (default: all)")
    select.add_argument(
        "--tags", action="append", metavar="TAG[,TAG]",
        help="only kernels with these tags (comma-separated or repeated)",
    )
    select.add_argument(
        "--match", choices=("all", "any"), default="all",
        help="a kernel needs all the tags (default) or any of them",
    )
    runs = argparse.ArgumentParser(add_help=False)
    runs.add_argument("--platform", help="cpu, gpu or tpu (default: JAX's default backend)")
    runs.add_argument("--backends", action="append", metavar="B[,B]",
                      help="only these backends (comma-separated or repeated)")
    runs.add_argument("--rtol", type=float, default=1e-3, help="relative tolerance (1e-3)")
    runs.add_argument("--atol", type=float, default=1e-3, help="absolute tolerance (1e-3)")

    parser = argparse.ArgumentParser(
        prog="primforge", description="List, inspect, benchmark, check and autotune kernels.",
    )
    # Accepted before the command too; a separate dest, since a subcommand's defaults would
    # overwrite the top-level value.
    parser.add_argument("--import", dest="imports_global", action="append", default=[],
                        metavar="MODULE", help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("list", parents=[common, select], help="registered kernels")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")

    p = sub.add_parser("info", parents=[common], help="everything about one kernel")
    p.add_argument("name", metavar="NAME")
    p.add_argument("--json", action="store_true", help="print JSON")

    p = sub.add_parser("bench", parents=[common, select, runs, quiet], help="benchmark backends")
    p.add_argument("--n-warmup", type=_count(0), default=5, help="untimed calls (5)")
    p.add_argument("--n-runs", type=_count(1), default=20, help="timed runs (20)")
    p.add_argument("--n-batch-per-run", type=_count(1), default=1,
                   help="calls per timed run (1)")
    p.add_argument("--stat", default="median", choices=_STATS,
                   help="statistic shown first, used for the best (*), speedups and plot")
    p.add_argument("--speedup-against", metavar="BACKEND", help="baseline of the speedups")
    p.add_argument("--output", metavar="FILE", help="save results to FILE.json or FILE.csv")
    p.add_argument("--plot", metavar="FILE", help="save a PNG plot to FILE (needs matplotlib)")

    p = sub.add_parser(
        "check", parents=[common, select, runs, quiet],
        help="compare every backend with its reference; exit 1 on any mismatch",
    )

    p = sub.add_parser("autotune", parents=[common, select, quiet],
                       help="benchmark and store each kernel's fastest backend")
    p.add_argument("--platform", help="cpu, gpu or tpu (default: JAX's default backend)")
    p.add_argument("--n-warmup", type=_count(0), default=3, help="untimed calls (3)")
    p.add_argument("--n-runs", type=_count(1), default=10, help="timed runs (10)")
    p.add_argument("--show", action="store_true",
                   help="list the stored choices (every kernel, or the selected ones)")
    p.add_argument("--clear", action="store_true", help="forget stored choices")
    return parser


def _out(text: str = "") -> None:
    print(text, flush=True)


def _err(text: str) -> None:
    print(f"primforge: {text}", file=sys.stderr, flush=True)


def _platform(name: str | None) -> str:
    import jax

    from primforge.kernel.selection import canonical_platform

    return canonical_platform(name or jax.default_backend())


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(header)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(header, widths)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(lines)


# ---------------------------------------------------------------------- commands
def _cmd_list(args, kernels) -> int:
    from primforge.registry import kernel_summary

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
    from primforge.registry import kernel_summary

    s = kernel_summary(kernels[0])
    if args.json:
        _out(json.dumps(s, indent=2))
        return 0
    _out(f"{s['name']}")
    if s["doc"]:
        _out(f"  {s['doc']}")
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
    if getattr(kernel, "_benchmark_data_fn", None) is None:
        return None, "no benchmark data (def_benchmark_data)"
    if getattr(kernel, "_call_fn", None) is None:
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


class _Report:
    """Progress of a long run on stderr: one line per kernel, and the total at the end.

    Silent with ``--quiet``. On a terminal the benchmark's own one-line bar also shows the
    (config, backend) being timed.
    """

    def __init__(self, total: int, enabled: bool, verb: str):
        self.total, self.enabled, self.verb = total, enabled and total > 0, verb
        self.start = time.perf_counter()
        self.done = 0

    def kernel(self, name: str, detail: str) -> None:
        self.done += 1
        if self.enabled:
            _err(f"[{self.done}/{self.total}] {self.verb} {name} ({detail})")

    def finish(self) -> None:
        if self.enabled:
            took = time.perf_counter() - self.start
            _err(f"{self.verb} {self.done} kernel(s) in {took:.1f} s")


def _run_all(args, kernels, *, n_warmup, n_runs, n_batch, progress, verb="benchmarking"):
    from primforge.bench import BenchmarkMismatchWarning, BenchmarkResult, benchmark_kernel

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
            _err("--plot needs matplotlib: pip install primforge[plot]")
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


def _stored_details() -> dict[str, dict[str, dict]]:
    """kernel -> platform -> the stored entry: ``backend``, and where the store records
    them, ``device`` (``device_kind`` or ``device``) and ``jax_version``. Read-only; the
    extra fields are read only from a file autotune itself accepted, never through a link.
    """
    from primforge import autotune

    details: dict[str, dict[str, dict]] = {
        name: {p: {"backend": b} for p, b in per.items()}
        for name, per in autotune.choices().items()
    }
    if not details:
        return details
    try:
        fd = os.open(autotune.cache_path(), os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd, "rb") as f:
            raw = json.loads(f.read().decode("utf-8", "replace"))["kernels"]
    except (OSError, ValueError, TypeError, KeyError):
        return details
    for name, per in details.items():
        for p, entry in per.items():
            stored = raw.get(name, {}).get(p) if isinstance(raw, dict) else None
            if not isinstance(stored, dict):
                continue
            device = stored.get("device_kind") or stored.get("device")
            if device:
                entry["device"] = str(device)
            if stored.get("jax_version"):
                entry["jax_version"] = str(stored["jax_version"])
    return details


def _cmd_autotune(args, kernels) -> int:
    from primforge import autotune

    path = autotune.cache_path()
    if args.clear:
        autotune.clear(kernels=[k.name for k in kernels] if (args.names or args.tags) else None)
        _out(f"cleared autotune choices in {path}")
        return 0
    if not args.show:
        from primforge.bench import format_seconds

        platform = _platform(args.platform)
        report = _Report(len(kernels), not args.quiet, "tuning")
        tuned = {}
        for kernel in kernels:
            report.kernel(kernel.name, f"on {platform}")
            tuned.update(autotune.tune([kernel], platform=platform, n_warmup=args.n_warmup,
                                       n_runs=args.n_runs, apply=False,
                                       progress=False if args.quiet else None))
        report.finish()
        for name, info in tuned.items():
            t = info["median_s"]
            _out(f"{name} [{platform}]: " + (
                f"{info['backend']} ({format_seconds(t)} geometric-mean median)"
                if info["backend"] else "no backend ran correctly on every config"))
        if not tuned:
            _out("nothing to tune (kernels need a call function, benchmark data and two "
                 "backends on the platform)")
    stored = _stored_details()
    # Every stored choice, also of kernels whose module was not imported; names or tags
    # narrow the list to the selected kernels.
    selected = {k.name for k in kernels} if (args.names or args.tags) else None
    rows = [
        [n, p, e["backend"], e.get("device", "-"), e.get("jax_version", "-")]
        for n, per in sorted(stored.items()) if selected is None or n in selected
        for p, e in sorted(per.items())
    ]
    _out(f"autotune cache: {path}")
    _out(_table(["NAME", "PLATFORM", "BACKEND", "DEVICE", "JAX"], rows) if rows
         else "(no stored choices)")
    if rows and not autotune.enabled():
        _out("use them with PRIMFORGE_AUTOTUNE=1 or primforge.autotune.load()")
    return 0


_COMMANDS = {
    "list": _cmd_list,
    "info": _cmd_info,
    "bench": _cmd_bench,
    "check": _cmd_check,
    "autotune": _cmd_autotune,
}


def _import_target(target: str) -> str | None:
    """Prepare ``--import TARGET``: import a file path now (returns None), or make the
    current directory importable, as ``python -m`` does, and return the module name."""
    looks_like_path = target.endswith(".py") or os.sep in target or (
        os.altsep is not None and os.altsep in target)
    if not looks_like_path:
        cwd = os.getcwd()
        if cwd not in sys.path and "" not in sys.path:
            sys.path.insert(0, cwd)
        return target
    path = Path(target).expanduser().resolve()
    if not path.is_file():
        raise ImportError(f"--import {target!r}: no such file")
    if path.suffix != ".py":
        raise ImportError(f"--import {target!r}: expected a module name or a .py file")
    name = path.stem
    loaded = sys.modules.get(name)
    if loaded is not None:
        if Path(getattr(loaded, "__file__", "") or "").resolve() == path:
            return None
        raise ImportError(
            f"--import {target!r}: a different module named {name!r} is already imported "
            f"({getattr(loaded, '__file__', None) or 'built in'}); rename the file"
        )
    # Like `python path/to/file.py`: the file's folder is importable, so the module can
    # import its siblings.
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:  # pragma: no cover - a .py file always has one
        raise ImportError(f"--import {target!r}: cannot be loaded as a module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``primforge`` command; returns the exit status.

    Example:
        >>> main(['info', 'doc_cli_missing_kernel'])
        2
    """
    from primforge import autotune, registry

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        names = [_import_target(m) for m in [*args.imports_global, *args.imports]]
        notes = registry.load_modules([n for n in names if n is not None])
    except ImportError as e:
        _err(str(e))
        return 2
    for note in notes:
        _err(f"note: {note}")
    if autotune.enabled():
        try:
            autotune.load()
        except (TypeError, ValueError) as e:
            _err(str(e))
    try:
        if args.command == "info":
            kernels = [registry.get_kernel(args.name)]
        else:
            kernels = registry.select_kernels(args.names, _split(args.tags), args.match)
    except (registry.UnknownKernelError, registry.UnknownTagError) as e:
        _err(str(e))
        return 2
    try:
        return _COMMANDS[args.command](args, kernels)
    except ValueError as e:  # bad platform, backend, tolerances: a usage error
        _err(str(e))
        return 2
