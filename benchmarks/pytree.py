"""Flatten/unflatten cost of primforge.utils.dataclass against other pytree dataclasses.

Compares, on a 100-field class and on a nested tree of 1000 nodes (a balanced binary tree
of node objects, each with one array leaf):

- ``primforge``: :func:`primforge.utils.dataclass` (generated flatten/unflatten,
  unflatten through ``object.__new__``);
- ``register_dataclass``: a frozen stdlib dataclass registered with
  :func:`jax.tree_util.register_dataclass` (JAX's C++ dataclass node);
- ``flax.struct`` and ``equinox.Module`` when those packages are installed (skipped
  otherwise).

Each timing is the median over ``--repeats`` runs of :mod:`timeit` (per-call time, in
microseconds). Prints a table and writes ``benchmarks/results/pytree.json``.

Usage: ``python benchmarks/pytree.py [--repeats 7] [--min-time 0.05]``
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import statistics
import sys
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np

from primforge.utils import dataclass as pf_dataclass

N_FIELDS = 100
N_NODES = 1000


def _annotations(n: int) -> dict[str, Any]:
    return {f"f{i}": Any for i in range(n)}


def _node_annotations() -> dict[str, Any]:
    return {"value": Any, "left": Any, "right": Any}


# Each maker turns (name, annotations) into a pytree class, or returns None if unavailable.
def _make_primforge(name: str, ann: dict[str, Any]) -> type:
    return pf_dataclass(type(name, (), {"__annotations__": dict(ann)}))


def _make_register_dataclass(name: str, ann: dict[str, Any]) -> type:
    cls = dataclasses.dataclass(frozen=True)(type(name, (), {"__annotations__": dict(ann)}))
    return jax.tree_util.register_dataclass(cls, data_fields=list(ann), meta_fields=[])


def _make_flax(name: str, ann: dict[str, Any]) -> type | None:
    try:
        from flax import struct
    except ImportError:
        return None
    return struct.dataclass(type(name, (), {"__annotations__": dict(ann)}))


def _make_equinox(name: str, ann: dict[str, Any]) -> type | None:
    try:
        import equinox as eqx
    except ImportError:
        return None
    return type(name, (eqx.Module,), {"__annotations__": dict(ann)})


MAKERS: dict[str, Callable[[str, dict[str, Any]], type | None]] = {
    "primforge": _make_primforge,
    "register_dataclass": _make_register_dataclass,
    "flax.struct": _make_flax,
    "equinox.Module": _make_equinox,
}


def _wide_instance(cls: type) -> Any:
    leaf = np.zeros((), np.float32)
    return cls(**{f"f{i}": leaf for i in range(N_FIELDS)})


def _tree_instance(cls: type) -> Any:
    leaf = np.zeros((), np.float32)

    def build(n: int) -> Any:
        # n nodes: this one plus balanced left/right subtrees.
        if n == 0:
            return None
        rest = n - 1
        return cls(value=leaf, left=build(rest // 2), right=build(rest - rest // 2))

    return build(N_NODES)


def _median_us(stmt: Callable[[], Any], repeats: int, min_time: float) -> float:
    timer = timeit.Timer(stmt)
    number, _ = timer.autorange()
    number = max(1, int(number * min_time / 0.2))
    runs = timer.repeat(repeat=repeats, number=number)
    return statistics.median(runs) / number * 1e6


def measure(repeats: int, min_time: float) -> list[dict[str, Any]]:
    rows = []
    for lib, maker in MAKERS.items():
        wide_cls = maker(f"Wide_{lib.replace('.', '_')}", _annotations(N_FIELDS))
        node_cls = maker(f"Node_{lib.replace('.', '_')}", _node_annotations())
        if wide_cls is None or node_cls is None:
            print(f"# {lib}: not installed, skipped", file=sys.stderr)
            continue
        for case, obj in (
            (f"{N_FIELDS}-field class", _wide_instance(wide_cls)),
            (f"tree of {N_NODES} nodes", _tree_instance(node_cls)),
        ):
            leaves, treedef = jax.tree_util.tree_flatten(obj)
            rebuilt = treedef.unflatten(leaves)
            assert type(rebuilt) is type(obj)
            assert jax.tree_util.tree_structure(rebuilt) == treedef
            rows.append(
                {
                    "library": lib,
                    "case": case,
                    "leaves": len(leaves),
                    "flatten_us": _median_us(
                        lambda o=obj: jax.tree_util.tree_flatten(o), repeats, min_time
                    ),
                    "unflatten_us": _median_us(
                        lambda t=treedef, lv=leaves: t.unflatten(lv), repeats, min_time
                    ),
                }
            )
    return rows


def _table(rows: list[dict[str, Any]]) -> str:
    head = f"| {'case':<22} | {'library':<18} | {'flatten (us)':>12} | {'unflatten (us)':>14} |"
    lines = [head, "|" + "|".join("-" * (len(c) + 0) for c in head.split("|")[1:-1]) + "|"]
    for r in rows:
        lines.append(
            f"| {r['case']:<22} | {r['library']:<18} | {r['flatten_us']:>12.2f} "
            f"| {r['unflatten_us']:>14.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="timeit repeats (median taken)")
    parser.add_argument("--min-time", type=float, default=0.05, help="seconds per repeat")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).parent / "results" / "pytree.json",
        help="JSON output path",
    )
    args = parser.parse_args(argv)
    rows = measure(args.repeats, args.min_time)
    print(_table(rows))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "python": platform.python_version(),
        "jax": jax.__version__,
        "machine": platform.machine(),
        "repeats": args.repeats,
        "statistic": "median per-call time, microseconds",
    }
    args.out.write_text(json.dumps({"meta": meta, "results": rows}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
