"""Tests for primforge._compat: the one home of JAX internals, and its version shims.

* Hygiene: every module of the package is parsed with :mod:`ast`; outside ``_compat.py``
  no ``import`` (lazy ones included), no ``importlib.import_module("...")`` and no
  attribute chain (``jax.core.Tracer``) may reach ``jax._src``, ``jax.core``,
  ``jax.interpreters`` or a jaxlib submodule. ``import jaxlib`` for its ``__version__``
  is public and allowed.
* The supported JAX range is stated in four places (``MIN_JAX_VERSION``, the ``jax>=``
  requirement in pyproject.toml, the pinned old-JAX run in ``.ci/run``, the README) and
  they must agree.
* The shims are checked against what JAX itself does (shard_map's typing of inputs by
  their ``in_specs``, ``jax.tree_util`` flattening), on whichever JAX is installed.
"""

from __future__ import annotations

import ast
import dataclasses
import re
import tomllib
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from primforge import _compat

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "primforge"
COMPAT = PACKAGE / "_compat.py"

#: JAX internals (or modules JAX is emptying), with everything under them.
INTERNAL = ("jax._src", "jax.core", "jax.interpreters")
#: ``from jax import X`` / ``from jaxlib import X`` names that reach the same places.
INTERNAL_FROM = {"jax": {"_src", "core", "interpreters"}, "jaxlib": None}  # None: any name


def _is_internal(module: str) -> bool:
    return module.startswith("jaxlib.") or any(
        module == p or module.startswith(p + ".") for p in INTERNAL)


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def internal_uses(source: str, filename: str = "<string>") -> list[tuple[int, str]]:
    """(line, what) for each reach into JAX internals in ``source``."""
    found = []
    tree = ast.parse(source, filename)
    for parent in ast.walk(tree):  # report each attribute chain once, by its outer node
        for child in ast.iter_child_nodes(parent):
            child._parent = parent  # type: ignore[attr-defined]
    aliases = {"jax": "jax", "jaxlib": "jaxlib"}  # local name -> module it stands for
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                root = a.name.split(".")[0]
                if root in ("jax", "jaxlib"):
                    aliases[a.asname or root] = a.name if a.asname else root
                if _is_internal(a.name):
                    found.append((node.lineno, f"import {a.name}"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if _is_internal(node.module):
                found.append((node.lineno, f"from {node.module} import ..."))
            elif node.module in INTERNAL_FROM:
                bad = INTERNAL_FROM[node.module]
                for a in node.names:
                    if bad is None or a.name in bad:
                        found.append((node.lineno, f"from {node.module} import {a.name}"))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            fn = _dotted(node.func)
            arg = node.args[0].value
            if fn in ("importlib.import_module", "import_module", "__import__") and \
                    isinstance(arg, str) and _is_internal(arg):
                found.append((node.lineno, f"{fn}({arg!r})"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and not isinstance(getattr(node, "_parent", None),
                                                              ast.Attribute):
            name = _dotted(node)
            if name is None:
                continue
            head, _, rest = name.partition(".")
            if head not in aliases:
                continue
            full = aliases[head] + ("." + rest if rest else "")
            if full != "jaxlib.__version__" and _is_internal(full):
                found.append((node.lineno, full))
    return sorted(set(found))


# ---------------------------------------------------------------------------- hygiene
@pytest.mark.parametrize("source, expected", [
    ("from jax._src import core", ["from jax._src import ..."]),
    ("import jax._src.dispatch as d", ["import jax._src.dispatch"]),
    ("def f():\n    from jax.interpreters import mlir", ["from jax.interpreters import ..."]),
    ("from jax import core", ["from jax import core"]),
    ("from jaxlib import xla_client", ["from jaxlib import xla_client"]),
    ("import jaxlib.mlir.ir", ["import jaxlib.mlir.ir"]),
    ("import jax\nx = jax.core.Tracer", ["jax.core.Tracer"]),
    ("import jax as j\nx = j._src.core", ["jax._src.core"]),
    ("import importlib\nm = importlib.import_module('jax._src.lib')",
     ["importlib.import_module('jax._src.lib')"]),
    ("import jaxlib\nv = jaxlib.xla_extension", ["jaxlib.xla_extension"]),
])
def test_checker_finds_internal_uses(source, expected):
    assert [what for _, what in internal_uses(source)] == expected


@pytest.mark.parametrize("source", [
    "import jax\nimport jax.numpy as jnp\nfrom jax.extend.core import Primitive",
    "import jaxlib\nv = jaxlib.__version__",
    "from jax import ffi, export, custom_batching",
    "import logging\nlogging.getLogger('jax._src.debugging')",  # a logger's name, no import
    "from primforge._compat import mlir, Tracer",
    "from . import core",
])
def test_checker_allows_public_uses(source):
    assert internal_uses(source) == []


def test_only_compat_reaches_into_jax_internals():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == COMPAT:
            continue
        rel = path.relative_to(ROOT)
        offenders += [f"{rel}:{line}: {what}"
                      for line, what in internal_uses(path.read_text(), str(path))]
    assert not offenders, (
        "JAX internals are imported only in primforge/_compat.py (re-export the name "
        "there and import it from primforge._compat):\n" + "\n".join(offenders))


# ------------------------------------------------------------------- supported range
#: What ``jax.core`` still exports in JAX 0.11 (the rest was removed there).
JAX_CORE_KEPT = {"AbstractValue", "Atom", "ParamDict", "ShapedArray", "Trace", "Tracer", "Value",
                 "ensure_compile_time_eval", "eval_context", "eval_jaxpr", "max_dim", "min_dim"}


def test_compat_takes_from_jax_core_only_what_jax_011_keeps():
    tree = ast.parse(COMPAT.read_text())
    taken = {a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
             and node.module == "jax.core" for a in node.names}
    assert taken and taken <= JAX_CORE_KEPT, taken - JAX_CORE_KEPT


def test_no_module_relies_on_jnp_empty():
    """``jnp.empty``/``empty_like`` return uninitialised memory from JAX 0.11 (zeros before)."""
    found = [f"{p.relative_to(ROOT)}:{n}" for p in sorted(PACKAGE.rglob("*.py"))
             for n, line in enumerate(p.read_text().splitlines(), 1)
             if re.search(r"\bjnp\.empty(_like)?\(|\bjax\.numpy\.empty", line)]
    assert not found, found


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split("."))


def test_min_jax_version_matches_pyproject_and_ci():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    req = [d for d in project["dependencies"] if re.match(r"jax\b(?!lib)", d)]
    assert len(req) == 1, project["dependencies"]
    low = re.search(r">=\s*([0-9.]+)", req[0])
    assert low, f"the jax requirement {req[0]!r} states no lower bound"
    assert _version(low.group(1)) == _compat.MIN_JAX_VERSION
    ci = (ROOT / ".ci" / "run").read_text()
    pinned = re.search(r"^OLD_JAX=([0-9.]+)$", ci, re.MULTILINE)
    assert pinned and _version(pinned.group(1)) == _compat.MIN_JAX_VERSION
    assert '"jax==$OLD_JAX" "jaxlib==$OLD_JAX"' in ci
    low_text = ".".join(map(str, _compat.MIN_JAX_VERSION))
    readme = (ROOT / "README.md").read_text()
    assert f"Supported JAX: {low_text} and newer (`jax>={low_text}`)" in readme


def test_jax_without_a_needed_api_fails_at_import_naming_the_version():
    import types

    old = types.SimpleNamespace(__version__="0.7.1", shard_map=1, typeof=1, ffi=1)
    with pytest.raises(ImportError, match=r"needs JAX 0\.8\.0 or newer; the installed jax "
                                          r"0\.7\.1 has no jax\.make_user_context"):
        _compat._check_jax(old)
    _compat._check_jax(jax)  # the installed one has everything


def test_installed_jax_is_in_the_supported_range():
    # The import succeeded, so at least say loudly if it is older than what is tested.
    assert _compat.JAX_VERSION >= _compat.MIN_JAX_VERSION, jax.__version__


# ---------------------------------------------------------------------------- shims
def _in_shard_map(body, *args, in_specs):
    mesh = jax.make_mesh((1,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))
    f = jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=P())
    return jax.jit(f)(*args)


def test_varying_axes_follows_shard_map_in_specs():
    seen = {}

    def body(a, b):
        seen["a"] = _compat.varying_axes(jax.typeof(a))
        seen["b"] = _compat.varying_axes(jax.typeof(b))
        return jnp.zeros(())

    _in_shard_map(body, jnp.ones(2), jnp.ones(2), in_specs=(P("x"), P()))
    # An input split over "x" varies over "x"; a replicated one varies over nothing.
    assert seen == {"a": frozenset({"x"}), "b": frozenset()}
    assert _compat.varying_axes(jax.typeof(jnp.ones(2))) == frozenset()
    assert _compat.varying_axes(jax.ShapeDtypeStruct((2,), jnp.float32)) == frozenset()


def test_varying_kwargs_carry_and_replace_the_type():
    seen = {}

    def body(a, b):
        va, vb = jax.typeof(a), jax.typeof(b)
        # Carried over: a struct and an updated aval keep the input's type.
        s = jax.ShapeDtypeStruct((3,), jnp.int32, sharding=va.sharding,
                                 **_compat.varying_kwargs(va))
        seen["struct"] = _compat.varying_axes(s)
        seen["update"] = _compat.varying_axes(vb.update(shape=(5,),
                                                        **_compat.varying_kwargs(va)))
        seen["replaced"] = _compat.varying_axes(
            va.update(**_compat.varying_kwargs(va, frozenset())))
        seen["added"] = _compat.varying_axes(
            vb.update(**_compat.varying_kwargs(vb, frozenset({"x"}))))
        return jnp.zeros(())

    _in_shard_map(body, jnp.ones(2), jnp.ones(2), in_specs=(P("x"), P()))
    assert seen == {"struct": frozenset({"x"}), "update": frozenset({"x"}),
                    "replaced": frozenset(), "added": frozenset({"x"})}
    assert _compat.varying_kwargs(jax.ShapeDtypeStruct((2,), jnp.float32)) == {}


def test_register_dataclass_node_flattens_like_jax():
    @dataclasses.dataclass
    class Pair:
        a: object
        b: object
        tag: str = "t"

    assert _compat.register_dataclass_node(Pair, ["a", "b"], ["tag"]) is True
    p = Pair(jnp.ones(2), None, "m")
    leaves, treedef = jax.tree_util.tree_flatten(p)
    assert len(leaves) == 1 and np.array_equal(leaves[0], np.ones(2))  # None is no leaf
    # The none-as-leaf registry (is_leaf paths) sees the class too.
    assert len(jax.tree_util.tree_leaves(p, is_leaf=lambda x: x is None)) == 2
    back = jax.tree_util.tree_unflatten(treedef, [jnp.zeros(2)])
    assert isinstance(back, Pair) and back.tag == "m" and back.b is None
    out = jax.jit(lambda q: Pair(q.a * 2, q.b, q.tag))(p)  # the dispatch registry
    np.testing.assert_array_equal(out.a, 2 * np.ones(2))
    assert out.tag == "m"


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float16, jnp.bfloat16, jnp.complex64,
                                   jnp.int32, jnp.uint8, jnp.bool_])
def test_tangent_dtype_is_what_grad_gives(dtype):
    # JAX's own answer: the dtype of the gradient with respect to an input of this dtype.
    x = jnp.zeros((2,), dtype)
    if jnp.issubdtype(dtype, jnp.complexfloating):
        expected = jax.vjp(lambda v: v, x)[1](x)[0].dtype
    else:
        expected = jax.grad(lambda v: jnp.sum(v.astype(jnp.float32)), allow_int=True)(x).dtype
    assert _compat.tangent_dtype(jnp.dtype(dtype)) == expected


def test_kernel_jvp_with_a_missing_tangent_on_this_jax():
    # A JVP rule that gives no tangent for an output (None) gets zeros of the tangent
    # dtype (float0 for an integer output) made through _compat.tangent_dtype.
    import primforge

    k = primforge.XLACustomKernel("compat_jvp_missing_tangent", replace=True)
    k.def_kernel("jax", "cpu", lambda **kw: lambda x: (2.0 * x, jnp.round(x).astype(jnp.int32)))

    def jvp(primals, tangents, *, outs, **kw):
        (x,), (t,) = primals, tangents
        return k(x, outs=outs, **kw), [2.0 * t, None]

    k.def_jvp_rule(jvp)
    outs = [jax.ShapeDtypeStruct((3,), jnp.float32), jax.ShapeDtypeStruct((3,), jnp.int32)]
    x = jnp.array([0.2, 1.6, -2.4], jnp.float32)
    (y, n), (ty, tn) = jax.jvp(lambda v: tuple(k(v, outs=outs)), (x,), (jnp.ones(3),))
    np.testing.assert_allclose(y, 2 * np.asarray(x), rtol=1e-6)
    np.testing.assert_array_equal(n, np.round(np.asarray(x)).astype(np.int32))
    np.testing.assert_allclose(ty, np.full(3, 2.0), rtol=1e-6)
    assert tn.dtype == jax.dtypes.float0 and tn.shape == (3,)
    g = jax.grad(lambda v: jnp.sum(jax.vmap(lambda r: k(r, outs=[
        jax.ShapeDtypeStruct((), jnp.float32), jax.ShapeDtypeStruct((), jnp.int32)])[0])(v)))(x)
    np.testing.assert_allclose(g, np.full(3, 2.0), rtol=1e-6)
