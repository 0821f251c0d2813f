"""Code on the documentation site is shown whole: no line of a code block is cut off.

The site shows a fenced code block in a column about 84 monospace characters wide and
scrolls longer lines out of sight, so every line inside a fence (```...``` or ~~~...~~~)
of every page under ``docs/`` and of the README is at most 84 characters. Table cells
keep inline code on one line (the site's stylesheet), so a name is never broken inside.
"""

from __future__ import annotations

import re
from pathlib import Path

from _docs import mkdocs_config

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
WIDTH = 84

FENCE = re.compile(r"^[ \t]*(?P<ticks>`{3,}|~{3,})")

# The README's two commands a newcomer copies and CI runs verbatim (CI's last command is
# the second one): they stay on one line each, whatever their length.
VERBATIM = {
    'python -m pip install -e ".[cpu]" && python examples/quickstart.py',
    'python -m pip install -e ".[test,gpu-compile]" && JAX_PLATFORMS=cpu python -m pytest -n auto',
}


def pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md")) + [ROOT / "README.md"]


def long_code_lines(text: str, width: int = WIDTH) -> list[tuple[int, int]]:
    """``(line number, length)`` of every line inside a fenced block longer than width."""
    out = []
    fence = None  # the opening fence's characters while inside a block
    for number, line in enumerate(text.splitlines(), start=1):
        m = FENCE.match(line)
        if fence is None:
            if m:
                fence = m["ticks"]
            continue
        stripped = line.strip()
        if (m and stripped.startswith(fence) and set(stripped) == {fence[0]}):
            fence = None  # the closing fence: as long as the opening one, or longer
            continue
        if len(line) > width:
            out.append((number, len(line)))
    return out


def offenders(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    found = []
    for number, length in long_code_lines(text):
        if path == ROOT / "README.md" and lines[number - 1].strip() in VERBATIM:
            continue
        found.append(f"{path.relative_to(ROOT)}:{number}:{length}")
    return found


def test_every_code_line_fits_the_site_column():
    found = [o for page in pages() for o in offenders(page)]
    assert not found, (
        f"code lines longer than {WIDTH} characters (file:line:length); break them inside "
        "brackets (Python) or with ' \\' continuations (shell):\n" + "\n".join(found))


def test_the_check_catches_a_long_line_and_ignores_prose():
    long = "x = " + "1 + " * 30 + "1"
    text = "\n".join([
        "A long line of prose: " + "word " * 30,
        "",
        "```python",
        "short = 1",
        long,
        "```",
        "",
        "| table | " + "cell " * 30 + "|",
        "",
        "- item",
        "",
        "    ~~~",
        "    " + long,
        "    ~~~",
        "",
        "````markdown",
        "```",
        long,
        "```",
        "````",
        "after the block: " + "word " * 30,
    ])
    assert long_code_lines(text) == [(5, len(long)), (13, len(long) + 4), (18, len(long))]
    assert long_code_lines("```\n" + "y" * WIDTH + "\n```\n") == []  # exactly the width


def test_the_verbatim_commands_are_the_readmes():
    readme = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert VERBATIM <= {line.strip() for line in readme}


def test_stylesheet_keeps_table_code_on_one_line():
    config = mkdocs_config()
    sheets = config.get("extra_css") or []
    assert sheets, "mkdocs.yml registers no extra_css stylesheet"
    rules = ""
    for sheet in sheets:
        path = DOCS / sheet
        assert path.is_file(), f"mkdocs.yml's extra_css names {sheet}, which is not in docs/"
        rules += re.sub(r"/\*.*?\*/", "", path.read_text(encoding="utf-8"), flags=re.DOTALL)
    table_code = re.compile(r"table[^{}]*\bcode\s*\{[^}]*white-space\s*:\s*nowrap", re.DOTALL)
    assert table_code.search(rules), "no stylesheet keeps inline code in tables on one line"
