"""Missing-rule errors: what a primitive lacks, why it is needed, and the call that adds it.

The messages are one table, by rule: what the rule is, the transformation that needs it,
the ``def_*`` call that installs it and the rule's signature.
"""

from __future__ import annotations

from typing import Any

from primforge._compat import Primitive

__all__ = ["MissingRuleError"]


class MissingRuleError(NotImplementedError):
    """Raised when a transformation needs a rule that a primitive does not have yet.

    The message names the rule, the primitive and the call that installs the rule.

    Example:
        >>> import jax.numpy as jnp
        >>> from primforge.primitive import ETPPrimitive, MissingRuleError
        >>> p = ETPPrimitive("demo_missing_impl")
        >>> try:
        ...     p.bind(jnp.ones(2))
        ... except MissingRuleError as err:
        ...     print(str(err).splitlines()[0])
        primitive 'demo_missing_impl' has no evaluation (impl) rule, needed to run it eagerly.
    """


_RULE_HELP = {
    "impl": (
        "evaluation (impl) rule",
        "to run it eagerly",
        "{p}.def_impl(impl)",
        "impl(*args, **params) -> result (NumPy or jax.numpy code)",
    ),
    "abstract_eval": (
        "abstract evaluation rule",
        "to trace it (jax.jit, jax.make_jaxpr, jax.eval_shape, grad and vmap of it)",
        "{p}.def_abstract_eval(abstract_eval)",
        ("abstract_eval(*avals, **params) -> aval, e.g. avals[0].update(shape=..., dtype=...)"),
    ),
    "lowering": (
        "lowering rule for platform {platform}",
        "to compile it under jax.jit",
        (
            "{p}.def_lowering(rule, platform=None)  "
            "[same as jax.interpreters.mlir.register_lowering({p}, rule)]"
        ),
        (
            "rule(ctx, *mlir_values, **params) -> list of mlir values; "
            "mlir.lower_fun(jax_traceable_fn, multiple_results=...) builds one"
        ),
    ),
    "jvp": (
        "JVP rule",
        "for forward-mode and reverse-mode differentiation (jax.jvp, jax.grad, jax.vjp)",
        "{p}.def_jvp(jvp)  [same as jax.interpreters.ad.primitive_jvps[{p}] = jvp]",
        (
            "jvp(primals, tangents, **params) -> (primal_out, tangent_out); "
            "primforge.defjvp({p}, *per_input_rules) builds one"
        ),
    ),
    "transpose": (
        "transpose rule",
        (
            "for reverse-mode differentiation through it when it is used linearly "
            "(jax.grad of a JVP that calls it, jax.linear_transpose)"
        ),
        (
            "{p}.def_transpose(transpose)  "
            "[same as jax.interpreters.ad.primitive_transposes[{p}] = transpose]"
        ),
        (
            "transpose(cotangent, *args, **params) -> one cotangent or None per arg, where the "
            "linear args are jax.interpreters.ad.UndefinedPrimal"
        ),
    ),
    "batching": (
        "batching rule",
        "for jax.vmap",
        (
            "{p}.def_batching(batcher)  "
            "[same as jax.interpreters.batching.primitive_batchers[{p}] = batcher]"
        ),
        "batcher(args, batch_dims, **params) -> (out, out_batch_dim)",
    ),
}


def missing_rule_error(prim: Primitive, rule: str, **fmt: Any) -> MissingRuleError:
    what, why, call, sig = _RULE_HELP[rule]
    pname = f"{prim.name}_p"
    return MissingRuleError(
        f"primitive {prim.name!r} has no {what.format(**fmt)}, needed {why}.\n"
        f"Add it with `{call.format(p=pname)}` (where {pname} is the primitive object),\n"
        f"with signature {sig.format(p=pname)}."
    )
