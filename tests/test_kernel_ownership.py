"""One owner per field in the kernel: a static scan of ``primforge/kernel/*.py``.

A field of a kernel part is an attribute ``self._name`` that some module writes (assigns,
item-assigns, or mutates with ``clear``/``add``/``update``/...). Each field is written by
one module (its owner) and read only there; other parts ask through methods. No module
reads a private attribute of an object other than ``self``/``cls``.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import primforge

CORE = Path(primforge.__file__).parent / "kernel"
#: Private reads off another object that stay: a module's function reading the cached
#: field of a class that module defines.
ALLOWED_FOREIGN = {"entry.py: entry._accepted"}
MUTATORS = {"clear", "add", "update", "pop", "popitem", "setdefault", "append", "extend",
            "remove", "discard", "insert"}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _self_attr(node) -> str | None:
    if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
            and node.value.id == "self" and _private(node.attr)):
        return node.attr
    return None


def scan(paths):
    """(writers, readers, foreign): field -> modules writing / reading it via ``self``,
    and ``file:line: expr`` for each private attribute read off another object."""
    writers, readers, foreign = defaultdict(set), defaultdict(set), []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            name = _self_attr(node)
            if name is not None:
                (writers if isinstance(node.ctx, (ast.Store, ast.Del)) else readers)[name].add(
                    path.name)
            if (isinstance(node, ast.Subscript) and isinstance(node.ctx, (ast.Store, ast.Del))
                    and (name := _self_attr(node.value)) is not None):
                writers[name].add(path.name)
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in MUTATORS and (name := _self_attr(node.func.value))):
                writers[name].add(path.name)
            if (isinstance(node, ast.Attribute) and _private(node.attr)
                    and not _is_self(node.value)):
                foreign.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return writers, readers, foreign


def _is_self(node) -> bool:
    """``self``, ``cls`` or ``super()``: the object's own attributes."""
    if isinstance(node, ast.Name):
        return node.id in ("self", "cls")
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id == "super")


def test_each_field_has_one_writer_and_is_read_only_there():
    writers, readers, _ = scan(sorted(CORE.glob("*.py")))
    shared = {f: sorted(m) for f, m in writers.items() if len(m) > 1}
    assert not shared, f"fields written by more than one module: {shared}"
    foreign_reads = {f: sorted(readers[f] - writers[f]) for f in writers if readers[f] - writers[f]}
    assert not foreign_reads, f"fields read outside their owner: {foreign_reads}"


def test_no_private_attribute_of_another_object():
    _, _, foreign = scan(sorted(CORE.glob("*.py")))
    found = [f for f in foreign
             if f"{f.split(':')[0]}: {f.split(': ', 1)[1]}" not in ALLOWED_FOREIGN]
    assert not found, "\n".join(found)


def test_the_scan_sees_what_it_forbids(tmp_path):
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("class A:\n    def f(self):\n        self._x = 1\n        self._c.clear()\n")
    b.write_text("class B(A):\n    def g(self, k):\n        self._c[1] = 2\n"
                 "        super()._f()\n        return self._x, k._entries\n")
    writers, readers, foreign = scan([a, b])
    assert writers["_c"] == {"a.py", "b.py"} and readers["_x"] == {"b.py"}
    assert foreign == ["b.py:5: k._entries"]
