"""The GPU acceptance command: prove primforge on a GPU machine in one call.

``python -m primforge.gpu_acceptance --out DIR`` reports the environment and which
backends launch a kernel, runs the suite's GPU tests on the GPU, checks every GPU backend
of every registered operator against its ``jax`` reference (forward, grad, vmap), times
contenders side by side (elementwise GB/s, CSR event products, the COBA network), runs the
suite's CPU core on the machine's JAX, and writes ``report.json``, ``report.md`` and
``logs/`` under ``DIR``. Each step runs in its own process under its own time budget.
Without a GPU (or with ``--rehearse``) every step runs with CPU runners and small sizes.
See docs/gpu.md.

Example:
    >>> from primforge.gpu_acceptance import STEPS
    >>> STEPS
    ('env', 'gpu_tests', 'kernels', 'bench', 'cpu_suite')
"""

from primforge.gpu_acceptance._driver import STEPS, main

__all__ = ["STEPS", "main"]
