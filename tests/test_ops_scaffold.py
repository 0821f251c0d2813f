"""The operator families' public calls, made by ``Family.public`` and ``_spikes.forms``:
named and documented like the functions they stand for, with their own signatures."""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from primforge import ops
from primforge.ops.csr.packed import binary_csrmv_packed
from primforge.ops.fixed_num.packed import binary_fixed_num_mv_packed

#: Each public call's module and parameters (``=``: with a default), as brainevent users
#: call them.
_CSR, _FIXED, _JITC = "data indices indptr", "weights indices", "weight seed"
_KW, _LIST = "*shape transpose= backend=", "spike_indices spike_count="
_JITC_KW = "*shape prob transpose= weight_kind= backend= rows= cols="
CALLS = {
    "csrmv": ("csr.api", f"{_CSR} vector {_KW}"),
    "binary_csrmv": ("csr.api", f"{_CSR} events {_KW}"),
    "csrmm": ("csr.api", f"{_CSR} matrix {_KW}"),
    "binary_csrmm": ("csr.api", f"{_CSR} events {_KW}"),
    "binary_csrmv_spikes": ("csr.indexed", f"{_CSR} {_LIST} {_KW}"),
    "binary_csrmm_spikes": ("csr.indexed", f"{_CSR} {_LIST} {_KW}"),
    "fixed_num_mv": ("fixed_num.api", f"{_FIXED} vector {_KW}"),
    "binary_fixed_num_mm": ("fixed_num.api", f"{_FIXED} events {_KW}"),
    "binary_fixed_num_mv_spikes": ("fixed_num.indexed", f"{_FIXED} {_LIST} {_KW}"),
    "jitc_matvec": ("jitconn.api", f"{_JITC} x {_JITC_KW}"),
    "binary_jitc_matmat": ("jitconn.api", f"{_JITC} events {_JITC_KW}"),
    "binary_jitc_mm_spikes": ("jitconn.indexed",
                              f"{_JITC} {_LIST} *shape prob weight_kind= backend="),
    "densemm": ("dense_event.api", "weights matrix *transpose= backend="),
    "binary_densemv_spikes": ("dense_event.indexed", f"weights {_LIST} *transpose= backend="),
}


def _described(fn) -> str:
    words = []
    for p in inspect.signature(fn).parameters.values():
        star = "*" if p.kind is p.KEYWORD_ONLY and not any(w.startswith("*") for w in words) else ""
        words.append(star + p.name + ("" if p.default is p.empty else "="))
    return " ".join(words)


@pytest.mark.parametrize("name", sorted(CALLS))
def test_a_public_call_is_a_named_function_with_its_own_signature(name):
    fn = getattr(ops, name)
    module, params = CALLS[name]
    assert inspect.isfunction(fn)
    assert (fn.__name__, fn.__qualname__, fn.__module__) == (name, name,
                                                              f"primforge.ops.{module}")
    assert _described(fn) == params
    assert inspect.signature(fn).return_annotation == "jax.Array"


@pytest.mark.parametrize("fn", [getattr(ops, n) for n in sorted(CALLS)]
                         + [binary_csrmv_packed, binary_fixed_num_mv_packed],
                         ids=lambda f: f.__name__)
def test_a_public_call_documents_every_parameter_and_has_an_example(fn):
    doc = inspect.getdoc(fn)
    args = doc[doc.index("Args:"):doc.index("Returns:")]
    for name in inspect.signature(fn).parameters:
        assert f"\n    {name}: " in args, name
    assert "{args}" not in doc and ">>>" in doc[doc.index("Example:"):]


def test_the_input_is_passed_by_its_own_name_and_a_bad_call_names_the_function():
    data, indices, indptr = jnp.array([1., 2., 3.]), jnp.array([0, 2, 1]), jnp.array([0, 2, 3])
    v = jnp.array([1., 2., 3.])
    want = ops.csrmv(data, indices, indptr, v, shape=(2, 3))
    got = ops.csrmv(data=data, indices=indices, indptr=indptr, vector=v, shape=(2, 3))
    np.testing.assert_array_equal(got, want)
    with pytest.raises(TypeError, match=r"csrmv\(\) missing a required argument: 'shape'"):
        ops.csrmv(data, indices, indptr, v)
    with pytest.raises(TypeError, match=r"binary_csrmv\(\) got an unexpected keyword"):
        ops.binary_csrmv(data, indices, indptr, events=v, shape=(2, 3), vector=v)


def test_jit_takes_static_arguments_by_name():
    f = jax.jit(ops.binary_densemv, static_argnames=("transpose",))
    w = jnp.array([[1., 2.], [3., 4.]])
    np.testing.assert_array_equal(f(w, jnp.array([True, False]), transpose=True),
                                  jnp.array([1., 2.]))


def test_a_packed_vector_goes_to_the_kernel_reading_the_words():
    events = np.array([False, True])
    packed = ops.pack_events(jnp.asarray(events))
    data, indices, indptr = jnp.array([1., 2., 3.]), jnp.array([0, 2, 1]), jnp.array([0, 2, 3])
    kw = {"shape": (2, 3), "transpose": True}
    want = ops.binary_csrmv(data, indices, indptr, events, **kw)
    jaxpr = jax.make_jaxpr(lambda w: ops.binary_csrmv(w, indices, indptr, packed, **kw))
    assert "packed" in str(jaxpr(data))
    np.testing.assert_array_equal(ops.binary_csrmv(data, indices, indptr, packed, **kw), want)
