"""Registration: kernel generators per backend and platform, defaults, tags.

``def_kernel`` is the one entry point (the ``def_*_kernel`` methods are shorthands); the
first kernel registered for a platform becomes its default.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from primforge.backends import get_backend, is_known
from primforge.kernel import hooks
from primforge.kernel import selection as _selection
from primforge.kernel.entry import KernelEntry
from primforge.kernel.state import KernelState
from primforge.utils._suggest import did_you_mean

__all__ = ["RegistrationMixin", "check_platform"]

_ALL_PLATFORMS = ("cpu", "gpu", "tpu")


def check_platform(kernel_name: str, backend: str, platform: Any) -> str:
    """The canonical name of ``platform``, checked against what ``backend`` serves.

    Raises:
        TypeError: ``platform`` is not a str.
        ValueError: ``backend`` does not serve ``platform``; the message names the backend,
            the platform given and the platforms the backend serves. A backend outside
            built-in or registered ones serves every platform primforge knows.

    Example:
        >>> check_platform('k', 'numba', 'cpu'), check_platform('k', 'mine', 'cuda')
        ('cpu', 'gpu')
        >>> check_platform('k', 'numba', 'gpu')
        Traceback (most recent call last):
        ...
        ValueError: def_kernel: kernel 'k': the 'numba' backend serves ['cpu'], not 'gpu'.
        Register it for one of those, or give a traceable JAX function for 'gpu' under another
        name (e.g. 'jax').
    """
    if not isinstance(platform, str):
        raise TypeError(f"def_kernel: 'platform' must be a str, got {platform!r}")
    served = get_backend(backend).PLATFORMS if is_known(backend) else _ALL_PLATFORMS
    canonical = _selection.PLATFORM_ALIASES.get(platform)
    if canonical in served:
        return canonical
    if canonical is None:
        raise ValueError(
            f"def_kernel: kernel {kernel_name!r}: unknown platform {platform!r} for the "
            f"{backend!r} backend, which serves {list(served)} (JAX's 'cuda' and 'rocm' "
            f"mean 'gpu')"
        )
    given = platform if canonical == platform else f"{platform} ({canonical})"
    raise ValueError(
        f"def_kernel: kernel {kernel_name!r}: the {backend!r} backend serves "
        f"{list(served)}, not {given!r}. Register it for one of those, or give a traceable "
        f"JAX function for {canonical!r} under another name (e.g. 'jax')."
    )


class RegistrationMixin(KernelState):
    """Registering kernel generators, choosing defaults, tagging.

    Part of :class:`primforge.XLACustomKernel`; owns ``_entries``, ``_defaults`` and
    ``tags``; the other parts read the registration through :meth:`_entries_on`,
    :meth:`_all_entries`, :meth:`_default_on` and :meth:`_backend_table`.
    """

    def _init_state(self) -> None:
        super()._init_state()
        self._entries: dict[str, dict[str, KernelEntry]] = {}  # platform -> backend -> entry
        self._defaults: dict[str, str] = {}  # platform -> default backend
        self.tags: set[str] = set()

    def _entries_on(self, platform: str) -> dict[str, KernelEntry]:
        """The kernels registered on ``platform``, by backend (empty when none)."""
        return dict(self._entries.get(platform, {}))

    def _all_entries(self) -> list[KernelEntry]:
        """Every registered kernel, platform by platform."""
        return [e for entries in self._entries.values() for e in entries.values()]

    def _default_on(self, platform: str) -> str | None:
        """The default backend on ``platform`` (None: nothing registered there)."""
        return self._defaults.get(platform)

    def _backend_table(self) -> dict[str, list[str]]:
        """Backend names per platform, in registration order."""
        return {p: list(e) for p, e in self._entries.items()}

    def def_kernel(
        self, backend: str, platform: str, kg: Callable[..., Any], asdefault: bool = False
    ) -> None:
        """Register kernel generator ``kg`` for ``backend`` on ``platform``.

        The first kernel registered for a platform becomes its default; ``asdefault=True``
        makes this one the default even if another is.

        Args:
            backend: backend name, e.g. 'jax', 'numba', 'pallas'.
            platform: 'cpu', 'gpu' or 'tpu' (or JAX's 'cuda', 'rocm'); one the backend
                serves (its module's ``PLATFORMS``).
            kg: kernel generator (see :class:`KernelEntry`).
            asdefault: make this backend the platform's default.

        Raises:
            ValueError: ``backend`` does not serve ``platform``.

        Example:
            >>> import primforge
            >>> k = primforge.XLACustomKernel('doc_def_kernel')
            >>> k.def_kernel('jax', 'cpu', lambda **kw: lambda x: x + 1)
            >>> k.available_backends('cpu')
            ['jax']
        """
        if not isinstance(backend, str) or not backend:
            raise TypeError(f"def_kernel: 'backend' must be a non-empty str, got {backend!r}")
        platform = check_platform(self.name, backend, platform)
        if not callable(kg):
            raise TypeError(
                f"def_kernel: 'kg' (the kernel generator) must be callable, got "
                f"{type(kg).__name__}"
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
                f"kernel {self.name!r} has no {backend!r} backend on {platform!r}"
                f"{did_you_mean(backend, entries)}; available: {list(entries)}"
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

    # ------------------------------------------------------------------ tags
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
