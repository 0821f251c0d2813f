"""Every backend module in KNOWN_BACKENDS keeps the same contract.

The contract (primforge.backends._contract.Backend): ``NAME``, ``PLATFORMS``,
``EXTRA``, a cached ``is_available(platform=None)`` that finds the optional package without
importing it, and ``make_callable(product, *, ins, outs, platform, name, **options)``, which
checks the platform first, then that the package is there (an ImportError naming
``pip install -e ".[EXTRA]"``), then the options (``batch=()`` taken by every
backend), then the product. Shared pieces (compute capability, jaxlib version, cache folder)
come from one module, and no backend reaches into another's private names.

The structural checks are written out here (not only through ``_contract.problems``), so
they say what is wrong in a module that predates the contract.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import json
import os
import re
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import pytest

from primforge.backends import KNOWN_BACKENDS, is_available_on

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BACKEND_DIR = os.path.join(ROOT, "primforge", "backends")
ALL_PLATFORMS = ("cpu", "gpu", "tpu")
S = jax.ShapeDtypeStruct((4,), jnp.float32)

#: The optional package each backend probes for (None: nothing to install, or a compiler).
PACKAGE = {
    "jax": None,
    "cuda_raw": None,
    "numba": "numba",
    "numba_cuda": "numba_cuda",
    "pallas": "jax.experimental.pallas",
    "triton": "triton",
    "warp": "warp",
}

def _params(only=None):
    return [n for n in sorted(KNOWN_BACKENDS) if only is None or only(n)]


def _module(name):
    return importlib.import_module(KNOWN_BACKENDS[name])


def _dummy(*arrays):
    return arrays


def test_the_table_names_every_backend_module():
    assert set(PACKAGE) == set(KNOWN_BACKENDS)
    names = [f for f in os.listdir(BACKEND_DIR) if not f.startswith("_")]
    files = {f[:-3] for f in names if f.endswith(".py")}
    folders = {f for f in names if os.path.isfile(os.path.join(BACKEND_DIR, f, "__init__.py"))}
    assert files | folders == {v.rsplit(".", 1)[1] for v in KNOWN_BACKENDS.values()}


# -- structure ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", _params())
def test_names_and_types(name):
    m = _module(name)
    assert m.NAME == name
    assert isinstance(m.PLATFORMS, tuple) and m.PLATFORMS
    assert set(m.PLATFORMS) <= set(ALL_PLATFORMS), m.PLATFORMS
    assert m.EXTRA is None or isinstance(m.EXTRA, str)
    if m.EXTRA is not None:  # the extra the error names must exist
        with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
            text = f.read()
        extras = text.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
        assert re.search(rf"^{re.escape(m.EXTRA)}\s*=", extras, re.MULTILINE), m.EXTRA


@pytest.mark.parametrize("name", _params())
def test_signatures(name):
    m = _module(name)
    avail = list(inspect.signature(m.is_available).parameters.values())
    assert [(p.name, p.default) for p in avail] == [("platform", None)]
    params = list(inspect.signature(m.make_callable).parameters.values())
    kinds = {p.name: p.kind for p in params}
    assert params[0].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
    for kw in ("ins", "outs", "platform", "name"):
        assert kinds.get(kw) is inspect.Parameter.KEYWORD_ONLY, kw
    assert inspect.Parameter.VAR_KEYWORD in kinds.values(), "make_callable takes no **options"


@pytest.mark.parametrize("name", _params())
def test_the_protocol_sees_no_problem(name):
    from primforge.backends import _contract

    m = _module(name)
    assert isinstance(m, _contract.Backend)
    assert _contract.problems(m) == []


@pytest.mark.parametrize("name", _params())
def test_the_registry_holds_the_modules_backend_a_backend_base(name):
    from primforge.backends import BackendBase, get_backend

    m, backend = _module(name), get_backend(name)
    assert backend is m.BACKEND and type(backend) is not BackendBase
    assert isinstance(backend, BackendBase) and type(backend).__module__ == m.__name__
    for attr in ("NAME", "PLATFORMS", "EXTRA", "is_available", "make_callable"):
        assert getattr(backend, attr) == getattr(m, attr), attr


# -- availability -------------------------------------------------------------------------
@pytest.mark.parametrize("name", _params())
def test_is_available_is_cached_and_consistent(name):
    m = _module(name)
    assert hasattr(m.is_available, "cache_clear"), "is_available is not cached"
    m.is_available.cache_clear()
    first = m.is_available()
    assert m.is_available() is first and isinstance(first, bool)
    assert m.is_available.cache_info().hits >= 1
    per_platform = {p: m.is_available(p) for p in ALL_PLATFORMS}
    assert all(isinstance(v, bool) for v in per_platform.values())
    for p in ALL_PLATFORMS:
        if p not in m.PLATFORMS:
            assert per_platform[p] is False, p
    assert first == any(per_platform[p] for p in m.PLATFORMS)
    assert m.is_available(None) == first
    assert m.is_available("fpga") is False


@functools.cache
def _probe_run() -> dict:
    """In a fresh process: the optional packages each ``is_available()`` imported."""
    script = textwrap.dedent(f"""
        import importlib, json, sys
        import primforge
        from primforge.backends import KNOWN_BACKENDS, is_available_on
        packages = {sorted(p for p in PACKAGE.values() if p)!r}
        out = {{"at_import": [p for p in packages if p in sys.modules]}}
        for name in sorted(KNOWN_BACKENDS):
            m = importlib.import_module(KNOWN_BACKENDS[name])
            before = set(sys.modules)
            m.is_available()
            out[name] = sorted(p for p in packages if p in set(sys.modules) - before)
        print(json.dumps(out))
    """)
    return _run(script)


def _run(script: str, env=None) -> dict:
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=ROOT, env=env or dict(os.environ, JAX_PLATFORMS="cpu"),
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_importing_primforge_imports_no_optional_package():
    assert _probe_run()["at_import"] == []


@pytest.mark.parametrize("name", _params(only=PACKAGE.get))
def test_the_probe_does_not_import_the_package(name):
    assert _probe_run()[name] == [], "is_available() imported its optional package"


@functools.cache
def _blocked_run() -> dict:
    """In a process where every optional package is missing: import, probe, build."""
    blocked = sorted(p for p in PACKAGE.values() if p)
    script = textwrap.dedent(f"""
        import importlib, json, sys
        for p in {blocked!r}:
            sys.modules[p] = None  # as if not installed: import and find_spec find nothing
        import jax, jax.numpy as jnp
        from primforge.backends import KNOWN_BACKENDS, is_available_on
        s = jax.ShapeDtypeStruct((4,), jnp.float32)
        out = {{}}
        for name in sorted(KNOWN_BACKENDS):
            r = out[name] = {{}}
            try:
                m = importlib.import_module(KNOWN_BACKENDS[name])
            except Exception as e:
                r["import"] = f"{{type(e).__name__}}: {{e}}"
                continue
            r["import"] = "ok"
            r["available"] = m.is_available()
            try:
                m.make_callable(lambda *a: a, ins=(s,), outs=(s,), platform=m.PLATFORMS[0],
                                name="k")
                r["build"] = "built"
            except Exception as e:
                r["build"] = [isinstance(e, ImportError), str(e)]
        print(json.dumps(out))
    """)
    return _run(script)


@pytest.mark.parametrize("name", _params())
def test_without_its_package_the_module_imports_and_says_what_to_install(name):
    m = _module(name)
    result = _blocked_run()[name]
    assert result["import"] == "ok"
    if PACKAGE[name] is None:
        return  # nothing was blocked for it
    assert result["available"] is False
    is_import_error, message = result["build"]
    assert is_import_error, message
    assert f'pip install -e ".[{m.EXTRA}]"' in message, message


# -- make_callable ------------------------------------------------------------------------
@pytest.mark.parametrize("name", _params())
def test_make_callable_rejects_a_platform_it_does_not_serve(name):
    m = _module(name)
    for platform in ("fpga", *(p for p in ALL_PLATFORMS if p not in m.PLATFORMS)):
        with pytest.raises(ValueError) as info:
            m.make_callable(_dummy, ins=(S,), outs=(S,), platform=platform, name="k")
        message = str(info.value)
        assert repr(platform) in message and all(p in message for p in m.PLATFORMS), message


@pytest.mark.parametrize("name", _params(only=lambda n: n != "jax"))
def test_make_callable_names_the_extra_when_the_package_is_missing(name, monkeypatch):
    m = _module(name)
    assert m.EXTRA is not None
    monkeypatch.setattr(m, "is_available", lambda platform=None: False)
    messages = []
    for platform in m.PLATFORMS:
        with pytest.raises(ImportError) as info:
            m.make_callable(_dummy, ins=(S,), outs=(S,), platform=platform, name="k")
        messages.append(str(info.value))
    assert any(f'pip install -e ".[{m.EXTRA}]"' in msg for msg in messages), messages


def _served_here(m) -> str:
    for p in m.PLATFORMS:
        if is_available_on(m, p):
            return p
    pytest.skip(f"the {m.NAME!r} backend is not installed here")


@pytest.mark.parametrize("name", _params())
def test_options_batch_is_taken_and_unknown_ones_are_named(name):
    m = _module(name)
    platform = _served_here(m)
    with pytest.raises(TypeError, match="not_an_option"):
        m.make_callable(object(), ins=(S,), outs=(S,), platform=platform, name="k",
                        not_an_option=1)
    # batch=() is taken: what fails is the product (an object() is no kernel), not batch.
    with pytest.raises(TypeError) as info:
        m.make_callable(object(), ins=(S,), outs=(S,), platform=platform, name="k", batch=())
    assert "batch" not in str(info.value), str(info.value)


# -- one answer for shared questions ------------------------------------------------------
def _sources():
    for folder, _, names in sorted(os.walk(BACKEND_DIR)):
        for f in sorted(names):
            path = os.path.join(folder, f)
            if f.endswith(".py") and path != os.path.join(BACKEND_DIR, "_common.py"):
                with open(path, encoding="utf-8") as fh:
                    yield os.path.relpath(path, BACKEND_DIR), fh.read()


#: Code that answers a question _common answers: (what, regex on the source).
_SHARED = (
    ("the compute capability of a GPU", r"\.compute_capability\b|[\"']compute_capability[\"']"),
    ("the visible GPUs", r"jax\.devices\(\s*[\"']gpu[\"']"),
    ("the jaxlib version", r"\bimport jaxlib\b|jaxlib\.__version__"),
    ("the on-disk cache folder", r"_cache\.directory\("),
    ("a scratch folder", r"tempfile\.mkdtemp\("),
)


@pytest.mark.parametrize("what, pattern", _SHARED, ids=[w for w, _ in _SHARED])
def test_shared_questions_are_answered_in_one_place(what, pattern):
    offenders = [f for f, text in _sources() if re.search(pattern, text)]
    assert offenders == [], f"{what} is worked out outside _common.py in {offenders}"


def _private_uses(tree) -> list[str]:
    backends = {v.rsplit(".", 1)[1] for v in KNOWN_BACKENDS.values()}
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "primforge.backends":
            aliases.update({a.asname or a.name: a.name for a in node.names if a.name in backends})
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("primforge.backends.") and a.asname:
                    aliases[a.asname] = a.name
    return [f"{aliases[n.value.id]}.{n.attr}" for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
            and n.value.id in aliases and n.attr.startswith("_") and not n.attr.startswith("__")]


def test_no_backend_uses_another_backends_private_names():
    found = {f: uses for f, text in _sources() if (uses := _private_uses(ast.parse(text)))}
    assert found == {}


def test_the_former_address_answers_with_the_same_objects():
    from primforge.kernel.backends.triton import triton_kernel

    import primforge.backends
    from primforge.kernel.backends import BackendBase, get_backend, numba

    assert BackendBase is primforge.backends.BackendBase
    assert get_backend is primforge.backends.get_backend
    assert numba is importlib.import_module(KNOWN_BACKENDS["numba"])
    assert triton_kernel is importlib.import_module(KNOWN_BACKENDS["triton"]).triton_kernel


def _imports_the_former_address(tree) -> bool:
    for node in ast.walk(tree):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                 [f"{node.module}.{a.name}" for a in node.names]
                 if isinstance(node, ast.ImportFrom) and node.module and not node.level else [])
        if any(n == "primforge.kernel.backends" or n.startswith("primforge.kernel.backends.")
               for n in names):
            return True
    return False


def test_the_package_itself_imports_the_backends_at_their_address():
    package = os.path.join(ROOT, "primforge")
    former = os.path.join(package, "kernel", "backends")
    found = []
    for folder, _, names in os.walk(package):
        for f in (n for n in names if n.endswith(".py")):
            path = os.path.join(folder, f)
            if path.startswith(former):
                continue
            with open(path, encoding="utf-8") as fh:
                if _imports_the_former_address(ast.parse(fh.read())):
                    found.append(os.path.relpath(path, ROOT))
    assert found == []
