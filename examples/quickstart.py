"""primforge quickstart: one custom operator, two backends, every transformation.

The operator is ``softclip(x, limit) = limit * tanh(x / limit)``, a smooth clamp. It gets
a Numba kernel for the CPU (run by XLA through the typed FFI, no Python on the call path)
and a pure-JAX reference. We run it eagerly and under jit, grad and vmap, and print each
result next to the same computation in plain ``jax.numpy``.

Run:  python examples/quickstart.py
"""

import math

import jax
import jax.numpy as jnp
import numpy as np

import primforge

softclip = primforge.XLACustomKernel("quickstart_softclip")


# 1. A Numba kernel for the CPU: inputs first, then outputs, written in place.
def numba_generator(limit, **_):
    import numba

    @numba.njit
    def kernel(x, out):
        for i in range(x.size):
            out.flat[i] = limit * math.tanh(x.flat[i] / limit)

    return kernel


# 2. A pure-JAX reference: runs on every platform and is the oracle for the others.
def jax_generator(limit, **_):
    return lambda x: limit * jnp.tanh(x / limit)


softclip.def_numba_kernel(numba_generator)  # first one registered: the CPU default
softclip.def_kernel("jax", "cpu", jax_generator)


# 3. A JVP rule (per input): d/dx softclip = 1 - tanh(x / limit)^2. Its tangent is plain
#    jax.numpy, so reverse mode (grad) needs no transpose rule.
def softclip_jvp(t, x, *, limit, **_):
    return [t * (1 - jnp.tanh(x / limit) ** 2)]


softclip.def_jvp_rule2(softclip_jvp)


def apply(x, limit=2.0):
    return softclip(x, outs=jax.ShapeDtypeStruct(x.shape, x.dtype), limit=limit)


def reference(x, limit=2.0):
    return limit * jnp.tanh(x / limit)


def show(label, got, want):
    got, want = np.asarray(got), np.asarray(want)
    err = float(np.max(np.abs(got - want))) if got.size else 0.0
    print(f"{label:<8} primforge {np.array2string(got.ravel()[:4], precision=4)}"
          f"  jax.numpy {np.array2string(want.ravel()[:4], precision=4)}  max|diff| {err:.1e}")
    assert err < 1e-5, f"{label}: primforge and jax.numpy disagree"


def main():
    x = jnp.linspace(-4.0, 4.0, 8, dtype=jnp.float32)
    batch = jnp.stack([x, 2 * x, -x])
    backend = softclip.get_default("cpu")
    print(f"softclip on the CPU with the {backend!r} backend (available: "
          f"{softclip.available_backends('cpu')})")
    show("eager", apply(x), reference(x))
    show("jit", jax.jit(apply)(x), jax.jit(reference)(x))
    loss = lambda x: jnp.sum(apply(x) ** 2)
    show("grad", jax.grad(loss)(x), jax.grad(lambda x: jnp.sum(reference(x) ** 2))(x))
    show("vmap", jax.vmap(apply)(batch), jax.vmap(reference)(batch))
    eqns = jax.make_jaxpr(jax.vmap(apply))(batch).eqns
    n_calls = sum(e.primitive.name == softclip.name for e in eqns)
    print(f"vmap over {batch.shape[0]} rows made {n_calls} kernel call (native batching, no loop)")
    with primforge.use_backend("cpu", "jax"):
        show("jax ref", apply(x), reference(x))
    print("all results match jax.numpy")


if __name__ == "__main__":
    main()
