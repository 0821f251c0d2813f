"""Griffe extension for the documentation site: read ``Example:`` as an examples section.

primforge's docstrings title their doctests ``Example:``; Google style (and griffe) only
knows the plural ``Examples:``, and would render the ``>>>`` lines as prose. This renames
the title before griffe parses a docstring, so the doctests are shown as Python code.
Loaded by mkdocs.yml (mkdocstrings' ``extensions`` option); nothing imports it at run time.
"""

import re

import griffe

_TITLE = re.compile(r"^(\s*)Example:\s*$", re.MULTILINE)


class ExampleSections(griffe.Extension):
    """Rename every ``Example:`` section title to ``Examples:``."""

    def on_instance(self, *, obj, **kwargs):
        if obj.docstring is not None:
            obj.docstring.value = _TITLE.sub(r"\1Examples:", obj.docstring.value)
