"""primforge quickstart: the two halves of the library, one screen of output.

1. A custom operator. ``softclip(x, limit) = limit * tanh(x / limit)``, a smooth clamp,
   gets a Numba kernel for the CPU (run by XLA through the typed FFI, no Python on the
   call path) and a pure-JAX reference. We run it eagerly and under jit, grad and vmap,
   and print each result next to the same computation in plain ``jax.numpy``.
2. The event-driven operator library, ``primforge.ops``. A random sparse connectivity
   ``W`` (a CSR matrix) receives a spike vector with 1% of its entries active:
   ``spikes @ W`` visits only the rows of the neurons that spiked. We check it against
   the dense product in ``jax.numpy`` and time both under ``jax.jit``.

Run:  python examples/quickstart.py
"""

import math
import time

import jax
import jax.numpy as jnp
import numpy as np

import primforge
from primforge import ops

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
    print(f"  {label:<7} primforge {np.array2string(got.ravel()[:3], precision=3)}"
          f"  jax.numpy {np.array2string(want.ravel()[:3], precision=3)}  max|diff| {err:.1e}")
    assert err < 1e-5, f"{label}: primforge and jax.numpy disagree"


def custom_operator():
    x = jnp.linspace(-4.0, 4.0, 8, dtype=jnp.float32)
    batch = jnp.stack([x, 2 * x, -x])
    backend = softclip.get_default("cpu")
    print(f"1. A custom operator, softclip: the {backend!r} backend on the CPU "
          f"(available: {softclip.available_backends('cpu')})")
    show("eager", apply(x), reference(x))
    show("jit", jax.jit(apply)(x), jax.jit(reference)(x))
    loss = lambda x: jnp.sum(apply(x) ** 2)
    show("grad", jax.grad(loss)(x), jax.grad(lambda x: jnp.sum(reference(x) ** 2))(x))
    show("vmap", jax.vmap(apply)(batch), jax.vmap(reference)(batch))
    eqns = jax.make_jaxpr(jax.vmap(apply))(batch).eqns
    n_calls = sum(e.primitive.name == softclip.name for e in eqns)
    print(f"  vmap over {batch.shape[0]} rows made {n_calls} kernel call (native batching, "
          "no loop)")
    with primforge.use_backend("cpu", "jax"):
        show("jax ref", apply(x), reference(x))


def median_ms(fns, args, repeats=21):
    """Median wall time of each jitted function, the calls interleaved (after one warm-up)."""
    for f, a in zip(fns, args):
        f(*a).block_until_ready()
    times = [[] for _ in fns]
    for _ in range(repeats):
        for f, a, t in zip(fns, args, times):
            start = time.perf_counter()
            f(*a).block_until_ready()
            t.append(time.perf_counter() - start)
    return [1e3 * float(np.median(t)) for t in times]


def event_driven(n=5000, p=0.02, rate=0.01):
    # n x n random connectivity, each pair connected with probability p, one weight per
    # synapse; rows are the presynaptic neurons, so ``spikes @ W`` is event-driven.
    W = ops.fixed_prob(n, n, p, weight=lambda rng, k: rng.normal(0.0, 0.1, k), seed=0)
    spikes = jax.random.bernoulli(jax.random.key(0), rate, (n,))  # bool, ~1% True
    dense = W.todense()  # the same matrix, dense (n x n float32)
    print(f"2. Event-driven operators, primforge.ops: W = ops.fixed_prob({n}, {n}, {p}) "
          f"({W.nnz:,} synapses)")
    print(f"  spikes: {int(spikes.sum())} of {n} neurons active ({rate:.0%})")

    event_fn = jax.jit(lambda s, W: s @ W)  # numba kernel: visits the spiking rows only
    dense_fn = jax.jit(lambda s, D: s.astype(D.dtype) @ D)  # jax.numpy: all n x n entries
    got, want = np.asarray(event_fn(spikes, W)), np.asarray(dense_fn(spikes, dense))
    err = float(np.max(np.abs(got - want)))
    assert np.allclose(got, want, rtol=1e-5, atol=1e-5), f"spikes @ W is off by {err}"
    print(f"  spikes @ W matches the dense spikes @ W.todense()  max|diff| {err:.1e}")

    t_event, t_dense = median_ms([event_fn, dense_fn], [(spikes, W), (spikes, dense)])
    print(f"  event-driven spikes @ W: {t_event:.2f} ms, dense: {t_dense:.2f} ms "
          f"({t_dense / t_event:.0f}x; jax.jit, median of 21)")


def main():
    custom_operator()
    event_driven()
    print("all results match jax.numpy")


if __name__ == "__main__":
    main()
