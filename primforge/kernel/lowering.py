"""Selection, build and lowering: from a bind to the backend's traceable callable.

``_lower`` -> ``build`` -> ``_select`` -> ``_make`` (the generator, once per signature,
through the backend's ``make_callable``) -> ``mlir.lower_fun``; eager calls (``_impl``)
run a cached ``jax.jit`` of the bind.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from primforge import _compat
from primforge import backends as _backends
from primforge import debug as _debug
from primforge.backends import get_backend
from primforge.kernel import _debug_checks, _lru
from primforge.kernel import batching as _batching
from primforge.kernel import selection as _selection
from primforge.kernel import sharding as _sharding
from primforge.kernel.entry import KernelEntry
from primforge.kernel.errors import BackendDeclined, KernelError
from primforge.kernel.state import KernelState

__all__ = ["LoweringMixin"]


class LoweringMixin(KernelState):
    """Backend selection, building the callable, lowering it, eager execution.

    Part of :class:`primforge.XLACustomKernel`; owns ``_impl_cache``, ``_build_cache``,
    ``_product_cache`` and ``_warned``. Reads the registration through its methods.
    """

    def _init_state(self) -> None:
        super()._init_state()
        # Per-signature caches, bounded (least recently used dropped; see kernel._lru).
        self._impl_cache: dict[Any, Callable] = _lru.LRUCache()  # params -> jitted bind
        self._build_cache: dict[Any, Callable] = _lru.LRUCache()  # signature -> callable
        self._product_cache: dict[Any, Any] = _lru.LRUCache()  # signature -> product
        self._warned: set[tuple[str, str]] = set()  # (platform, backend) fallbacks warned

    def _drop_derived(self) -> None:
        super()._drop_derived()
        self._build_cache.clear()
        self._impl_cache.clear()
        self._product_cache.clear()

    def _release_built(self) -> None:
        """Drop everything built, and have each backend release its products."""
        built = list(self._product_cache.items())
        self._changed()
        for (_platform, backend, _params), product in built:
            get_backend(backend).release(product)

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

    def _select(self, platform: str, backend: str | None, context) -> KernelEntry:
        entries = self._entries_on(platform)
        if not entries:
            raise KernelError(
                f"kernel {self.name!r} has no kernel for platform {platform!r}. Registered: "
                f"{self._backend_table() or 'nothing'}. Register one with "
                f"kernel.def_kernel(backend, {platform!r}, generator) (a 'jax' backend runs "
                f"everywhere)."
            )
        choice = _selection.choose(self.name, platform, entries, backend=backend,
                                   context=context, default=self._default_on(platform))
        return entries[_selection.installed(self.name, platform, entries, choice,
                                            explicit=backend is not None, warned=self._warned)]

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

        Example:
            >>> import jax, jax.numpy as jnp, primforge
            >>> k = primforge.XLACustomKernel('demo_build')
            >>> k.def_kernel('jax', 'cpu', lambda **kw: lambda x: 2 * x)
            >>> s = jax.ShapeDtypeStruct((3,), jnp.float32)
            >>> k.build('cpu', ins=(s,), outs=(s,))(jnp.ones(3))
            (Array([2., 2., 2.], dtype=float32),)
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
        except BackendDeclined as e:
            if backend is not None or e.fallback in (None, entry.backend):
                raise
            # A default the call did not ask for: the backend its params name instead.
            return self.build(platform, ins=ins, outs=outs, batch=batch, backend=e.fallback,
                              context=context, debug=debug, **params)
        except KernelError:
            raise
        except Exception as e:
            raise KernelError(
                f"kernel {self.name!r} failed to build with backend {entry.backend!r} on "
                f"{platform!r}: {type(e).__name__}: {e}\n"
                f"{self._switch_hint(platform, entry.backend)}"
            ) from e
        self._build_cache[key] = fn
        return fn

    def _debug_checked(self, entry, module, platform, ins, outs, batch, context, params, fn):
        """``fn`` with debug mode's output-coverage and reference checks around it."""
        prefilled_run, prefilled = None, []
        if not (batch and entry.wants_batch_shape):
            prefilled_run, prefilled = self._prefilled_run(entry, module, platform, ins, outs,
                                                           batch, params)
        reference = None
        ref = _backends.REFERENCE
        if entry.backend != ref and ref in self._entries_on(platform):
            reference = self.build(platform, ins=ins, outs=outs, batch=batch, backend=ref,
                                   context=context, debug=False, **params)
        if prefilled_run is None and reference is None:
            return fn
        return _debug_checks.checked_call(self.name, entry.backend, outs, fn, prefilled_run,
                                          prefilled, reference, platform)

    def _prefilled_run(self, entry, module, platform, ins, outs, batch, params):
        """The call with pre-filled outputs (``run(arrays, pattern)``) and the indices
        pre-filled, from the ``debug_prefill`` hook of the backend that builds the product
        (or of the backend that owns it, for a product another backend's generator
        returned); ``(None, [])`` when no backend offers it. Built by :meth:`_make`, with
        the product swapped for the pre-filling one on the way."""
        prefilled: list[int] = []

        def prefill(product, asked, routed):
            builder, wrapped = asked, None
            if routed is asked:
                wrapped = asked.debug_prefill(product, n_ins=len(ins), outs=outs,
                                              name=self.name)
            if wrapped is None:
                owner = _backends.owner_of(product)
                if owner is not None and owner is not asked and owner.is_available(platform):
                    builder = owner
                    wrapped = owner.debug_prefill(product, n_ins=len(ins), outs=outs,
                                                  name=self.name)
            if wrapped is None:
                return None
            new, indices = wrapped
            prefilled.extend(indices)
            ext_ins = tuple(ins) + tuple(outs[j] for j in indices)
            ext_batch = tuple((s, tuple(m) + (False,) * len(indices)) for s, m in batch)
            return new, builder, ext_ins, ext_batch

        core = self._make(entry, module, platform, ins, outs, batch, params, swap=prefill)
        if core is None:
            return None, []

        def run(arrays, pattern, core=core, prefilled=tuple(prefilled)):
            fills = [_debug_checks.fill(outs[j], pattern) for j in prefilled]
            return core(*arrays, *fills)

        return run, list(prefilled)

    def _make(self, entry, module, platform, ins, outs, batch, params, swap=None):
        """The one build: generate the product, route it to the backend that builds it,
        and build it for ``batch`` (natively where the backend batches, else vmapped).

        ``swap(product, asked, routed)`` (debug mode's hook) may replace, before the build,
        the product, its builder and the inputs and batch levels it takes (a tuple), or
        stop the build (None; ``_make`` then returns None). Never with a batch shape.
        """
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
        routed = _route(module, product, ins, outs, name)
        if swap is not None:
            swapped = swap(product, module, routed)
            if swapped is None:
                return None
            product, routed, ins, batch = swapped
        if batch and routed.BATCHES_NATIVELY:
            return routed.make_callable(
                product, ins=ins, outs=outs, platform=platform, name=name, batch=batch
            )
        core = routed.make_callable(product, ins=ins, outs=outs, platform=platform, name=name)
        return _batching.vmap_levels(core, batch) if batch else core

    def _lower(
        self, ctx, *args, platform, outs, backend=None, context=(), batch=(), debug=False,
        **params,
    ):
        ins = tuple(
            _batching.core_struct(aval, _batching.n_mapped(batch, i))
            for i, aval in enumerate(ctx.avals_in)
        )
        fn = self.build(
            platform, ins=ins, outs=outs, batch=batch, backend=backend, context=context,
            debug=debug, **params,
        )
        # Debug mode checks whole arrays: a sharded call runs gathered. A kernel lowered
        # inside another kernel's lowering has no device assignment to partition over
        # (the outer kernel runs on gathered inputs): it lowers as is.
        if not debug and _compat.lowering_has_device_assignment(ctx):
            fn = _sharding.partition_lowering(
                self, fn, platform=platform, ins=ins, outs=outs, batch=batch, backend=backend,
                context=context, params=params,
            )
        checked = self._shape_checked(fn, outs, batch, configured=bool(params))
        try:
            if platform != "gpu":
                return _compat.mlir.lower_fun(checked, multiple_results=True)(ctx, *args)
            with _compat.device_less_gpu_lowering(ctx):
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

    def _shape_checked(self, fn, outs, batch, *, configured: bool):
        """``fn`` raising a :class:`KernelError` when its outputs differ from ``outs``."""
        sizes = tuple(s for s, _ in batch)
        want = [(sizes + o.shape, jnp.dtype(o.dtype)) for o in outs]

        def checked(*arrays):
            results = tuple(fn(*arrays))
            got = [(tuple(r.shape), jnp.dtype(r.dtype)) for r in results]
            if got != want:
                raise KernelError(
                    f"kernel {self.name!r}: the {'configured ' if configured else ''}kernel "
                    f"returned outputs {got} but outs declares {want}"
                )
            return results

        return checked

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



def _route(module, product, ins, outs, name: str):
    """The backend module that turns ``product`` into the kernel's callable.

    A backend that launches its own kind of kernel says through its ``product_form`` hook
    whether the generator returned such a kernel or a function that is already a
    traceable JAX callable (what a generator of other libraries returns for every
    backend); the latter is built by the reference backend, as it is.
    """
    if module.product_form(product, n_ins=len(ins), n_outs=len(outs), name=name) == "callable":
        return get_backend(_backends.REFERENCE)
    return module
