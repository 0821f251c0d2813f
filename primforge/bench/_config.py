"""What one benchmark case is: a name, the call's arguments, and the values that describe it.

``args`` and ``kwargs`` go to the kernel's call function; ``params`` (keyword arguments
that are not fields) are what a table or plot shows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["BenchmarkConfig", "BenchmarkDataFnNotProvidedError", "BenchmarkMismatchWarning"]


class BenchmarkDataFnNotProvidedError(ValueError):
    """A kernel was benchmarked but has no benchmark data function.

    Register one with ``kernel.def_benchmark_data(fn)``, where ``fn(*, platform)`` returns a
    list of :class:`BenchmarkConfig`.
    """


class BenchmarkMismatchWarning(UserWarning):
    """A backend's output differs from the reference backend's beyond the tolerances."""


def _describe(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


class BenchmarkConfig:
    """One benchmark case of a kernel.

    Args:
        name: label of the case in tables and plots; derived from ``params`` when omitted
            (``'n=100,density=0.1'``).
        args: positional arguments for the kernel's call function. Array leaves become
            runtime inputs of the timed, compiled function; other values are fixed.
        kwargs: keyword arguments for the call function (static: shapes, flags).
        params: values that describe the case (sizes, densities); recorded with every
            result and used as the x axis of plots.
        kernel_kwargs: another name for ``kwargs`` (give one of the two).
        data_kwargs: another name for ``params`` (give one of the two).
        **more_params: further params, merged into ``params``.

    Example:
        >>> import jax.numpy as jnp
        >>> cfg = BenchmarkConfig(args=(jnp.ones(100),), n=100, density=0.1)
        >>> cfg.name
        'n=100,density=0.1'
        >>> cfg.params
        {'n': 100, 'density': 0.1}
        >>> BenchmarkConfig('small', (jnp.ones(3),), {'scale': 2}).kwargs
        {'scale': 2}
        >>> cfg = BenchmarkConfig('T', (jnp.ones(3),), kernel_kwargs={'transpose': True},
        ...                       data_kwargs={'n': 3})
        >>> cfg.kwargs, cfg.params
        ({'transpose': True}, {'n': 3})
    """

    __slots__ = ("args", "kwargs", "name", "params")

    def __init__(
        self,
        name: str | None = None,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        params: Mapping[str, Any] | None = None,
        *,
        kernel_kwargs: Mapping[str, Any] | None = None,
        data_kwargs: Mapping[str, Any] | None = None,
        **more_params: Any,
    ):
        for alias, value, own, own_value in (("kernel_kwargs", kernel_kwargs, "kwargs", kwargs),
                                             ("data_kwargs", data_kwargs, "params", params)):
            if value is not None and own_value is not None:
                raise TypeError(
                    f"BenchmarkConfig: give '{own}' or its other name '{alias}', not both"
                )
        kwargs = kernel_kwargs if kernel_kwargs is not None else kwargs
        params = data_kwargs if data_kwargs is not None else params
        if isinstance(args, (str, bytes)) or not isinstance(args, Sequence):
            raise TypeError(
                f"BenchmarkConfig: 'args' must be a tuple or list of the call's positional "
                f"arguments, got {type(args).__name__}"
            )
        if kwargs is not None and not isinstance(kwargs, Mapping):
            raise TypeError(
                f"BenchmarkConfig: 'kwargs' must be a mapping of keyword arguments, got "
                f"{type(kwargs).__name__}"
            )
        if params is not None and not isinstance(params, Mapping):
            raise TypeError(
                f"BenchmarkConfig: 'params' must be a mapping, got {type(params).__name__}"
            )
        merged = dict(params or {})
        merged.update(more_params)
        if name is None:
            name = ",".join(f"{k}={_describe(v)}" for k, v in merged.items()) or "default"
        if not isinstance(name, str) or not name:
            raise TypeError(f"BenchmarkConfig: 'name' must be a non-empty str, got {name!r}")
        self.name = name
        self.args = tuple(args)
        self.kwargs = dict(kwargs or {})
        self.params = merged

    @property
    def kernel_kwargs(self) -> dict[str, Any]:
        """``kwargs`` under its other name.

        Example:
            >>> BenchmarkConfig(kwargs={'k': 1}).kernel_kwargs
            {'k': 1}
        """
        return self.kwargs

    @property
    def data_kwargs(self) -> dict[str, Any]:
        """``params`` under its other name.

        Example:
            >>> BenchmarkConfig(n=4).data_kwargs
            {'n': 4}
        """
        return self.params

    def __repr__(self) -> str:
        return f"BenchmarkConfig({self.name!r}, params={self.params!r})"
