"""What every subcommand uses: output, the platform asked for, tables, kernel summaries."""

from __future__ import annotations

import re
import sys
import time
from typing import Any

import jax

from primforge import autotune, registry
from primforge.backends._platforms import canonical_platform

__all__ = ["kernel_summary"]


def _out(text: str = "") -> None:
    print(text, flush=True)


def _err(text: str) -> None:
    print(f"primforge: {text}", file=sys.stderr, flush=True)



def _platform(name: str | None) -> str:
    return canonical_platform(name or jax.default_backend())


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(header)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(header, widths)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(lines)



_ROLE = re.compile(r":[a-z]+(?::[a-z]+)?:`~?([^`]+)`")
_LITERAL = re.compile(r"``([^`]+)``")


def plain_text(doc: str) -> str:
    """A docstring's reStructuredText markup as terminal text: literals and roles in
    single backticks.

    Example:
        >>> plain_text("Adds ``factor`` to :func:`~primforge.ops.csrmv`'s result.")
        "Adds `factor` to `primforge.ops.csrmv`'s result."
    """
    return _LITERAL.sub(r"`\1`", _ROLE.sub(r"`\1`", doc))


def kernel_summary(kernel: Any) -> dict[str, Any]:
    """What ``primforge list`` and ``info`` show about a kernel, as plain data.

    The registry's :func:`primforge.registry.kernel_summary` with the kernel's stored
    autotune choices (``primforge.autotune.choices()``) under ``'tuned'``; a damaged
    autotune cache shows none (the command reports it separately).

    Example:
        >>> import primforge
        >>> k = primforge.XLACustomKernel('doc_cli_kernel_summary', 'Adds one.')
        >>> k.def_kernel('jax', 'cpu', lambda **kw: lambda x: x + 1)
        >>> s = kernel_summary(k)
        >>> s['backends'], s['defaults'], s['doc'], s['has_call']
        ({'cpu': ['jax']}, {'cpu': 'jax'}, 'Adds one.', False)
    """
    try:
        tuned = autotune.choices().get(kernel.name, {})
    except (TypeError, ValueError):  # a damaged cache is reported by the CLI, not here
        tuned = {}
    return registry.kernel_summary(kernel, tuned)


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

