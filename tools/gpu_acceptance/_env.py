"""The environment step: versions, the GPU, tools, and which backends can launch a kernel."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
import time

from primforge.backends._common import install_hint

#: Distributions reported by version ("missing" when not installed).
DISTRIBUTIONS = (
    "jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda13-pjrt", "jax-cuda12-plugin",
    "jax-cuda12-pjrt", "numpy", "scipy", "ml_dtypes", "numba", "numba-cuda", "llvmlite",
    "triton", "warp-lang", "cupy-cuda13x", "cupy-cuda12x", "torch", "pytest", "pytest-xdist",
    "hypothesis", "matplotlib", "flatbuffers",
)
#: What needs each optional Python package (reported when it is missing).
USED_BY = {
    "pytest": "the suite steps", "pytest-xdist": "parallel suite runs (serial without it)",
    "hypothesis": "property tests (they skip without it)", "scipy": "some reference tests",
    "matplotlib": "plotting tests and examples", "numba": "CPU kernels (numba backend)",
    "numba-cuda": "the numba_cuda backend", "triton": "the triton backend",
    "warp-lang": "the warp backend", "flatbuffers": "jax.export serialization tests",
}


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _run(cmd: list[str], timeout: float = 15.0) -> str | None:
    if shutil.which(cmd[0]) is None:
        return None
    try:
        out = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError) as e:
        return f"error: {e}"
    return (out.stdout or out.stderr).strip()


def _nvidia_smi() -> list[dict]:
    text = _run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,compute_cap",
                 "--format=csv,noheader"])
    if not text or text.startswith("error"):
        return []
    gpus = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 4:
            gpus.append(dict(zip(("name", "driver", "memory", "compute_capability"), parts)))
    return gpus


def _cuda_version() -> str | None:
    text = _run(["nvidia-smi"])
    if text and "CUDA Version:" in text:
        return text.split("CUDA Version:")[1].split()[0]
    return None


def _backend_reason(name: str, module, platform: str) -> str | None:
    """Why backend ``name`` cannot build for ``platform`` here, or None when it can."""
    if platform not in module.PLATFORMS:
        return f"serves only {', '.join(module.PLATFORMS)}"
    if module.is_available(platform):
        return None
    if name == "cuda_raw":
        return ("nvcc not found (PATH, CUDA_HOME, /usr/local/cuda, pip nvidia-cuda-nvcc)"
                if platform == "gpu" else "no C++ compiler found (CXX, g++, c++, clang++)")
    if name == "triton" and importlib.util.find_spec("triton") is not None:
        return "jaxlib ships no Triton dialect"
    extra = f" ({install_hint(module.EXTRA)})" if module.EXTRA else ""
    return f"missing its package{extra}"


def collect(emit, *, platform: str, backends: list[str] | None) -> None:
    """Emit the environment record, then one record per backend (reason when it cannot run)."""
    import jax
    import numpy as np

    info: dict = {
        "kind": "env", "python": sys.version.split()[0], "executable": sys.executable,
        "machine": platform_name(), "cpus": os.cpu_count(),
        "versions": {d: _version(d) for d in DISTRIBUTIONS},
        "nvidia_smi": _nvidia_smi(), "cuda_driver_version": _cuda_version(),
        "nvcc": _run(["nvcc", "--version"]), "tools": {
            t: shutil.which(t) for t in ("nvcc", "ptxas", "ncu", "compute-sanitizer", "gdb")},
        "env": {k: os.environ.get(k) for k in ("JAX_PLATFORMS", "CUDA_VISIBLE_DEVICES",
                                               "XLA_PYTHON_CLIENT_PREALLOCATE", "PYTHONPATH")},
    }
    if info["nvcc"]:
        info["nvcc"] = info["nvcc"].splitlines()[-1]
    info["missing"] = {d: USED_BY[d] for d in USED_BY if info["versions"].get(d) is None}
    try:
        devices = jax.devices()
        info["jax_devices"] = [
            {"platform": d.platform, "kind": d.device_kind,
             "compute_capability": getattr(d, "compute_capability", None)} for d in devices]
        info["jax_default_backend"] = jax.default_backend()
    except Exception as e:  # noqa: BLE001 - a plugin that cannot start
        info["jax_devices"], info["jax_error"] = [], f"{type(e).__name__}: {e}"
    import primforge

    info["primforge"] = {"version": getattr(primforge, "__version__", "?"),
                         "path": os.path.dirname(primforge.__file__)}
    emit(info)

    from primforge.backends import KNOWN_BACKENDS, get_backend
    from tools.gpu_acceptance import _affine

    x = np.linspace(-1, 1, 4096, dtype=np.float32)
    # cuda_raw last: its nvcc build is the slowest probe.
    for name in sorted(KNOWN_BACKENDS, key=lambda b: b == "cuda_raw"):
        if name == "jax":
            continue
        module = get_backend(name)
        record = {"kind": "backend", "name": name, "platform": platform,
                  "reason": _backend_reason(name, module, platform)}
        record["available"] = record["reason"] is None
        if not record["available"]:
            record["ran"] = None
        elif name not in _affine.BACKENDS[platform]:
            record["ran"] = None
            record["reason"] = (f"not probed on {platform} (probed there: "
                                f"{', '.join(_affine.BACKENDS[platform])})")
        elif backends is not None and name not in backends:
            record["ran"], record["reason"] = None, "not selected (--backends)"
        else:
            t0 = time.perf_counter()
            try:
                y = np.asarray(jax.block_until_ready(_affine.run_affine(platform, name, x)))
                ok = bool(np.allclose(y, 2 * x + 1, rtol=1e-6, atol=1e-6))
                record["ran"] = ok
                if not ok:
                    record["reason"] = "launched, but 2x+1 came back wrong"
            except Exception as e:  # noqa: BLE001 - recorded, the run goes on
                record["ran"], record["reason"] = False, f"{type(e).__name__}: {e}"[:1500]
            record["seconds"] = round(time.perf_counter() - t0, 2)
        emit(record)


def platform_name() -> str:
    """``'Linux-...-x86_64'``: the OS and architecture of this machine."""
    return platform.platform()
