"""Test-suite configuration."""

# Scripts run in subprocesses (several simulated devices, several processes): they parse
# their own command line at import, so pytest must not import them for doctests.
collect_ignore_glob = ["sharding_scripts/*"]


def pytest_terminal_summary(terminalreporter):
    """How many functions XLA:GPU compiled, per backend and target (see gpu_utils)."""
    import sys

    gpu_utils = sys.modules.get("gpu_utils")
    if gpu_utils is None or not gpu_utils.COMPILED:
        return
    terminalreporter.section("XLA:GPU compiles (functions per backend and target)")
    targets = gpu_utils.GPU_TARGETS
    terminalreporter.write_line(f"{'backend':12s}" + "".join(f"{t:>8s}" for t in targets))
    for backend in sorted({b for b, _ in gpu_utils.COMPILED}):
        row = "".join(f"{gpu_utils.COMPILED[backend, t]:8d}" for t in targets)
        terminalreporter.write_line(f"{backend:12s}{row}")
