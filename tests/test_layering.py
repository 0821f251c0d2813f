"""The package's imports go one way: down the layers, with no cycle between modules.

Every module of ``primforge`` is parsed with :mod:`ast`; every ``import`` statement counts,
at module level and inside functions (a lazy import is still a dependency), except those
under ``if TYPE_CHECKING:`` (annotations only, never run). Each module is placed in a
layer by the longest matching prefix in :data:`LAYERS`, so a new submodule of a known
package is placed automatically; a module no prefix matches fails the test until it is
added to the map. A module may import from its own layer or below. Separately, the graph
of module-to-module imports must have no cycle, within a layer too.

What counts as an edge: ``import a.b`` depends on ``a.b``; ``from a import b`` on the
module ``a.b`` when it exists, else on ``a`` (the package's ``__init__``). Python also runs
the ``__init__`` of every parent package on import; those implicit imports are not edges
(every module would otherwise depend on ``primforge/__init__.py``). Imports done by name
at run time (``importlib.import_module``) are not seen.
"""

from __future__ import annotations

import ast
import itertools
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "primforge"

#: Bottom to top: a module may import only from its own layer or a lower one.
LAYERS: list[tuple[str, list[str]]] = [
    # primforge.sim's loop tools import nothing of primforge; the operator library uses the
    # thread team. The COBA model built on them and on the operators is a layer of its own.
    ("leaves", ["primforge._compat", "primforge._cache", "primforge.debug", "primforge.sim",
                "primforge.sim.fusion", "primforge.sim.online", "primforge.sim.team"]),
    ("core", ["primforge.utils", "primforge.params", "primforge.primitive", "primforge.rules"]),
    ("backends", ["primforge.backends"]),
    ("store", ["primforge.registry", "primforge.bench"]),
    ("kernel", ["primforge.kernel"]),
    ("autotune", ["primforge.autotune"]),
    ("library", ["primforge.ops", "primforge.testing", "primforge._gpu_compile"]),
    ("simulation", ["primforge.sim.coba"]),
    ("entry points", ["primforge.cli", "primforge.__main__", "primforge", "primforge.runtime",
                      "primforge.distributed"]),
]

#: Prefixes that match only the module itself, not its submodules: the top package's
#: ``__init__`` sits at the top, but ``primforge.newthing`` must not be placed there; the
#: ``__init__`` of ``primforge.sim`` is a leaf, but not every module under it.
EXACT = {"primforge", "primforge.sim"}


def module_files() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = module_files()


def layer_of(module: str) -> int | None:
    """Index in LAYERS of the longest prefix that matches ``module`` (None: unknown)."""
    best, best_len = None, -1
    for i, (_name, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            hit = module == prefix or (prefix not in EXACT and module.startswith(prefix + "."))
            if hit and len(prefix) > best_len:
                best, best_len = i, len(prefix)
    return best


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST):
    """Every Import/ImportFrom node, skipping the bodies of ``if TYPE_CHECKING:``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def _resolve(module: str, path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if path.name != "__init__.py":
        base = base[:-1]
    base = base[: len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _known(name: str) -> str | None:
    """The module of the package that ``name`` refers to (its longest known prefix)."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in MODULES:
            return candidate
        parts.pop()
    return None


def import_edges() -> dict[str, dict[str, int]]:
    """module -> {imported module of the package: line of the first such import}."""
    edges: dict[str, dict[str, int]] = defaultdict(dict)
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in _imports(tree):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = _resolve(module, path, node)
                targets = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base
                    for a in node.names
                ]
            for target in targets:
                if not (target == "primforge" or target.startswith("primforge.")):
                    continue
                found = _known(target)
                if found is not None and found != module:
                    edges[module].setdefault(found, node.lineno)
    return edges


def find_cycles(edges: dict[str, dict[str, int]], nodes=None):
    """One cycle (a closed path of modules) per strongly connected group of two or more
    modules, and the groups (every module of a group is on some cycle with the others)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []
    counter = [0]

    def visit(v: str) -> None:  # Tarjan; the package is small enough for recursion
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(MODULES if nodes is None else nodes):
        if v not in index:
            visit(v)

    cycles = []
    for group in groups:
        start = min(group)
        # Shortest way back to ``start`` inside the group (breadth first).
        previous = {start: None}
        queue = [start]
        end = None
        while queue and end is None:
            v = queue.pop(0)
            for w in sorted(edges.get(v, {})):
                if w not in group:
                    continue
                if w == start:
                    end = v
                    break
                if w not in previous:
                    previous[w] = v
                    queue.append(w)
        path = [end]
        while path[-1] != start:
            path.append(previous[path[-1]])
        cycles.append([*reversed(path), start])
    return cycles, [sorted(g) for g in groups]


def _fmt_cycle(cycle: list[str], edges) -> str:
    steps = [cycle[0]]
    for a, b in itertools.pairwise(cycle):
        steps.append(f"-> {b} (line {edges[a][b]} of {a})")
    return " ".join(steps)


def test_every_module_has_a_layer():
    unknown = sorted(m for m in MODULES if layer_of(m) is None)
    assert not unknown, (
        f"modules not in the layer map of tests/test_layering.py: {unknown}; add each to "
        f"LAYERS (or a package prefix that covers it) at the layer it belongs to"
    )


def test_imports_only_go_down():
    edges = import_edges()
    upward = []
    for module, targets in sorted(edges.items()):
        here = layer_of(module)
        for target, line in sorted(targets.items()):
            there = layer_of(target)
            if here is not None and there is not None and there > here:
                upward.append(
                    f"{MODULES[module].relative_to(ROOT)}:{line}: {module} "
                    f"(layer {LAYERS[here][0]!r}) imports {target} (layer {LAYERS[there][0]!r})"
                )
    assert not upward, "imports that go up the layers:\n  " + "\n  ".join(upward)


def test_no_import_cycles():
    edges = import_edges()
    cycles, groups = find_cycles(edges)
    assert not cycles, "import cycles between modules:\n  " + "\n  ".join(
        _fmt_cycle(c, edges) + (f" [all of {g} are on cycles]" if len(g) > len(c) - 1 else "")
        for c, g in zip(cycles, groups)
    )


# ------------------------------------------------------------- the checker itself
def test_checker_sees_lazy_imports_and_skips_type_checking():
    src = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from primforge.kernel import kernel\n"
        "def f():\n    from primforge import autotune\n"
    )
    tree = ast.parse(src)
    seen = [n.module for n in _imports(tree) if isinstance(n, ast.ImportFrom)]
    assert sorted(seen) == ["primforge", "typing"]


def test_layer_map_places_submodules_by_prefix():
    assert LAYERS[layer_of("primforge.backends.some_new_backend")][0] == "backends"
    assert LAYERS[layer_of("primforge.kernel.some_new_part")][0] == "kernel"
    assert LAYERS[layer_of("primforge")][0] == "entry points"
    assert LAYERS[layer_of("primforge.sim.coba.some_new_part")][0] == "simulation"
    assert layer_of("primforge.sim.some_new_tool") is None  # a leaf or a model: say which
    assert layer_of("primforge.something_unmapped") is None


def test_cycle_finder_reports_a_closed_path():
    edges = {"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3}, "d": {"a": 4}}
    assert find_cycles(edges, "abcd") == ([["a", "b", "c", "a"]], [["a", "b", "c"]])
    assert find_cycles({"a": {"b": 1}, "b": {}}, "ab") == ([], [])


@pytest.mark.parametrize("module", ["primforge.registry", "primforge.bench._run"])
def test_store_layer_does_not_reach_the_kernel(module):
    """The registry and the benchmark runner work on kernel objects they are handed."""
    reached = set(import_edges().get(module, {}))
    assert not {m for m in reached if f"{m}.".startswith("primforge.kernel.")}


# ------------------------------------------------------------- the operator families
OPS = "primforge.ops"
#: What every family of :mod:`primforge.ops` builds on (it imports no family).
OPS_SHARED = {f"{OPS}._scaffold", f"{OPS}._sharding", f"{OPS}._pallas_common", f"{OPS}.packed",
              f"{OPS}._spikes", f"{OPS}._prefetch", f"{OPS}._operator"}
#: Modules over the families: they wrap CSR and fixed-number matrices.
OPS_OVER = {f"{OPS}.column_index": {"csr", "fixed_num"}, f"{OPS}.connectivity": {"csr"}}
#: Each family (a folder of primforge.ops) and the families and modules above it may import.
FAMILIES: dict[str, set[str]] = {
    "csr": set(),
    "dense_event": set(),
    "jitconn": set(),
    "fixed_num": {"csr"},  # the CSR kernels' threading-layer check
    "plasticity": {"csr", "fixed_num", "column_index", "connectivity"},
    "delay": {"csr", "fixed_num", "connectivity", "jitconn"},
}
#: The module roles every family folder has; the optional roles some families add (a
#: family whose GPU path is the ``jax`` reference has no ``pallas`` module).
FAMILY_ROLES = {"__init__", "api", "numba", "bench"}
OPTIONAL_ROLES = {"pallas", "matrix", "structure", "grad", "cuda", "generator", "numba_columns",
                  "convert", "slicing", "sddmm", "indexed", "packed", "numba_spikes",
                  "numba_grad",
                  "ring", "csr", "jitc", "read"}  # the delayed products: buffer, formats, read


def _ops_unit(module: str) -> str | None:
    """The family or top-level module of primforge.ops that ``module`` belongs to."""
    if not module.startswith(OPS + "."):
        return None
    return module[len(OPS) + 1:].split(".")[0]


def test_every_ops_folder_is_a_declared_family_of_the_same_shape():
    root = PACKAGE / "ops"
    folders = {p.name for p in root.iterdir() if (p / "__init__.py").is_file()}
    assert folders == set(FAMILIES), (
        f"family folders {sorted(folders)} differ from FAMILIES in tests/test_layering.py")
    for name in sorted(folders):
        roles = {p.stem for p in (root / name).glob("*.py")}
        assert FAMILY_ROLES <= roles, f"primforge/ops/{name} lacks {FAMILY_ROLES - roles}"
        assert roles <= FAMILY_ROLES | OPTIONAL_ROLES, (
            f"primforge/ops/{name} has modules of no known role: "
            f"{roles - FAMILY_ROLES - OPTIONAL_ROLES}")


def test_ops_families_import_only_what_they_build_on():
    wrong = []
    for module, targets in sorted(import_edges().items()):
        unit = _ops_unit(module)
        if unit is None:
            continue
        if module in OPS_SHARED:
            allowed = {f"{OPS}.{m.rsplit('.', 1)[1]}" for m in OPS_SHARED}
        elif module in OPS_OVER:
            allowed = OPS_SHARED | {f"{OPS}.{f}" for f in OPS_OVER[module]}
        elif unit in FAMILIES:
            allowed = OPS_SHARED | {f"{OPS}.{f}" for f in FAMILIES[unit] | {unit}}
        else:
            continue
        for target, line in sorted(targets.items()):
            there = _ops_unit(target)
            if target == OPS or (there is not None and not any(
                    target == a or target.startswith(a + ".") for a in allowed)):
                wrong.append(f"{MODULES[module].relative_to(ROOT)}:{line}: {module} imports "
                             f"{target}")
    assert not wrong, "imports across the operator families:\n  " + "\n  ".join(wrong)


def test_no_module_imports_a_family_bench_module():
    """Benchmark cases are loaded by name when benchmark data is asked for, never imported."""
    wrong = [f"{module} imports {target}" for module, targets in sorted(import_edges().items())
             for target in targets
             if _ops_unit(target) in FAMILIES and target.endswith(".bench")
             and not module.endswith(".bench")]
    assert not wrong, wrong


def test_importing_ops_leaves_the_benchmark_cases_unloaded():
    import os
    import subprocess
    import sys

    benches = [f"{OPS}.{name}.bench" for name in sorted(FAMILIES)]
    code = ("import sys, primforge.ops\n"
            f"print([m for m in {benches!r} if m in sys.modules])\n"
            "import primforge.ops.csr.bench\n"
            "print('primforge.ops.csr.bench' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert out.stdout.split() == ["[]", "True"], out.stdout + out.stderr


def test_the_simulation_tools_load_neither_the_model_nor_the_operators():
    """``primforge`` and ``primforge.ops`` import ``primforge.sim`` (a leaf): that must not
    load the COBA model, which imports the operators and registers kernels."""
    import os
    import subprocess
    import sys

    code = ("import sys, primforge, primforge.sim\n"
            "print([m for m in ('primforge.ops', 'primforge.sim.coba') if m in sys.modules])\n"
            "import primforge.ops\n"
            "print('primforge.sim.coba' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert out.stdout.split() == ["[]", "False"], out.stdout + out.stderr
