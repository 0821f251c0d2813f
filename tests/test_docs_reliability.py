"""docs/reliability.md names the tests that hold each guarantee: every one must exist."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _defined_tests():
    names = set()
    for path in (ROOT / "tests").glob("test_*.py"):
        for m in re.finditer(r"^\s*def (test_\w+)", path.read_text(encoding="utf-8"), re.MULTILINE):
            names.add((path.name, m.group(1)))
    return names


def test_every_test_named_in_the_reliability_page_exists():
    text = (ROOT / "docs" / "reliability.md").read_text(encoding="utf-8")
    defined = _defined_tests()
    by_name = {name for _, name in defined}
    missing = []
    current_file = None
    # `file.py::test_x`, then `::test_y` (same file) or a bare `test_z`
    pattern = r"(test_\w+\.py)?::(test_\w+)|(?<![\w:])(test_\w+)(?![\w.])"
    for m in re.finditer(pattern, text):
        file, qualified, bare = m.groups()
        if file:
            current_file = file
        if qualified:
            f = file or current_file
            if (f, qualified) not in defined:
                missing.append(f"{f}::{qualified}")
        elif bare and bare not in by_name:
            missing.append(bare)
    assert not missing, f"docs/reliability.md names tests that do not exist: {missing}"
    assert len(re.findall(r"test_\w+", text)) > 40
