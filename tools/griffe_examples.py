"""Griffe extension for the documentation site: adapt primforge's docstrings to Markdown.

primforge's docstrings are Google style with two habits from Sphinx that Markdown does not
know: doctests under an ``Example:`` title (Google style and griffe only recognise the
plural ``Examples:``, and would render the ``>>>`` lines as prose), and cross-reference
roles such as ``:class:`ETPPrimitive``` (shown literally). Before griffe parses a
docstring, this renames the title and turns each role into an inline code span.
Loaded by mkdocs.yml (mkdocstrings' ``extensions`` option); nothing imports it at run time.
"""

import re

import griffe

_TITLE = re.compile(r"^(\s*)Example:\s*$", re.MULTILINE)
_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|data|exc|obj):`~?([^`]+)`")


def markdown_docstring(text: str) -> str:
    """The docstring ``text`` with ``Example:`` titles pluralised and roles as code spans.

    Example:
        >>> markdown_docstring("See :class:`~a.B`.\\n\\nExample:\\n    >>> 1\\n")
        'See `a.B`.\\n\\nExamples:\\n    >>> 1\\n'
    """
    return _ROLE.sub(r"`\1`", _TITLE.sub(r"\1Examples:", text))


class ExampleSections(griffe.Extension):
    """Apply :func:`markdown_docstring` to every docstring griffe loads."""

    def on_instance(self, *, obj, **kwargs):
        if obj.docstring is not None:
            obj.docstring.value = markdown_docstring(obj.docstring.value)
