"""The ``primforge`` command: list, inspect, benchmark, check and autotune kernels.

Usage errors exit with status 2 before anything runs; ``check`` exits 1 when a backend
fails or disagrees with its reference. The package: ``_parser``, ``_common``,
``_commands``, ``_autotune``; this module imports the ``--import`` targets and dispatches.

Example:
    >>> main(['list', '--tags', 'no-such-tag-anywhere'])
    2
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types
from collections.abc import Sequence
from pathlib import Path

from primforge import autotune, registry
from primforge.cli._autotune import _cmd_autotune
from primforge.cli._commands import _cmd_bench, _cmd_check, _cmd_info, _cmd_list
from primforge.cli._common import _err, kernel_summary
from primforge.cli._parser import _STATS, _split, build_parser  # noqa: F401  (_STATS: tests)

__all__ = ["build_parser", "kernel_summary", "main"]

_COMMANDS = {
    "list": _cmd_list,
    "info": _cmd_info,
    "bench": _cmd_bench,
    "check": _cmd_check,
    "autotune": _cmd_autotune,
}


def _import_target(target: str) -> str | None:
    """Prepare ``--import TARGET``: import a file path now (returns None), or make the
    current directory importable, as ``python -m`` does, and return the module name."""
    looks_like_path = target.endswith(".py") or os.sep in target or (
        os.altsep is not None and os.altsep in target)
    if not looks_like_path:
        cwd = os.getcwd()
        if cwd not in sys.path and "" not in sys.path:
            sys.path.insert(0, cwd)
        return target
    path = Path(target).expanduser().resolve()
    if not path.is_file():
        raise ImportError(f"--import {target!r}: no such file")
    if path.suffix != ".py":
        raise ImportError(f"--import {target!r}: expected a module name or a .py file")
    name = path.stem
    loaded = sys.modules.get(name)
    if loaded is not None:
        if Path(getattr(loaded, "__file__", "") or "").resolve() == path:
            return None
        raise ImportError(
            f"--import {target!r}: a different module named {name!r} is already imported "
            f"({getattr(loaded, '__file__', None) or 'built in'}); rename the file"
        )
    # Like `python path/to/file.py`: the file's folder is importable, so the module can
    # import its siblings.
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:  # pragma: no cover - a .py file always has one
        raise ImportError(f"--import {target!r}: cannot be loaded as a module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return None


def _stored_or_registered(names) -> list:
    """``autotune --show/--clear NAME``: a stored choice is found by its kernel's name even
    when the module defining that kernel was not imported (only ``.name`` is used)."""
    stored = autotune.choices()
    registered = {k.name for k in registry.list_kernels()}
    return [
        types.SimpleNamespace(name=n) if n in stored and n not in registered
        else registry.get_kernel(n)
        for n in dict.fromkeys(names)
    ]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``primforge`` command; returns the exit status.

    Example:
        >>> main(['info', 'doc_cli_missing_kernel'])
        2
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        names = [_import_target(m) for m in [*args.imports_global, *args.imports]]
        notes = registry.load_modules([n for n in names if n is not None])
    except ImportError as e:
        _err(str(e))
        return 2
    for note in notes:
        _err(f"note: {note}")
    if autotune.enabled():
        try:
            autotune.load()
        except (TypeError, ValueError) as e:
            _err(str(e))
    try:
        if args.command == "info":
            kernels = [registry.get_kernel(args.name)]
        elif args.command == "autotune" and (args.clear or args.show) and not args.tags:
            kernels = _stored_or_registered(args.names)
        else:
            kernels = registry.select_kernels(args.names, _split(args.tags), args.match)
    except (registry.UnknownKernelError, registry.UnknownTagError) as e:
        _err(str(e))
        return 2
    try:
        return _COMMANDS[args.command](args, kernels)
    except ValueError as e:  # bad platform, backend, tolerances: a usage error
        _err(str(e))
        return 2

