"""The documentation site: its code runs, its API reference is complete, it builds strictly.

Checks on ``docs/``:

* every fenced ```python block of every page is executed, the blocks of one page in order
  in one fresh interpreter (so a page's later blocks see its earlier names), with warnings
  as errors. A block is skipped only when an HTML comment ``<!-- not run: REASON -->``
  with a non-empty reason stands on the line(s) just before its fence. A block headed by
  ``<!-- needs: MODULE[, MODULE] -->`` (an optional backend's package) is left out when one
  of those modules cannot be imported here, and runs otherwise; the page's other blocks
  must not use its names;
* every ``$ primforge ...`` command of a ```console block runs (same exemption);
* every public name (the ``__all__`` of each module of ``API_MODULES``: ``primforge``,
  ``primforge.utils``, ``primforge.ops``, ``primforge.sim.coba`` and the others) has a
  ``::: name`` directive on one of the API pages under ``docs/api/``;
* every exception and warning class in the source has an entry on the troubleshooting page;
* ``mkdocs build --strict`` succeeds (broken links, unresolved references and missing
  API objects fail it), when mkdocs is installed (the ``docs`` extra).
"""

from __future__ import annotations

import importlib
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from primforge.backends._common import package_installed

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<ticks>`{3,}|~{3,})\s*(?P<info>[^\n`]*)$")
NOT_RUN = re.compile(r"^\s*<!--\s*not run:(?P<reason>.*?)-->\s*$")
NEEDS = re.compile(r"^\s*<!--\s*needs:(?P<modules>[\w., ]+)-->\s*$")


def pages():
    return sorted(p for p in DOCS.rglob("*.md"))


def code_blocks(path: Path):
    """Yield ``(first_line, language, source, exempt_reason)`` for each fenced block."""
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, ticks = m["indent"], m["ticks"]
        lang = (m["info"].split() or [""])[0].lower()
        start = i
        body = []
        i += 1
        while i < len(lines) and not (
            lines[i].strip().startswith(ticks) and set(lines[i].strip()) == {ticks[0]}
        ):
            body.append(lines[i].removeprefix(indent))
            i += 1
        i += 1  # the closing fence
        reason = None
        j = start - 1
        while j >= 0 and not lines[j].strip():
            j -= 1
        if j >= 0:
            n = NOT_RUN.match(lines[j])
            if n:
                reason = n["reason"].strip()
        yield start + 1, lang, "\n".join(body) + "\n", reason


def needed_modules(path: Path) -> dict[int, list[str]]:
    """The modules each block headed by a ``needs:`` comment needs, by its fence's line."""
    lines = path.read_text(encoding="utf-8").splitlines()
    out = {}
    for i, text in enumerate(lines):
        m = NEEDS.match(text)
        if m:
            j = i + 1
            while j < len(lines) and not lines[j].strip():
                j += 1
            assert j < len(lines) and FENCE.match(lines[j]), (
                f"{path.name}:{i + 1}: a 'needs:' comment must stand just before a fence")
            out[j + 1] = [n.strip() for n in m["modules"].split(",") if n.strip()]
    return out


def python_pages():
    return [p for p in pages() if any(b[1] in ("python", "py") for b in code_blocks(p))]


RUNNER = textwrap.dedent(
    """
    import sys, warnings
    warnings.simplefilter("error")
    warnings.filterwarnings("ignore", category=DeprecationWarning, module="numba.*")
    warnings.filterwarnings("ignore", category=ImportWarning)
    ns = {"__name__": "__main__"}
    for path in sys.argv[1:]:
        print(f"--- {path}", flush=True)
        with open(path, encoding="utf-8") as f:
            src = f.read()
        exec(compile(src, path, "exec"), ns)
    """
)


@pytest.mark.parametrize("page", python_pages(), ids=lambda p: str(p.relative_to(DOCS)))
def test_python_blocks_run(page, tmp_path):
    blocks = []
    needs = needed_modules(page)
    for line, lang, src, reason in code_blocks(page):
        if lang not in ("python", "py"):
            continue
        if reason is not None:
            assert reason, f"{page.name}:{line}: a 'not run' block needs a written reason"
            continue
        if not all(package_installed(m) for m in needs.get(line, ())):
            continue  # an optional backend's package that is not installed here
        blocks.append((line, src))
    if not blocks:
        pytest.skip(f"every Python block of {page.name} is marked 'not run' with a reason")
    # Each block gets a file of its own (named after the page and line, so a traceback
    # says where it failed, and decorators that read their function's source work).
    script = tmp_path / "run_page.py"
    script.write_text(RUNNER, encoding="utf-8")
    files = []
    for line, src in blocks:
        f = tmp_path / f"{page.stem}_line{line}.py"
        f.write_text(src, encoding="utf-8")
        files.append(str(f))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.setdefault("JAX_PLATFORMS", "cpu")
    env["PRIMFORGE_CACHE_DIR"] = str(tmp_path / "cache")
    env["MPLBACKEND"] = "Agg"
    r = subprocess.run(
        [sys.executable, str(script), *files],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False,
    )
    assert r.returncode == 0, (
        f"a code block of {page.name} failed:\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}")


def console_blocks():
    out = []
    for page in pages():
        for line, lang, src, reason in code_blocks(page):
            if lang == "console" and reason is None:
                out.append(pytest.param(page, line, src, id=f"{page.stem}:{line}"))
    return out


@pytest.mark.parametrize(("page", "line", "src"), console_blocks())
def test_console_blocks_run(page, line, src, tmp_path):
    """Each ``$ primforge ...`` command of a ```console block runs and exits with status 0,
    and the first word of every output line shown under it appears in what it prints
    (timings differ from run to run, the table's rows and words do not)."""
    shutil.copytree(ROOT / "examples", tmp_path / "examples")  # files the commands name
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.setdefault("JAX_PLATFORMS", "cpu")
    env["PRIMFORGE_CACHE_DIR"] = str(tmp_path / "cache")
    env["MPLBACKEND"] = "Agg"
    commands = []
    for text in src.splitlines():
        if text.startswith("$ "):
            commands.append((text[2:].split("#")[0].split(), []))
        elif commands and text.strip():
            commands[-1][1].append(text.split()[0])
    assert commands, f"{page.name}:{line}: a console block without a '$ ' command"
    for argv, words in commands:
        assert argv[0] == "primforge", f"{page.name}:{line}: only primforge commands are run"
        r = subprocess.run(
            [sys.executable, "-m", "primforge", *argv[1:]], cwd=tmp_path, env=env,
            capture_output=True, text=True, timeout=600, check=False,
        )
        shown = r.stdout + r.stderr
        assert r.returncode == 0, f"{page.name}:{line}: {' '.join(argv)} failed:\n{shown[-4000:]}"
        missing = [w for w in words if w not in shown]
        assert not missing, f"{page.name}:{line}: {' '.join(argv)} printed no {missing}:\n{shown}"


def test_block_parser_sees_fences_and_exemptions(tmp_path):
    page = tmp_path / "p.md"
    page.write_text(
        "text\n\n```python\nx = 1\n```\n\n<!-- not run: needs a GPU -->\n```python\ngpu()\n```\n"
        "\n```console\n$ ls\n```\n\n- item\n\n    ```python\n    y = x + 1\n    ```\n",
        encoding="utf-8",
    )
    got = list(code_blocks(page))
    assert [(b[1], b[2], b[3]) for b in got] == [
        ("python", "x = 1\n", None),
        ("python", "gpu()\n", "needs a GPU"),
        ("console", "$ ls\n", None),
        ("python", "y = x + 1\n", None),
    ]


def test_needs_comment_names_the_modules_of_the_next_block(tmp_path):
    page = tmp_path / "p.md"
    page.write_text(
        "```python\nx = 1\n```\n\n<!-- needs: warp, numba_cuda -->\n\n"
        "```python\nimport warp\n```\n",
        encoding="utf-8",
    )
    assert needed_modules(page) == {7: ["warp", "numba_cuda"]}
    assert [b[0] for b in code_blocks(page)] == [1, 7]
    assert package_installed("json") and not package_installed("no_such_module_anywhere")
    stray = tmp_path / "q.md"
    stray.write_text("<!-- needs: warp -->\ntext\n", encoding="utf-8")
    with pytest.raises(AssertionError, match="must stand just before a fence"):
        needed_modules(stray)


# ---- the API reference -------------------------------------------------------------------

API_MODULES = ["primforge", "primforge.utils", "primforge.ops", "primforge.testing",
               "primforge.distributed", "primforge.sim.coba"]
DIRECTIVE = re.compile(r"^:::\s+(?P<path>[\w.]+)\s*$", re.MULTILINE)


def api_directives():
    found = set()
    for page in (DOCS / "api").glob("*.md"):
        found.update(m["path"] for m in DIRECTIVE.finditer(page.read_text(encoding="utf-8")))
    return found


def public_names():
    names = []
    for modname in API_MODULES:
        try:
            mod = importlib.import_module(modname)
        except ModuleNotFoundError as e:
            if e.name == modname:  # a module that does not exist (yet) has nothing to document
                continue
            raise
        names += [f"{modname}.{n}" for n in mod.__all__]
    return names


def test_every_public_name_has_an_api_entry():
    directives = api_directives()
    missing = [
        n for n in public_names()
        if n not in directives and not any(d.startswith(n + ".") for d in directives)
    ]
    assert not missing, (
        "public names with no '::: name' directive on a page under docs/api/: "
        + ", ".join(missing)
    )


def test_every_public_name_has_a_docstring():
    # mkdocstrings renders an object without a docstring as an empty entry; fail instead.
    import inspect

    empty = []
    for path in public_names():
        modname, _, attr = path.rpartition(".")
        if not (inspect.getdoc(getattr(importlib.import_module(modname), attr)) or "").strip():
            empty.append(path)
    assert not empty, "public names without a docstring: " + ", ".join(empty)


def test_api_entries_name_existing_objects():
    # mkdocs --strict checks this too; this version runs without mkdocs installed.
    for path in sorted(api_directives()):
        modname, _, attr = path.rpartition(".")
        try:
            mod = importlib.import_module(path)
            continue
        except ModuleNotFoundError:
            pass
        mod = importlib.import_module(modname)
        assert hasattr(mod, attr), f"docs/api names {path}, which does not exist"


# ---- the strict build --------------------------------------------------------------------


@pytest.fixture(scope="module")
def built_site(tmp_path_factory):
    """The site built once with ``mkdocs build --strict``: ``(returncode, output, site dir)``."""
    pytest.importorskip("mkdocs", reason="the docs extra (mkdocs) is not installed")
    pytest.importorskip("mkdocstrings", reason="the docs extra (mkdocstrings) is not installed")
    pytest.importorskip("material", reason="the docs extra (mkdocs-material) is not installed")
    site = tmp_path_factory.mktemp("site") / "site"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["NO_MKDOCS_2_WARNING"] = "1"
    env.setdefault("JAX_PLATFORMS", "cpu")
    r = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False,
    )
    yield r.returncode, r.stdout[-3000:] + "\n" + r.stderr[-6000:], site
    shutil.rmtree(site, ignore_errors=True)


def test_site_builds_strictly(built_site):
    code, output, site = built_site
    assert code == 0, f"mkdocs build --strict failed:\n{output}"
    assert (site / "index.html").is_file()
    assert (site / "api" / "kernels" / "index.html").is_file()


def public_members():
    """``(class path, member name, object)`` for every public method and property of every
    public class that primforge defines (members a class inherits from JAX or the standard
    library are documented there)."""
    out = []
    for path in public_names():
        modname, _, attr = path.rpartition(".")
        cls = getattr(importlib.import_module(modname), attr)
        if not isinstance(cls, type):
            continue
        for name in dir(cls):
            if name.startswith("_"):
                continue
            owner = next((k for k in cls.__mro__ if name in vars(k)), None)
            if owner is None or not owner.__module__.startswith("primforge"):
                continue
            value = vars(owner)[name]
            if isinstance(value, (staticmethod, classmethod)):
                value = value.__func__
            if isinstance(value, property) or callable(value):
                out.append((path, name, value))
    return out


def anchors(site):
    ids = set()
    for page in (site / "api").rglob("*.html"):
        ids.update(re.findall(r'id="([\w.]+)"', page.read_text(encoding="utf-8")))
    return ids


def test_every_public_member_is_on_the_site(built_site):
    """Each public method and property of each public class has its own entry (signature
    and docstring) on the built API pages, inherited ones included."""
    code, output, site = built_site
    assert code == 0, output
    members = public_members()
    assert ("primforge.XLACustomKernel", "def_transpose_rule") in {m[:2] for m in members}
    ids = anchors(site)
    missing = [f"{c}.{n}" for c, n, _ in members if f"{c}.{n}" not in ids]
    assert not missing, "public members missing from the built API pages: " + ", ".join(missing)


def test_no_private_base_class_on_the_site(built_site):
    code, output, site = built_site
    assert code == 0, output
    shown = [
        p.relative_to(site).as_posix() for p in (site / "api").rglob("*.html")
        if re.search(r"Bases:|\bMixin\b", p.read_text(encoding="utf-8"))
    ]
    assert not shown, f"API pages listing base classes: {shown}"


def test_every_public_member_has_a_docstring_with_an_example():
    import inspect

    bad = []
    for cls, name, value in public_members():
        doc = (value.__doc__ if isinstance(value, property) else inspect.getdoc(value)) or ""
        if ">>>" not in doc:
            bad.append(f"{cls}.{name}")
    assert not bad, "public methods/properties without a docstring example: " + ", ".join(bad)


# ---- troubleshooting ---------------------------------------------------------------------

CLASS = re.compile(r"^class (?P<name>\w+)\((?P<bases>[^)]*)\)", re.MULTILINE)


def raised_classes():
    """Every exception or warning class defined in primforge's source."""
    found = set()
    for path in (ROOT / "primforge").rglob("*.py"):
        for m in CLASS.finditer(path.read_text(encoding="utf-8")):
            if re.search(r"(Error|Warning|Exception)\b", m["bases"]) or re.search(
                r"(Error|Warning)$", m["name"]
            ):
                found.add(m["name"])
    return found


def test_troubleshooting_names_every_error_and_warning_class():
    classes = raised_classes()
    assert {"KernelError", "MissingRuleError", "BackendUnavailableWarning"} <= classes
    page = (DOCS / "troubleshooting.md").read_text(encoding="utf-8")
    missing = sorted(c for c in classes if f"`{c}`" not in page)
    assert not missing, f"docs/troubleshooting.md has no entry for: {', '.join(missing)}"


def test_griffe_extension_rewrites_examples_and_roles():
    pytest.importorskip("griffe", reason="the docs extra (mkdocstrings) is not installed")
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        from griffe_examples import markdown_docstring
    finally:
        sys.path.remove(str(ROOT / "tools"))
    text = ("Uses :class:`ETPPrimitive` and :func:`~primforge.defjvp`.\n\n"
            "    Example:\n        >>> 1\n")
    assert markdown_docstring(text) == (
        "Uses `ETPPrimitive` and `primforge.defjvp`.\n\n    Examples:\n        >>> 1\n"
    )


# ---- wording -----------------------------------------------------------------------------

INTERNAL = re.compile(r"\bissue\s*#?\d+|\(issue|\bspec[ /-]?\d{3}\b", re.IGNORECASE)


def test_no_project_internal_wording_where_users_read():
    """The pages, the README and the docstrings (what the API pages show) speak of the
    library only, never of the project's own tickets or specs."""
    import ast

    found = []
    for path in [*pages(), ROOT / "README.md"]:
        for n, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if INTERNAL.search(text):
                found.append(f"{path.relative_to(ROOT)}:{n}: {text.strip()}")
    for path in (ROOT / "primforge").rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node) or ""
                if INTERNAL.search(doc):
                    where = getattr(node, 'name', 'the module')
                    found.append(f"{path.relative_to(ROOT)}: docstring of {where}")
    assert not found, "project-internal wording:\n" + "\n".join(found)


# ---- tutorial and diagrams ---------------------------------------------------------------


def test_the_tutorial_runs_every_block():
    """The spiking-network tutorial is run block by block by ``test_python_blocks_run``;
    none of its blocks may be exempted."""
    page = DOCS / "tutorial-snn.md"
    assert page in python_pages()
    blocks = [b for b in code_blocks(page) if b[1] in ("python", "py")]
    assert len(blocks) >= 5
    assert all(reason is None for *_, reason in blocks)


IMAGE = re.compile(r"!\[[^\]]*\]\((?P<src>[^)\s]+)\)")


def test_diagrams_are_static_images():
    """No diagram needs a script from a CDN: no ```mermaid block, and every image a page
    shows is a file under docs/."""
    for page in pages():
        for line, lang, _, _ in code_blocks(page):
            assert lang != "mermaid", f"{page.name}:{line}: draw diagrams as SVG files"
        for m in IMAGE.finditer(page.read_text(encoding="utf-8")):
            assert (page.parent / m["src"]).is_file(), f"{page.name}: missing image {m['src']}"
