"""Demo kernels for the CLI, bench, registry and autotune tests (imported with --import).

* ``pf_demo_scale``: y = 2x; backends 'jax' and 'alt' (x + x) agree.
* ``pf_demo_wrong``: y = x + 1; backend 'wrong' computes x + 2, a deliberate mismatch.
* ``pf_demo_plain``: a jax-only kernel without benchmark data.
``replace=True`` lets the module be imported under two names (doctest collection) safely.
"""

import jax
import jax.numpy as jnp

import primforge
from primforge.bench import BenchmarkConfig


def _same_shape_call(kernel):
    def call(x, backend=None):
        return kernel(x, outs=jax.ShapeDtypeStruct(x.shape, x.dtype), backend=backend)

    return call


def _data(*, platform):
    return [BenchmarkConfig(args=(jnp.linspace(-1.0, 1.0, n, dtype=jnp.float32),), n=n)
            for n in (16, 256)]


scale = primforge.XLACustomKernel("pf_demo_scale", "Doubles its input.", replace=True)
scale.def_kernel("jax", "cpu", lambda **kw: lambda x: 2 * x)
scale.def_kernel("alt", "cpu", lambda **kw: lambda x: x + x)
scale.def_tags("pf_demo", "pf_elementwise")
scale.def_call(_same_shape_call(scale))
scale.def_benchmark_data(_data)

wrong = primforge.XLACustomKernel("pf_demo_wrong", "Adds one (one backend is wrong).",
                                  replace=True)
wrong.def_kernel("jax", "cpu", lambda **kw: lambda x: x + 1)
wrong.def_kernel("wrong", "cpu", lambda **kw: lambda x: x + 2)
wrong.def_tags("pf_demo", "pf_broken")
wrong.def_call(_same_shape_call(wrong))
wrong.def_benchmark_data(_data)

plain = primforge.XLACustomKernel("pf_demo_plain", replace=True)
plain.def_kernel("jax", "cpu", lambda **kw: lambda x: -x)
plain.def_tags("pf_other")

# Its default backend always fails to build; 'jax' works. Autotune must pick 'jax'.
flaky = primforge.XLACustomKernel("pf_demo_flaky", "Negates; its default backend is broken.",
                                  replace=True)


def _broken_generator(**kw):
    raise RuntimeError("this backend is broken on purpose")


flaky.def_kernel("broken", "cpu", _broken_generator)
flaky.def_kernel("jax", "cpu", lambda **kw: lambda x: -x)
flaky.def_tags("pf_flaky")
flaky.def_call(_same_shape_call(flaky))
flaky.def_benchmark_data(_data)
