"""Benchmark cases of the delayed products, imported only when benchmark data is asked for.

:func:`floats` feeds ``delayed_csrmv_p``, :func:`events` ``binary_delayed_csrmv_p``,
:func:`reads` ``delay_read_p``, :func:`jitc_events` ``binary_delayed_jitc_matvec_p``.
"""

from __future__ import annotations

import numpy as np

from primforge.bench import BenchmarkConfig
from primforge.ops.connectivity import fixed_prob

__all__ = ["CASES", "RATE", "configs", "events", "floats", "jitc_events", "reads"]

CASES = ((4_000, 0.02, 50), (10_000, 0.01, 50))  # (n, p, longest delay in steps)
RATE = 0.02  # fraction of neurons that spike


def configs(*, binary: bool, platform: str) -> list:
    """Random CSR matrices with delays uniform in ``[1, longest]`` steps."""
    del platform
    out = []
    for i, (n, p, longest) in enumerate(CASES):
        W = fixed_prob(n, n, p, weight=0.5, seed=31 + i)
        rs = np.random.RandomState(7 + i)
        data = rs.random_sample(W.nnz).astype(np.float32)
        delays = rs.randint(1, longest + 1, W.nnz).astype(np.int32)
        active = rs.random_sample(n) < RATE
        x = active if binary else np.where(active, rs.standard_normal(n), 0).astype(np.float32)
        buffer = np.zeros((longest + 1, n), np.float32)
        out.append(BenchmarkConfig(
            args=(data, np.asarray(W.indices), np.asarray(W.indptr), delays, x, buffer, 3),
            kwargs={"shape": (n, n)},
            params={"n": n, "p": p, "rate": RATE, "max_delay": longest}))
    return out


def floats(*, platform: str) -> list:
    """The cases with a float input."""
    return configs(binary=False, platform=platform)


def events(*, platform: str) -> list:
    """The cases with binary events."""
    return configs(binary=True, platform=platform)


def reads(*, platform: str) -> list:
    """Reads of a ring buffer of the sizes above."""
    del platform
    out = []
    for i, (n, _, longest) in enumerate(CASES):
        rs = np.random.RandomState(41 + i)
        buffer = rs.standard_normal((longest + 1, n)).astype(np.float32)
        out.append(BenchmarkConfig(args=(buffer, 17), kwargs={},
                                   params={"n": n, "max_delay": longest}))
    return out


def jitc_events(*, platform: str) -> list:
    """Binary events through a just-in-time matrix with delays uniform in ``[1, longest]``."""
    del platform
    out = []
    for i, (n, p, longest) in enumerate(CASES):
        rs = np.random.RandomState(53 + i)
        active = rs.random_sample(n) < RATE
        buffer = np.zeros((longest + 1, n), np.float32)
        out.append(BenchmarkConfig(
            args=(0.5, 17 + i, active, buffer, 3),
            kwargs={"shape": (n, n), "prob": p, "delay_range": (1, longest)},
            params={"n": n, "p": p, "rate": RATE, "max_delay": longest}))
    return out
