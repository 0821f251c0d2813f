"""docs/migration.md: every Python block runs, and a block followed by an "Output:" text
block prints exactly that."""

import contextlib
import io
import pathlib
import re

import pytest

DOC = pathlib.Path(__file__).resolve().parent.parent / "docs" / "migration.md"
BLOCK = re.compile(r"```(\w+)\n(.*?)```", re.DOTALL)


def _blocks():
    found = [(m.group(1), m.group(2), m.end()) for m in BLOCK.finditer(DOC.read_text())]
    out = []
    for i, (lang, code, end) in enumerate(found):
        if lang != "python":
            continue
        expected = None
        if i + 1 < len(found) and found[i + 1][0] == "text":
            between = DOC.read_text()[end:DOC.read_text().index(found[i + 1][1])]
            if "Output:" in between:
                expected = found[i + 1][1]
        out.append((code, expected))
    return out


def test_the_page_has_python_blocks():
    assert len(_blocks()) >= 3


@pytest.mark.parametrize("index", range(len(_blocks())))
def test_python_block_runs(index):
    code, expected = _blocks()[index]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        block = compile(code, f"{DOC.name}[block {index}]", "exec")
        exec(block, {"__name__": "__doc__"})  # noqa: S102
    if expected is not None:
        assert buf.getvalue() == expected


def test_the_import_lines_name_real_objects():
    import primforge
    import primforge.utils

    text = DOC.read_text()
    for name in re.findall(r"^from primforge import (.+?)\s+#", text, re.MULTILINE):
        for n in name.split(","):
            assert hasattr(primforge, n.strip()), n
    for name in re.findall(r"^from primforge\.utils import (.+?)\s+#", text, re.MULTILINE):
        for n in name.split(","):
            assert hasattr(primforge.utils, n.strip()), n
    listed = re.search(r"under the same name:\n(.*?)\n\n", text, re.DOTALL).group(1)
    for n in re.findall(r"`(\w+)`", listed):
        assert hasattr(primforge.utils, n), n
