"""Facts stated in more than one place say the same thing, or are stated once and linked.

* What ran on GPU hardware is stated in one section (docs/gpu.md, "What ran on a GPU");
  no other page says the GPU kernels are unverified on GPU hardware, and the README and
  the landing page link to that section.
* The time of the default test tier is given with the same figure by the README and the
  landing page.
* The site's navigation gives every entry its own label, and images live in one folder
  (``docs/img``) that every image reference on a page resolves to.
"""

from __future__ import annotations

import re
from pathlib import Path

from _docs import mkdocs_config

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
GPU_SECTION = "gpu.md#what-ran-on-a-gpu"
UNVERIFIED = re.compile(r"not\s+(?:yet\s+)?verified\s+on\s+(?:a\s+)?GPU", re.IGNORECASE)
TIER_TIME = re.compile(r"default test tier \((\d+(?:-\d+)?) minutes on (\d+) (idle )?cores")


def user_pages():
    return sorted(DOCS.rglob("*.md")) + [ROOT / "README.md"]


def unverified_claims(text: str) -> list[str]:
    flat = " ".join(text.split())  # a claim may break across lines
    return [m.group() for m in UNVERIFIED.finditer(flat)]


def tier_times(text: str) -> list[tuple[str, str]]:
    flat = " ".join(text.split())
    return [(m.group(1), m.group(2)) for m in TIER_TIME.finditer(flat)]


def test_gpu_status_is_stated_once():
    gpu = (DOCS / "gpu.md").read_text(encoding="utf-8")
    assert "\n## What ran on a GPU\n" in gpu
    found = [f"{p.relative_to(ROOT)}: {c}" for p in user_pages()
             for c in unverified_claims(p.read_text(encoding="utf-8"))]
    assert not found, ("pages that contradict docs/gpu.md's 'What ran on a GPU':\n"
                       + "\n".join(found))
    for page in (ROOT / "README.md", DOCS / "index.md"):
        assert GPU_SECTION in page.read_text(encoding="utf-8"), page.name


def test_readme_and_landing_page_give_one_test_time():
    readme = tier_times((ROOT / "README.md").read_text(encoding="utf-8"))
    landing = tier_times((DOCS / "index.md").read_text(encoding="utf-8"))
    assert len(readme) == 1 and len(landing) == 1, (readme, landing)
    assert readme == landing


def test_the_checks_catch_planted_contradictions():
    assert unverified_claims("The GPU kernels are compiled but not verified\non GPU hardware.")
    assert not unverified_claims("Every kernel check was verified on an H200.")
    assert tier_times("run the default test tier (7-25 minutes on 2 cores, by machine)") == [
        ("7-25", "2")]
    assert tier_times("the default test tier (about 10 minutes on 2 cores)") == []


def nav_labels(nav, path=()):
    """``(section path, label)`` of every entry of mkdocs.yml's nav; None for a bare page."""
    for item in nav:
        if isinstance(item, str):
            yield path, None
        else:
            ((label, value),) = item.items()
            yield path, label
            if isinstance(value, list):
                yield from nav_labels(value, path + (label,))


def test_nav_labels_are_unique_and_every_page_is_named():
    config = mkdocs_config()
    entries = list(nav_labels(config["nav"]))
    bare = [path for path, label in entries if label is None]
    assert not bare, f"nav pages without a label (shown with the page's own title): {bare}"
    labels = [label for _, label in entries]
    assert len(labels) == len(set(labels)), sorted(labels)


def test_images_live_in_one_folder():
    folders = sorted({p.parent.relative_to(DOCS).as_posix() for p in DOCS.rglob("*")
                      if p.suffix.lower() in {".png", ".svg", ".jpg", ".jpeg", ".gif"}
                      and "_screens" not in p.parts})
    assert folders == ["img"], folders
    missing = []
    for page in DOCS.rglob("*.md"):
        for ref in re.findall(r"!\[[^\]]*\]\(([^)\s]+)", page.read_text(encoding="utf-8")):
            local = not ref.startswith(("http://", "https://"))
            if local and not (page.parent / ref).resolve().is_file():
                missing.append(f"{page.relative_to(ROOT)}: {ref}")
    assert not missing, missing
