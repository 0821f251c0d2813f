"""The repository's scripts (``benchmarks/``, ``examples/``) loaded as modules by tests."""

from __future__ import annotations

import importlib.util
import pathlib
import sys
from types import ModuleType

ROOT = pathlib.Path(__file__).resolve().parents[1]


def load_script(relpath: str, name: str, *, register: bool = False) -> ModuleType:
    """The script at ``ROOT / relpath`` as a fresh module called ``name``.

    With ``register`` the module goes into ``sys.modules`` before it runs (dataclasses
    resolve their annotations through it, and numba-cuda imports a kernel's module), and a
    module already registered under ``name`` from the same file is returned as it is, with
    whatever it compiled.
    """
    path = ROOT / relpath
    if register:
        known = sys.modules.get(name)
        if known is not None and pathlib.Path(getattr(known, "__file__", "") or "") == path:
            return known
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    if register:
        sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
