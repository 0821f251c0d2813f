"""One kernel per operation (primforge/ops/_operator.py): forms as static params.

A toy operator with two forms checks the recipe against plain ``jax.numpy``; the library's
operators are then checked for what the recipe promises: one primitive per family, the
``*_p`` names its forms, a backend a form lacks refused when asked for and passed over when
it is only a default.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _jaxpr import eqn_names

import primforge
from primforge import ops, registry
from primforge.kernel.errors import BackendDeclined
from primforge.ops._operator import Form, Operator, forms_of

_counter = itertools.count()


def _toy():
    """An operator ``y = factor * x`` in two forms: 'double' (backends jax, alt) and
    'triple' (jax only); rules derived by hand so that grad and vmap are checked."""
    op = Operator(f"toy_{next(_counter)}", keys=("kind",), prefix="test_ops_operator.")
    forms = {}
    for kind, factor in (("double", 2.0), ("triple", 3.0)):
        form = op.form(f"toy_{kind}_{next(_counter)}", kind=kind)
        gen = lambda *, scale=1.0, factor=factor, **_: lambda x: factor * scale * x
        for platform in ("cpu", "gpu"):
            form.def_kernel("jax", platform, gen)
        if kind == "double":
            form.def_kernel("alt", "cpu", lambda *, scale=1.0, **_: lambda x: (x + x) * scale)
        form.def_abstract_eval(lambda x, *, scale=1.0: jax.ShapeDtypeStruct(x.shape, x.dtype))

        def jvp(primals, tangents, *, outs, backend=None, scale=1.0, form=form):
            return ([form(primals[0], scale=scale, backend=backend)],
                    [form(tangents[0], scale=scale, backend=backend)])

        form.def_jvp_rule(jvp)

        def transpose(cts, x, *, outs, backend=None, scale=1.0, form=form):
            return [form(cts[0], scale=scale, backend=backend)]

        form.def_transpose_rule(transpose)
        form.register_general_batching()
        forms[kind] = form
    return op, forms


def test_forms_share_one_primitive_and_match_numpy():
    op, forms = _toy()
    x = np.arange(4.0, dtype=np.float32)
    for kind, factor in (("double", 2.0), ("triple", 3.0)):
        got = forms[kind](x, scale=0.5)
        np.testing.assert_allclose(np.asarray(got), factor * 0.5 * x)
        jaxpr = jax.make_jaxpr(lambda v, f=forms[kind]: f(v, scale=0.5))(x)
        (eqn,) = jaxpr.eqns
        assert eqn.primitive is op.kernel.primitive and eqn.params["kind"] == kind
        assert eqn_names(jaxpr.jaxpr) == [forms[kind].name]
    assert registry.list_kernels().count(op.kernel) == 1
    assert all(registry.get_kernel(f.name) is f for f in forms.values())


def test_rules_dispatch_by_form():
    _, forms = _toy()
    x = jnp.arange(3.0)
    g = jax.grad(lambda v: jnp.sum(forms["triple"](v, scale=2.0)))(x)
    np.testing.assert_allclose(np.asarray(g), np.full(3, 6.0))
    batched = jax.vmap(lambda v: forms["double"](v))(jnp.arange(6.0).reshape(2, 3))
    np.testing.assert_allclose(np.asarray(batched), 2 * np.arange(6.0).reshape(2, 3))


def test_a_backend_the_form_lacks_is_refused_when_asked_for():
    _, forms = _toy()
    x = jnp.ones(2)
    np.testing.assert_allclose(np.asarray(forms["double"](x, backend="alt")), [2.0, 2.0])
    with pytest.raises(BackendDeclined, match=r"toy_triple.*'alt'.*\['jax'\]"):
        forms["triple"](x, backend="alt")


def test_a_default_the_form_lacks_falls_back_to_the_forms_own():
    op, forms = _toy()
    x = jnp.ones(2)
    op.kernel.set_default("cpu", "alt")
    # the triple form has no 'alt' kernel: a call that names no backend runs its 'jax' one
    np.testing.assert_allclose(np.asarray(forms["triple"](x)), [3.0, 3.0])
    np.testing.assert_allclose(np.asarray(jax.jit(forms["triple"])(x)), [3.0, 3.0])
    with primforge.use_backend("cpu", "alt"):
        np.testing.assert_allclose(np.asarray(forms["triple"](x + 1)), [6.0, 6.0])


def test_unknown_and_missing_form_params_are_refused():
    op, forms = _toy()
    with pytest.raises(TypeError, match=r"unknown static param\(s\) \['scal'\]"):
        forms["double"](jnp.ones(2), scal=2.0)
    with pytest.raises(ValueError, match=r"has no form \{'kind': 'quad'\}"):
        op.kernel(jnp.ones(2), kind="quad")
    with pytest.raises(TypeError, match=r"needs the static params \['kind'\]"):
        op.kernel(jnp.ones(2))
    with pytest.raises(TypeError, match=r"a form names \('kind',\)"):
        op.form("toy_bad", kinds="x")


def test_benchmark_records_only_the_backends_a_form_has():
    op, forms = _toy()
    from primforge.bench import BenchmarkConfig

    for form in forms.values():
        form.def_call(lambda x, backend=None, form=form: form(x, backend=backend))
        form.def_benchmark_data(lambda *, platform: [BenchmarkConfig(args=(jnp.ones(8),), n=8)])
    result = op.kernel.benchmark(platform="cpu", n_warmup=0, n_runs=1)
    got = sorted((r.config.split()[0], r.backend, r.success) for r in result.records)
    double, triple = (f.name.rsplit(".", 1)[-1] for f in forms.values())
    assert got == sorted([(double, "alt", True), (double, "jax", True), (triple, "jax", True)])
    assert result.fastest_backend(op.kernel.name) == "jax"  # 'alt' lacks a form


# ----------------------------------------------------------------------------- the library
FAMILIES = {"csr", "fixed_num", "jitc", "dense", "delayed", "plasticity"}


def test_one_kernel_per_family_and_the_p_names_are_its_forms():
    kernels = {k.name.removeprefix("primforge.ops."): k for k in registry.list_kernels()
               if k.name.startswith("primforge.ops.")}
    assert FAMILIES <= set(kernels) and len(kernels) <= 12, sorted(kernels)
    forms = {f.name: f for k in kernels.values() for f in forms_of(k)}
    for name in ops.__all__:
        if name.endswith("_p"):
            obj = getattr(ops, name)
            assert obj.name in forms or obj.name in {k.name for k in kernels.values()}, name
    csr = forms_of(kernels["csr"])
    assert {f.name.removeprefix("primforge.ops.") for f in csr} == {
        "csrmv", "binary_csrmv", "csrmm", "binary_csrmm", "binary_csrmv_spikes",
        "binary_csrmm_spikes", "binary_csrmv_packed"}
    assert all(isinstance(f, Form) and f.kernel is kernels["csr"] for f in csr)


def _csr_case():
    dense = np.array([[1.0, 0.0, 2.0], [0.0, 3.0, 0.0]], np.float32)
    return ops.CSR.from_dense(dense), dense


def test_a_spike_list_refuses_pallas_when_asked_and_runs_its_default_otherwise():
    W, dense = _csr_case()
    args = (W.data, W.indices, W.indptr, jnp.array([1, 1, 0]), 3)
    with pytest.raises(BackendDeclined, match=r"binary_csrmv_spikes.*'pallas'.*\['jax', 'numba'\]"):
        ops.binary_csrmv_spikes(*args, shape=W.shape, transpose=True, backend="pallas")
    want = 2 * dense[1] + dense[0]
    with primforge.use_backend("cpu", "pallas", kernel="primforge.ops.csr"):
        got = ops.binary_csrmv_spikes(*args, shape=W.shape, transpose=True)
        # the float form has a Pallas kernel and uses it: the same numbers
        dense_form = ops.csrmv(W.data, W.indices, W.indptr, jnp.array([1.0, 2.0]),
                               shape=W.shape, transpose=True)
    np.testing.assert_allclose(np.asarray(got), want)
    np.testing.assert_allclose(np.asarray(dense_form), np.array([1.0, 2.0]) @ dense)
