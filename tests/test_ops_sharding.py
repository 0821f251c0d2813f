"""Sharding rules of the primforge.ops kernels (primforge/ops/_sharding.py).

The multi-device checks run in a subprocess on 4 simulated CPU devices
(``sharding_scripts/ops_sharding.py``): each compares with a NumPy reference and then
asserts that the call ran partitioned (output sharding; collectives in the compiled HLO).
The same process then removes every ops kernel's rule and runs the partitioned checks a
second time: the values must stay right and every partition assertion must fail, so these
tests can fail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from test_ops_processes import MULTIPROCESS_VARIABLES, line

import primforge
from primforge import ops
from primforge.kernel import sharding
from primforge.ops._operator import forms_of

ROOT = Path(__file__).parent.parent
SCRIPT = Path(__file__).parent / "sharding_scripts" / "ops_sharding.py"
PROCESSES_SCRIPT = Path(__file__).parent / "sharding_scripts" / "ops_processes.py"
N_DEV = 4

# Checks that assert values only: the rule keeps everything whole (or the call is a
# lax.map), so there is no partitioning to assert, with or without the rules.
VALUE_ONLY = {
    "csr_row_sharded_inputs_stay_right",
    "spike_list_sharded_inputs_stay_right",
    "fixed_num_and_dense_spike_lists_stay_right",
    "jitc_spike_lists_stay_right",
    "csr_packed_events_stay_right",
    "fixed_num_packed_events_stay_right",
    "jitc_row_sharded_inputs_stay_right",
    "compressed_update_sharded_inputs_stay_right",
    "vmap_over_sharded_weights_stays_right",
    "jitc_a_row_splitting_rule_would_be_wrong",  # the control of the jitc rule
    "delayed_product_sharded_inputs_stay_right",
}
PARTITIONED = [
    "csr_matmat_columns_sharded",
    "csr_homogeneous_matmat_columns_sharded",
    "csr_vmap_over_a_sharded_batch",
    "csr_grad_columns_sharded",
    "fixed_num_gather_rows_sharded",
    "fixed_num_scatter_rows_reduced",
    "fixed_num_entries_per_row_reduced",
    "fixed_num_matmat_columns_sharded",
    "fixed_num_grad_rows_sharded",
    "fixed_num_weight_grad_of_the_scatter_matmat",
    "fixed_num_vmap_over_a_sharded_batch",
    "jitc_matmat_columns_sharded",
    "jitc_vmap_over_a_sharded_batch",
    "dense_kept_dimension_sharded",
    "dense_contracted_dimension_reduced",
    "dense_matmat_columns_and_rows_on_a_2d_mesh",
    "dense_grad_rows_sharded",
    "dense_vmap_over_a_sharded_batch",
    "dense_update_rows_and_columns_sharded",
    "dense_update_vmap_over_a_sharded_batch",
    "compressed_update_vmap_over_a_sharded_batch",
    "compressed_update_with_a_column_index",
    "other_backends_partitioned",
    "explicit_mesh_types_follow_the_rules",
    "delay_read_columns_sharded",
]
CHECKS = PARTITIONED + sorted(VALUE_ONLY)

# Which checks exercise each kernel under sharding (every ops kernel must be here).
_CSR = ["csr_matmat_columns_sharded", "csr_row_sharded_inputs_stay_right"]
_FN = ["fixed_num_gather_rows_sharded", "fixed_num_scatter_rows_reduced"]
_JC = ["jitc_matmat_columns_sharded", "jitc_row_sharded_inputs_stay_right"]
_DENSE = ["dense_kept_dimension_sharded", "dense_contracted_dimension_reduced"]
KERNEL_CHECKS = {
    "primforge.ops.csrmv": _CSR + ["csr_vmap_over_a_sharded_batch"],
    "primforge.ops.binary_csrmv": _CSR,
    "primforge.ops.binary_csrmv_spikes": ["spike_list_sharded_inputs_stay_right"],
    "primforge.ops.binary_csrmm_spikes": ["spike_list_sharded_inputs_stay_right"],
    "primforge.ops.spike_list": ["spike_list_sharded_inputs_stay_right"],
    "primforge.ops.binary_csrmv_packed": ["csr_packed_events_stay_right"],
    "primforge.ops.binary_fixed_num_mv_packed": ["fixed_num_packed_events_stay_right"],
    "primforge.ops.binary_fixed_num_mv_spikes": ["fixed_num_and_dense_spike_lists_stay_right"],
    "primforge.ops.binary_fixed_num_mm_spikes": ["fixed_num_and_dense_spike_lists_stay_right"],
    "primforge.ops.binary_densemv_spikes": ["fixed_num_and_dense_spike_lists_stay_right"],
    "primforge.ops.binary_densemm_spikes": ["fixed_num_and_dense_spike_lists_stay_right"],
    "primforge.ops.binary_jitc_mv_spikes": ["jitc_spike_lists_stay_right"],
    "primforge.ops.binary_jitc_mm_spikes": ["jitc_spike_lists_stay_right"],
    "primforge.ops.csrmm": _CSR + ["csr_grad_columns_sharded"],
    "primforge.ops.binary_csrmm": _CSR + ["csr_homogeneous_matmat_columns_sharded"],
    "primforge.ops.csr_weight_grad": ["csr_grad_columns_sharded"],
    "primforge.ops.fixed_num_weight_grad": ["fixed_num_grad_rows_sharded",
                                            "fixed_num_weight_grad_of_the_scatter_matmat"],
    "primforge.ops.fixed_num_mv": _FN + ["fixed_num_grad_rows_sharded",
                                         "fixed_num_entries_per_row_reduced"],
    "primforge.ops.binary_fixed_num_mv": _FN + ["fixed_num_vmap_over_a_sharded_batch"],
    "primforge.ops.fixed_num_mm": _FN + ["fixed_num_matmat_columns_sharded"],
    "primforge.ops.binary_fixed_num_mm": _FN + ["fixed_num_matmat_columns_sharded"],
    "primforge.ops.jitc_matvec": _JC + ["vmap_over_sharded_weights_stays_right"],
    "primforge.ops.binary_jitc_matvec": _JC + ["jitc_a_row_splitting_rule_would_be_wrong"],
    "primforge.ops.jitc_matmat": _JC + ["jitc_vmap_over_a_sharded_batch"],
    "primforge.ops.binary_jitc_matmat": _JC,
    "primforge.ops.densemv": _DENSE + ["dense_grad_rows_sharded"],
    "primforge.ops.binary_densemv": _DENSE,
    "primforge.ops.densemm": _DENSE + ["dense_vmap_over_a_sharded_batch"],
    "primforge.ops.binary_densemm": _DENSE + ["dense_matmat_columns_and_rows_on_a_2d_mesh"],
    "primforge.ops.dense_update": ["dense_update_rows_and_columns_sharded",
                                   "dense_update_vmap_over_a_sharded_batch"],
    "primforge.ops.delayed_csrmv": ["delayed_product_sharded_inputs_stay_right"],
    "primforge.ops.binary_delayed_csrmv": ["delayed_product_sharded_inputs_stay_right"],
    "primforge.ops.binary_delayed_jitc_matvec": ["delayed_product_sharded_inputs_stay_right"],
    "primforge.ops.delay_read": ["delay_read_columns_sharded"],
    "primforge.ops.compressed_update": ["compressed_update_sharded_inputs_stay_right",
                                        "compressed_update_vmap_over_a_sharded_batch",
                                        "compressed_update_with_a_column_index"],
}


def _run(tmp_path_factory, *flags):
    out = tmp_path_factory.mktemp("ops_sharding") / "report.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    for name in ("XLA_FLAGS", *MULTIPROCESS_VARIABLES):  # one process of N_DEV devices
        env.pop(name, None)
    env.setdefault("JAX_PLATFORMS", "cpu")
    proc = subprocess.run([sys.executable, str(SCRIPT), str(out), str(N_DEV), *flags],
                          check=False, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0 and out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["n_devices"] == N_DEV
    return report


def _selected(request, test: str, flag: str) -> list[str]:
    """``flag=NAME`` for the checks of ``test`` that this run selected (each tier runs its
    own share of them; none selected: run none)."""
    wanted = sorted({item.callspec.params["name"] for item in request.session.items
                     if getattr(item, "originalname", None) == test})
    return [f"{flag}={name}" for name in wanted] or [f"{flag}=-none-"]


WITHOUT_TEST = "test_without_the_rules_the_values_hold_but_partitioning_fails"


PROCESSES_TEST = "test_the_ops_processes_script_as_one_process_of_these_devices"


@pytest.fixture(scope="module")
def report(tmp_path_factory, request):
    """One run of the script: the selected checks with the rules, the ops_processes script
    when its test is selected, then the selected controls without the rules."""
    also = [f"--also-run={PROCESSES_SCRIPT}" for item in request.session.items
            if getattr(item, "originalname", None) == PROCESSES_TEST]
    return _run(tmp_path_factory, *_selected(request, "test_partitioned", "--only"),
                *_selected(request, WITHOUT_TEST, "--without"), *also[:1])


# The script's checks run in one process on 4 simulated devices: the exhaustive tier runs
# it whole (once); the rules' shapes are inspected below in the default tier.
@pytest.mark.exhaustive
@pytest.mark.parametrize("name", CHECKS)
def test_partitioned(report, name):
    ran = report["checks"]
    assert name in ran, f"check {name} did not run; ran: {sorted(ran)}"
    entry = ran[name]
    assert entry["ok"] and entry["partitioned"], entry["detail"]


@pytest.mark.exhaustive
def test_the_script_runs_exactly_these_checks(report):
    assert sorted(report["defined"]) == sorted(CHECKS)


# The control: the partitioned checks again, in the same process, without the rules.
@pytest.mark.exhaustive
@pytest.mark.parametrize("name", PARTITIONED)
def test_without_the_rules_the_values_hold_but_partitioning_fails(report, name):
    ran = report["without_rules"]
    assert name in ran, f"check {name} did not run without the rules; ran: {sorted(ran)}"
    entry = ran[name]
    assert entry["ok"], entry["detail"]  # unpartitioned calls are gathered: still right
    assert not entry["partitioned"], f"{name} passed its partition assertions without rules"


@pytest.mark.exhaustive
def test_the_ops_processes_script_as_one_process_of_these_devices(report):
    """Every family that splits across devices (sharding_scripts/ops_processes.py, which
    tests/test_ops_processes.py runs on 2 processes of 2 devices) as one process of the 4
    devices, in the script's process after its checks (their Numba builds reused)."""
    ran = report["scripts"][str(PROCESSES_SCRIPT)]
    assert ran["ok"], ran["detail"] + ran["stdout"]
    assert line(0, 1) in ran["stdout"], ran["stdout"]


def test_every_ops_kernel_has_a_rule_and_checks():
    kernels = {f.name: f for k in primforge.registry.list_kernels()
               if k.name.startswith("primforge.ops.") for f in forms_of(k)}
    assert sorted(kernels) == sorted(KERNEL_CHECKS)
    for name, kernel in kernels.items():
        assert kernel.sharding_rule is not None, name
    assert {c for cs in KERNEL_CHECKS.values() for c in cs} <= set(CHECKS)


# ----------------------------------------------------------------------------- resolved rules
def _s(*shape, dtype=jnp.float32):
    return jax.ShapeDtypeStruct(shape, dtype)


def _free(kernel, ins, outs, **params):
    """The factors of a call that may be sharded, and its reduction factors."""
    res = sharding._resolve(kernel, ins, outs, (), params)
    factors = {f for fs in res.operands + res.results for f in fs}
    return factors - res.replicated - res.reduction, set(res.reduction)


@pytest.mark.parametrize("transpose", [False, True])
def test_csr_and_jitc_shard_only_the_columns(transpose):
    m, n, nnz, c = 6, 5, 9, 4
    rows_in, rows_out = (m, n) if transpose else (n, m)
    i32 = jnp.int32
    csr_in = (_s(nnz), _s(nnz, dtype=i32), _s(m + 1, dtype=i32))
    kw = {"shape": (m, n), "transpose": transpose}
    free = _free(ops.csrmm_p, csr_in + (_s(rows_in, c),), (_s(rows_out, c),), **kw)
    assert free == ({"c"}, set())
    assert _free(ops.csrmv_p, csr_in + (_s(rows_in),), (_s(rows_out),), **kw) == (set(), set())
    jc_in = (_s(1), _s(1, dtype=jnp.uint32), _s(30, dtype=jnp.uint32))
    kw.update(prob=0.5, weight_kind="homo")
    assert _free(ops.jitc_matmat_p, jc_in + (_s(rows_in, c),), (_s(rows_out, c),),
                 **kw) == ({"c"}, set())
    assert _free(ops.binary_jitc_matvec_p, jc_in + (_s(rows_in, dtype=jnp.bool_),),
                 (_s(rows_out),), **kw) == (set(), set())


def test_fixed_num_rows_gather_or_reduce():
    m, n, k = 6, 5, 3
    ins = (_s(m, k), _s(m, k, dtype=jnp.int32))
    gather = _free(ops.fixed_num_mv_p, ins + (_s(n),), (_s(m),), shape=(m, n), transpose=False)
    scatter = _free(ops.fixed_num_mv_p, ins + (_s(m),), (_s(n),), shape=(m, n), transpose=True)
    assert gather == ({"m"}, {"k"})
    assert scatter == (set(), {"m", "k"})


def test_dense_shards_kept_and_contracted_dimensions():
    w = _s(6, 5)
    assert _free(ops.densemm_p, (w, _s(5, 2)), (_s(6, 2),), transpose=False) == ({"m", "c"}, {"n"})
    assert _free(ops.densemv_p, (w, _s(6)), (_s(5),), transpose=True) == ({"n"}, {"m"})


def test_plasticity_dense_is_elementwise_and_compressed_stays_whole():
    w = _s(6, 5)
    assert _free(ops.dense_update_p, (w, _s(5), _s(6)), (w,), on_rows=False, w_min=None,
                 w_max=None) == ({"m", "n"}, set())
    ins = (_s(9), _s(9, dtype=jnp.int32), _s(7, dtype=jnp.int32), _s(6), _s(5))
    assert _free(ops.compressed_update_p, ins, (_s(9),), shape=(6, 5), on_rows=True,
                 masked=False, w_min=None, w_max=None) == (set(), set())


@pytest.mark.parametrize("on_rows", [True, False])
def test_plasticity_on_fixed_number_rows_shards_the_rows(on_rows):
    w, i = _s(6, 3), _s(6, 3, dtype=jnp.int32)
    vectors = (_s(6), _s(5)) if on_rows else (_s(5), _s(6))
    assert _free(ops.compressed_update_p, (w, i) + vectors, (w,), shape=(6, 5),
                 on_rows=on_rows, masked=True, w_min=None, w_max=None) == ({"m", "k"}, set())
