"""A custom jaxpr interpreter in a few lines: count the FLOPs of your own primitives.

Two primitives are derived from jax.numpy implementations with ``register_primitive``;
a named rule table holds a FLOP formula for each; ``iter_rule_eqns`` finds every use,
however deep it sits (inside ``jit``, ``scan``, ``cond``, ``remat``...). A second
"interpreter" lists the trainable inputs of ETP primitives from their metadata.

Run: ``python examples/custom_interpreter.py``
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from primforge.primitive import get_trainable_invars_fn, get_x_invar_index, register_primitive
from primforge.rules import iter_rule_eqns, rule_table

# Two primitives, all JAX rules derived from their implementations.
dense_p = register_primitive(
    "example_dense",
    lambda x, w, b: x @ w + b,
    trainable_invars_fn=lambda params: {"weight": 1, "bias": 2},
)
act_p = register_primitive("example_act", lambda x, *, slope: jnp.where(x > 0, x, slope * x))

# The interpreter's own kind of rule: equation -> FLOPs.
FLOPS = rule_table("example.flops")


def _dense_flops(eqn):
    (batch, k), (_, n) = eqn.invars[0].aval.shape, eqn.invars[1].aval.shape
    return 2 * batch * k * n + batch * n


FLOPS.register(dense_p, _dense_flops)
FLOPS.register(act_p, lambda eqn: 2 * math.prod(eqn.outvars[0].aval.shape))


def count_flops(fn, *args) -> int:
    """The interpreter: walk the jaxpr and sum the rules (loops count once per trace)."""
    return sum(rule(eqn) for eqn, rule in iter_rule_eqns(jax.make_jaxpr(fn)(*args), FLOPS))


def trainable_inputs(fn, *args) -> list[tuple[str, dict]]:
    """List each ETP equation with the shapes of its x input and of its trainable inputs."""
    rows = []
    for eqn, tif in iter_rule_eqns(jax.make_jaxpr(fn)(*args), get_trainable_invars_fn):
        shapes = {key: eqn.invars[i].aval.shape for key, i in tif(eqn.params).items()}
        shapes["x"] = eqn.invars[get_x_invar_index(eqn.primitive)].aval.shape
        rows.append((eqn.primitive.name, shapes))
    return rows


def model(params, x):
    @jax.jit
    def layer(h, p):
        return act_p.bind(dense_p.bind(h, p["w"], p["b"]), slope=0.1)

    h = layer(x, params[0])
    h, _ = jax.lax.scan(lambda h, _: (layer(h, params[1]), None), h, None, length=3)
    return jax.lax.cond(h.sum() > 0, lambda h: layer(h, params[1]), jax.checkpoint(jnp.tanh), h)


def main() -> dict:
    key = jax.random.key(0)
    params = [
        {"w": jax.random.normal(key, (4, 8)), "b": jnp.zeros(8)},
        {"w": jax.random.normal(key, (8, 8)), "b": jnp.zeros(8)},
    ]
    x = jnp.ones((2, 4))
    flops = count_flops(model, params, x)
    rows = trainable_inputs(model, params, x)
    print(f"FLOPs of the custom primitives (each loop body counted once): {flops}")
    for name, shapes in rows:
        print(f"  {name}: {shapes}")
    return {"flops": flops, "rows": rows}


if __name__ == "__main__":
    main()
