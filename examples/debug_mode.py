"""Debug mode catches a kernel that skips elements and one that disagrees with its reference.

Run: ``python examples/debug_mode.py``. Each broken kernel runs once normally (a wrong
result comes back without a word) and once under ``primforge.debug_mode()``, where the
call raises ``primforge.KernelError`` naming the kernel, the output and the first bad
index.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numba

import primforge

# A kernel that forgets the last element of its output: what it returns there is whatever
# the (uninitialised) buffer held.
forgetful = primforge.XLACustomKernel("example_forgetful")


def forgetful_gen(**_):
    @numba.njit
    def kernel(x, out):
        for i in range(x.size - 1):  # off by one
            out.flat[i] = 2 * x.flat[i]

    return kernel


forgetful.def_numba_kernel(forgetful_gen)

# A kernel whose values are wrong, next to its pure-JAX reference.
sloppy = primforge.XLACustomKernel("example_sloppy")


def sloppy_gen(**_):
    @numba.njit
    def kernel(x, out):
        for i in range(x.size):
            out.flat[i] = 2 * x.flat[i] + (1.0 if i == 3 else 0.0)

    return kernel


sloppy.def_numba_kernel(sloppy_gen)
sloppy.def_kernel("jax", "cpu", lambda **_: lambda x: 2 * x)


def main():
    x = jnp.arange(6.0).reshape(2, 3)
    out = jax.ShapeDtypeStruct(x.shape, x.dtype)
    for kernel in (forgetful, sloppy):
        print(f"{kernel.name}: without debug mode ->", kernel(x, outs=out).ravel().tolist())
        with primforge.debug_mode():
            try:
                kernel(x, outs=out)
            except primforge.KernelError as e:
                print(f"{kernel.name}: debug mode caught it -> {e}")
            else:
                raise SystemExit(f"{kernel.name}: debug mode missed the bug")


if __name__ == "__main__":
    main()
