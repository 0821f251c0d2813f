"""Import a migrated example module by file name (once per test session)."""

import importlib.util
import pathlib
import sys

HERE = pathlib.Path(__file__).parent


def load(stem: str):
    """The module ``tests/migration/<stem>.py``, imported once under ``migration_<stem>``."""
    name = f"migration_{stem}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, HERE / f"{stem}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_again(stem: str):
    """A fresh second import of the same file (what re-running a notebook cell does)."""
    spec = importlib.util.spec_from_file_location(f"migration_{stem}_again", HERE / f"{stem}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
