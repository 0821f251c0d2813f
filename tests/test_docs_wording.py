"""What users read speaks of the library, not of how it was built.

The pages under ``docs/`` and the README state what primforge does and guarantees. A
sentence about the project's own history (what was tried, what a kernel used to do, which
machine had a GPU when, which ticket asked for what) fails this check. HTML comments are
left out: they are notes for whoever edits the page, not shown on the site.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Development-log phrasing, each with a word boundary so that e.g. "previously" and
# "previous" match but "sessions" in another sense would have to be reworded too.
PATTERNS = [
    r"\bearlier\b",
    r"\b(?<!is )(?<!are )(?<!be )(?<!also )used to\b",  # "used to leak", not "is used to check"
    r"\b(?:was|were) tried\b",
    r"\bprevious(?:ly)?\b",
    r"\bdevelopment machine\b",
    r"\bissue\s*#?\d+",
    r"\bspec[ /-]?0\d\d\b",
    r"\bsessions?\b",
    r"\bwe found\b",
    r"\bpredates?\b",
    r"\bthis project\b",
    r"\bon a GPU yet\b",
    r"\bno GPU (?:has been|was) available\b",
    r"\bwhen that bound was set\b",
    r"\bhow the kernels got there\b",
    r"\bbefore (?:the|this) (?:change|fix|rewrite)\b",
    # A run number as a label ("run 14", "(run 16)", "runs 1-6", "Run 9,"), not a count of
    # steps or calls ("run 10 steps", "`--runs 10`", "100 steps a call").
    (r"(?<![\w-])runs? \d+(?:-\d+)?\b(?!\s*(?:steps?|calls?|times|seconds?|rounds?|processes"
     r"|repetitions?|seeds?|chunks?|iterations?|ms|s)\b)"),
    # A run-numbered record outside a ``benchmarks/reference/`` path (see ``findings``).
    r"run(?:\d+|\{\d)",
    # A commit hash: 7-40 hex digits, at least one digit and one letter, in backticks or
    # after "commit" / "--against".
    r"(?:`|\bcommits?\s+|--against\s+)(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b",
    # One machine's paths and the machine a figure happened to be measured on.
    r"/work/",
    r"/root/",
    r"/home/",
    r"\bvenv-",
    r"\bthis machine\b",
]
WORDING = re.compile("|".join(PATTERNS), re.IGNORECASE)
COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
# A stored record named by its path may carry a run number in its file name: a page may
# name the record a table comes from, not list runs by number.
RECORD = re.compile(r"benchmarks/reference/[\w.-]+(?![\w.{-])")


def user_pages():
    return sorted(p for p in (ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]


def findings(text: str) -> list[tuple[int, str]]:
    """``(line number, line)`` of each line of ``text`` with development-log phrasing."""
    # Blank out comments without changing the line numbers.
    text = COMMENT.sub(lambda m: re.sub(r"[^\n]", " ", m.group()), text)
    text = RECORD.sub("benchmarks/reference/RECORD", text)
    return [(n, line.strip()) for n, line in enumerate(text.splitlines(), 1)
            if WORDING.search(line)]


def test_no_development_log_wording():
    # One test over every page (a parametrization would be cut to a subset by the default
    # tier, and pages such as docs/ops.md and docs/api/ops.md share their id's tokens).
    found = [
        f"{page.relative_to(ROOT)}:{n}: {line}"
        for page in user_pages()
        for n, line in findings(page.read_text(encoding="utf-8"))
    ]
    assert len(user_pages()) > 10
    assert not found, "development-log wording where users read:\n" + "\n".join(found)


PLANTED = [
    "On the earlier development machine, at 1% events the floor took 0.52 ms.",
    "A row-parallel jitc `W @ x` was tried and was slower on the shared 2-core machine.",
    "Against the previous column-major kernel, in alternating runs: 0.91 to 0.57.",
    "It used to leak `StopIteration`.",
    "No session of this project has had a GPU so far.",
    "The table above predates the current kernels.",
    "Fixed in issue 27, as spec 004 asks.",
    "| Xeon, run 8 | 1x | 0.123 | 0.262 | 0.061 | 0.058 |",
    "On the 2-core AMD EPYC of run 14, the command gave:",
    "two threads took 0.61x (run 16) at 100x",
    "In runs 1-6, in one call, two threads took 0.64-0.72x.",
    "Run 9, the same command with a fourth way.",
    "JSON in `coba_threads_cpu_run13.json`.",
    "JSON of both in `benchmarks/reference/ops_brainevent_cpu_run{1,2}.json`.",
    "the threaded kernel of commit 5e21f2a",
    "`python benchmarks/coba_threads.py --against 4e0b0b7`",
    "beside the kernel before (`c588579`)",
    "export BRIAN_PYTHON=/work/venv-brian/bin/python",
    "cd /root/primforge && pytest",
    "python -m venv ~/venv-brainevent",
    "whole processes on this machine differ by up to 1.4x",
]


def test_the_check_catches_a_planted_sentence():
    # One test, not a parametrization: every sentence is checked in the default tier.
    for sentence in PLANTED:
        page = f"# A page\n\nSome text.\n\n{sentence}\n\n<!-- an earlier note -->\n"
        assert findings(page) == [(5, sentence)], sentence


def test_the_check_lets_documentation_through():
    for sentence in [
        "A `'jax'` kernel is also used to check each call's `outs`.",
        "<!-- not run: lists the choices an earlier run stored -->",
        "Stored choices measured on another JAX version are skipped.",
        "Each call to the kernel runs 100 steps a call.",
        "`examples/coba.py --steps-per-call 10` runs 10 steps in one call.",
        "Time it with `--runs 10` and `--reps 21`.",
        "Contenders run 3 times each; none of its 32 runs was disturbed.",
        "As `benchmarks/coba.py` runs 100x over just-in-time connectivity.",
        "Source: `benchmarks/reference/coba_threads_cpu_run14.json`.",
        "The kernel is `deadbeef` free; a hash such as `abcdefa` is not a commit.",
        "The array holds `1234567` entries.",
        "Set `BRIAN_PYTHON` to the Python of an environment with Brian2.",
    ]:
        assert findings(sentence) == [], sentence
