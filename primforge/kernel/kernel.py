"""XLACustomKernel: one named JAX primitive, kernels registered per backend and platform.

Design:
    * One multiple-results primitive per kernel. ``kernel(*inputs, outs=..., **params)``
      binds it with static params ``outs`` (core output structs), ``backend`` (a per-call
      choice or None), ``context`` (the :func:`use_backend` overrides active at trace time),
      ``batch`` (native batch levels, see ``batching.py``), ``debug`` (whether debug mode
      was on at trace time) and the user's own params. A bind that omits the internal
      params (a user rule calling ``kernel.primitive.bind``) gets the ones in force.
    * Every rule primforge runs for a call (JVP, transpose, custom batching) runs with the
      call's ``context`` and ``debug`` re-established (replacing those in force there), so the call's backend selection and
      debug mode follow it through every transformation, to the kernels the rule calls.
    * Registration is checked when it happens: a backend only on its platforms, static
      params against what the generators accept, ``outs`` against the ``jax`` reference's
      ``jax.eval_shape`` when there is one. Any change to a kernel's kernels, defaults or
      rules drops its build caches and re-lowers the jitted functions that call it.
    * Abstract evaluation comes from ``outs`` (and an optional shape rule that checks the
      inputs or infers ``outs``). The lowering rule, registered per platform, selects a
      backend, calls the kernel generator once per signature (cached), turns its product
      into a traceable callable with the backend module's ``make_callable`` and lowers that
      callable with ``mlir.lower_fun``: every backend is just another JAX-traceable route.
    * JVP and transpose rules written by the user always see per-example (unbatched)
      shapes: for a natively batched bind, the rule is applied under ``jax.vmap`` one
      level at a time.
    * Eager calls run through a cached ``jax.jit`` of the bind, so eager and jitted calls
      execute the same compiled kernel.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import operator
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from primforge import _compat, registry
from primforge import debug as _debug
from primforge.bench import benchmark_kernel
from primforge.kernel import _debug_checks, _lru, hooks
from primforge.kernel import batching as _batching
from primforge.kernel import selection as _selection
from primforge.kernel import sharding as _sharding
from primforge.kernel.backends import KNOWN_BACKENDS, get_backend, is_available_on
from primforge.primitive import defjvp, static_param

__all__ = [
    "BackendUnavailableWarning",
    "KernelEntry",
    "KernelError",
    "XLACustomKernel",
]

_INTERNAL_PARAMS = ("outs", "backend", "context", "batch", "debug")

# Keyword arguments primforge itself passes to kernel generators (never user params).
_GENERATOR_ARGS = frozenset({"ins", "outs", "platform", "batch_shape"})


class _KernelPrimitive(_compat.Primitive):
    """The kernel's primitive: a bind without the internal params gets the ones in force.

    User rules may call ``kernel.primitive.bind(*args, **params)`` with the params they
    were given (their own, ``outs`` and ``backend``); the call's backend overrides and
    debug mode are then taken from the rule's surroundings, which primforge set to the
    original call's.
    """

    def bind(self, *args, **params):
        if "context" not in params:
            params["context"] = _selection.current_overrides()
        if "debug" not in params:
            params["debug"] = _debug.enabled()
        params.setdefault("batch", ())
        params.setdefault("backend", None)
        return super().bind(*args, **params)


class KernelError(RuntimeError):
    """A kernel failed to build or run; the message names the primitive, backend and cause."""


class BackendUnavailableWarning(UserWarning):
    """A kernel's backend package is not installed, so another backend was used."""


@dataclasses.dataclass(frozen=True)
class KernelEntry:
    """One registered kernel: which backend, which platform, and its generator.

    Attributes:
        backend: backend name ('jax', 'numba', 'pallas', 'triton', 'warp', 'cuda_raw',
            'numba_cuda', or any name whose generator returns a traceable JAX callable).
        platform: 'cpu', 'gpu' or 'tpu'.
        kernel_generator: called with keyword arguments (the call's static params, plus
            ``outs`` and ``ins`` — tuples of ``jax.ShapeDtypeStruct`` — and ``batch_shape``
            when it declares that argument) and returns the backend's kernel.

    Example:
        >>> entry = KernelEntry('jax', 'cpu', lambda **kw: lambda x: x)
        >>> entry.backend, entry.platform
        ('jax', 'cpu')
    """

    backend: str
    platform: str
    kernel_generator: Callable[..., Any]

    @functools.cached_property
    def _accepted(self) -> tuple[bool, frozenset[str]]:
        try:
            sig = inspect.signature(self.kernel_generator)
        except (TypeError, ValueError):  # builtins, some C callables
            return True, frozenset()
        params = sig.parameters.values()
        var_kw = any(p.kind is p.VAR_KEYWORD for p in params)
        named = frozenset(
            p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
        )
        return var_kw, named

    @property
    def wants_batch_shape(self) -> bool:
        """Whether the generator declares ``batch_shape`` (it then handles batches itself)."""
        return "batch_shape" in self._accepted[1]

    def generate(self, **kwargs) -> Any:
        """Call the generator with the keyword arguments its signature accepts."""
        var_kw, named = self._accepted
        if not var_kw:
            kwargs = {k: v for k, v in kwargs.items() if k in named}
        return self.kernel_generator(**kwargs)


def _as_struct(x, what: str) -> jax.ShapeDtypeStruct:
    if not (hasattr(x, "shape") and hasattr(x, "dtype")):
        raise TypeError(
            f"{what} must be a jax.ShapeDtypeStruct (or have .shape and .dtype), got "
            f"{type(x).__name__}: {x!r}"
        )
    try:
        shape = tuple(operator.index(d) for d in x.shape)
    except TypeError:
        raise TypeError(
            f"{what} has a non-integer shape {tuple(x.shape)!r}: every dimension must be an "
            f"int"
        ) from None
    if any(d < 0 for d in shape):
        raise ValueError(f"{what} has a negative dimension: {shape}")
    try:
        dtype = jnp.dtype(x.dtype)
    except TypeError:
        raise TypeError(f"{what} has an invalid dtype {x.dtype!r}") from None
    return jax.ShapeDtypeStruct(shape, dtype)


def _normalize_outs(outs) -> tuple[tuple[jax.ShapeDtypeStruct, ...], type | None]:
    """Return (structs, container) where container is None for a single output."""
    if isinstance(outs, (list, tuple)):
        if not outs:
            raise ValueError("outs must describe at least one output, got an empty sequence")
        return tuple(_as_struct(o, f"outs[{i}]") for i, o in enumerate(outs)), type(outs)
    return (_as_struct(outs, "outs"),), None


def _core_struct(aval, n_lead: int) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(tuple(aval.shape[n_lead:]), aval.dtype)


def _n_mapped(batch, i: int) -> int:
    return sum(1 for _, mapped in batch if mapped[i])


def _user_params(params: dict) -> dict:
    """The params a user rule sees: their own, plus ``outs`` and ``backend``."""
    return {k: v for k, v in params.items() if k not in ("context", "batch", "debug")}


class XLACustomKernel:
    """A custom JAX operator with kernels per backend and platform.

    Register kernel generators with :meth:`def_kernel` (or a ``def_*_kernel`` shorthand),
    then call the object with inputs and ``outs``. The first kernel registered for a
    platform becomes its default; :meth:`set_default`, :func:`primforge.use_backend` and the
    ``backend=`` argument choose another.

    Args:
        name: name of the primitive (also its registry key). A kernel created under a
            name already registered replaces that one in the registry, with a
            :class:`primforge.registry.KernelReplacedWarning` (re-running a notebook cell
            or re-importing a module works); the replaced object keeps working.
        doc: optional description.
        replace: replace a registered kernel of the same name without the warning.

    Example:
        >>> import jax, jax.numpy as jnp, primforge
        >>> scale = primforge.XLACustomKernel('doc_scale')
        >>> scale.def_kernel('jax', 'cpu', lambda factor, **kw: lambda x: x * factor)
        >>> out = jax.ShapeDtypeStruct((3,), jnp.float32)
        >>> scale(jnp.arange(3.0), outs=out, factor=2.0)
        Array([0., 2., 4.], dtype=float32)
        >>> scale.defaults
        {'cpu': 'jax'}
    """

    def __init__(self, name: str, doc: str | None = None, *, replace: bool = False):
        if not isinstance(name, str) or not name:
            raise TypeError(f"XLACustomKernel: 'name' must be a non-empty str, got {name!r}")
        self.name = name
        self.doc = doc
        self.primitive = _KernelPrimitive(name)
        self.primitive.multiple_results = True
        self._entries: dict[str, dict[str, KernelEntry]] = {}
        self._defaults: dict[str, str] = {}
        self._shape_rule: Callable | None = None
        self._jvp_rule: Callable | None = None
        self._transpose_rule: Callable | None = None
        self._batching_mode = "native"
        self._custom_batching: Callable | None = None
        # Per-signature caches, bounded (least recently used dropped; see kernel._lru).
        self._impl_cache: dict[Any, Callable] = _lru.LRUCache()
        self._build_cache: dict[Any, Callable] = _lru.LRUCache()
        self._ref_cache: dict[Any, Any] = _lru.LRUCache()
        self._product_cache: dict[Any, Any] = _lru.LRUCache()
        self._memo: dict[str, Any] = {}  # derived from the registration, dropped on change
        self._per_input_rules: tuple[Callable, ...] = ()
        self._warned: set[tuple[str, str]] = set()
        self.tags: set[str] = set()
        self._call_fn: Callable | None = None
        self._benchmark_data_fn: Callable | None = None

        prim = self.primitive
        prim.def_impl(self._impl)
        prim.def_abstract_eval(self._abstract_eval)
        _compat.primitive_jvps[prim] = self._jvp
        _compat.primitive_transposes[prim] = self._transpose
        _compat.primitive_batchers[prim] = self._batch
        # One lowering per platform, registered up front: a platform without a kernel then
        # fails with an error that says how to add one, not JAX's generic message.
        for platform in ("cpu", "gpu", "tpu"):
            _compat.mlir.register_lowering(
                prim, functools.partial(self._lower, platform=platform), platform
            )

        registry.register_kernel(self, replace=replace)
        _selection.note_kernel(self)
        hooks.emit(hooks.KERNEL_DEFINED, self)

    def __repr__(self) -> str:
        return f"XLACustomKernel({self.name!r}, backends={self._backend_table()})"

    def _backend_table(self) -> dict[str, list[str]]:
        return {p: list(e) for p, e in self._entries.items()}

    def clear_cache(self) -> None:
        """Drop everything this kernel built: callables, generated kernels, compiled code.

        The per-signature caches are already bounded (``PRIMFORGE_KERNEL_CACHE_SIZE``,
        least recently used dropped first); this empties them now, releases the compiled
        code the Numba backend holds for the kernels this one generated (see
        :func:`primforge.kernel.backends.numba.clear`), and makes functions compiled by
        ``jax.jit`` that call this kernel trace again. The next call rebuilds what it needs.

        Example:
            >>> import jax, jax.numpy as jnp, primforge
            >>> k = primforge.XLACustomKernel("doc_clear_cache")
            >>> k.def_kernel("jax", "cpu", lambda **kw: lambda x: x + 1)
            >>> spec = jax.ShapeDtypeStruct((2,), jnp.float32)
            >>> _ = k(jnp.zeros(2), outs=spec)
            >>> k.clear_cache()
            >>> k(jnp.zeros(2), outs=spec)
            Array([1., 1.], dtype=float32)
        """
        products = [
            product
            for (_platform, backend, _params), product in list(self._product_cache.items())
            if backend == "numba"
        ]
        self._changed()
        if products:
            from primforge.kernel.backends import numba as _numba

            for product in products:
                _numba.clear(product)

    def _changed(self) -> None:
        """Registration changed: drop what was built from it, re-lower jitted callers."""
        self._build_cache.clear()
        self._impl_cache.clear()
        self._ref_cache.clear()
        self._product_cache.clear()
        self._memo.clear()
        _selection.defaults_changed()

    # ------------------------------------------------------------------ registration
    def def_kernel(
        self, backend: str, platform: str, kg: Callable[..., Any], asdefault: bool = False
    ) -> None:
        """Register kernel generator ``kg`` for ``backend`` on ``platform``.

        The first kernel registered for a platform becomes its default; ``asdefault=True``
        makes this one the default even if another is.

        Args:
            backend: backend name, e.g. 'jax', 'numba', 'pallas'.
            platform: 'cpu', 'gpu' or 'tpu'.
            kg: kernel generator (see :class:`KernelEntry`).
            asdefault: make this backend the platform's default.

        Example:
            >>> import primforge
            >>> k = primforge.XLACustomKernel('doc_def_kernel')
            >>> k.def_kernel('jax', 'cpu', lambda **kw: lambda x: x + 1)
            >>> k.available_backends('cpu')
            ['jax']
        """
        if not isinstance(backend, str) or not backend:
            raise TypeError(f"def_kernel: 'backend' must be a non-empty str, got {backend!r}")
        if not isinstance(platform, str):
            raise TypeError(f"def_kernel: 'platform' must be a str, got {platform!r}")
        platform = _selection.canonical_platform(platform)
        if not callable(kg):
            raise TypeError(
                f"def_kernel: 'kg' (the kernel generator) must be callable, got "
                f"{type(kg).__name__}"
            )
        if backend in KNOWN_BACKENDS:
            served = get_backend(backend).PLATFORMS
            if platform not in served:
                raise ValueError(
                    f"def_kernel: kernel {self.name!r}: the {backend!r} backend serves "
                    f"{list(served)}, not {platform!r}. Register it for one of those, or give "
                    f"a traceable JAX function for {platform!r} under another name (e.g. "
                    f"'jax')."
                )
        self._entries.setdefault(platform, {})[backend] = KernelEntry(backend, platform, kg)
        if asdefault or platform not in self._defaults:
            self._defaults[platform] = backend
        # Re-registering replaces the generator: whatever was built or compiled from the
        # old one (build cache, eager jit, jitted callers) must not be served again.
        self._changed()
        hooks.emit(hooks.BACKEND_DEFINED, self, platform, backend)  # e.g. autotuned choices

    def def_numba_kernel(self, kg: Callable[..., Any], asdefault: bool = False) -> None:
        """Register a Numba kernel generator for the CPU (``def_kernel('numba', 'cpu', kg)``).

        The generator returns an ``@numba.njit`` function ``kernel(*inputs, *outputs)`` that
        writes its outputs in place, or a :func:`primforge.numba_kernel`.

        Example:
            >>> import primforge
            >>> k = primforge.XLACustomKernel('doc_def_numba')
            >>> k.def_numba_kernel(lambda **kw: None)
            >>> k.defaults
            {'cpu': 'numba'}
        """
        self.def_kernel("numba", "cpu", kg, asdefault)

    def def_pallas_kernel(
        self, platform: str, kg: Callable[..., Any], asdefault: bool = False
    ) -> None:
        """Register a Pallas kernel generator for 'gpu', 'tpu' or 'cpu' (interpret mode).

        Example:
            >>> import primforge
            >>> k = primforge.XLACustomKernel('doc_def_pallas')
            >>> k.def_pallas_kernel('gpu', lambda **kw: None)
            >>> k.available_backends('gpu')
            ['pallas']
        """
        if _selection.canonical_platform(platform) not in ("gpu", "tpu", "cpu"):
            raise ValueError("def_pallas_kernel: platform must be 'gpu', 'tpu' or 'cpu'")
        self.def_kernel("pallas", platform, kg, asdefault)

    def def_warp_kernel(self, kg: Callable[..., Any], asdefault: bool = False,
                        platform: str = "gpu") -> None:
        """Register a Warp kernel generator (GPU by default; Warp also runs on 'cpu').

        Example:
            >>> import primforge
            >>> k = primforge.XLACustomKernel('doc_def_warp')
            >>> k.def_warp_kernel(lambda **kw: None)
            >>> k.available_backends('gpu')
            ['warp']
        """
        self.def_kernel("warp", platform, kg, asdefault)

    def def_triton_kernel(self, kg: Callable[..., Any], asdefault: bool = False) -> None:
        """Register a Triton kernel generator for the GPU.

        Example:
            >>> import primforge
            >>> k = primforge.XLACustomKernel('doc_def_triton')
            >>> k.def_triton_kernel(lambda **kw: None)
            >>> k.available_backends('gpu')
            ['triton']
        """
        self.def_kernel("triton", "gpu", kg, asdefault)

    def def_numba_cuda_kernel(self, kg: Callable[..., Any], asdefault: bool = False) -> None:
        """Register a Numba-CUDA kernel generator for the GPU.

        Example:
            >>> import primforge
            >>> k = primforge.XLACustomKernel('doc_def_numba_cuda')
            >>> k.def_numba_cuda_kernel(lambda **kw: None)
            >>> k.available_backends('gpu')
            ['numba_cuda']
        """
        self.def_kernel("numba_cuda", "gpu", kg, asdefault)

    def def_cuda_raw_kernel(
        self, kg: Callable[..., Any], asdefault: bool = False, platform: str = "gpu"
    ) -> None:
        """Register an nvcc-compiled (``load_cuda_inline``/``load_cuda_file``) kernel generator.

        Example:
            >>> import primforge
            >>> k = primforge.XLACustomKernel('doc_def_cuda_raw')
            >>> k.def_cuda_raw_kernel(lambda **kw: None)
            >>> k.available_backends('gpu')
            ['cuda_raw']
        """
        self.def_kernel("cuda_raw", platform, kg, asdefault)

    # ------------------------------------------------------------------ defaults
    @property
    def defaults(self) -> dict[str, str]:
        """A copy of the default backend per platform.

        Example:
            >>> import primforge
            >>> k = primforge.XLACustomKernel('doc_defaults')
            >>> k.def_kernel('jax', 'cpu', lambda **kw: lambda x: x)
            >>> k.defaults
            {'cpu': 'jax'}
        """
        return dict(self._defaults)

    def get_default(self, platform: str) -> str | None:
        """The default backend for ``platform``, or None when none is registered.

        Example:
            >>> import primforge
            >>> k = primforge.XLACustomKernel('doc_get_default')
            >>> k.get_default('gpu') is None
            True
        """
        return self._defaults.get(_selection.canonical_platform(platform))

    def set_default(self, platform: str, backend: str) -> None:
        """Make ``backend`` the default on ``platform``; jitted callers re-lower on next call.

        Raises:
            ValueError: if nothing, or not ``backend``, is registered for ``platform``.

        Example:
            >>> import primforge
            >>> k = primforge.XLACustomKernel('doc_set_default')
            >>> k.def_kernel('jax', 'cpu', lambda **kw: lambda x: x)
            >>> k.def_kernel('other', 'cpu', lambda **kw: lambda x: x)
            >>> k.set_default('cpu', 'other'); k.get_default('cpu')
            'other'
        """
        platform = _selection.canonical_platform(platform)
        entries = self._entries.get(platform)
        if not entries:
            raise ValueError(
                f"kernel {self.name!r} has no kernels registered for platform {platform!r}; "
                f"registered platforms: {sorted(self._entries) or 'none'}"
            )
        if backend not in entries:
            raise ValueError(
                f"kernel {self.name!r} has no {backend!r} backend on {platform!r}; "
                f"available: {list(entries)}"
            )
        self._defaults[platform] = backend
        self._changed()

    def available_backends(self, platform: str) -> list[str]:
        """Backend names registered for ``platform`` (empty list if none).

        Example:
            >>> import primforge
            >>> k = primforge.XLACustomKernel('doc_available')
            >>> k.available_backends('tpu')
            []
        """
        return list(self._entries.get(_selection.canonical_platform(platform), {}))

    def use_backend(self, platform: str, backend: str):
        """Context manager: within it this kernel uses ``backend`` on ``platform``.

        Example:
            >>> import jax, jax.numpy as jnp, primforge
            >>> k = primforge.XLACustomKernel('doc_kernel_use_backend')
            >>> k.def_kernel('jax', 'cpu', lambda **kw: lambda x: x + 1)
            >>> k.def_kernel('minus', 'cpu', lambda **kw: lambda x: x - 1)
            >>> with k.use_backend('cpu', 'minus'):
            ...     print(k(jnp.zeros(1), outs=jax.ShapeDtypeStruct((1,), jnp.float32)))
            [-1.]
        """
        return _selection.use_backend(platform, backend, kernel=self)

    # ------------------------------------------------------------------ shape rule
    def def_abstract_eval(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Register a shape rule ``fn(*inputs, **params) -> outs``.

        ``fn`` receives ``jax.ShapeDtypeStruct`` inputs (per-example shapes) and the call's
        static params; it may raise to reject inputs, and returns the output struct(s).
        With a shape rule ``outs`` may be omitted at call time; when given it must agree.

        Example:
            >>> import jax, jax.numpy as jnp, primforge
            >>> k = primforge.XLACustomKernel('doc_shape_rule')
            >>> k.def_kernel('jax', 'cpu', lambda **kw: lambda a, b: a @ b)
            >>> @k.def_abstract_eval
            ... def _(a, b, **kw):
            ...     if a.shape[1] != b.shape[0]:
            ...         raise ValueError(f'inner dims differ: {a.shape} @ {b.shape}')
            ...     return jax.ShapeDtypeStruct((a.shape[0], b.shape[1]), a.dtype)
            >>> k(jnp.ones((2, 3)), jnp.ones((3, 4))).shape
            (2, 4)
        """
        if not callable(fn):
            raise TypeError("def_abstract_eval: fn must be callable")
        self._shape_rule = fn
        self._changed()
        return fn

    # ------------------------------------------------------------------ rules
    def def_batching_rule(self, fun: Callable[..., Any]) -> Callable[..., Any]:
        """Use a custom batching rule ``fun(args, axes, **params) -> (outs, out_axes)``.

        ``params`` holds the call's static params plus ``outs`` and ``backend``.

        Example:
            >>> import jax, jax.numpy as jnp, primforge
            >>> k = primforge.XLACustomKernel('doc_custom_batching')
            >>> k.def_kernel('jax', 'cpu', lambda **kw: lambda x: x * 2)
            >>> def rule(args, axes, *, outs, **params):
            ...     (x,), (ax,) = args, axes
            ...     x = jnp.moveaxis(x, ax, 0)
            ...     big = jax.ShapeDtypeStruct(x.shape, outs[0].dtype)
            ...     return [k(x, outs=big, **params)], [0]
            >>> _ = k.def_batching_rule(rule)
            >>> jax.vmap(lambda x: k(x, outs=jax.ShapeDtypeStruct((2,), jnp.float32)))(jnp.ones((3, 2)))[0]
            Array([2., 2.], dtype=float32)
        """
        if not callable(fun):
            raise TypeError("def_batching_rule: fun must be callable")
        self._batching_mode = "custom"
        self._custom_batching = fun
        self._changed()
        return fun

    def register_general_batching(self) -> None:
        """Batch with :func:`general_batching_rule` (a ``lax.scan``, one call per element).

        Example:
            >>> import primforge
            >>> k = primforge.XLACustomKernel('doc_register_general')
            >>> k.register_general_batching()
        """
        self._batching_mode = "general"
        self._changed()

    def register_native_batching(self) -> None:
        """Batch natively (the default): ``vmap`` makes one kernel call for the whole batch.

        Numba kernels loop over the batch inside the compiled handler; other backends hand
        the batch to their own vectorisation; a generator that declares ``batch_shape``
        receives the batch and handles it itself.

        Example:
            >>> import primforge
            >>> k = primforge.XLACustomKernel('doc_register_native')
            >>> k.register_native_batching()
        """
        self._batching_mode = "native"
        self._changed()

    def def_jvp_rule(self, fun: Callable[..., Any]) -> Callable[..., Any]:
        """Register a whole JVP rule ``fun(primals, tangents, **params) -> (outs, tangents)``.

        Tangents may be ``jax.interpreters.ad.Zero``; outputs are sequences, one entry per
        output. ``params`` holds the call's static params plus ``outs`` and ``backend``.

        Example:
            >>> import jax, jax.numpy as jnp, primforge
            >>> k = primforge.XLACustomKernel('doc_jvp_rule')
            >>> k.def_kernel('jax', 'cpu', lambda **kw: lambda x: jnp.sin(x))
            >>> def jvp(primals, tangents, *, outs, **kw):
            ...     (x,), (t,) = primals, tangents
            ...     return k(x, outs=outs, **kw), [jnp.cos(x) * t]
            >>> _ = k.def_jvp_rule(jvp)
            >>> f = lambda x: k(x, outs=[jax.ShapeDtypeStruct((), jnp.float32)])[0]
            >>> float(jax.grad(f)(0.0))
            1.0
        """
        if not callable(fun):
            raise TypeError("def_jvp_rule: fun must be callable")
        self._jvp_rule = fun
        self._changed()
        return fun

    def _install_jvp(self, jvp_fn: Callable[..., Any]) -> None:
        # Hook used by primforge.defjvp: the kernel layers batching around any JVP rule.
        self._jvp_rule = jvp_fn
        self._changed()

    def def_jvp_rule2(self, *jvp_rules: Callable[..., Any] | None) -> None:
        """Register per-input JVP rules ``rule(tangent, *primals, **params)`` (see ``defjvp``).

        Example:
            >>> import jax, jax.numpy as jnp, primforge
            >>> k = primforge.XLACustomKernel('doc_jvp_rule2')
            >>> k.def_kernel('jax', 'cpu', lambda **kw: lambda x, y: x * y)
            >>> k.def_jvp_rule2(lambda t, x, y, **kw: [t * y], lambda t, x, y, **kw: [x * t])
            >>> f = lambda x, y: k(x, y, outs=jax.ShapeDtypeStruct((), jnp.float32))
            >>> float(jax.grad(f)(2.0, 5.0))
            5.0
        """
        defjvp(self, *jvp_rules)
        self._per_input_rules = tuple(r for r in jvp_rules if r is not None)

    def def_transpose_rule(self, fun: Callable[..., Any]) -> Callable[..., Any]:
        """Register a transpose rule ``fun(cts, *args, **params) -> cotangents per input``.

        ``cts`` is a sequence with one cotangent per output (entries may be
        ``ad.Zero``); undefined-primal inputs are ``ad.UndefinedPrimal``; return one entry
        per input, ``None`` where there is no cotangent.

        Example:
            >>> import jax, jax.numpy as jnp, primforge
            >>> k = primforge.XLACustomKernel('doc_transpose_rule')
            >>> k.def_kernel('jax', 'cpu', lambda **kw: lambda x: 3 * x)
            >>> def transpose(cts, x, *, outs, **kw):
            ...     return [k(cts[0], outs=outs[0], **kw)]
            >>> _ = k.def_transpose_rule(transpose)
            >>> f = lambda x: k(x, outs=jax.ShapeDtypeStruct((2,), jnp.float32))
            >>> jax.linear_transpose(f, jnp.ones(2))(jnp.ones(2))[0]
            Array([3., 3.], dtype=float32)
        """
        if not callable(fun):
            raise TypeError("def_transpose_rule: fun must be callable")
        self._transpose_rule = fun
        self._changed()
        return fun

    # ------------------------------------------------------------------ calling
    def __call__(self, *inputs, outs=None, backend: str | None = None, **params):
        """Bind the primitive on ``inputs`` and return outputs shaped like ``outs``.

        Args:
            *inputs: arrays (or values convertible to arrays).
            outs: a ``jax.ShapeDtypeStruct`` (one output, returned as an array) or a
                sequence of them (returned as the same kind of sequence). Optional when a
                shape rule is registered.
            backend: use this backend for this call.
            **params: static (hashable) params passed to the kernel generator.

        Raises:
            TypeError: a param the kernel does not declare (see :meth:`accepted_params`),
                a non-integer ``outs`` shape.
            ValueError: ``outs`` that differ from what the kernel's ``jax`` reference
                backend (when it has one) returns for these inputs, per ``jax.eval_shape``
                (checked when the call is traced).
        """
        arrays = []
        for i, x in enumerate(inputs):
            if isinstance(x, jax.Array) or hasattr(x, "aval"):
                arrays.append(x)
            else:
                try:
                    arrays.append(jnp.asarray(x))
                except TypeError as e:
                    raise TypeError(
                        f"kernel {self.name!r}: input {i} is not an array ({type(x).__name__})"
                    ) from e
        if backend is not None:
            if not isinstance(backend, str):
                raise TypeError(f"kernel {self.name!r}: backend must be a str or None")
            known = {b for e in self._entries.values() for b in e}
            if backend not in known:
                raise ValueError(
                    f"kernel {self.name!r} has no backend {backend!r}; registered: "
                    f"{self._backend_table()}"
                )
        params = {k: static_param(v, name=k, where=f"kernel {self.name!r}") for k, v in params.items()}
        clash = set(params) & set(_INTERNAL_PARAMS)
        if clash:
            raise TypeError(f"kernel {self.name!r}: reserved param name(s) {sorted(clash)}")
        self._check_params(params)
        structs, container = self._resolve_outs(arrays, outs, params)
        flat = self.primitive.bind(
            *arrays, outs=structs, backend=backend, context=_selection.current_overrides(),
            batch=(), debug=_debug.enabled(), **params,
        )
        if container is None:
            return flat[0]
        return container(flat)

    def _resolve_outs(self, arrays, outs, params):
        if self._shape_rule is not None:
            ins = tuple(jax.ShapeDtypeStruct(jnp.shape(a), jnp.result_type(a)) for a in arrays)
            expected = self._shape_rule(*ins, **params)
            exp_structs, exp_container = _normalize_outs(expected)
            if outs is None:
                return exp_structs, exp_container
            structs, container = _normalize_outs(outs)
            if structs != exp_structs:
                raise ValueError(
                    f"kernel {self.name!r}: outs {_fmt(structs)} do not match what its shape "
                    f"rule infers from the inputs, {_fmt(exp_structs)}"
                )
            return structs, container
        if outs is None:
            raise TypeError(
                f"kernel {self.name!r} needs outs=jax.ShapeDtypeStruct(shape, dtype) (or a "
                f"sequence of them), or a shape rule registered with def_abstract_eval"
            )
        return _normalize_outs(outs)

    def accepted_params(self) -> tuple[frozenset[str], bool]:
        """The static params this kernel declares, and whether any others pass.

        Declared: the keyword parameters its generators name, and the keyword-only ones of
        its shape, JVP, transpose and batching rules. Others pass only when nothing is
        declared and a generator takes ``**kwargs``.

        Example:
            >>> import primforge
            >>> k = primforge.XLACustomKernel('doc_accepted_params')
            >>> k.def_kernel('jax', 'cpu', lambda factor=1.0, **kw: lambda x: factor * x)
            >>> k.accepted_params()
            (frozenset({'factor'}), False)
        """
        declared: set[str] = set()
        var_kw = False
        for entries in self._entries.values():
            for entry in entries.values():
                takes_any, named = entry._accepted
                var_kw = var_kw or takes_any
                declared.update(named - _GENERATOR_ARGS)
        rules = (self._shape_rule, self._jvp_rule, self._transpose_rule,
                 self._custom_batching, *self._per_input_rules)
        for rule in rules:
            declared.update(_keyword_only(rule) - set(_INTERNAL_PARAMS))
        return frozenset(declared), var_kw and not declared

    def _check_params(self, params: dict) -> None:
        if not self._entries or not params:
            return
        accepted = self._memo.get("params")
        if accepted is None:
            accepted = self._memo["params"] = self.accepted_params()
        declared, open_ = accepted
        unknown = sorted(set(params) - declared)
        if unknown and not open_:
            raise TypeError(
                f"kernel {self.name!r}: unknown static param(s) {unknown}; it declares "
                f"{sorted(declared) or 'no params'} (named by its kernel generators or, "
                f"keyword-only, by its rules)"
            )

    def _reference_entry(self) -> KernelEntry | None:
        cached = self._memo.get("reference")
        if cached is not None:
            return cached or None
        refs = [e["jax"] for e in self._entries.values() if "jax" in e]
        if not refs:
            self._memo["reference"] = False
            return None
        try:
            here = _selection.canonical_platform(jax.default_backend())
        except ValueError:
            here = None
        found = next((r for r in refs if r.platform == here), refs[0])
        self._memo["reference"] = found
        return found

    def _generate(self, entry: KernelEntry, **kwargs) -> Any:
        """Call ``entry``'s generator, once per signature (shared by lowering and checks)."""
        key = (entry.platform, entry.backend, tuple(sorted(kwargs.items())))
        try:
            return self._product_cache[key]
        except KeyError:
            pass
        except TypeError:  # an unhashable argument: do not cache
            return entry.generate(**kwargs)
        product = self._product_cache[key] = entry.generate(**kwargs)
        return product

    def _reference_structs(self, entry, ins, outs, params):
        """What the ``jax`` reference returns for ``ins`` (structs), or the error to raise."""
        extra = {"batch_shape": ()} if entry.wants_batch_shape else {}
        try:
            product = self._generate(
                entry, ins=ins, outs=outs, platform=entry.platform, **extra, **params
            )
            fn = get_backend("jax").make_callable(
                product, ins=ins, outs=outs, platform=entry.platform, name=self.name
            )
            got = jax.eval_shape(fn, *ins)
        except Exception as e:  # noqa: BLE001 - reported to the caller with the kernel's name
            err = KernelError(
                f"kernel {self.name!r}: its 'jax' reference backend, used to check outs, "
                f"failed on inputs {_fmt(ins)}: {type(e).__name__}: {e}"
            )
            err.__cause__ = e
            return err
        return tuple(jax.ShapeDtypeStruct(tuple(g.shape), jnp.dtype(g.dtype)) for g in got)

    def _check_against_reference(self, sig, structs, params) -> None:
        """``outs`` must be what the ``jax`` reference returns (``jax.eval_shape``).

        ``sig`` holds each input's per-example ``(shape, dtype)``. Runs when the call is
        traced (abstract evaluation), once per signature.
        """
        entry = self._reference_entry()
        if entry is None:
            return
        key = (sig, structs, tuple(sorted(params.items())) if params else ())
        got = self._ref_cache.get(key)
        if got is None:
            ins = tuple(jax.ShapeDtypeStruct(tuple(shape), dtype) for shape, dtype in sig)
            got = self._reference_structs(entry, ins, structs, params)
            self._ref_cache[key] = got
        if isinstance(got, Exception):
            raise got
        if got is _MATCHES:
            return
        ins = tuple(jax.ShapeDtypeStruct(tuple(shape), dtype) for shape, dtype in sig)
        if len(got) != len(structs):
            raise ValueError(
                f"kernel {self.name!r}: outs describes {len(structs)} output(s) but its 'jax' "
                f"reference backend returns {len(got)} for inputs {_fmt(ins)}: {_fmt(got)}"
            )
        for i, (want, have) in enumerate(zip(got, structs)):
            if (tuple(want.shape), jnp.dtype(want.dtype)) != (tuple(have.shape), have.dtype):
                raise ValueError(
                    f"kernel {self.name!r}: outs[{i}] is {_fmt([have])[1:-1]} but its 'jax' "
                    f"reference backend returns {_fmt([want])[1:-1]} for inputs {_fmt(ins)} "
                    f"(jax.eval_shape); fix outs (or the reference)"
                )
        self._ref_cache[key] = _MATCHES  # checked once per signature

    # ------------------------------------------------------------------ primitive rules
    def _impl(self, *args, **params):
        key = tuple(sorted(params.items()))
        fn = self._impl_cache.get(key)
        if fn is None:
            fn = jax.jit(functools.partial(self.primitive.bind, **params))
            self._impl_cache[key] = fn
        if not params.get("debug"):
            return fn(*args)
        try:
            return jax.block_until_ready(fn(*args))
        except jax.errors.JaxRuntimeError as e:
            _debug_checks.reraise(e)  # the debug check's own KernelError, not XLA's wrapper
            raise

    def _abstract_eval(
        self, *avals, outs, backend=None, context=(), batch=(), debug=False, **params
    ):
        sizes = tuple(size for size, _ in batch)
        sig = []
        for i, aval in enumerate(avals):
            n_lead = _n_mapped(batch, i)
            lead = aval.shape[:n_lead]
            expected = tuple(s for s, m in batch if m[i])
            if tuple(lead) != expected:
                raise ValueError(
                    f"kernel {self.name!r}: input {i} of shape {aval.shape} does not carry the "
                    f"batch dimensions {expected} its batch levels require"
                )
            sig.append((tuple(aval.shape[n_lead:]), aval.dtype))
        self._check_against_reference(tuple(sig), outs, params)
        result = [_compat.ShapedArray(sizes + tuple(o.shape), o.dtype) for o in outs]
        # Rebuilt from an input aval so shard_map's varying-axes types and explicit-mesh
        # shardings carry over to the results.
        return _sharding.result_avals(self, avals, result, outs=outs, batch=batch, params=params)

    def _select(self, platform: str, backend: str | None, context) -> KernelEntry:
        entries = self._entries.get(platform)
        if not entries:
            raise KernelError(
                f"kernel {self.name!r} has no kernel for platform {platform!r}. Registered: "
                f"{self._backend_table() or 'nothing'}. Register one with "
                f"kernel.def_kernel(backend, {platform!r}, generator) (a 'jax' backend runs "
                f"everywhere)."
            )
        explicit = backend is not None
        choice = (
            backend
            or _selection.resolve(context, self.name, platform, entries)
            or self._defaults[platform]
        )
        if choice not in entries:
            raise KernelError(
                f"kernel {self.name!r} has no {choice!r} backend on {platform!r}; available "
                f"there: {list(entries)}"
            )
        module = get_backend(choice)
        if is_available_on(module, platform):
            return entries[choice]
        how = f"pip install 'primforge[{module.EXTRA}]'" if module.EXTRA else "its package"
        if explicit:
            raise KernelError(
                f"kernel {self.name!r}: backend {choice!r} was asked for but its package is not "
                f"installed ({how}). Other backends on {platform!r}: "
                f"{[b for b in entries if b != choice]}"
            )
        for other, entry in entries.items():
            if other != choice and is_available_on(get_backend(other), platform):
                if (platform, choice) not in self._warned:
                    self._warned.add((platform, choice))
                    warnings.warn(
                        f"kernel {self.name!r}: backend {choice!r} is not installed ({how}); "
                        f"using {other!r} on {platform!r} instead.",
                        BackendUnavailableWarning,
                        stacklevel=2,
                    )
                return entry
        raise KernelError(
            f"kernel {self.name!r}: no installed backend on {platform!r}: {list(entries)} "
            f"(install {how})"
        )

    def _switch_hint(self, platform: str, current: str) -> str:
        others = [b for b in self.available_backends(platform) if b != current]
        if not others:
            return f"No other backend is registered for {platform!r}."
        return (
            f"Other backends on {platform!r}: {others}. Switch with backend={others[0]!r} in "
            f"the call, `with primforge.use_backend({platform!r}, {others[0]!r}):`, or "
            f"kernel.set_default({platform!r}, {others[0]!r})."
        )

    def build(
        self, platform: str, *, ins, outs, batch=(), backend=None, context=(), debug=False,
        **params,
    ):
        """The traceable callable that lowers this kernel on ``platform`` (cached).

        It takes the physical (batched) input arrays and returns a tuple of outputs.
        Mostly internal; useful to inspect what a backend produces. ``context`` is a tuple
        of :func:`use_backend` overrides ``(kernel name or None, platform, backend)``.
        """
        entry = self._select(platform, backend, context)
        key = (platform, entry.backend, ins, outs, batch, debug, tuple(sorted(params.items())))
        fn = self._build_cache.get(key)
        if fn is not None:
            return fn
        module = get_backend(entry.backend)
        try:
            # Backends read debug mode while building (e.g. Numba's bounds checking): give
            # them the call's, whatever is in force where the lowering happens.
            with _debug.debug_mode(debug):
                fn = self._make(entry, module, platform, ins, outs, batch, params)
                if debug:
                    fn = self._debug_checked(entry, module, platform, ins, outs, batch,
                                             context, params, fn)
        except KernelError:
            raise
        except Exception as e:
            raise KernelError(
                f"kernel {self.name!r} failed to build with backend {entry.backend!r} on "
                f"{platform!r}: {type(e).__name__}: {e}\n{self._switch_hint(platform, entry.backend)}"
            ) from e
        self._build_cache[key] = fn
        return fn

    def _debug_checked(self, entry, module, platform, ins, outs, batch, context, params, fn):
        """``fn`` with debug mode's output-coverage and reference checks around it."""
        prefilled_run, prefilled = None, []
        if entry.backend == "numba" and not (batch and entry.wants_batch_shape):
            extra = {"batch_shape": ()} if entry.wants_batch_shape else {}
            product = self._generate(entry, ins=ins, outs=outs, platform=platform, **extra,
                                     **params)
            wrapped = None
            if _route(module, product, ins, outs, self.name) is module:
                wrapped = _debug_checks.prefilled_numba(product, len(ins), outs, self.name)
            if wrapped is not None:
                new, prefilled = wrapped
                ext_ins = tuple(ins) + tuple(outs[j] for j in prefilled)
                ext_batch = tuple((s, tuple(m) + (False,) * len(prefilled)) for s, m in batch)
                core = module.make_callable(new, ins=ext_ins, outs=outs, platform=platform,
                                            name=self.name, batch=ext_batch)

                def prefilled_run(arrays, pattern, core=core, prefilled=tuple(prefilled)):
                    fills = [_debug_checks.fill(outs[j], pattern) for j in prefilled]
                    return core(*arrays, *fills)
        reference = None
        if entry.backend != "jax" and "jax" in self._entries.get(platform, {}):
            reference = self.build(platform, ins=ins, outs=outs, batch=batch, backend="jax",
                                   context=context, debug=False, **params)
        if prefilled_run is None and reference is None:
            return fn
        return _debug_checks.checked_call(self.name, entry.backend, outs, fn, prefilled_run,
                                          prefilled, reference)

    def _make(self, entry, module, platform, ins, outs, batch, params):
        name = self.name
        if batch and entry.wants_batch_shape:
            sizes = tuple(s for s, _ in batch)
            big_ins = tuple(jax.ShapeDtypeStruct(sizes + i.shape, i.dtype) for i in ins)
            big_outs = tuple(jax.ShapeDtypeStruct(sizes + o.shape, o.dtype) for o in outs)
            product = self._generate(
                entry, ins=big_ins, outs=big_outs, batch_shape=sizes, platform=platform, **params
            )
            module = _route(module, product, big_ins, big_outs, name)
            core = module.make_callable(
                product, ins=big_ins, outs=big_outs, platform=platform, name=name
            )
            return lambda *arrays: core(*_batching.broadcast_levels(arrays, batch))
        extra = {"batch_shape": ()} if entry.wants_batch_shape else {}
        product = self._generate(entry, ins=ins, outs=outs, platform=platform, **extra, **params)
        module = _route(module, product, ins, outs, name)
        if batch and _accepts_batch(module.make_callable):
            return module.make_callable(
                product, ins=ins, outs=outs, platform=platform, name=name, batch=batch
            )
        core = module.make_callable(product, ins=ins, outs=outs, platform=platform, name=name)
        return _batching.vmap_levels(core, batch) if batch else core

    def _lower(
        self, ctx, *args, platform, outs, backend=None, context=(), batch=(), debug=False,
        **params,
    ):
        ins = tuple(
            _core_struct(aval, _n_mapped(batch, i)) for i, aval in enumerate(ctx.avals_in)
        )
        fn = self.build(
            platform, ins=ins, outs=outs, batch=batch, backend=backend, context=context,
            debug=debug, **params,
        )
        if not debug:  # debug mode checks whole arrays: a sharded call runs gathered
            fn = _sharding.partition_lowering(
                self, fn, platform=platform, ins=ins, outs=outs, batch=batch, backend=backend,
                context=context, params=params,
            )

        def checked(*arrays):
            results = tuple(fn(*arrays))
            sizes = tuple(s for s, _ in batch)
            want = [(sizes + o.shape, jnp.dtype(o.dtype)) for o in outs]
            got = [(tuple(r.shape), jnp.dtype(r.dtype)) for r in results]
            if got != want:
                raise KernelError(
                    f"kernel {self.name!r}: the {params and 'configured ' or ''}kernel returned "
                    f"outputs {got} but outs declares {want}"
                )
            return results

        try:
            return _compat.mlir.lower_fun(checked, multiple_results=True)(ctx, *args)
        except KernelError:
            raise
        except Exception as e:
            try:
                used = self._select(platform, backend, context).backend
            except Exception:  # noqa: BLE001 - the hint must not hide the real error
                used = backend or ""
            raise KernelError(
                f"kernel {self.name!r} failed to lower with backend {used!r} on {platform!r}: "
                f"{type(e).__name__}: {e}\n{self._switch_hint(platform, used)}"
            ) from e

    # -- batching
    def _batch(self, args, axes, **params):
        if not any(_batching._is_mapped(ax) for ax in axes):
            return self.primitive.bind(*args, **params), [None] * len(params["outs"])
        if self._batching_mode == "native":
            return _batching.native_batching_rule(self.primitive, args, axes, **params)
        if self._batching_mode == "general":
            return _batching.general_batching_rule(self.primitive, args, axes, **params)
        if params.get("batch"):
            raise KernelError(f"kernel {self.name!r}: custom batching met a native batch level")
        with _following(params):
            return self._custom_batching(args, axes, **_user_params(params))

    # -- JVP (user rules always see per-example shapes)
    def _jvp(self, primals, tangents, *, batch=(), **params):
        if self._jvp_rule is None:
            raise NotImplementedError(
                f"kernel {self.name!r} has no JVP rule, so it cannot be differentiated. Add "
                f"one with kernel.def_jvp_rule(fn), kernel.def_jvp_rule2(*per_input_rules) "
                f"or primforge.defjvp(kernel, ...)."
            )
        if not batch:
            with _following(params):
                result = self._jvp_rule(primals, tangents, **_user_params(params))
            out, tan = self._jvp_result(result, len(params["outs"]))
            return out, [_instantiate_like(t, o) for t, o in zip(tan, out)]
        (size, mapped), inner = batch[0], batch[1:]
        zero = [type(t) is _compat.Zero for t in tangents]
        live_t = [t for t, z in zip(tangents, zero) if not z]
        t_mapped = [m for m, z in zip(mapped, zero) if not z]
        t_avals = [_unbatch_aval(t.aval, m) if z else None for t, z, m in zip(tangents, zero, mapped)]

        def per_example(ps, ts):
            it = iter(ts)
            full_t = [_compat.Zero(a) if z else next(it) for z, a in zip(zero, t_avals)]
            out, tan = self._jvp(list(ps), full_t, batch=inner, **params)
            return tuple(out), tuple(_instantiate_like(t, o) for t, o in zip(tan, out))

        axes = tuple(0 if m else None for m in mapped)
        t_axes = tuple(0 if m else None for m in t_mapped)
        out, tan = jax.vmap(per_example, in_axes=(axes, t_axes), axis_size=size)(
            tuple(primals), tuple(live_t)
        )
        return list(out), list(tan)

    def _jvp_result(self, result, n_out: int):
        """A JVP rule's ``(outputs, tangents)`` as two lists of ``n_out`` entries.

        With one output, a bare array for either is taken as that output's.
        """
        rule = getattr(self._jvp_rule, "__qualname__", None) or type(self._jvp_rule).__name__
        if not isinstance(result, (tuple, list)) or len(result) != 2:
            raise KernelError(
                f"kernel {self.name!r}: the JVP rule {rule} must return (outputs, tangents); "
                f"got {type(result).__name__}"
            )
        parts = []
        for what, part in zip(("outputs", "tangents"), result):
            if n_out == 1 and not isinstance(part, (tuple, list)):
                part = [part]
            if not isinstance(part, (tuple, list)) or len(part) != n_out:
                got = f"{len(part)} values" if isinstance(part, (tuple, list)) else type(part).__name__
                raise KernelError(
                    f"kernel {self.name!r}: the JVP rule {rule} must return {n_out} {what} "
                    f"(one per output, as a sequence); got {got}"
                )
            parts.append(list(part))
        return parts[0], parts[1]

    # -- transpose (user rules always see per-example shapes)
    def _transpose(self, cts, *args, batch=(), **params):
        if self._transpose_rule is None:
            raise NotImplementedError(
                f"kernel {self.name!r} has no transpose rule, so reverse-mode differentiation "
                f"(grad, vjp, linear_transpose) through it is not possible. Add one with "
                f"kernel.def_transpose_rule(fn)."
            )
        if not batch:
            with _following(params):
                res = self._transpose_rule(list(cts), *args, **_user_params(params))
            res = list(res) if isinstance(res, (list, tuple)) else [res]
            if len(res) != len(args):
                raise ValueError(
                    f"kernel {self.name!r}: the transpose rule returned {len(res)} cotangents "
                    f"for {len(args)} inputs"
                )
            return [r if _compat.is_undefined_primal(a) else None for r, a in zip(res, args)]
        (size, mapped), inner = batch[0], batch[1:]
        undef = [_compat.is_undefined_primal(a) for a in args]
        defined = [a for a, u in zip(args, undef) if not u]
        d_axes = tuple(0 if m else None for m, u in zip(mapped, undef) if not u)
        inner_avals = [
            _unbatch_aval(a.aval, m) if u else None for a, u, m in zip(args, undef, mapped)
        ]
        ct_zero = [type(c) is _compat.Zero for c in cts]
        live_ct = [c for c, z in zip(cts, ct_zero) if not z]
        ct_avals = [_unbatch_aval(c.aval, True) if z else None for c, z in zip(cts, ct_zero)]

        def per_example(ds, cs):
            it_d, it_c = iter(ds), iter(cs)
            full = [_compat.UndefinedPrimal(av) if u else next(it_d) for u, av in zip(undef, inner_avals)]
            full_ct = [_compat.Zero(av) if z else next(it_c) for z, av in zip(ct_zero, ct_avals)]
            res = self._transpose(full_ct, *full, batch=inner, **params)
            return tuple(
                _instantiate_like(r, None, aval=av) if u else None
                for r, u, av in zip(res, undef, inner_avals)
            )

        out = jax.vmap(per_example, in_axes=(d_axes, 0), out_axes=0, axis_size=size)(
            tuple(defined), tuple(live_ct)
        )
        result = []
        for r, u, m in zip(out, undef, mapped):
            if not u:
                result.append(None)
            else:
                result.append(r if m else jnp.sum(r, axis=0))
        return result

    # ------------------------------------------------------------------ sharding
    def def_sharding_rule(
        self,
        rule,
        *,
        reduction_factors: Sequence[str] = (),
        need_replication_factors: Sequence[str] = (),
    ):
        """Partition calls on sharded inputs by ``rule`` instead of gathering them.

        ``rule`` is ``'elementwise'``, an einsum-like string in Shardy's notation (one
        factor per dimension, e.g. ``'i j, j -> i'``), or a callable of the call's params
        returning one. See :func:`primforge.kernel.sharding.def_sharding_rule`.

        Example:
            >>> import primforge
            >>> k = primforge.XLACustomKernel('doc_sharding_rule_method')
            >>> k.def_kernel('jax', 'cpu', lambda **kw: lambda a, x: a @ x)
            >>> rule = k.def_sharding_rule('i j, j -> i')
            >>> type(rule).__name__
            'ShardingRule'
        """
        result = _sharding.def_sharding_rule(
            self, rule, reduction_factors=reduction_factors,
            need_replication_factors=need_replication_factors,
        )
        self._changed()  # jitted callers re-lower with the rule
        return result

    # ------------------------------------------------------------------ call / benchmark hooks
    def def_tags(self, *tags: str) -> None:
        """Add categorisation tags (used by the registry and the CLI to filter kernels).

        Example:
            >>> import primforge
            >>> k = primforge.XLACustomKernel('doc_def_tags')
            >>> k.def_tags('csr', 'binary')
            >>> sorted(k.tags)
            ['binary', 'csr']
        """
        for t in tags:
            if not isinstance(t, str) or not t:
                raise TypeError(f"def_tags: tags must be non-empty strings, got {t!r}")
        self.tags.update(tags)

    def def_call(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Store the user-facing call function used by :meth:`call` and benchmarking.

        Example:
            >>> import primforge
            >>> k = primforge.XLACustomKernel('doc_def_call')
            >>> _ = k.def_call(lambda x, backend=None: x + 1)
            >>> k.call(1)
            2
        """
        if not callable(fn):
            raise TypeError("def_call: fn must be callable")
        self._call_fn = fn
        return fn

    def call(self, *args, **kwargs):
        """Invoke the function registered with :meth:`def_call`.

        Raises:
            ValueError: if no call function is registered.

        Example:
            >>> import primforge
            >>> k = primforge.XLACustomKernel('doc_call_missing')
            >>> k.call(1)
            Traceback (most recent call last):
            ...
            ValueError: kernel 'doc_call_missing' has no call function; register one with kernel.def_call(fn)
        """
        if self._call_fn is None:
            raise ValueError(
                f"kernel {self.name!r} has no call function; register one with "
                f"kernel.def_call(fn)"
            )
        return self._call_fn(*args, **kwargs)

    def has_call(self) -> bool:
        """Whether a call function is registered (:meth:`def_call`).

        Example:
            >>> import primforge
            >>> k = primforge.XLACustomKernel('doc_has_call')
            >>> k.has_call()
            False
            >>> _ = k.def_call(lambda x, backend=None: x)
            >>> k.has_call()
            True
        """
        return self._call_fn is not None

    def call_signature(self) -> inspect.Signature:
        """The signature of the function registered with :meth:`def_call`.

        Raises:
            ValueError: if no call function is registered, or its signature cannot be read.

        Example:
            >>> import primforge
            >>> k = primforge.XLACustomKernel('doc_call_signature')
            >>> _ = k.def_call(lambda x, backend=None: x)
            >>> 'backend' in k.call_signature().parameters
            True
        """
        if self._call_fn is None:
            raise ValueError(
                f"kernel {self.name!r} has no call function; register one with "
                f"kernel.def_call(fn)"
            )
        return inspect.signature(self._call_fn)

    def has_benchmark_data(self) -> bool:
        """Whether a benchmark data function is registered (:meth:`def_benchmark_data`).

        Example:
            >>> import primforge
            >>> k = primforge.XLACustomKernel('doc_has_benchmark_data')
            >>> k.has_benchmark_data()
            False
            >>> _ = k.def_benchmark_data(lambda *, platform: [])
            >>> k.has_benchmark_data()
            True
        """
        return self._benchmark_data_fn is not None

    def benchmark_data(self, *, platform: str) -> list:
        """The benchmark configs for ``platform``, from :meth:`def_benchmark_data`'s function.

        Raises:
            ValueError: if no benchmark data function is registered.

        Example:
            >>> import jax.numpy as jnp, primforge
            >>> k = primforge.XLACustomKernel('doc_benchmark_data')
            >>> _ = k.def_benchmark_data(lambda *, platform: [
            ...     primforge.BenchmarkConfig(args=(jnp.ones(4),), n=4)])
            >>> [c.name for c in k.benchmark_data(platform='cpu')]
            ['n=4']
        """
        if self._benchmark_data_fn is None:
            raise ValueError(
                f"kernel {self.name!r} has no benchmark data: register a function "
                f"fn(*, platform) -> list[BenchmarkConfig] with kernel.def_benchmark_data(fn)"
            )
        return list(self._benchmark_data_fn(platform=platform))

    def benchmark(
        self,
        *,
        platform: str,
        n_warmup: int = 5,
        n_runs: int = 20,
        n_batch_per_run: int = 1,
        compare_results: bool = True,
        rtol: float = 1e-3,
        atol: float = 1e-3,
        verbose: bool = False,
        catch_errors: bool = True,
        backends: Sequence[str] | None = None,
        **kwargs,
    ):
        """Time every backend on every benchmark config (see :func:`primforge.bench.benchmark_kernel`).

        Needs :meth:`def_call` and :meth:`def_benchmark_data`. Returns a ``BenchmarkResult``
        with one record per (config, backend); each backend's output is compared with the
        reference backend (``reference=``, default 'jax' where registered).

        Example:
            >>> import jax, jax.numpy as jnp, primforge
            >>> k = primforge.XLACustomKernel('doc_benchmark_method')
            >>> k.def_kernel('jax', 'cpu', lambda **kw: lambda x: x * 2)
            >>> k.def_kernel('twice', 'cpu', lambda **kw: lambda x: x + x)
            >>> _ = k.def_call(lambda x, backend=None: k(x, outs=jax.ShapeDtypeStruct(x.shape, x.dtype), backend=backend))
            >>> _ = k.def_benchmark_data(lambda *, platform: [primforge.BenchmarkConfig(args=(jnp.ones(8),))])
            >>> result = k.benchmark(platform='cpu', n_warmup=1, n_runs=2)
            >>> sorted(r.backend for r in result.records)
            ['jax', 'twice']
        """
        return benchmark_kernel(
            self, platform=platform, n_warmup=n_warmup, n_runs=n_runs,
            n_batch_per_run=n_batch_per_run, compare_results=compare_results, rtol=rtol,
            atol=atol, verbose=verbose, catch_errors=catch_errors, backends=backends, **kwargs,
        )

    def def_benchmark_data(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Register ``fn(*, platform) -> list[BenchmarkConfig]`` for :meth:`benchmark`.

        Example:
            >>> import primforge
            >>> k = primforge.XLACustomKernel('doc_def_bench_data')
            >>> _ = k.def_benchmark_data(lambda *, platform: [])
        """
        if not callable(fn):
            raise TypeError("def_benchmark_data: fn must be callable")
        self._benchmark_data_fn = fn
        return fn


_MATCHES = object()  # _ref_cache value: outs agreed with the reference


def _keyword_only(fn) -> set[str]:
    if fn is None:
        return set()
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return set()
    return {p.name for p in params if p.kind is p.KEYWORD_ONLY}


@contextlib.contextmanager
def _following(params: dict):
    """Run a rule with the backend overrides and debug mode of the call it serves."""
    with _selection.restored(params.get("context", ())), _debug.debug_mode(
        bool(params.get("debug", False))
    ):
        yield



def _fmt(structs) -> str:
    return "[" + ", ".join(f"{s.dtype}{list(s.shape)}" for s in structs) + "]"


def _route(module, product, ins, outs, name: str):
    """The backend module that turns ``product`` into the kernel's callable.

    A backend that launches its own kind of kernel (numba, numba_cuda, warp, triton) says
    through ``product_form`` whether the generator returned such a kernel or a function
    that is already a traceable JAX callable (what a generator of other libraries returns
    for every backend, e.g. a function that calls ``numba_kernel(fn, outs=...)``); the
    latter is used as it is, like a 'jax' product.
    """
    form = getattr(module, "product_form", None)
    if form is None:
        return module
    if form(product, n_ins=len(ins), n_outs=len(outs), name=name) == "callable":
        return get_backend("jax")
    return module


def _accepts_batch(fn) -> bool:
    try:
        return "batch" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _unbatch_aval(aval, mapped: bool):
    return aval.update(shape=aval.shape[1:]) if mapped else aval


def _instantiate_like(t, out, aval=None):
    """Turn a symbolic zero / None tangent into a concrete zero of the right aval."""
    if t is None or type(t) is _compat.Zero:
        if aval is None:
            aval = t.aval if type(t) is _compat.Zero else _compat.get_aval(out)
        dtype = _compat.tangent_dtype(aval.dtype)
        if dtype == _compat.float0:
            return np.zeros(aval.shape, dtype=_compat.float0)
        return jnp.zeros(aval.shape, dtype)
    return t
