"""Every JAX-version-dependent and JAX-internal import lives here, and only here.

Supported: JAX ``MIN_JAX_VERSION`` (0.8.0) and newer; each shim for an older release says
which releases take which path. ``tests/test_compat.py`` fails if another module imports
``jax._src``, ``jax.core``, ``jax.interpreters`` or jaxlib's internals.
"""

from __future__ import annotations

import jax

#: The oldest JAX release primforge supports (keep in step with pyproject.toml).
MIN_JAX_VERSION: tuple[int, ...] = (0, 8, 0)


def _check_jax(module) -> None:
    """Fail at import, naming the JAX release needed, when JAX lacks an API primforge uses."""
    needed = ("make_user_context", "shard_map", "typeof", "ffi")
    missing = [n for n in needed if not hasattr(module, n)]
    if missing:
        low = ".".join(map(str, MIN_JAX_VERSION))
        raise ImportError(
            f"primforge needs JAX {low} or newer; the installed jax "
            f"{getattr(module, '__version__', '?')} has no "
            f"{', '.join('jax.' + n for n in missing)}. Upgrade with: "
            f"pip install -U 'jax>={low}' 'jaxlib>={low}'"
        )


_check_jax(jax)

from jax import ffi  # noqa: F401  (re-exported)
from jax.extend.core import (  # noqa: F401  (re-exported)
    ClosedJaxpr,
    Jaxpr,
    JaxprEqn,
    Primitive,
)
from jax.interpreters import ad, batching, mlir  # noqa: F401  (re-exported)

JAX_VERSION: tuple[int, ...] = tuple(int(p) for p in jax.__version__.split(".")[:3] if p.isdigit())

# Abstract array type that abstract-eval rules return, and the tracer base class (both
# still public in jax.core, which JAX is emptying release by release).
from jax.core import ShapedArray, Tracer  # noqa: F401


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

# shard_map types a value by the manual mesh axes it varies over. JAX >= 0.10 keeps them in
# `aval.manual_axis_type` (an interned ManualAxisType with a `varying` set); JAX 0.8 and 0.9
# in `aval.vma` (a frozenset). `ShapeDtypeStruct` and `aval.update` take the same keyword.
_HAS_MANUAL_AXIS_TYPE = "manual_axis_type" in getattr(ShapedArray, "__slots__", ())


def varying_axes(x) -> frozenset:
    """The manual mesh axes an aval (or ``ShapeDtypeStruct``) varies over inside ``shard_map``.

    Empty outside ``shard_map`` and for objects that carry no such type.
    """
    if _HAS_MANUAL_AXIS_TYPE:
        return getattr(getattr(x, "manual_axis_type", None), "varying", None) or frozenset()
    return frozenset(getattr(x, "vma", None) or ())


def varying_kwargs(x, varying: frozenset | None = None) -> dict:
    """Keyword arguments that carry ``x``'s shard_map type into a new aval or struct.

    For ``aval.update(...)``, ``ShapedArray(...)`` and ``jax.ShapeDtypeStruct(...)``.
    With ``varying`` given, the result varies over exactly those manual axes. Empty when
    ``x`` carries no shard_map type (a struct made without one).
    """
    if _HAS_MANUAL_AXIS_TYPE:
        mat = getattr(x, "manual_axis_type", None)
        if mat is None:
            return {}
        if varying is not None and frozenset(varying) != mat.varying:
            mat = mat.update(varying=frozenset(varying))
        return {"manual_axis_type": mat}
    vma = getattr(x, "vma", None)
    if vma is None:
        return {}
    return {"vma": frozenset(vma if varying is None else varying)}


def _to_varying(x, axes: tuple):
    if hasattr(jax.lax, "pcast"):  # JAX >= 0.10
        return jax.lax.pcast(x, axes, to="varying")
    return jax.lax.pvary(x, axes)


def match_varying(arrays) -> list:
    """``arrays``, each made to vary over every manual axis that one of them varies over.

    Inside ``shard_map``, an operand that is the same on every device (e.g. ``P()``) bound
    with device-varying ones is cast to varying (a no-op on the values), as ``jax.ffi``
    calls do; its cotangent then comes back summed over those axes instead of mistyped.
    Outside ``shard_map`` the arrays are returned as they are.

    Example:
        >>> import jax.numpy as jnp
        >>> x = jnp.ones(2)
        >>> match_varying([x])[0] is x
        True
    """
    arrays = list(arrays)
    kinds = [varying_axes(getattr(a, "aval", None)) for a in arrays]
    union = frozenset().union(*kinds)
    if not union:
        return arrays
    return [a if k == union else _to_varying(a, tuple(sorted(union - k)))
            for a, k in zip(arrays, kinds)]


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


# Public in jax.extend.core from JAX 0.10; internal before.
try:
    from jax.extend.core import primal_dtype_to_tangent_dtype as _tangent_dtype
except ImportError:  # JAX 0.8, 0.9
    from jax._src.core import primal_dtype_to_tangent_dtype as _tangent_dtype


def tangent_dtype(dtype):
    """The dtype of a tangent for a primal of ``dtype`` (float0 for ints and bools)."""
    return _tangent_dtype(dtype)


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


def backends_initialized() -> bool:
    """Whether JAX has created its runtime clients (done by the first computation or device
    query of the process). Every supported release has ``xla_bridge.backends_are_initialized``."""
    from jax._src import xla_bridge

    return bool(xla_bridge.backends_are_initialized())


def jaxlib_version() -> tuple[int, ...]:
    """The installed jaxlib version as a tuple of ints."""
    import jaxlib

    return tuple(int(p) for p in jaxlib.__version__.split(".")[:3] if p.isdigit())


def register_dataclass_node(cls, data_fields, meta_fields) -> bool:
    """Register ``cls`` as a C++ dataclass pytree node with exactly these fields.

    ``jax.tree_util.register_dataclass`` does the same but insists that the fields be
    exactly the ``__init__`` parameters; ``primforge.utils.dataclass`` also lists
    ``init=False`` fields and a marker attribute. Returns False (nothing registered) when
    this JAX lacks the registries, so the caller can fall back to Python callbacks.
    """
    try:
        from jax._src import tree_util as _tu

        # JAX < 0.10 has no tuple of its registries; these three are all there are there.
        registries = getattr(_tu, "_all_registries", None) or (
            _tu.default_registry, _tu.none_leaf_registry, _tu.dispatch_registry)
        entry = _tu._RegistryEntry
        python_registry = _tu._registry
    except (ImportError, AttributeError):  # pragma: no cover - moved in a future JAX
        return False
    data_fields, meta_fields = tuple(data_fields), tuple(meta_fields)

    def flatten(x):
        return (
            tuple(getattr(x, n) for n in data_fields),
            tuple(getattr(x, n) for n in meta_fields),
        )

    def unflatten(meta, data):
        return cls(**dict(zip(meta_fields, meta)), **dict(zip(data_fields, data)))

    for registry in registries:
        registry.register_dataclass_node(cls, list(data_fields), list(meta_fields))
    python_registry[cls] = entry(flatten, unflatten)
    return True


def lowering_has_device_assignment(ctx) -> bool:
    """False when a lowering rule's ``ctx`` lowers without a device assignment.

    That happens when a primitive is lowered inside another primitive's lowering (a kernel
    whose ``jax`` backend calls another kernel): JAX decides from the top-level program
    whether lowering needs devices, and custom_partitioning cannot run without them.
    """
    from jax._src import sharding_impls

    ac = getattr(getattr(ctx, "module_context", None), "axis_context", None)
    return not (isinstance(ac, sharding_impls.ShardingContext)
                and ac.device_assignment is None)


def lowering_devices(ctx) -> tuple:
    """The devices of the backend a lowering rule's ``ctx`` lowers for (may be empty).

    For ``jax.jit(f).lower(...)`` on a compile-only topology these are the topology's
    devices; for a cross-platform lowering on a CPU machine, the CPU devices.
    """
    backend = getattr(getattr(ctx, "module_context", None), "backend", None)
    try:
        return tuple(backend.devices()) if backend is not None else ()
    except Exception:  # noqa: BLE001 - a client without devices
        return ()


#: The GPU a device-less lowering targets when nothing names one: Hopper, as the Triton
#: backend's own fallback (``triton.DEFAULT_CC``).
DEVICE_LESS_GPU_KIND = "NVIDIA H100"


def device_less_gpu_lowering(ctx=None, device_kind: str | None = None):
    """A context for lowering for the GPU where JAX sees none (JAX 0.11 and newer).

    From JAX 0.11, Pallas's GPU lowering takes the target GPU from the abstract mesh when
    no GPU is visible, and fails without one ("No supported GPU devices found"). This
    names one: ``device_kind``, else the GPU of the lowering's devices (a compile-only
    topology's), else :data:`DEVICE_LESS_GPU_KIND`. Where a GPU is visible, an abstract
    device is already set, or JAX is older, it does nothing.
    """
    import contextlib

    if JAX_VERSION < (0, 11) or jax.default_backend() == "gpu":
        return contextlib.nullcontext()
    from jax._src.mesh import AbstractDevice

    current = jax.sharding.get_abstract_mesh()
    if getattr(current, "abstract_device", None) is not None:
        return contextlib.nullcontext()
    kinds = [device_kind] if device_kind else [
        d.device_kind for d in (lowering_devices(ctx) if ctx is not None else ())
        if getattr(d, "platform", "") in ("gpu", "cuda")]
    device = AbstractDevice(device_kind=kinds[0] if kinds else DEVICE_LESS_GPU_KIND,
                            num_cores=None, platform="gpu")
    return jax.sharding.use_abstract_mesh(current.update(abstract_device=device))
