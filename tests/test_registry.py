"""The global kernel registry: names, tags (all/any), selection errors, module loading."""

import sys

import pytest

import primforge
from primforge import registry


@pytest.fixture
def kernels():
    made = []

    def make(name, *tags):
        k = primforge.XLACustomKernel(name, replace=True)
        k.def_tags(*tags)
        made.append(name)
        return k

    make("reg_t_a", "reg_csr", "reg_binary")
    make("reg_t_b", "reg_csr", "reg_float")
    make("reg_t_c", "reg_coo", "reg_float")
    yield make
    for name in made:
        registry.unregister_kernel(name)


def names(ks):
    return [k.name for k in ks if k.name.startswith("reg_t_")]


def test_tag_filtering_all_and_any(kernels):
    assert names(registry.list_kernels(["reg_csr", "reg_float"])) == ["reg_t_b"]
    assert names(registry.list_kernels(["reg_csr", "reg_float"], match="any")) == [
        "reg_t_a", "reg_t_b", "reg_t_c"]
    assert names(registry.list_kernels("reg_coo")) == ["reg_t_c"]
    assert names(registry.list_kernels()) == ["reg_t_a", "reg_t_b", "reg_t_c"]
    with pytest.raises(ValueError, match="match must be 'all' or 'any'"):
        registry.list_kernels("reg_csr", match="some")


def test_select_kernels_uses_the_same_semantics(kernels):
    for match in ("all", "any"):
        tags = ["reg_binary", "reg_coo"]
        assert names(registry.select_kernels(tags=tags, match=match)) == names(
            registry.list_kernels(tags, match=match))
    assert names(registry.select_kernels(["reg_t_c", "reg_t_a"], tags="reg_float")) == [
        "reg_t_c"]


def test_unknown_names_and_tags_list_what_exists(kernels):
    with pytest.raises(registry.UnknownKernelError, match="no kernel named 'nope'.*reg_t_a"):
        registry.select_kernels(["nope"])
    with pytest.raises(KeyError):  # still a KeyError for old callers
        registry.get_kernel("nope")
    with pytest.raises(registry.UnknownTagError, match="unknown tag 'nah'.*reg_coo"):
        registry.select_kernels(tags=["reg_csr", "nah"], match="any")


def test_duplicate_names_warn_and_replace(kernels):
    first = registry.get_kernel("reg_t_a")
    with pytest.warns(registry.KernelReplacedWarning, match="'reg_t_a'.*replace=True"):
        again = primforge.XLACustomKernel("reg_t_a")
    assert registry.get_kernel("reg_t_a") is again is not first
    second = kernels("reg_t_a")  # replace=True: silent (filterwarnings=error would raise)
    assert registry.get_kernel("reg_t_a") is second is not again


def test_def_tags_adds_and_all_tags_lists(kernels):
    k = registry.get_kernel("reg_t_a")
    k.def_tags("reg_extra")
    assert {"reg_csr", "reg_binary", "reg_extra"} <= k.tags
    assert {"reg_extra", "reg_coo"} <= set(registry.all_tags())
    with pytest.raises(TypeError, match="non-empty strings"):
        k.def_tags("")


def test_load_modules(tmp_path, monkeypatch):
    (tmp_path / "reg_user_mod.py").write_text(
        "import primforge\nk = primforge.XLACustomKernel('reg_t_user', replace=True)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        registry.load_modules(["reg_user_mod"], builtin=False)
        assert registry.get_kernel("reg_t_user").name == "reg_t_user"
    finally:
        registry.unregister_kernel("reg_t_user")
        sys.modules.pop("reg_user_mod", None)
    with pytest.raises(ImportError, match="could not import kernel module 'reg_no_such'"):
        registry.load_modules(["reg_no_such"], builtin=False)


def test_missing_builtin_ops_is_ignored(monkeypatch):
    monkeypatch.setitem(sys.modules, registry.BUILTIN_OPS_MODULE, None)
    assert registry.load_modules([]) == []  # None in sys.modules: import fails quietly


def test_kernel_summary():
    k = primforge.XLACustomKernel("reg_t_summary", "Doc.", replace=True)
    try:
        k.def_kernel("jax", "cpu", lambda **kw: lambda x: x)
        k.def_kernel("alt", "cpu", lambda **kw: lambda x: x)
        k.def_kernel("jax", "gpu", lambda **kw: lambda x: x)
        k.def_tags("reg_s")
        s = registry.kernel_summary(k)
        assert s["backends"] == {"cpu": ["jax", "alt"], "gpu": ["jax"]}
        assert s["defaults"] == {"cpu": "jax", "gpu": "jax"}
        assert s["tags"] == ["reg_s"] and not s["has_call"] and not s["has_benchmark_data"]
    finally:
        registry.unregister_kernel("reg_t_summary")
