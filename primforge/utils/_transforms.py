"""Typed wrappers around JAX transformations, and tracing guards.

``jit``, ``vectorize``, ``linearize`` and ``shard_map`` forward to JAX and keep the wrapped
function's type; the guards turn silent misuse into errors at trace time.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar, overload

import jax
from jax import custom_batching

from primforge import _compat

__all__ = [
    "NotJaxCompatibleError",
    "is_traced",
    "jit",
    "linearize",
    "no_jax_tracing",
    "non_differentiable",
    "sequential_vmap_with_vjp",
    "shard_map",
    "vectorize",
]

C = TypeVar("C", bound=Callable[..., Any])
T = TypeVar("T")


@overload
def jit(fn: C, **kwargs: Any) -> C: ...
@overload
def jit(fn: None = None, **kwargs: Any) -> Callable[[C], C]: ...


def jit(
    fn: C | None = None,
    *,
    in_shardings: Any = None,
    out_shardings: Any = None,
    static_argnums: int | Sequence[int] | None = None,
    static_argnames: str | Iterable[str] | None = None,
    donate_argnums: int | Sequence[int] | None = None,
    donate_argnames: str | Iterable[str] | None = None,
    keep_unused: bool = False,
    device: Any = None,
    backend: str | None = None,
    inline: bool = False,
    abstracted_axes: Any = None,
    compiler_options: dict[str, Any] | None = None,
) -> C | Callable[[C], C]:
    """:func:`jax.jit` that keeps the function's type and also works as ``@jit(...)``.

    Arguments left at ``None`` are not passed to JAX, so JAX's own defaults apply (in
    particular ``in_shardings=None`` means "unspecified", not "replicated").

    Args:
        fn: Function to compile, or None to get a decorator.
        in_shardings: Shardings of the inputs.
        out_shardings: Shardings of the outputs.
        static_argnums: Positional arguments that are compile-time constants.
        static_argnames: Keyword arguments that are compile-time constants.
        donate_argnums: Positional arguments whose buffers may be reused.
        donate_argnames: Keyword arguments whose buffers may be reused.
        keep_unused: Keep arguments the computation does not use.
        device: Device to run on (prefer shardings).
        backend: XLA backend name (prefer shardings).
        inline: Inline into enclosing jaxprs instead of a nested call.
        abstracted_axes: Not supported by the installed JAX; must stay None.
        compiler_options: Extra XLA compiler options.

    Returns:
        The compiled function, or a decorator.

    Raises:
        TypeError: If ``abstracted_axes`` is given.

    Example:
        >>> import jax.numpy as jnp
        >>> from primforge.utils import jit
        >>> @jit(static_argnames="n")
        ... def power(x, n):
        ...     return x**n
        >>> power(jnp.float32(2.0), n=3)
        Array(8., dtype=float32)
    """
    if abstracted_axes is not None:
        raise TypeError(
            "jit(abstracted_axes=...) is not supported: the installed JAX removed dynamic "
            "shapes from jax.jit. Leave abstracted_axes=None."
        )
    kwargs: dict[str, Any] = {"keep_unused": keep_unused, "inline": inline}
    optional = {
        "in_shardings": in_shardings,
        "out_shardings": out_shardings,
        "static_argnums": static_argnums,
        "static_argnames": static_argnames,
        "donate_argnums": donate_argnums,
        "donate_argnames": donate_argnames,
        "device": device,
        "backend": backend,
        "compiler_options": compiler_options,
    }
    kwargs.update({k: v for k, v in optional.items() if v is not None})

    def wrap(f: C) -> C:
        return jax.jit(f, **kwargs)  # type: ignore[return-value]

    return wrap if fn is None else wrap(fn)


def vectorize(
    pyfunc: C | None = None,
    *,
    excluded: frozenset[int] = frozenset(),
    signature: str | None = None,
) -> C | Callable[[C], C]:
    """:func:`jax.numpy.vectorize` that keeps the function's type and works as a decorator.

    The function is written for the core shapes of ``signature`` (scalars by default) and
    is batched with ``vmap`` over any leading dimensions, which broadcast as in NumPy.

    Args:
        pyfunc: Function to vectorize, or None to get a decorator.
        excluded: Positions of arguments passed through unvectorized.
        signature: Generalized-ufunc signature such as ``"(n),(n)->()"``.

    Returns:
        The vectorized function, or a decorator.

    Example:
        >>> import jax.numpy as jnp
        >>> from primforge.utils import vectorize
        >>> @vectorize(signature="(n),(n)->()")
        ... def dot(a, b):
        ...     return jnp.sum(a * b)
        >>> dot(jnp.ones((3, 2)), jnp.ones(2))
        Array([2., 2., 2.], dtype=float32)
    """

    def wrap(f: C) -> C:
        vectorized = jax.numpy.vectorize(f, excluded=excluded, signature=signature)
        return vectorized  # type: ignore[return-value]

    return wrap if pyfunc is None else wrap(pyfunc)


def linearize(fn: Callable[..., Any], *primals: Any, has_aux: bool = False) -> tuple[Any, ...]:
    """:func:`jax.linearize`: evaluate ``fn`` and return its JVP as a linear function.

    Args:
        fn: Function to linearize.
        *primals: Point of linearization.
        has_aux: Whether ``fn`` returns ``(output, aux)``.

    Returns:
        ``(output, jvp_fn)``, or ``(output, jvp_fn, aux)`` when ``has_aux``.

    Example:
        >>> import jax.numpy as jnp
        >>> from primforge.utils import linearize
        >>> y, f_jvp = linearize(jnp.sin, 0.0)
        >>> f_jvp(2.0)
        Array(2., dtype=float32, weak_type=True)
    """
    return jax.linearize(fn, *primals, has_aux=has_aux)


def shard_map(
    f: C | None = None,
    /,
    *,
    out_specs: Any,
    in_specs: Any = None,
    mesh: Any = None,
    axis_names: frozenset[Any] = frozenset(),
    check_vma: bool = True,
) -> C | Callable[[C], C]:
    """``jax.shard_map``: run ``f`` once per shard of its inputs on a device mesh.

    ``in_specs=None`` (the default) lets JAX infer the input specs from the arguments'
    shardings. Outside ``jit`` the inputs must already carry the shardings the specs
    describe; under ``jit`` JAX reshards them. ``mesh=None`` uses the mesh set by
    :func:`jax.set_mesh`.

    Args:
        f: Function applied per shard, or None to get a decorator.
        out_specs: Pytree of ``PartitionSpec`` saying how output shards are assembled.
        in_specs: Pytree of ``PartitionSpec`` saying how inputs are split, or None.
        mesh: The device mesh.
        axis_names: Mesh axes ``f`` is manual over (empty: all of them).
        check_vma: Check replication of values over mesh axes (and use it in autodiff).

    Returns:
        The mapped function, or a decorator.

    Example:
        >>> import jax, jax.numpy as jnp, numpy as np
        >>> from jax.sharding import Mesh, PartitionSpec as P
        >>> from primforge.utils import shard_map
        >>> mesh = Mesh(np.array(jax.devices()[:1]), ("x",))
        >>> double = shard_map(lambda x: 2 * x, mesh=mesh, in_specs=P("x"), out_specs=P("x"))
        >>> double(jnp.arange(4.0))
        Array([0., 2., 4., 6.], dtype=float32)
    """
    kwargs: dict[str, Any] = {
        "out_specs": out_specs,
        "mesh": mesh,
        "axis_names": axis_names,
        "check_vma": check_vma,
    }
    if in_specs is not None:
        kwargs["in_specs"] = in_specs

    def wrap(fn: C) -> C:
        return _compat.shard_map(fn, **kwargs)  # type: ignore[return-value]

    return wrap if f is None else wrap(f)


def is_traced(x: Any) -> bool:
    """Whether any leaf of the pytree ``x`` is a JAX tracer (inside a transformation).

    Args:
        x: A pytree.

    Returns:
        True if some leaf is a tracer.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from primforge.utils import is_traced
        >>> is_traced(jnp.ones(2)), bool(jax.jit(is_traced)(jnp.ones(2)))
        (False, True)
    """
    return any(isinstance(leaf, _compat.Tracer) for leaf in jax.tree_util.tree_leaves(x))


class NotJaxCompatibleError(RuntimeError):
    """Raised when a function marked :func:`no_jax_tracing` receives traced values.

    Example:
        >>> from primforge.utils import NotJaxCompatibleError
        >>> issubclass(NotJaxCompatibleError, RuntimeError)
        True
    """


def no_jax_tracing(fn: C) -> C:
    """Forbid calling ``fn`` with traced arguments (inside ``jit``, ``vmap``, ``grad``...).

    Use it for host-side code (I/O, Python control flow on values, NumPy) that would
    otherwise fail obscurely or silently bake one trace-time value into a compiled program.
    Only the arguments are inspected: a call inside ``jit`` with concrete, untraced
    arguments is allowed.

    Args:
        fn: The function to guard.

    Returns:
        A wrapper that raises :class:`NotJaxCompatibleError` when an argument leaf is a
        tracer, and otherwise calls ``fn``.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from primforge.utils import NotJaxCompatibleError, no_jax_tracing
        >>> @no_jax_tracing
        ... def to_list(x):
        ...     return x.tolist()
        >>> to_list(jnp.arange(2))
        [0, 1]
        >>> try:
        ...     jax.jit(to_list)(jnp.arange(2))
        ... except NotJaxCompatibleError as e:
        ...     print("refused")
        refused
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if is_traced((args, kwargs)):
            name = getattr(fn, "__qualname__", repr(fn))
            raise NotJaxCompatibleError(
                f"{name} was called with traced arguments, but it is marked no_jax_tracing: "
                "it runs on the host and cannot be used inside jax.jit, vmap, grad, scan or "
                "other transformations. Call it outside the transformed function, or pass "
                "concrete values (for example with jax.device_get)."
            )
        return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


_NON_DIFFERENTIABLE_MSG = (
    "non_differentiable: the value is not differentiable (it is marked "
    "non-differentiable), but it was differentiated. "
    "Something that depends on the inputs you differentiate with respect to flows into "
    "non_differentiable(...). Wrap it in jax.lax.stop_gradient if a zero derivative is "
    "what you want, or remove the marker if the derivative is meaningful."
)


@jax.custom_jvp
def _non_differentiable(x: Any) -> Any:
    return x


@_non_differentiable.defjvp
def _non_differentiable_jvp(primals: Any, tangents: Any) -> Any:
    raise NotImplementedError(_NON_DIFFERENTIABLE_MSG)


def non_differentiable(x: T) -> T:
    """Identity that refuses differentiation.

    The value (any pytree) passes through unchanged, under ``jit`` and ``vmap`` too. Any
    JVP with a non-zero tangent through it (so ``grad``, ``jvp``, ``jacfwd``...) raises
    ``NotImplementedError`` at trace time. Values that do not depend on the differentiated
    inputs carry symbolic-zero tangents and pass without error.

    Args:
        x: A pytree of arrays.

    Returns:
        ``x``.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from primforge.utils import non_differentiable
        >>> non_differentiable(jnp.float32(3.0))
        Array(3., dtype=float32)
        >>> try:
        ...     jax.grad(non_differentiable)(3.0)
        ... except NotImplementedError:
        ...     print("refused")
        refused
    """
    return _non_differentiable(x)


def sequential_vmap_with_vjp(func: C) -> C:
    """Make ``func`` batchable by looping, in the forward and the backward pass.

    Called directly, the result is ``func``. Under :func:`jax.vmap` it evaluates ``func``
    once per batch element in a ``lax.map`` loop instead of batching its operations, so
    ``func`` may contain code without a batching rule. It is differentiable in reverse
    mode through a custom VJP: the forward pass keeps only the inputs, and the backward
    pass recomputes each element's VJP, again one element at a time when batched (so
    ``vmap(grad(...))`` and ``grad`` of a ``vmap`` both loop). Forward-mode
    differentiation (``jvp``, ``jacfwd``) is not supported, as for any custom VJP.
    Arguments are positional; unbatched arguments are broadcast over the batch.

    Args:
        func: Function of positional array pytrees.

    Returns:
        A function with ``func``'s signature and values.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from primforge.utils import sequential_vmap_with_vjp
        >>> f = sequential_vmap_with_vjp(lambda x: jnp.sum(x**2))
        >>> jax.vmap(jax.grad(f))(jnp.arange(4.0).reshape(2, 2))
        Array([[0., 2.],
               [4., 6.]], dtype=float32)
    """
    forward = custom_batching.sequential_vmap(func)

    def elementwise_vjp(args: tuple[Any, ...], ct: Any) -> tuple[Any, ...]:
        _, pullback = jax.vjp(func, *args)
        return pullback(ct)

    backward = custom_batching.sequential_vmap(elementwise_vjp)

    @jax.custom_vjp
    def wrapped(*args: Any) -> Any:
        return forward(*args)

    def fwd(*args: Any) -> tuple[Any, tuple[Any, ...]]:
        return forward(*args), args

    def bwd(args: tuple[Any, ...], ct: Any) -> tuple[Any, ...]:
        return backward(args, ct)

    wrapped.defvjp(fwd, bwd)
    functools.update_wrapper(wrapped, func)
    return wrapped  # type: ignore[return-value]
