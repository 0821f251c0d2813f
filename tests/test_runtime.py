"""``set_cpu_threads``: XLA's CPU thread pool gets the size asked for, or the call says why not."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax.numpy as jnp
import pytest

import primforge

# A child that sizes the pool, runs a computation XLA splits over its pool, and reports
# the threads of the process by name (XLA's pool threads are named "...XLAEigen").
_CHILD = r"""
import collections, json, os, sys
import jax, jax.numpy as jnp
import primforge
n = int(sys.argv[1])
if n:
    primforge.set_cpu_threads(n)
x = jnp.ones(1 << 20)
jax.jit(lambda x: jnp.where(x > 0.5, x * 0.5, x + 1.0))(x).block_until_ready()
names = collections.Counter(open(f"/proc/self/task/{t}/comm").read().strip()
                            for t in os.listdir("/proc/self/task"))
print(json.dumps({"pool": sum(c for k, c in names.items() if "XLAEigen" in k),
                  "env": os.environ.get("PJRT_NPROC")}))
"""


def _child(n: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PJRT_NPROC", "NPROC")}
    env["JAX_PLATFORMS"] = "cpu"
    out = subprocess.run([sys.executable, "-c", _CHILD, str(n)], check=False,
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux's /proc")
def test_the_pool_has_the_threads_asked_for():
    default = _child(0)
    assert default["env"] is None and default["pool"] >= 1
    for n in (1, 3):
        got = _child(n)
        assert got == {"pool": n, "env": str(n)}, (n, got, default)


def test_too_late_is_an_error_unless_the_pool_already_has_that_size(monkeypatch):
    jnp.zeros(1).block_until_ready()  # the CPU backend exists from here on
    monkeypatch.delenv("PJRT_NPROC", raising=False)
    with pytest.raises(RuntimeError, match="already created its CPU backend.*PJRT_NPROC=2"):
        primforge.set_cpu_threads(2)
    assert "PJRT_NPROC" not in os.environ  # nothing pretends to have taken effect
    monkeypatch.setenv("PJRT_NPROC", "2")
    primforge.set_cpu_threads(2)  # what the pool was started with: nothing to change
    with pytest.raises(RuntimeError, match="cannot be resized"):
        primforge.set_cpu_threads(1)


@pytest.mark.parametrize("bad, error", [(0, ValueError), (-2, ValueError), (True, TypeError),
                                        (1.5, TypeError), ("2", TypeError), (None, TypeError)])
def test_bad_thread_counts_are_refused_by_name(bad, error, monkeypatch):
    monkeypatch.delenv("PJRT_NPROC", raising=False)
    with pytest.raises(error, match="set_cpu_threads: n must be a positive integer"):
        primforge.set_cpu_threads(bad)
    assert "PJRT_NPROC" not in os.environ
