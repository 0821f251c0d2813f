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
]
WORDING = re.compile("|".join(PATTERNS), re.IGNORECASE)
COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)


def user_pages():
    return sorted(p for p in (ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]


def findings(text: str) -> list[tuple[int, str]]:
    """``(line number, line)`` of each line of ``text`` with development-log phrasing."""
    # Blank out comments without changing the line numbers.
    text = COMMENT.sub(lambda m: re.sub(r"[^\n]", " ", m.group()), text)
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
    ]:
        assert findings(sentence) == [], sentence
