"""A pytest plugin for the acceptance command: selects tests and logs each result at once.

Loaded with ``-p tools.gpu_acceptance._pytest_plugin``. ``PF_ACCEPTANCE_LOG`` names a
file that gets one JSON line per test result, as it happens (a run stopped at its time
budget keeps what finished). ``PF_ACCEPTANCE_SELECT=gpu`` keeps only the tests marked to
skip without a GPU (the reason :data:`GPU_SKIP_REASON`), ``cpu`` drops them.
"""

from __future__ import annotations

import json
import os

#: The skip reason of the suite's tests that need a GPU (tests/gpu_utils.py).
GPU_SKIP_REASON = "needs an NVIDIA GPU visible to JAX"
_MESSAGE_CHARS = 1500


def _write(record: dict) -> None:
    path = os.environ.get("PF_ACCEPTANCE_LOG")
    if not path:
        return
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


def _needs_gpu(item) -> bool:
    return any(GPU_SKIP_REASON in str(m.kwargs.get("reason", "")) for m in
               item.iter_markers("skipif"))


def pytest_collection_modifyitems(config, items):
    select = os.environ.get("PF_ACCEPTANCE_SELECT", "")
    if select not in ("gpu", "cpu"):
        return
    keep = [it for it in items if _needs_gpu(it) == (select == "gpu")]
    dropped = [it for it in items if it not in keep]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


def pytest_collection_finish(session):
    _write({"kind": "collected", "n": len(session.items), "pid": os.getpid()})


def pytest_collectreport(report):
    if report.failed and not os.environ.get("PYTEST_XDIST_WORKER"):
        _write({"kind": "collect_error", "id": report.nodeid,
                "message": str(report.longrepr)[-_MESSAGE_CHARS:]})


def pytest_runtest_logreport(report):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return  # on an xdist worker: the controller logs the report it receives
    outcome = None
    if report.when == "call":
        outcome = report.outcome
    elif report.failed:
        outcome = "error"  # setup or teardown failed
    elif report.when == "setup" and report.skipped:
        outcome = "skipped"
    if outcome is None:
        return
    record = {"kind": "test", "id": report.nodeid, "outcome": outcome,
              "seconds": round(report.duration, 3)}
    if outcome != "passed":
        if outcome == "skipped" and isinstance(report.longrepr, tuple):
            record["message"] = str(report.longrepr[2])[:_MESSAGE_CHARS]
        else:
            record["message"] = str(report.longrepr)[-_MESSAGE_CHARS:]
    _write(record)
