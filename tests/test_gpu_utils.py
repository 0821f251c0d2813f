"""The batched XLA:GPU compile of the compile sweeps (``compile_cases_for_targets``) still
names the case XLA rejects and the case left without a kernel launch of its own."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gpu_utils import _unmatched, compile_cases_for_targets, requires_gpu_compiler
from test_cache_cuda_trust import HANDLERS, source

from primforge.backends import _cuda_build
from primforge.backends import cuda as pcuda

X = jax.ShapeDtypeStruct((4,), jnp.float32)


def test_launches_are_matched_one_to_one():
    starts = lambda prefix: lambda n: n.startswith(prefix)
    assert _unmatched({"a": starts("pf_k"), "b": starts("pf_k")}, ["pf_k", "fusion"]) == ["b"]
    assert _unmatched({"a": starts("pf_k"), "b": starts("pf_k")}, ["pf_k", "pf_k__1"]) == []
    # the narrower case takes its launch first
    assert _unmatched({"a": starts("pf_k"), "b": starts("pf_k__1")}, ["pf_k__1", "pf_k"]) == []


@requires_gpu_compiler
def test_a_rejected_case_is_named():
    if _cuda_build.find_cxx() is None:
        pytest.skip("no host C++ compiler")
    m = pcuda.load_cpp_inline(source(1.0), name="t_gpu_utils", handlers=HANDLERS)
    cpu_only = lambda x: m.call("Affine", x, outs=X, a=np.float32(3))  # no CUDA handler
    with pytest.raises(pytest.fail.Exception, match=r"(?s)rejects the cases:\ncpu-only: .*CUDA"):
        compile_cases_for_targets({"fine": (jnp.sin, (X,)), "cpu-only": (cpu_only, (X,))},
                                  backend="test", targets=("a100",))


@requires_gpu_compiler
def test_a_case_without_its_own_launch_is_named():
    cases = {"sin": (jnp.sin, (X,)), "cos": (jnp.cos, (X,))}
    expect = dict.fromkeys(cases, lambda n: "cosine" in n)  # only one launch matches
    with pytest.raises(AssertionError, match="no kernel launch of their own for"):
        compile_cases_for_targets(cases, backend="test", targets=("a100",), expect=expect)
    compile_cases_for_targets(cases, backend="test", targets=("a100",), expect={
        "sin": lambda n: n.endswith("_sine"), "cos": lambda n: "cosine" in n})
