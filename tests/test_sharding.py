"""Tests for primforge.kernel.sharding.

Multi-device behaviour runs in subprocesses (the pytest process has one CPU device):
``sharding_scripts/multidevice.py`` on 8 simulated devices, ``sharding_scripts/multihost.py``
as two processes started by ``primforge.distributed.launch``, joined on loopback. Each
script compares against NumPy references and reports per check; the tests below assert on
those reports.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import primforge
from primforge.kernel import sharding
from primforge.kernel.sharding import ShardingRule, def_sharding_rule, get_sharding_rule

SCRIPTS = Path(__file__).parent / "sharding_scripts"
ROOT = Path(__file__).parent.parent


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env.pop("XLA_FLAGS", None)
    env.setdefault("JAX_PLATFORMS", "cpu")
    return env


@pytest.fixture(scope="module")
def multidevice(tmp_path_factory):
    out = tmp_path_factory.mktemp("sharding") / "multidevice.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / "multidevice.py"), str(out), "8"],
        check=False, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0 and out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["n_devices"] == 8
    return report["checks"]


CHECKS = [
    "elementwise_row_sharded",
    "elementwise_2d_mesh",
    "elementwise_uneven_shards_replicate",
    "numba_with_rule_does_not_gather",
    "numba_without_rule_gathers",
    "elementwise_grad_and_jvp",
    "vmap_native_batch_is_a_factor",
    "csr_row_sharded_matvec",
    "csr_grad_through_partitioned_kernel",
    "dense_matvec_reduction_factor",
    "kernel_inside_shard_map",
    "register_primitive_partitions",
    "explicit_mesh_types_and_grad",
    "bad_rule_raises_at_trace_time",
    "ops_csrmv_under_sharding",
]


@pytest.mark.parametrize("name", CHECKS)
def test_multidevice(multidevice, name):
    assert name in multidevice, f"check {name} did not run; ran: {sorted(multidevice)}"
    assert multidevice[name]["ok"], multidevice[name]["detail"]


def test_multidevice_runs_every_check(multidevice):
    assert sorted(multidevice) == sorted(CHECKS)


def test_multihost_two_processes_on_loopback(tmp_path):
    from primforge.distributed import launch

    launch(SCRIPTS / "multihost.py", [str(tmp_path)], num_processes=2, devices_per_process=2,
           timeout=240, echo=False, env=_env())
    for i in range(2):
        r = json.loads((tmp_path / f"p{i}.json").read_text())
        assert r["ok"], r.get("error")
        assert r["devices"] == [4, 2]
        assert r["ew_no_all_gather"] and r["csr_no_all_gather"]


# ---------------------------------------------------------------------- in-process units
def _structs(*shapes):
    return tuple(jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes)


def _kernel(name, rule, **kw):
    k = primforge.XLACustomKernel(name, replace=True)
    def_sharding_rule(k, rule, **kw)
    return k


def test_rule_is_stored_and_removed():
    k = _kernel("t_sh_store", "i j, j -> i")
    assert get_sharding_rule(k) == ShardingRule("i j, j -> i")
    assert def_sharding_rule(k, None) is None and get_sharding_rule(k) is None


def test_the_rule_is_a_declared_field_set_only_through_the_kernel():
    k = primforge.XLACustomKernel("t_sh_field", replace=True)
    assert k.sharding_rule is None  # declared from construction on
    rule = k.def_sharding_rule("i j, j -> i", reduction_factors=("j",))
    assert k.sharding_rule is rule and get_sharding_rule(k) is rule
    assert rule == ShardingRule("i j, j -> i", reduction_factors=("j",))
    def_sharding_rule(k, "elementwise")  # the module function goes through the method
    assert k.sharding_rule == ShardingRule("elementwise")
    with pytest.raises(AttributeError):
        k.sharding_rule = None
    with pytest.raises(TypeError, match="'kernel' must be an XLACustomKernel"):
        def_sharding_rule(object(), "elementwise")


def test_the_partitioned_call_rejects_a_wrong_number_of_arrays_by_name():
    k = _kernel("t_sh_nargs", "elementwise")
    k.def_kernel("jax", "cpu", lambda **kw: lambda x: 2 * x)
    (s,) = _structs((4,))
    f = sharding.partition_lowering(k, lambda x: (2 * x,), platform="cpu", ins=(s,), outs=(s,))
    assert f(jnp.ones(4))[0].tolist() == [2.0] * 4
    with pytest.raises(TypeError, match=r"takes 1 input array\(s\) \('arrays'.*got 2"):
        f(jnp.ones(4), jnp.ones(4))


def test_a_rule_set_by_the_module_function_relowers_jitted_callers():
    k = primforge.XLACustomKernel("t_sh_relower", replace=True)
    k.def_kernel("jax", "cpu", lambda **kw: lambda x: 2 * x)
    f = jax.jit(lambda x: k(x, outs=jax.ShapeDtypeStruct((4,), jnp.float32)))
    assert f(jnp.ones(4)).tolist() == [2.0] * 4
    def_sharding_rule(k, "i, j -> i")  # two operands: does not fit the one-input call
    with pytest.raises(ValueError, match="describes 2 operand"):
        f(jnp.ones(4))


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ("i j, j", "exactly one '->'"),
        ("i (j k) -> i", "compound factors"),
        ("i ... -> i", "may only lead"),
        ("i i -> i", "repeats"),
        ("pf_x -> pf_x", "reserved"),
        ("i 2 -> i", "not a factor name"),
    ],
)
def test_bad_rule_strings_raise_at_definition(rule, message):
    with pytest.raises(ValueError, match=message):
        ShardingRule(rule)


def test_bad_rule_types_and_factor_kinds():
    with pytest.raises(TypeError, match="must be a str"):
        ShardingRule(3)
    with pytest.raises(ValueError, match="both"):
        ShardingRule("i j -> i", reduction_factors=("j",), need_replication_factors=("j",))


def test_resolve_einsum_marks_operand_only_factors_replicated():
    k = _kernel("t_sh_mv", "i j, j -> i")
    r = sharding._resolve(k, _structs((4, 3), (3,)), _structs((4,)), (), {})
    assert r.text == "i j, j -> i"
    assert r.replicated == {"j"} and not r.reduction


def test_resolve_reduction_factor():
    k = _kernel("t_sh_red", "i j, j -> i", reduction_factors=("j",))
    r = sharding._resolve(k, _structs((4, 3), (3,)), _structs((4,)), (), {})
    assert r.reduction == {"j"} and "j" not in r.replicated


def test_resolve_elementwise_broadcasts_from_the_right():
    k = _kernel("t_sh_ew", "elementwise")
    r = sharding._resolve(k, _structs((4, 3), (3,), (1, 3), ()), _structs((4, 3)), (), {})
    x, b, c, s = r.operands
    assert x == r.results[0] and b == x[1:] and s == ()
    assert c[1] == x[1] and c[0] != x[0] and c[0] in r.replicated


def test_resolve_prepends_native_batch_levels():
    k = _kernel("t_sh_batch", "i, i -> i")
    batch = ((5, (True, False)),)
    r = sharding._resolve(k, _structs((4,), (4,)), _structs((4,)), batch, {})
    assert r.operands[0][0] == r.results[0][0] == r.batch_factors[0]
    assert len(r.operands[1]) == 1


def test_resolve_errors_name_the_kernel():
    k = _kernel("t_sh_err", "i j, j -> i")
    with pytest.raises(ValueError, match="t_sh_err.*2 operand"):
        sharding._resolve(k, _structs((4, 3)), _structs((4,)), (), {})
    with pytest.raises(ValueError, match="sizes 3 and 5"):
        sharding._resolve(k, _structs((4, 3), (5,)), _structs((4,)), (), {})
    with pytest.raises(ValueError, match="names 2 dimension"):
        sharding._resolve(k, _structs((4,), (3,)), _structs((4,)), (), {})
    k2 = _kernel("t_sh_err2", "i j, j -> i", reduction_factors=("i",))
    with pytest.raises(ValueError, match="appear in a result"):
        sharding._resolve(k2, _structs((4, 3), (3,)), _structs((4,)), (), {})


def test_callable_rule_sees_params():
    seen = {}

    def rule(ins, outs, *, transpose=False):
        seen["transpose"] = transpose
        return ShardingRule("i, i -> ", reduction_factors=("i",)) if transpose else "i, i -> i"

    k = _kernel("t_sh_callable", rule)
    r = sharding._resolve(k, _structs((4,), (4,)), _structs(()), (), {"transpose": True})
    assert seen == {"transpose": True} and r.reduction == {"i"}
    k2 = _kernel("t_sh_callable_bad", lambda ins, outs: 42)
    with pytest.raises(TypeError, match="returned int"):
        sharding._resolve(k2, _structs((4,)), _structs((4,)), (), {})


def test_single_device_types_unchanged():
    k = _kernel("t_sh_types", "elementwise")
    aval = jax.typeof(jnp.ones(3))
    outs = _structs((3,))
    assert sharding.result_shardings(k, [aval], outs=outs) is None
    (res,) = sharding.result_avals(k, [aval], [aval], outs=outs)
    assert res.shape == (3,) and res.dtype == jnp.float32


def test_a_kernel_with_a_rule_lowers_inside_another_kernels_lowering():
    """A ``jax`` backend may call a kernel that has a rule: lowered inside the outer kernel
    (no device assignment there), the inner one runs unpartitioned, with the right values."""
    inner = primforge.XLACustomKernel("test_nested_rule_inner", replace=True)
    inner.def_kernel("jax", "cpu", lambda **kw: lambda x: (3.0 * x,))
    inner.def_sharding_rule("elementwise")
    outer = primforge.XLACustomKernel("test_nested_rule_outer", replace=True)
    out = jax.ShapeDtypeStruct((5,), jnp.float32)
    outer.def_kernel("jax", "cpu", lambda **kw: lambda x: (inner(x, outs=out) + 1.0,))
    x = jnp.arange(5, dtype=jnp.float32)
    got = jax.jit(lambda x: outer(x, outs=out))(x)
    np.testing.assert_allclose(np.asarray(got), 3.0 * np.arange(5) + 1.0)
