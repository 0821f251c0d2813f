"""XLACustomKernel: one named JAX primitive, kernels registered per backend and platform.

The class is assembled from one part per concern (``registration``, ``checks``,
``lowering``, ``batching``, ``autodiff``, ``sharding``, ``benchmarking``), each owning its
own fields (see :mod:`primforge.kernel.state`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from primforge import _compat, registry
from primforge.backends import KNOWN_BACKENDS
from primforge.kernel import hooks
from primforge.kernel import selection as _selection
from primforge.kernel.autodiff import INTERNAL_PARAMS, AutodiffMixin, KernelPrimitive
from primforge.kernel.batching import BatchingMixin
from primforge.kernel.benchmarking import BenchmarkingMixin
from primforge.kernel.checks import ChecksMixin
from primforge.kernel.entry import KernelEntry
from primforge.kernel.errors import BackendUnavailableWarning, KernelError
from primforge.kernel.lowering import LoweringMixin
from primforge.kernel.registration import RegistrationMixin
from primforge.kernel.sharding import ShardingMixin
from primforge.kernel.state import KernelState
from primforge.primitive import static_param
from primforge.utils._suggest import did_you_mean

__all__ = [
    "BackendUnavailableWarning",
    "KernelEntry",
    "KernelError",
    "XLACustomKernel",
]


class XLACustomKernel(
    RegistrationMixin,
    ChecksMixin,
    LoweringMixin,
    BatchingMixin,
    AutodiffMixin,
    ShardingMixin,
    BenchmarkingMixin,
):
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
        KernelState.__init__(self, name, doc)
        self.primitive = KernelPrimitive(name)
        self.primitive.multiple_results = True
        self._install_rules()
        self._register(replace)

    def _install_rules(self) -> None:
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

    def _register(self, replace: bool) -> None:
        """Enter the kernel in the registry (by name) and in the live-kernel table, then
        announce it (``hooks.KERNEL_DEFINED``)."""
        registry.register_kernel(self, replace=replace)
        _selection.note_kernel(self)
        hooks.emit(hooks.KERNEL_DEFINED, self)

    def __repr__(self) -> str:
        return f"XLACustomKernel({self.name!r}, backends={self._backend_table()})"

    def clear_cache(self) -> None:
        """Drop everything this kernel built: callables, generated kernels, compiled code.

        The per-signature caches are already bounded (``PRIMFORGE_KERNEL_CACHE_SIZE``,
        least recently used dropped first); this empties them now, has each backend release
        what it holds for the kernels this one generated (its ``release`` hook: the
        Numba backend drops their compiled code), and makes functions compiled by
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
        self._release_built()

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
        arrays = self._as_arrays(inputs)
        self._check_backend(backend)
        where = f"kernel {self.name!r}"
        params = {k: static_param(v, name=k, where=where) for k, v in params.items()}
        clash = set(params) & set(INTERNAL_PARAMS)
        if clash:
            raise TypeError(f"kernel {self.name!r}: reserved param name(s) {sorted(clash)}")
        self._check_params(params)
        structs, container = self._resolve_outs(arrays, outs, params)
        arrays = _compat.match_varying(arrays)  # inside shard_map: one varying type
        # KernelPrimitive.bind adds the backend overrides and debug mode in force here.
        flat = self.primitive.bind(*arrays, outs=structs, backend=backend, **params)
        if container is None:
            return flat[0]
        return container(flat)

    def _as_arrays(self, inputs) -> list:
        arrays = []
        for i, x in enumerate(inputs):
            if isinstance(x, jax.Array) or hasattr(x, "aval"):
                arrays.append(x)
                continue
            try:
                arrays.append(jnp.asarray(x))
            except TypeError as e:
                raise TypeError(
                    f"kernel {self.name!r}: input {i} is not an array ({type(x).__name__})"
                ) from e
        return arrays

    def _check_backend(self, backend) -> None:
        if backend is None:
            return
        if not isinstance(backend, str):
            raise TypeError(f"kernel {self.name!r}: backend must be a str or None")
        known = {b for backends in self._backend_table().values() for b in backends}
        if backend not in known:
            hint = did_you_mean(backend, known | set(KNOWN_BACKENDS))
            raise ValueError(
                f"kernel {self.name!r} has no backend {backend!r}{hint}; the 'backend' "
                f"argument must name a registered one: {self._backend_table()}"
            )
