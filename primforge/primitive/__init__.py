"""Primitives whose JAX rules come from one implementation function, and per-input JVPs.

The public surface, re-exported here from one private module per concept:

- ``_static``: :func:`static_param`, :class:`FrozenDict`, :class:`HashableCallable`: the
  hashable forms ``ETPPrimitive.bind`` gives keyword params, so a fresh but identical
  lambda or list never causes a new trace.
- ``_errors``: :class:`MissingRuleError`, raised by a rule a primitive does not have yet,
  naming the rule, the primitive and the call that adds it.
- ``_etp``: :class:`ETPPrimitive` (one ``def_*`` method per JAX rule), its four rule slots
  (``yw_to_w``, ``xy_to_dw``, ``init_drtrl``, ``init_pp``: named
  :class:`~primforge.rules.RuleTable` objects in :data:`ETP_RULE_TABLES`) and metadata for
  custom jaxpr interpreters, with the queries that read them.
- ``_derived``: :func:`register_primitive`, every rule derived from a JAX-traceable impl
  (``jax.jit``, ``jax.eval_shape``, ``jax.jvp``, ``jax.vmap``, ``jax.linear_transpose``).
- ``_jvp``: :func:`defjvp` and :func:`per_input_jvp`, a JVP made of one rule per input, for
  any primitive or kernel.

Example:
    >>> import jax, jax.numpy as jnp
    >>> from primforge.primitive import register_primitive
    >>> scale_p = register_primitive("demo_package_scale", lambda x, *, k: k * x)
    >>> jax.grad(lambda x: scale_p.bind(x, k=3.0))(1.0)
    Array(3., dtype=float32, weak_type=True)
"""

from primforge.primitive._derived import register_primitive
from primforge.primitive._errors import MissingRuleError
from primforge.primitive._etp import (
    ETP_RULE_TABLES,
    ETPPrimitive,
    etp_primitives,
    get_etp_rule,
    get_trainable_invars_fn,
    get_x_invar_index,
    get_y_outvar_index,
    is_batched,
    is_etp_primitive,
    is_gradient_enabled,
)
from primforge.primitive._jvp import defjvp, per_input_jvp
from primforge.primitive._static import FrozenDict, HashableCallable, static_param

__all__ = [
    "ETP_RULE_TABLES",
    "ETPPrimitive",
    "FrozenDict",
    "HashableCallable",
    "MissingRuleError",
    "defjvp",
    "etp_primitives",
    "get_etp_rule",
    "get_trainable_invars_fn",
    "get_x_invar_index",
    "get_y_outvar_index",
    "is_batched",
    "is_etp_primitive",
    "is_gradient_enabled",
    "per_input_jvp",
    "register_primitive",
    "static_param",
]
