"""The ``primforge`` command's argument parser.

Plain argparse with shared parent parsers; it imports nothing of the library, so
``--help`` and usage errors are answered before JAX is needed.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

# The statistics a benchmark record has (primforge.bench.STATS; repeated here so that
# building the parser does not need the benchmark package). A test keeps the two in step.
_STATS = ("mean", "median", "min", "max", "p90", "std")

__all__ = ["build_parser"]


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
    # Long by design: a flat list of argparse declarations, one per option, read top down.
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
