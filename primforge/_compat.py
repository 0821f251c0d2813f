"""Every JAX-version-dependent import lives here, and only here.

JAX moves its primitive-level API between releases (``jax.core.Primitive`` became
``jax.extend.core.Primitive``, ``jax.experimental.shard_map`` became ``jax.shard_map``,
``jax.extend.ffi`` became ``jax.ffi``). The rest of primforge imports these names from this
module so that a JAX upgrade touches one file.
"""

from __future__ import annotations

import jax
from jax import ffi  # noqa: F401  (re-exported)
from jax.extend.core import (  # noqa: F401  (re-exported)
    ClosedJaxpr,
    Jaxpr,
    JaxprEqn,
    Literal,
    Primitive,
    Var,
    jaxpr_as_fun,
)
from jax.interpreters import ad, batching, mlir  # noqa: F401  (re-exported)

JAX_VERSION: tuple[int, ...] = tuple(int(p) for p in jax.__version__.split(".")[:3] if p.isdigit())

# Abstract array type that abstract-eval rules return. Still public in jax.core.
from jax.core import ShapedArray  # noqa: F401


class _UserContext:
    """A value that is part of ``jax.jit``'s cache key (used for backend selection).

    Wraps ``jax.make_user_context``: ``value`` (effective now), ``ctx(v)`` (a context
    manager), ``get_global``/``set_global``. JAX < 0.9 lacks the last two on the public
    object; they live on its config object there.
    """

    def __init__(self, default_value):
        self._ctx = jax.make_user_context(default_value=default_value)
        self._cfg = self._ctx if hasattr(self._ctx, "set_global") else self._ctx._obj

    @property
    def value(self):
        return self._ctx.value

    def __call__(self, new_value):
        return self._ctx(new_value)

    def get_global(self):
        return self._cfg.get_global()

    def set_global(self, new_value) -> None:
        self._cfg.set_global(new_value)


def make_user_context(default_value=None) -> _UserContext:
    """A jit-cache-sensitive context value (see ``jax.make_user_context``)."""
    return _UserContext(default_value)

# SPMD entry point; `jax.experimental.shard_map` warns on recent JAX.
shard_map = jax.shard_map

# Symbolic-zero tangent and undefined-primal markers used by JVP/transpose rules.
Zero = ad.Zero
UndefinedPrimal = ad.UndefinedPrimal
is_undefined_primal = ad.is_undefined_primal
instantiate_zeros = ad.instantiate_zeros
primitive_jvps = ad.primitive_jvps
primitive_transposes = ad.primitive_transposes
primitive_batchers = batching.primitive_batchers
float0 = jax.dtypes.float0


def get_aval(x):
    """Abstract value (shape, dtype, weak type) of an array, tracer or Python scalar."""
    return jax.typeof(x)


def zeros_like_aval(aval):
    """A concrete zero array for ``aval`` (float0 avals give a float0 zero)."""
    return ad.zeros_like_aval(aval)


def tangent_dtype(dtype):
    """The dtype of a tangent for a primal of ``dtype`` (float0 for ints and bools)."""
    from jax.extend.core import primal_dtype_to_tangent_dtype

    return primal_dtype_to_tangent_dtype(dtype)


# Custom SPMD partitioning of an opaque call (used by primforge.kernel.sharding).
from jax.experimental.custom_partitioning import custom_partitioning  # noqa: F401

try:  # primitives whose lowering needs the concrete device assignment
    from jax._src.dispatch import prim_requires_devices_during_lowering
except ImportError:  # pragma: no cover - moved in a future JAX
    prim_requires_devices_during_lowering: set = set()


def mlir_custom_call(*args, **kwargs):
    """JAX's internal builder of a ``stablehlo.custom_call`` op (no public equivalent yet).

    Used by backends that emit a custom call JAX has no public wrapper for (the Triton
    backend's ``__gpu$xla.gpu.triton`` call).
    """
    from jax._src.interpreters import mlir as _internal_mlir

    return _internal_mlir.custom_call(*args, **kwargs)


def triton_dialect():
    """jaxlib's bundled Triton MLIR dialect (the version XLA:GPU compiles), or None."""
    try:
        from jax._src.lib.triton import dialect
    except ImportError:
        return None
    return dialect


def jaxlib_version() -> tuple[int, ...]:
    """The installed jaxlib version as a tuple of ints."""
    import jaxlib

    return tuple(int(p) for p in jaxlib.__version__.split(".")[:3] if p.isdigit())


def lowering_devices(ctx) -> tuple:
    """The devices of the backend a lowering rule's ``ctx`` lowers for (may be empty).

    For ``jax.jit(f).lower(...)`` on a compile-only topology these are the topology's
    devices; for a cross-platform lowering on a CPU machine, the CPU devices.
    """
    backend = getattr(getattr(ctx, "module_context", None), "backend", None)
    try:
        return tuple(backend.devices()) if backend is not None else ()
    except Exception:  # a client without devices
        return ()
