"""The troubleshooting page quotes the errors JAX raises about primforge kernels verbatim.

A user who searches the docs for JAX's message must find the entry, so the entry's quoted
start is checked against the message JAX raises today.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

import primforge

numba = pytest.importorskip("numba")  # the cpu extra; the test extra installs it

PAGE = Path(__file__).resolve().parents[1] / "docs" / "troubleshooting.md"


def quoted_starts() -> list[str]:
    """The first cells of the 'Errors raised by JAX' table, without their backticks."""
    text = PAGE.read_text(encoding="utf-8")
    section = text.split("## Errors raised by JAX about primforge kernels", 1)[1]
    section = section.split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return [row.split("|")[1].strip().strip("`") for row in rows]


def test_export_of_a_numba_kernel_raises_the_quoted_message():
    k = primforge.XLACustomKernel("troubleshooting_export_numba")

    def gen(**_):
        @numba.njit
        def kernel(x, out):
            for i in range(x.size):
                out.flat[i] = 2 * x.flat[i]
        return kernel

    k.def_numba_kernel(gen)
    spec = jax.ShapeDtypeStruct((3,), jnp.float32)

    def f(x):
        return k(x, outs=jax.ShapeDtypeStruct(x.shape, x.dtype))

    with pytest.raises(ValueError) as info:
        export.export(jax.jit(f))(spec)
    message = str(info.value)
    assert "primforge_numba_" in message
    assert any(message.startswith(start) for start in quoted_starts()), (message[:200],
                                                                           quoted_starts())
    # What the entry says to do works: prepare, export with the checks disabled, call.
    from primforge.backends import numba as nb

    targets = nb.prepare(f, spec)
    exp = export.export(jax.jit(f), disabled_checks=nb.disabled_checks(targets))(spec)
    x = np.arange(3, dtype=np.float32)
    np.testing.assert_array_equal(export.deserialize(exp.serialize()).call(x), 2 * x)
