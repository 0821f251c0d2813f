"""Pytree cost of primforge.utils.dataclass against other pytree dataclasses.

Cases: classes of 10, 20 and 100 fields, a nested tree of 1000 nodes (a balanced binary
tree of node objects, each with one array leaf), and a 10-field class with a
``__post_init__`` (primforge rebuilds it through its marker path; ``register_dataclass``
runs the check on every rebuild). Operations, per case:

- ``flatten``: ``jax.tree_util.tree_flatten(obj)``;
- ``unflatten``: ``treedef.unflatten(leaves)``;
- ``jit in``: dispatch of a jitted function taking the object and returning one leaf;
- ``jit out``: dispatch of a jitted function taking one array and returning the object.

Libraries:

- ``primforge``: :func:`primforge.utils.dataclass` (JAX's C++ dataclass node, rebuilt
  without ``__init__``);
- ``primforge (callbacks)``: the same class registered with generated Python
  flatten/unflatten callbacks, primforge's fallback when JAX's C++ registry is unreachable
  (and its implementation before the C++ node was used);
- ``register_dataclass``: a frozen stdlib dataclass registered with
  :func:`jax.tree_util.register_dataclass` (rebuilds through ``__init__``);
- ``flax.struct`` and ``equinox.Module`` when those packages are installed.

Timings are interleaved: each repeat times every library once on the same case and
operation, in rotating order, so drifts in machine load hit all of them alike. Each number
is the median per-call time over ``--repeats`` repeats, in microseconds (the JSON also
has the minimum, the least noisy estimate on a loaded machine). Prints a table
(with each library's ratio to ``register_dataclass``) and writes
``benchmarks/results/pytree.json``.

Usage: ``python benchmarks/pytree.py [--repeats 9] [--min-time 0.05]`` (from the repository
root, or with primforge installed).
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
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from primforge.utils import _dataclass as pf_impl
from primforge.utils import dataclass as pf_dataclass

FIELD_COUNTS = (10, 20, 100)
N_NODES = 1000
VALIDATED = 10  # fields of the class with a __post_init__
BASELINE = "register_dataclass"
OPS = ("flatten", "unflatten", "jit in", "jit out")


def _annotations(n: int) -> dict[str, Any]:
    return {"__annotations__": {f"f{i}": Any for i in range(n)}}


def _node_annotations() -> dict[str, Any]:
    return {"__annotations__": {"value": Any, "left": Any, "right": Any}}


def _validated(n: int) -> dict[str, Any]:
    """A class whose ``__post_init__`` checks its fields (what user classes often have)."""

    def __post_init__(self: Any) -> None:
        if getattr(self, "f0", None) is None:
            raise ValueError("f0 is required")

    return {**_annotations(n), "__post_init__": __post_init__}


# Each maker turns (name, annotations) into a pytree class, or returns None if unavailable.
def _make_primforge(name: str, ns: dict[str, Any]) -> type:
    return pf_dataclass(type(name, (), dict(ns)))


def _make_primforge_callbacks(name: str, ns: dict[str, Any]) -> type:
    cls = dataclasses.dataclass(frozen=True)(type(name, (), dict(ns)))
    pf_impl._register_python(cls, list(ns["__annotations__"]), [], has_dict=True)
    return cls


def _make_register_dataclass(name: str, ns: dict[str, Any]) -> type:
    cls = dataclasses.dataclass(frozen=True)(type(name, (), dict(ns)))
    return jax.tree_util.register_dataclass(
        cls, data_fields=list(ns["__annotations__"]), meta_fields=[]
    )


def _make_flax(name: str, ns: dict[str, Any]) -> type | None:
    try:
        from flax import struct
    except ImportError:
        return None
    return struct.dataclass(type(name, (), dict(ns)))


def _make_equinox(name: str, ns: dict[str, Any]) -> type | None:
    try:
        import equinox as eqx
    except ImportError:
        return None
    return type(name, (eqx.Module,), dict(ns))


MAKERS: dict[str, Callable[[str, dict[str, Any]], type | None]] = {
    "primforge": _make_primforge,
    "primforge (callbacks)": _make_primforge_callbacks,
    "register_dataclass": _make_register_dataclass,
    "flax.struct": _make_flax,
    "equinox.Module": _make_equinox,
}


def _wide_instance(cls: type, n: int, leaf: Any) -> Any:
    return cls(**{f"f{i}": leaf for i in range(n)})


def _tree_instance(cls: type, leaf: Any) -> Any:
    def build(n: int) -> Any:
        # n nodes: this one plus balanced left/right subtrees.
        if n == 0:
            return None
        rest = n - 1
        return cls(value=leaf, left=build(rest // 2), right=build(rest - rest // 2))

    return build(N_NODES)


def _cases(maker: Callable[[str, dict[str, Any]], type | None], lib: str) -> dict[str, Any]:
    """Case name -> (numpy-leaf instance, jax-leaf instance), or {} when unavailable."""
    tag = "".join(c if c.isalnum() else "_" for c in lib)
    np_leaf, jax_leaf = np.zeros((), np.float32), jnp.zeros((), jnp.float32)
    out = {}
    for n in FIELD_COUNTS:
        cls = maker(f"Wide{n}_{tag}", _annotations(n))
        if cls is None:
            return {}
        out[f"{n}-field class"] = (_wide_instance(cls, n, np_leaf),
                                   _wide_instance(cls, n, jax_leaf))
    cls = maker(f"Node_{tag}", _node_annotations())
    if cls is None:
        return {}
    out[f"tree of {N_NODES} nodes"] = (_tree_instance(cls, np_leaf), _tree_instance(cls, jax_leaf))
    cls = maker(f"Checked{VALIDATED}_{tag}", _validated(VALIDATED))
    out[f"{VALIDATED}-field, __post_init__"] = (
        _wide_instance(cls, VALIDATED, np_leaf),
        _wide_instance(cls, VALIDATED, jax_leaf),
    )
    return out


def _statements(np_obj: Any, jax_obj: Any) -> dict[str, Callable[[], Any]]:
    leaves, treedef = jax.tree_util.tree_flatten(np_obj)
    rebuilt = treedef.unflatten(leaves)
    assert type(rebuilt) is type(np_obj) and jax.tree_util.tree_structure(rebuilt) == treedef
    jax_leaves = jax.tree_util.tree_leaves(jax_obj)
    take_in = jax.jit(lambda t: jax.tree_util.tree_leaves(t)[0])
    give_out = jax.jit(lambda x: jax.tree_util.tree_unflatten(treedef, [x] * len(leaves)))
    x = jax_leaves[0]
    # Compile once, outside the timings, and check the results.
    assert float(take_in(jax_obj)) == 0.0
    assert jax.tree_util.tree_structure(give_out(x)) == treedef
    return {
        "flatten": lambda: jax.tree_util.tree_flatten(np_obj),
        "unflatten": lambda: treedef.unflatten(leaves),
        "jit in": lambda: take_in(jax_obj),
        "jit out": lambda: give_out(x),
    }


def _number(stmt: Callable[[], Any], min_time: float) -> int:
    number, took = timeit.Timer(stmt).autorange()
    return max(1, int(number * min_time / max(took, 1e-9)))


def measure(repeats: int, min_time: float) -> list[dict[str, Any]]:
    per_lib: dict[str, dict[str, Any]] = {}
    for lib, maker in MAKERS.items():
        cases = _cases(maker, lib)
        if not cases:
            print(f"# {lib}: not installed, skipped", file=sys.stderr)
            continue
        per_lib[lib] = cases
    libs = list(per_lib)
    rows = []
    for case in next(iter(per_lib.values())):
        stmts = {lib: _statements(*per_lib[lib][case]) for lib in libs}
        row_times: dict[str, dict[str, float]] = {lib: {} for lib in libs}
        for op in OPS:
            print(f"# {case}: {op}", file=sys.stderr)
            numbers = {lib: _number(stmts[lib][op], min_time) for lib in libs}
            samples: dict[str, list[float]] = {lib: [] for lib in libs}
            for r in range(repeats):
                for lib in libs[r % len(libs) :] + libs[: r % len(libs)]:
                    took = timeit.Timer(stmts[lib][op]).timeit(numbers[lib])
                    samples[lib].append(took / numbers[lib] * 1e6)
            for lib in libs:
                row_times[lib][op] = statistics.median(samples[lib])
                row_times[lib][op + " min"] = min(samples[lib])
        for lib in libs:
            rows.append(
                {
                    "library": lib,
                    "case": case,
                    **{f"{op.replace(' ', '_')}_us": row_times[lib][op] for op in OPS},
                    **{
                        f"{op.replace(' ', '_')}_min_us": row_times[lib][op + " min"]
                        for op in OPS
                    },
                }
            )
    return rows


def _table(rows: list[dict[str, Any]], suffix: str = "_us") -> str:
    base = {r["case"]: r for r in rows if r["library"] == BASELINE}
    cols = [op.replace(" ", "_") + suffix for op in OPS]
    times = " | ".join(f"{op + ' (us)':>19}" for op in OPS)
    head = f"| {'case':<23} | {'library':<21} | " + times + " |"
    lines = [head, "|" + "|".join("-" * len(c) for c in head.split("|")[1:-1]) + "|"]
    for r in rows:
        cells = []
        for c in cols:
            b = base.get(r["case"], {}).get(c)
            ratio = f" ({r[c] / b:4.2f}x)" if b else ""
            cells.append(f"{r[c]:>10.2f}{ratio:>9}")
        lines.append(f"| {r['case']:<23} | {r['library']:<21} | " + " | ".join(cells) + " |")
    lines.append(f"(ratio: time / {BASELINE}'s time; below 1 is faster)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9, help="interleaved repeats (median taken)")
    parser.add_argument("--min-time", type=float, default=0.05, help="seconds per repeat")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).parent / "results" / "pytree.json",
        help="JSON output path",
    )
    args = parser.parse_args(argv)
    rows = measure(args.repeats, args.min_time)
    print("median per-call time")
    print(_table(rows))
    print("\nminimum per-call time")
    print(_table(rows, "_min_us"))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "python": platform.python_version(),
        "jax": jax.__version__,
        "machine": platform.machine(),
        "repeats": args.repeats,
        "statistic": "median per-call time, microseconds (interleaved repeats)",
        "baseline": BASELINE,
    }
    args.out.write_text(json.dumps({"meta": meta, "results": rows}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
