"""A backend is a plugin: one defined here, outside the package, gets every feature.

The backend below (``BufferBackend``) runs "buffer programs": a ``body(*inputs,
*output_buffers)`` written in ``jax.numpy`` that returns the output buffers it wrote. It
is registered through ``primforge.backends.register_backend`` and overrides the
contract's hooks it takes part in; nothing in primforge names it. Every result is checked
against an independent ``jax.numpy`` reference. The static test at the end holds the
kernel core to never switch on a backend's name or import a backend's private parts.
"""

from __future__ import annotations

import ast
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

import primforge
from primforge import autotune
from primforge.backends import (
    KNOWN_BACKENDS,
    BackendBase,
    backend_names,
    export_checks,
    register_backend,
    unregister_backend,
)
from primforge.backends._contract import problems
from primforge.bench import BenchmarkConfig
from primforge.cli import main

NAME = "pf_test_buffers"


class BufferProgram:
    """What the plugin's generators return: ``body(*inputs, *outs) -> outs``."""

    def __init__(self, body):
        self.body = body


class BufferBackend(BackendBase):
    NAME = NAME
    PLATFORMS = ("cpu",)

    def __init__(self):
        self.built, self.released, self.exported = [], [], []

    def make_callable(self, product, *, ins, outs, platform, name, **options):
        if not isinstance(product, BufferProgram):
            raise TypeError(f"kernel {name!r}: expected a BufferProgram, got {product!r}")
        super().make_callable(lambda: None, ins=ins, outs=outs, platform=platform, name=name,
                              **options)  # the contract's platform and option checks
        self.built.append(product)

        def call(*arrays):
            buffers = [jnp.zeros(o.shape, o.dtype) for o in outs]
            return tuple(product.body(*arrays, *buffers))

        return call

    def product_form(self, product, *, n_ins, n_outs, name):
        return "kernel" if isinstance(product, BufferProgram) else "callable"

    def release(self, product):
        self.released.append(product)

    def owns(self, product):
        return isinstance(product, BufferProgram)

    def debug_prefill(self, product, *, n_ins, outs, name):
        # The pre-filled buffers become the output buffers the body writes into.
        def body(*args):
            return product.body(*args[: n_ins + len(outs)])

        return BufferProgram(body), list(range(len(outs)))

    def export_checks(self, fn, *specs):
        self.exported.append(fn)
        return []


def affine_body(x, out):
    return (out.at[:].set(2 * x + 1),)


def skips_last(x, out):  # leaves the last element as the buffer held it
    return (out.at[:-1].set(2 * x[:-1] + 1),)


def off_by_one(x, out):
    return (out.at[:].set(2 * x + 2),)


def reference(x):
    return 2 * x + 1


SPEC = jax.ShapeDtypeStruct((5,), jnp.float32)
X = jnp.linspace(-1.0, 1.0, 5, dtype=jnp.float32)


@pytest.fixture
def backend():
    b = register_backend(BufferBackend())
    yield b
    unregister_backend(NAME)


def make_kernel(name, body=affine_body, *, tags=()):
    k = primforge.XLACustomKernel(name, replace=True)
    k.def_kernel("jax", "cpu", lambda **kw: reference)
    k.def_kernel(NAME, "cpu", lambda **kw: BufferProgram(body))
    k.def_call(lambda x, backend=None: k(x, outs=jax.ShapeDtypeStruct(x.shape, x.dtype),
                                         backend=backend))
    k.def_benchmark_data(lambda *, platform: [BenchmarkConfig(args=(X,), n=5)])
    if tags:
        k.def_tags(*tags)
    return k


def test_registration_checks_the_contract(backend):
    assert problems(backend) == []
    assert NAME in backend_names() and NAME not in KNOWN_BACKENDS
    with pytest.raises(ValueError, match="registered already"):
        register_backend(BufferBackend())
    with pytest.raises(ValueError, match="built-in"):
        register_backend(type("Numba", (BackendBase,), {"NAME": "numba"})())
    with pytest.raises(TypeError, match="NAME must be a non-empty str"):
        register_backend(BackendBase())


def test_selection_use_backend_and_platforms(backend):
    k = make_kernel("pf_plugin_select")
    expected = np.asarray(reference(X))
    np.testing.assert_allclose(k(X, outs=SPEC), expected)
    assert backend.built == []  # the default ('jax', registered first) ran
    with primforge.use_backend("cpu", NAME):
        np.testing.assert_allclose(jax.jit(lambda x: k(x, outs=SPEC))(X), expected)
    assert len(backend.built) == 1  # built by the plugin
    np.testing.assert_allclose(k(X, outs=SPEC, backend=NAME), expected)
    batch = jnp.stack([X, -X, 3 * X])
    np.testing.assert_allclose(jax.vmap(lambda x: k(x, outs=SPEC, backend=NAME))(batch),
                               reference(batch), rtol=1e-6)
    with pytest.raises(ValueError, match=f"the '{NAME}' backend serves \\['cpu'\\]"):
        k.def_kernel(NAME, "gpu", lambda **kw: BufferProgram(affine_body))


def test_build_cache_clear_cache_and_release(backend):
    k = make_kernel("pf_plugin_cache")
    for _ in range(2):
        np.testing.assert_allclose(k(X, outs=SPEC, backend=NAME), reference(X))
    assert len(backend.built) == 1
    product = backend.built[0]
    k.clear_cache()
    assert product in backend.released
    np.testing.assert_allclose(k(X, outs=SPEC, backend=NAME), reference(X))
    assert len(backend.built) == 2 and backend.built[1] is not product


def test_a_traceable_callable_goes_to_the_reference_backend(backend):
    k = primforge.XLACustomKernel("pf_plugin_callable", replace=True)
    k.def_kernel(NAME, "cpu", lambda **kw: lambda x: 2 * x + 1)
    np.testing.assert_allclose(k(X, outs=SPEC), reference(X))
    assert backend.built == []


def test_debug_mode_checks_coverage_and_the_reference(backend):
    good = make_kernel("pf_plugin_debug_good")
    with primforge.debug_mode():
        np.testing.assert_allclose(good(X, outs=SPEC, backend=NAME), reference(X))
    holes = make_kernel("pf_plugin_debug_holes", skips_last)
    with primforge.debug_mode(), pytest.raises(primforge.KernelError,
                                               match=r"element \(4,\) was never written"):
        holes(X, outs=SPEC, backend=NAME)
    wrong = make_kernel("pf_plugin_debug_wrong", off_by_one)
    with primforge.debug_mode(), pytest.raises(primforge.KernelError,
                                               match="differs from the 'jax' reference"):
        wrong(X, outs=SPEC, backend=NAME)


def test_primforge_check_passes_and_fails(backend, capsys):
    make_kernel("pf_plugin_check_good", tags=("pf_plugin_good",))
    make_kernel("pf_plugin_check_bad", off_by_one, tags=("pf_plugin_bad",))
    assert main(["check", "--tags", "pf_plugin_good"]) == 0
    assert "PASS  pf_plugin_check_good" in capsys.readouterr().out
    assert main(["check", "--tags", "pf_plugin_bad"]) == 1
    out = capsys.readouterr().out
    assert "FAIL  pf_plugin_check_bad" in out and f"{NAME}: differs from jax" in out


def test_benchmark_and_autotune(backend, tmp_path):
    k = make_kernel("pf_plugin_bench")
    res = k.benchmark(platform="cpu", n_warmup=1, n_runs=2)
    by_backend = {r.backend: r for r in res}
    assert set(by_backend) == {"jax", NAME}
    assert by_backend[NAME].success and by_backend[NAME].matches_reference
    out = autotune.tune([k], platform="cpu", n_warmup=1, n_runs=2,
                        path=tmp_path / "tune.json", apply=False)
    assert out["pf_plugin_bench"]["backend"] in ("jax", NAME)
    assert autotune.choices(tmp_path / "tune.json")["pf_plugin_bench"]["cpu"] in ("jax", NAME)


def test_export_round_trip(backend):
    k = make_kernel("pf_plugin_export")

    def f(x):
        return k(x, outs=SPEC, backend=NAME)

    exp = export.export(jax.jit(f), disabled_checks=export_checks(f, SPEC))(SPEC)
    assert backend.exported == [f]
    restored = export.deserialize(exp.serialize())
    np.testing.assert_allclose(restored.call(X), reference(X))


# ------------------------------------------------------------------ the core names no backend
CORE = Path(primforge.__file__).parent / "kernel"
BACKEND_NAMES = {*KNOWN_BACKENDS, "cuda"}
#: Public shorthands that name their backend: ``def_<backend>_kernel`` in registration.py.
ALLOWED = {("registration.py", f"def_{b}_kernel") for b in KNOWN_BACKENDS}


def _docstrings(tree) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def core_violations(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _docstrings(tree)
    allowed: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and (path.name, node.name) in ALLOWED:
            allowed.update(id(n) for n in ast.walk(node))
    out = []
    for node in ast.walk(tree):
        if id(node) in allowed:
            continue
        if (isinstance(node, ast.Constant) and node.value in BACKEND_NAMES
                and id(node) not in skip):
            out.append(f"{path.name}:{node.lineno}: names backend {node.value!r}")
        if isinstance(node, ast.ImportFrom) and node.module:
            parts = node.module.split(".")
            if parts[:2] != ["primforge", "backends"]:
                continue
            inner = parts[2:]
            names = [a.name for a in node.names]
            if any(p.startswith("_") for p in inner) or any(n.startswith("_") for n in names):
                out.append(f"{path.name}:{node.lineno}: imports a private part of "
                           f"{node.module}: {names}")
            if (inner and inner[0] in {m.rsplit('.', 1)[1] for m in KNOWN_BACKENDS.values()}
                    or set(names) & {m.rsplit(".", 1)[1] for m in KNOWN_BACKENDS.values()}):
                out.append(f"{path.name}:{node.lineno}: imports a backend module: "
                           f"{node.module} {names}")
    return out


def test_kernel_core_never_names_a_backend():
    found = [v for p in sorted(CORE.glob("*.py")) for v in core_violations(p)]
    assert not found, "\n".join(found)


def test_the_core_scan_catches_what_it_forbids(tmp_path):
    bad = tmp_path / "lowering.py"
    bad.write_text(
        '"""Docstrings may say \'numba\'."""\n'
        "from primforge.backends.numba import _require_numba\n"
        "from primforge.backends import numba\n"
        "def f(entry):\n"
        "    return entry.backend == 'numba' or 'jax' in entry\n"
    )
    found = core_violations(bad)
    assert len(found) == 5, found
    ok = tmp_path / "registration.py"
    ok.write_text("def def_numba_kernel(self, kg):\n    self.def_kernel('numba', 'cpu', kg)\n")
    assert core_violations(ok) == []
