"""Griffe extension for the documentation site: adapt primforge's docstrings to Markdown.

primforge's docstrings are Google style with two habits from Sphinx that Markdown does not
know: doctests under an ``Example:`` title (Google style and griffe only recognise the
plural ``Examples:``, and would render the ``>>>`` lines as prose), and cross-reference
roles such as ``:class:`ETPPrimitive``` (shown literally). Before griffe parses a
docstring, this renames the title and turns each role into an inline code span.
Loaded by mkdocs.yml (mkdocstrings' ``extensions`` option); nothing imports it at run time.
"""

import importlib
import inspect
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


_KINDS = {
    inspect.Parameter.POSITIONAL_ONLY: griffe.ParameterKind.positional_only,
    inspect.Parameter.POSITIONAL_OR_KEYWORD: griffe.ParameterKind.positional_or_keyword,
    inspect.Parameter.VAR_POSITIONAL: griffe.ParameterKind.var_positional,
    inspect.Parameter.KEYWORD_ONLY: griffe.ParameterKind.keyword_only,
    inspect.Parameter.VAR_KEYWORD: griffe.ParameterKind.var_keyword,
}


def _classes(obj):
    for member in obj.members.values():
        if member.is_alias:
            continue
        if member.is_class:
            yield member
        if member.is_module:
            yield from _classes(member)


class AttachedMethods(griffe.Extension):
    """Show the public methods a decorator attaches and the functions made at run time.

    griffe reads the source, so a method added by a class decorator (``replace`` of the
    classes made by ``primforge.utils.dataclass``) is invisible to it. After the package is
    loaded, each class is looked up at run time and every public function in its
    ``__dict__`` that griffe did not see is added with its signature and docstring; the
    functions modules make by a call are shown as functions (:func:`made_functions`).
    """

    def on_package(self, *, pkg, **kwargs):
        if pkg.name != "primforge":
            return
        made_functions(pkg)
        for cls in _classes(pkg):
            try:
                module = importlib.import_module(cls.module.path)
            except ImportError:  # a module of an optional backend's package
                module = None
            runtime = getattr(module, cls.name, None)
            if not isinstance(runtime, type):
                continue
            for name, value in vars(runtime).items():
                if name.startswith("_") or name in cls.members or not inspect.isfunction(value):
                    continue
                params = griffe.Parameters(*(
                    griffe.Parameter(
                        p.name, kind=_KINDS[p.kind],
                        default=None if p.default is p.empty else repr(p.default),
                    )
                    for p in inspect.signature(value).parameters.values()
                ))
                fn = griffe.Function(name, parameters=params, parent=cls)
                doc = inspect.getdoc(value)
                if doc:
                    fn.docstring = griffe.Docstring(markdown_docstring(doc), parent=fn)
                cls.set_member(name, fn)


def _annotation(value):
    return None if value is inspect.Parameter.empty else str(value)


def _modules(obj):
    for member in obj.members.values():
        if not member.is_alias and member.is_module:
            yield member
            yield from _modules(member)


def made_functions(pkg):
    """Show the public functions a module makes by a call rather than a ``def``.

    An operator family builds its public calls from one template (``csrmv = FAMILY.public(
    ...)``), where griffe reads an assignment. Each such module attribute that is at run
    time a function of that name and module becomes a function with its run-time signature
    and docstring.
    """
    for module in _modules(pkg):
        made = [name for name, m in module.members.items()
                if not m.is_alias and m.is_attribute and not name.startswith("_")]
        if not made:
            continue
        try:
            runtime = importlib.import_module(module.path)
        except ImportError:  # a module of an optional backend's package
            continue
        for name in made:
            value = getattr(runtime, name, None)
            if not (inspect.isfunction(value) and value.__name__ == name
                    and value.__module__ == module.path):
                continue
            sig = inspect.signature(value)
            params = griffe.Parameters(*(
                griffe.Parameter(p.name, kind=_KINDS[p.kind],
                                 annotation=_annotation(p.annotation),
                                 default=None if p.default is p.empty else repr(p.default))
                for p in sig.parameters.values()
            ))
            old = module.members[name]
            fn = griffe.Function(name, parameters=params,
                                 returns=_annotation(sig.return_annotation),
                                 lineno=old.lineno, endlineno=old.endlineno, parent=module)
            doc = inspect.getdoc(value)
            if doc:
                fn.docstring = griffe.Docstring(markdown_docstring(doc), parent=fn)
            module.set_member(name, fn)
