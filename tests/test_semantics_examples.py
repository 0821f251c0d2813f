"""The README's example kernel is correct for every input rank it accepts.

It runs in a subprocess (a kernel writing out of bounds may abort the process), on inputs
of rank 0 to 3 and a zero-size one, eagerly, under jit, vmap and grad, in debug mode
(outputs checked for untouched elements and against the 'jax' reference), and is compared
with NumPy.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

pytest.importorskip("numba")

CHECK = """
import numpy as np
for shape in [(), (5,), (2, 3), (2, 3, 4), (0, 3)]:
    x = jnp.asarray(np.random.default_rng(0).normal(size=shape).astype(np.float32))
    out = jax.ShapeDtypeStruct(x.shape, x.dtype)
    want = 3.0 * np.asarray(x)
    np.testing.assert_allclose(scale(x, outs=out, factor=3.0), want, rtol=1e-6)
    np.testing.assert_allclose(jax.jit(lambda v: scale(v, outs=out, factor=3.0))(x), want,
                               rtol=1e-6)
    g = jax.grad(lambda v: scale(v, outs=out, factor=3.0).sum())(x)
    np.testing.assert_allclose(g, np.full(shape, 3.0), rtol=1e-6)
    xs = jnp.stack([x, 2 * x])
    np.testing.assert_allclose(jax.vmap(lambda v: scale(v, outs=out, factor=3.0))(xs),
                               3.0 * np.asarray(xs), rtol=1e-6)
print("README example OK")
"""


def test_readme_example_is_correct_for_every_rank():
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"## What it looks like\s+```python\n(.*?)```", readme, re.DOTALL).group(1)
    env = {**os.environ, "PRIMFORGE_DEBUG": "1", "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", block + CHECK], capture_output=True,
                          text=True, timeout=300, cwd=ROOT, env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "README example OK" in proc.stdout


def test_debug_mode_example_catches_both_kernels():
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("PRIMFORGE_DEBUG", None)
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "debug_mode.py")],
                          capture_output=True, text=True, timeout=300, cwd=ROOT, env=env,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"example_forgetful: debug mode caught it -> .*output 0 \(float32\[2, 3\]\)"
                     r" element \(1, 2\) was never written", proc.stdout)
    assert re.search(r"example_sloppy: debug mode caught it -> .*first differing index \(1, 0\):"
                     r" got 7\.0, reference 6\.0", proc.stdout)
