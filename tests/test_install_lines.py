"""Every install line users are shown works as written from a checkout of the repository.

primforge is installed from its checkout (there is no package on an index), so a line such
as ``pip install "primforge[cpu]"`` fails. Every ``pip install`` in the docs, the README and
primforge's own messages and docstrings that installs primforge must be the checkout form
``pip install -e ".[extra,...]"``, naming only extras that ``pyproject.toml`` defines.
Lines that install other packages (``pip install matplotlib``) are left alone.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PIP = re.compile(r"pip install\b(?P<rest>[^\n`]*)")
CHECKOUT = re.compile(r"""^\s*(?:-U\s+)?-e\s+(?P<q>["']?)\.\[(?P<extras>[^\]]*)\](?P=q)""")
PLACEHOLDER = re.compile(r"\{[^}]*\}|<[^>]*>|\bEXTRA\b|\.\.\.")


def extras() -> set[str]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return set(data["project"]["optional-dependencies"])


def problems(text: str, known: set[str]) -> list[str]:
    """What is wrong with each ``pip install`` of ``text`` that installs primforge."""
    out = []
    for m in PIP.finditer(text):
        rest = m["rest"]
        installs_primforge = "primforge" in rest.split("(")[0] or ".[" in rest or (
            re.match(r"\s*(-e\s+)?\.(\s|$)", rest))
        if not installs_primforge:
            continue
        c = CHECKOUT.match(rest)
        if c is None:
            out.append(f"not the checkout form pip install -e \".[...]\": {m.group().strip()}")
            continue
        for extra in c["extras"].split(","):
            extra = extra.strip()
            if extra and not PLACEHOLDER.fullmatch(extra) and extra not in known:
                out.append(f"extra {extra!r} is not in pyproject.toml: {m.group().strip()}")
    return out


def shown_files() -> list[Path]:
    return [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md",
            *sorted((ROOT / "primforge").rglob("*.py"))]


def test_every_install_line_uses_the_checkout_form_and_known_extras():
    known = extras()
    assert {"cpu", "plot", "test", "docs", "gpu-compile"} <= known
    found = []
    for path in shown_files():
        found += [f"{path.relative_to(ROOT)}: {p}"
                  for p in problems(path.read_text(encoding="utf-8"), known)]
    assert not found, "install lines that do not work from a checkout:\n" + "\n".join(found)


def test_the_check_catches_lines_that_fail():
    known = {"cpu", "plot"}
    assert problems('`pip install "primforge[cpu]"`', known)
    assert problems("needs matplotlib: pip install primforge[plot]", known)
    assert problems('python -m pip install ".[cpu]"', known)  # not editable: not the form
    assert problems('python -m pip install -e ".[cpu,nope]"', known) == [
        "extra 'nope' is not in pyproject.toml: pip install -e \".[cpu,nope]\""]
    assert problems('python -m pip install -e ".[cpu,plot]" && python x.py', known) == []
    assert problems("pip install matplotlib", known) == []
    assert problems("pip install -e \".[{extra}]\" (in the primforge checkout)", known) == []


def test_every_backend_extra_exists():
    # The messages name a backend's EXTRA through install_hint: each must be a real extra.
    from primforge.backends import KNOWN_BACKENDS, get_backend
    from primforge.backends._common import install_hint

    known = extras()
    for name in KNOWN_BACKENDS:
        extra = get_backend(name).EXTRA
        if extra is not None:
            assert extra in known, f"backend {name!r} names the extra {extra!r}"
            assert problems(install_hint(extra), known) == []
