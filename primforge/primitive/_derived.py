"""Every rule of a primitive derived from one JAX-traceable implementation function.

:func:`register_primitive` builds an :class:`~primforge.primitive.ETPPrimitive` whose
rules all go through ``impl_fn``.
"""

from __future__ import annotations

import functools
import inspect
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax

from primforge._compat import (
    ShapedArray,
    Zero,
    instantiate_zeros,
    is_undefined_primal,
    mlir,
    varying_kwargs,
)
from primforge.primitive._etp import ETPPrimitive
from primforge.primitive._tangents import is_float, is_symbolic_zero, zero_tangent_like

__all__ = ["register_primitive"]


def _positional_arity(fn: Callable) -> int | None:
    """Number of operands ``fn`` takes, when its signature says so unambiguously."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    n = 0
    for param in sig.parameters.values():
        if param.kind is param.VAR_POSITIONAL:
            return None
        if param.kind in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD):
            if param.default is not param.empty:
                return None  # could be an operand or a keyword param
            n += 1
    return n


def _spec_of(aval: Any) -> jax.ShapeDtypeStruct:
    # Keep shard_map's varying-manual-axes type, or the cotangents come back mistyped.
    mat = varying_kwargs(aval)
    if not mat:
        return jax.ShapeDtypeStruct(aval.shape, aval.dtype)
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype, sharding=aval.sharding, **mat)


class _DerivedRules:
    """The JAX rules of one primitive, all derived from ``impl_fn``."""

    def __init__(self, prim: ETPPrimitive, impl_fn: Callable[..., Any], cache_size: int = 128):
        self.prim = prim
        self.impl_fn = impl_fn
        self.multiple = prim.multiple_results
        self._jit_cache: OrderedDict[tuple, Callable] = OrderedDict()
        self._cache_size = cache_size

    # The impl with its params fixed, jitted once per distinct params: eager calls,
    # abstract evaluation and lowering share jit's trace cache, so the impl's Python body
    # runs once per (params, input types).
    def jitted(self, params: Mapping[str, Any]) -> Callable[..., Any]:
        key = tuple(sorted(params.items()))
        fn = self._jit_cache.get(key)
        if fn is None:
            fn = jax.jit(functools.partial(self._checked_impl, **params))
            self._jit_cache[key] = fn
            if len(self._jit_cache) > self._cache_size:
                self._jit_cache.popitem(last=False)
        else:
            self._jit_cache.move_to_end(key)
        return fn

    def _checked_impl(self, *args: Any, **params: Any) -> Any:
        out = self.impl_fn(*args, **params)
        if self.multiple:
            if not isinstance(out, (tuple, list)):
                raise TypeError(
                    f"primitive {self.prim.name!r} was registered with multiple_results=True, "
                    f"so its impl must return a tuple or list of arrays; it returned "
                    f"{type(out).__name__}"
                )
            return tuple(out)
        if isinstance(out, (tuple, list)):
            raise TypeError(
                f"primitive {self.prim.name!r}: its impl returned a {type(out).__name__} of "
                f"{len(out)} values; register it with multiple_results=True to return several "
                f"arrays"
            )
        return out

    def impl(self, *args: Any, **params: Any) -> Any:
        out = self.jitted(params)(*args)
        return list(out) if self.multiple else out

    def abstract_eval(self, *avals: Any, **params: Any) -> Any:
        out = jax.eval_shape(self.jitted(params), *avals)
        outs = out if self.multiple else (out,)
        results = [self._to_aval(o, avals) for o in outs]
        return results if self.multiple else results[0]

    @staticmethod
    def _to_aval(out: jax.ShapeDtypeStruct, avals: Sequence[Any]) -> Any:
        # Start from an input aval so that types JAX attaches to avals (memory space, and
        # under shard_map the varying manual axes) carry over; take shape, dtype, sharding
        # and manual axes from eval_shape, which computed them with JAX's own rules.
        template = next((a for a in avals if isinstance(a, ShapedArray)), None)
        kwargs: dict[str, Any] = {}
        if getattr(out, "sharding", None) is not None:
            kwargs["sharding"] = out.sharding
        kwargs.update(varying_kwargs(out))
        weak = bool(getattr(out, "weak_type", False))
        if template is None:
            return ShapedArray(out.shape, out.dtype, weak, **kwargs)
        return template.update(shape=out.shape, dtype=out.dtype, weak_type=weak, **kwargs)

    def lowering_fn(self, *args: Any, **params: Any) -> Any:
        return self.jitted(params)(*args)

    def jvp(self, primals: Sequence[Any], tangents: Sequence[Any], **params: Any) -> Any:
        # Differentiate only the inputs with a non-zero tangent; the others (symbolic zeros,
        # integer inputs with float0 tangents) are held fixed.
        active = [i for i, t in enumerate(tangents) if not is_symbolic_zero(t)]
        fn = functools.partial(self.impl_fn, **params)

        def of_active(*xs: Any) -> Any:
            full = list(primals)
            for i, x in zip(active, xs):
                full[i] = x
            return fn(*full)

        out, t_out = jax.jvp(
            of_active,
            tuple(primals[i] for i in active),
            tuple(tangents[i] for i in active),
        )
        if not self.multiple:
            return out, (t_out if is_float(out.dtype) else zero_tangent_like(out))
        out = list(out)
        t_out = [t if is_float(o.dtype) else zero_tangent_like(o) for o, t in zip(out, t_out)]
        return out, t_out

    def transpose(self, cts: Any, *args: Any, **params: Any) -> list[Any]:
        # Correct when the impl is linear in the undefined (transposed) args.
        linear = [i for i, a in enumerate(args) if is_undefined_primal(a)]
        ct_list = list(cts) if self.multiple else [cts]
        if all(type(ct) is Zero for ct in ct_list):
            return [Zero(args[i].aval) if i in linear else None for i in range(len(args))]
        ct_list = [instantiate_zeros(ct) if type(ct) is Zero else ct for ct in ct_list]
        fn = functools.partial(self.impl_fn, **params)

        def of_linear(*xs: Any) -> Any:
            full = list(args)
            for i, x in zip(linear, xs):
                full[i] = x
            out = fn(*full)
            return tuple(out) if self.multiple else out

        in_specs = [_spec_of(args[i].aval) for i in linear]
        transposed = jax.linear_transpose(of_linear, *in_specs)
        ct_in = transposed(tuple(ct_list) if self.multiple else ct_list[0])
        result: list[Any] = [None] * len(args)
        for i, ct in zip(linear, ct_in):
            result[i] = ct
        return result

    def batch(self, args: Sequence[Any], dims: Sequence[Any], **params: Any) -> Any:
        fn = functools.partial(self.impl_fn, **params)
        out = jax.vmap(fn, in_axes=tuple(dims), out_axes=0)(*args)
        if self.multiple:
            out = list(out)
            return out, [0] * len(out)
        return out, 0


# Long only for its docstring (arguments, conversions, runnable examples); the code is short.
def register_primitive(
    name: str,
    impl_fn: Callable[..., Any],
    *,
    multiple_results: bool = False,
    batched: bool = False,
    gradient_enabled: bool = False,
    trainable_invars_fn: Callable[[Mapping[str, Any]], Mapping[str, int]] | None = None,
    x_invar_index: int | None = 0,
    y_outvar_index: int = 0,
) -> ETPPrimitive:
    """Create an :class:`ETPPrimitive` whose JAX rules are all derived from ``impl_fn``.

    ``impl_fn(*arrays, **params)`` must be JAX-traceable; its keyword params are static
    (hashable; lists arrive as tuples, dicts as :class:`FrozenDict`, functions wrapped in
    :class:`HashableCallable`). It returns one array, or with ``multiple_results=True`` a
    tuple or list of arrays; ``bind`` then returns a tuple (so a cotangent for ``jax.vjp``
    or ``jax.linear_transpose`` is a tuple too). The rules installed:

    * impl: ``jax.jit`` of the impl, compiled once per distinct params;
    * abstract eval: ``jax.eval_shape`` of the impl;
    * lowering, every platform: ``mlir.lower_fun`` of the impl;
    * JVP: ``jax.jvp`` of the impl (symbolic-zero and integer inputs held fixed, integer
      outputs get zero tangents);
    * transpose: ``jax.linear_transpose`` of the impl with respect to the transposed args,
      the others held fixed (correct when the impl is linear in those args; needed by
      ``jax.linear_transpose`` of code binding the primitive, not by ``jax.grad``);
    * batching: ``jax.vmap`` of the impl, for any ``in_axes``.

    Because the JVP and batching rules trace the impl, the primitive itself does not appear
    in the jaxprs of ``jax.jvp``/``jax.grad``/``jax.vmap`` of code that binds it.

    Args:
        name: the primitive's name.
        impl_fn: the implementation.
        multiple_results: ``impl_fn`` returns a tuple/list of arrays.
        batched: metadata for custom interpreters; see :class:`ETPPrimitive`.
        gradient_enabled: the same.
        trainable_invars_fn: the same.
        x_invar_index: the same.
        y_outvar_index: the same.

    Returns:
        The new primitive. Call it with ``prim.bind(*arrays, **params)``.

    Raises:
        TypeError: if ``impl_fn`` is not callable.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from primforge.primitive import register_primitive
        >>> def mm_impl(x, w):
        ...     return x @ w
        >>> mm_p = register_primitive("demo_mm", mm_impl, batched=True)
        >>> mm_p.bind(jnp.ones((2, 3)), jnp.ones((3, 4))).shape
        (2, 4)
        >>> jax.grad(lambda w: mm_p.bind(jnp.ones((2, 3)), w).sum())(jnp.ones((3, 4)))[0]
        Array([2., 2., 2., 2.], dtype=float32)
        >>> def split_impl(x, *, at):
        ...     return x[:at], x[at:]
        >>> split_p = register_primitive("demo_split", split_impl, multiple_results=True)
        >>> [a.shape for a in jax.jit(lambda x: split_p.bind(x, at=1))(jnp.arange(3.0))]
        [(1,), (2,)]
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"register_primitive: name must be a non-empty str; got {name!r}")
    if not callable(impl_fn):
        raise TypeError(
            f"register_primitive({name!r}): impl_fn must be a callable taking arrays and "
            f"static keyword params; got {type(impl_fn).__name__}: {impl_fn!r:.80}"
        )
    prim = ETPPrimitive(
        name,
        multiple_results=multiple_results,
        batched=batched,
        gradient_enabled=gradient_enabled,
        trainable_invars_fn=trainable_invars_fn,
        x_invar_index=x_invar_index,
        y_outvar_index=y_outvar_index,
    )
    prim._num_inputs = _positional_arity(impl_fn)
    rules = _DerivedRules(prim, impl_fn)
    prim.def_impl(rules.impl)
    prim.def_abstract_eval(rules.abstract_eval)
    prim.def_lowering(mlir.lower_fun(rules.lowering_fn, multiple_results=prim.multiple_results))
    prim.def_jvp(rules.jvp)
    prim.def_transpose(rules.transpose)
    prim.def_batching(rules.batch)
    return prim
