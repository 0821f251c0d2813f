"""Primitives whose JAX rules come from one implementation function, and per-input JVPs.

Re-exports one private module per concept: ``_static`` (hashable params), ``_errors``
(:class:`MissingRuleError`), ``_etp`` (:class:`ETPPrimitive` and its rule slots),
``_derived`` (:func:`register_primitive`) and ``_jvp`` (:func:`defjvp`).

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
