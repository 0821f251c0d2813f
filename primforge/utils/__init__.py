"""JAX and pytree utilities: dataclass pytrees, tree helpers, transforms, numerics.

Re-exported from private modules: ``_dataclass``, ``_post_init``, ``_tree``,
``_transforms`` and ``_numerics``.
"""

from primforge.utils._dataclass import dataclass, field, lens_field
from primforge.utils._numerics import isin, kahan_summation, key_chain
from primforge.utils._post_init import (
    enable_post_init,
    is_post_init_enabled,
    no_post_init,
    skip_post_init_if_disabled,
)
from primforge.utils._transforms import (
    NotJaxCompatibleError,
    is_traced,
    jit,
    linearize,
    no_jax_tracing,
    non_differentiable,
    sequential_vmap_with_vjp,
    shard_map,
    vectorize,
)
from primforge.utils._tree import (
    HasScatterArgs,
    PyTreeDef,
    ScatterArgs,
    SupportsTreeMatch,
    tree_concat,
    tree_map,
    tree_scatter_set,
    tree_stack,
    tree_structure,
    tree_where_broadcast_last,
    tree_zeros_like,
)

__all__ = [
    "HasScatterArgs",
    "NotJaxCompatibleError",
    "PyTreeDef",
    "ScatterArgs",
    "SupportsTreeMatch",
    "dataclass",
    "enable_post_init",
    "field",
    "is_post_init_enabled",
    "is_traced",
    "isin",
    "jit",
    "kahan_summation",
    "key_chain",
    "lens_field",
    "linearize",
    "no_jax_tracing",
    "no_post_init",
    "non_differentiable",
    "sequential_vmap_with_vjp",
    "shard_map",
    "skip_post_init_if_disabled",
    "tree_concat",
    "tree_map",
    "tree_scatter_set",
    "tree_stack",
    "tree_structure",
    "tree_where_broadcast_last",
    "tree_zeros_like",
    "vectorize",
]
