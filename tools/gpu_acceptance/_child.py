"""Entry point of one step's process: ``python -m tools.gpu_acceptance._child STEP
CONFIG`` runs the step, appending one JSON record per result to the file named by
``PF_ACCEPTANCE_LOG``."""

from __future__ import annotations

import json
import os
import sys


def _emitter(path: str):
    def emit(record: dict) -> None:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record, default=str) + "\n")

    return emit


def _platform(requested: str) -> str:
    if requested != "auto":
        return requested
    import jax

    try:
        return "gpu" if jax.devices("gpu") else "cpu"
    except RuntimeError:
        return "cpu"


def run(step: str, log: str, config: dict) -> None:
    """Run ``step`` with ``config`` (platform, backends, kernels, max_cases)."""
    emit = _emitter(log)
    platform = _platform(config.get("platform", "auto"))
    backends = config.get("backends")
    if step == "env":
        from tools.gpu_acceptance import _env

        emit({"kind": "platform", "platform": platform})
        _env.collect(emit, platform=platform, backends=backends)
    elif step == "kernels":
        from tools.gpu_acceptance import _kernels

        _kernels.check_all(emit, platform=platform, patterns=config.get("kernels"),
                           backends=backends, max_cases=int(config.get("max_cases", 4)))
    elif step == "bench":
        from tools.gpu_acceptance import _bench

        _bench.run_all(emit, platform=platform, backends=backends)
    else:
        raise SystemExit(f"unknown step {step!r}")


if __name__ == "__main__":
    run(sys.argv[1], os.environ["PF_ACCEPTANCE_LOG"], json.loads(sys.argv[2]))
