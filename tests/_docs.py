"""Helpers shared by the tests that read the documentation site's configuration."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def mkdocs_config() -> dict:
    """mkdocs.yml as data; its ``!!python/...`` tags (Material's helpers) read as text."""

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("tag:yaml.org,2002:python/",
                                 lambda loader, suffix, node: str(node.value))
    return yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=Loader)
