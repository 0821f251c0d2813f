"""Per-input JVPs: a primitive's JVP assembled from one rule per input.

:func:`per_input_jvp` sums each input's contribution per output; :func:`defjvp` installs
it on an ``ETPPrimitive``, any other primitive, or a kernel.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from primforge._compat import Primitive, Zero, ad
from primforge.primitive._etp import ETPPrimitive
from primforge.primitive._tangents import is_float, is_symbolic_zero, zero_tangent_like
from primforge.rules import as_primitive

__all__ = ["defjvp", "per_input_jvp"]


def _add(a: Any, b: Any) -> Any:
    if a is None:
        return b
    if b is None:
        return a
    return a + b


def _as_tangent(t: Any, primal_out: Any) -> Any:
    # A rule may compute in another float dtype (e.g. NumPy float64); JAX expects the
    # output's tangent dtype. Python scalars are weakly typed and left alone.
    t_dtype = getattr(t, "dtype", None)
    dtype = jax.typeof(primal_out).dtype
    if t_dtype is None or t_dtype == dtype:
        return t
    return jax.numpy.asarray(t, dtype=dtype)


def _rule_name(rule: Callable[..., Any]) -> str:
    return getattr(rule, "__qualname__", None) or type(rule).__name__


def _per_output(prim: Primitive, i: int, rule: Callable[..., Any], contrib: Any, n: int) -> list:
    """Rule ``i``'s contribution as a list with one tangent (or ``None``) per output."""
    if not prim.multiple_results:
        return [contrib]
    if n == 1 and not isinstance(contrib, (tuple, list)):
        return [contrib]  # one output: a bare tangent is that output's
    if not isinstance(contrib, (tuple, list)) or len(contrib) != n:
        length = f" of length {len(contrib)}" if isinstance(contrib, (tuple, list)) else ""
        raise TypeError(
            f"JVP rule {i} ({_rule_name(rule)}) of primitive {prim.name!r}, which "
            f"has {n} outputs, must return a sequence of {n} "
            f"tangents (one per output, None for zero); got "
            f"{type(contrib).__name__}" + length
        )
    return list(contrib)


def _accumulate(prim: Primitive, i: int, contribs: list, outs: list, acc: list) -> None:
    """Add rule ``i``'s per-output contributions into ``acc`` (``None`` means zero)."""
    for k, (c, o) in enumerate(zip(contribs, outs)):
        if c is None or type(c) is Zero:
            continue
        if np.shape(c) != np.shape(o):
            raise ValueError(
                f"JVP rule {i} of primitive {prim.name!r} returned a tangent of shape "
                f"{np.shape(c)} for output {k}, whose shape is {np.shape(o)}"
            )
        acc[k] = _add(acc[k], _as_tangent(c, o))


def per_input_jvp(primitive: Any, rules: Sequence[Callable[..., Any] | None]) -> Callable[..., Any]:
    """Build a JVP rule ``jvp(primals, tangents, **params)`` from one rule per input.

    ``rules[i](tangent_i, *primals, **params)`` gives input ``i``'s contribution to the
    output tangent (one tangent per output, as a sequence, for multiple results, or a bare
    tangent when there is only one output; entries may be ``None``). ``None`` in ``rules``
    means input ``i`` contributes nothing; inputs
    with a symbolic-zero tangent skip their rule. The primal output is ``primitive.bind``.

    Args:
        primitive: the primitive (or an object with a ``primitive`` attribute).
        rules: one callable or ``None`` per input.

    Returns:
        A function usable as ``jax.interpreters.ad.primitive_jvps[primitive]``.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from primforge.primitive import ETPPrimitive, per_input_jvp
        >>> p = ETPPrimitive("demo_per_input")
        >>> _ = p.def_impl(lambda x, y: x * y)
        >>> jvp = per_input_jvp(p, [lambda t, x, y: t * y, lambda t, x, y: t * x])
        >>> jvp((2.0, 3.0), (1.0, 0.0))  # eager, on Python floats
        (6.0, 3.0)
    """
    prim = as_primitive(primitive)
    rules = tuple(rules)
    for i, rule in enumerate(rules):
        if rule is not None and not callable(rule):
            raise TypeError(
                f"JVP rule {i} of primitive {prim.name!r} must be callable or None; got "
                f"{type(rule).__name__}"
            )

    def jvp(primals: Sequence[Any], tangents: Sequence[Any], **params: Any) -> Any:
        if len(primals) != len(rules):
            raise ValueError(
                f"primitive {prim.name!r} was bound with {len(primals)} input(s) but has "
                f"{len(rules)} per-input JVP rule(s) (from defjvp); give exactly one rule "
                f"(or None) per input"
            )
        out = prim.bind(*primals, **params)
        outs = list(out) if prim.multiple_results else [out]
        acc: list[Any] = [None] * len(outs)
        for i, (rule, t) in enumerate(zip(rules, tangents)):
            if rule is None or is_symbolic_zero(t):
                continue
            contrib = rule(t, *primals, **params)
            _accumulate(prim, i, _per_output(prim, i, rule, contrib, len(outs)), outs, acc)
        t_outs = [
            zero_tangent_like(o) if a is None or not is_float(jax.typeof(o).dtype) else a
            for a, o in zip(acc, outs)
        ]
        if prim.multiple_results:
            return outs, t_outs
        return out, t_outs[0]

    jvp.rules = rules  # type: ignore[attr-defined]
    return jvp


def defjvp(primitive: Any, *jvp_rules: Callable[..., Any] | None) -> None:
    """Define a primitive's JVP by one rule per input.

    Each rule is ``rule(tangent, *primals, **params) -> tangent_out`` (for a primitive with
    multiple results: a sequence with one tangent per output, ``None`` for zero; with a
    single output, a bare tangent works too). Pass
    ``None`` for an input that contributes nothing. Works for single and multiple results.

    ``primitive`` may be a ``Primitive`` or an ``XLACustomKernel`` (anything with a
    ``primitive`` attribute); a kernel that defines ``_install_jvp(jvp_fn)`` installs the
    built rule itself, so it can wrap its own batching logic around it.

    Args:
        primitive: the primitive or kernel.
        *jvp_rules: one callable or ``None`` per input.

    Raises:
        TypeError: if ``primitive`` is not a primitive or kernel, or a rule is not callable.
        ValueError: if the number of rules differs from the number of inputs, when that is
            known here (for :func:`register_primitive` primitives); otherwise at the first JVP.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from primforge.primitive import defjvp, register_primitive
        >>> mul_p = register_primitive("demo_defjvp_mul", lambda x, y: x * y)
        >>> def jvp_x(t, x, y):
        ...     return t * y
        >>> def jvp_y(t, x, y):
        ...     return t * x
        >>> defjvp(mul_p, jvp_x, jvp_y)
        >>> x, y = jnp.float32(2.0), jnp.float32(3.0)
        >>> jax.jvp(mul_p.bind, (x, y), (jnp.float32(1.0), jnp.float32(10.0)))[1]
        Array(23., dtype=float32)
    """
    try:
        prim = as_primitive(primitive)
    except TypeError as err:
        raise TypeError(f"defjvp: {err}") from None
    n = getattr(prim, "num_inputs", None)
    if n is not None and len(jvp_rules) != n:
        raise ValueError(
            f"defjvp: primitive {prim.name!r} takes {n} input(s) but {len(jvp_rules)} JVP "
            f"rule(s) were given; give exactly one rule (or None) per input"
        )
    jvp_fn = per_input_jvp(prim, jvp_rules)
    install = getattr(primitive, "_install_jvp", None)
    if primitive is not prim and callable(install):
        install(jvp_fn)
    elif isinstance(prim, ETPPrimitive):
        prim.def_jvp(jvp_fn)
    else:
        ad.primitive_jvps[prim] = jvp_fn
