"""The GPU acceptance command: prove primforge on a GPU machine in one call.

``python -m tools.gpu_acceptance --out DIR`` runs each step in its own process under
its own budget and writes ``report.json``, ``report.md`` and ``logs/`` (see docs/gpu.md).

Example:
    >>> from tools.gpu_acceptance import STEPS
    >>> STEPS
    ('env', 'gpu_tests', 'kernels', 'bench', 'cpu_suite')
"""

from tools.gpu_acceptance._driver import STEPS, main

__all__ = ["STEPS", "main"]
