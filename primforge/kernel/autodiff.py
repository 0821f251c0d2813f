"""Autodiff of kernel binds, and the one place that decides what user rules see.

:func:`rule_params` is what user rules are given, :func:`call_rule` runs them with the
call's overrides re-established, and :class:`KernelPrimitive` fills the hidden params back
in when a rule rebinds.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from primforge import _compat
from primforge import debug as _debug
from primforge.kernel import selection as _selection
from primforge.kernel.errors import KernelError
from primforge.kernel.state import KernelState
from primforge.primitive import defjvp

__all__ = [
    "INTERNAL_PARAMS",
    "AutodiffMixin",
    "KernelPrimitive",
    "bind_defaults",
    "call_rule",
    "following",
    "rule_params",
]

#: Params primforge adds to every bind of a kernel's primitive (never user params).
INTERNAL_PARAMS = ("outs", "backend", "context", "batch", "debug")

# The internal params a user rule does not see; a bind without them gets them back.
_HIDDEN = ("context", "batch", "debug")


def rule_params(params: dict) -> dict:
    """The params a user rule sees: the call's own, plus ``outs`` and ``backend``.

    Example:
        >>> rule_params({'outs': (), 'backend': None, 'context': (), 'batch': (),
        ...              'debug': False, 'factor': 2.0})
        {'outs': (), 'backend': None, 'factor': 2.0}
    """
    return {k: v for k, v in params.items() if k not in _HIDDEN}


def bind_defaults(params: dict) -> dict:
    """``params`` with the hidden internal params a rule's rebind left out filled in.

    ``context`` and ``debug`` come from where the bind happens (inside :func:`call_rule`:
    the original call's); ``batch`` and ``backend`` default to none.

    Example:
        >>> sorted(bind_defaults({'outs': ()}))
        ['backend', 'batch', 'context', 'debug', 'outs']
    """
    params = dict(params)
    if "context" not in params:
        params["context"] = _selection.current_overrides()
    if "debug" not in params:
        params["debug"] = _debug.enabled()
    params.setdefault("batch", ())
    params.setdefault("backend", None)
    return params


@contextlib.contextmanager
def following(params: dict) -> Iterator[None]:
    """Run a rule with the backend overrides and debug mode of the call it serves.

    Example:
        >>> import primforge
        >>> with following({'context': (), 'debug': True}):
        ...     primforge.debug.enabled()
        True
    """
    with _selection.restored(params.get("context", ())), _debug.debug_mode(
        bool(params.get("debug", False))
    ):
        yield


def call_rule(rule: Callable[..., Any], params: dict, *args: Any) -> Any:
    """Call user ``rule(*args, **rule_params(params))`` in the surroundings of the call.

    Example:
        >>> call_rule(lambda x, **kw: sorted(kw), {'outs': (), 'debug': False}, 1)
        ['outs']
    """
    with following(params):
        return rule(*args, **rule_params(params))


class KernelPrimitive(_compat.Primitive):
    """The kernel's primitive: a bind without the internal params gets the ones in force.

    User rules may call ``kernel.primitive.bind(*args, **params)`` with the params they
    were given (their own, ``outs`` and ``backend``); the call's backend overrides and
    debug mode are then taken from the rule's surroundings, which primforge set to the
    original call's (see :func:`bind_defaults`).

    Example:
        >>> p = KernelPrimitive('doc_kernel_primitive')
        >>> p.name
        'doc_kernel_primitive'
    """

    def bind(self, *args, **params):
        return super().bind(*args, **bind_defaults(params))


class AutodiffMixin(KernelState):
    """JVP and transpose: the rule setters and the primitive's rules.

    Part of :class:`primforge.XLACustomKernel`; owns ``_jvp_rule``, ``_transpose_rule``
    and ``_per_input_rules``.
    """

    def _init_state(self) -> None:
        super()._init_state()
        self._jvp_rule: Callable | None = None  # whole-call JVP (or one built per input)
        self._transpose_rule: Callable | None = None
        self._per_input_rules: tuple[Callable, ...] = ()  # as given to def_jvp_rule2

    def _declared_rules(self) -> tuple[Callable | None, ...]:
        return (*super()._declared_rules(), self._jvp_rule, self._transpose_rule,
                *self._per_input_rules)

    # ------------------------------------------------------------------ rule setters
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

    # ------------------------------------------------------------------ JVP
    def _jvp(self, primals, tangents, *, batch=(), **params):
        if self._jvp_rule is None:
            raise NotImplementedError(
                f"kernel {self.name!r} has no JVP rule, so it cannot be differentiated. Add "
                f"one with kernel.def_jvp_rule(fn), kernel.def_jvp_rule2(*per_input_rules) "
                f"or primforge.defjvp(kernel, ...)."
            )
        if batch:
            return self._jvp_batched(primals, tangents, batch, params)
        result = call_rule(self._jvp_rule, params, primals, tangents)
        out, tan = self._jvp_result(result, len(params["outs"]))
        return out, [_instantiate_like(t, o) for t, o in zip(tan, out)]

    def _jvp_batched(self, primals, tangents, batch, params):
        """The JVP of a natively batched bind: the outermost level under ``jax.vmap``."""
        (size, mapped), inner = batch[0], batch[1:]
        zero = [type(t) is _compat.Zero for t in tangents]
        live_t = [t for t, z in zip(tangents, zero) if not z]
        t_mapped = [m for m, z in zip(mapped, zero) if not z]
        t_avals = [_unbatch_aval(t.aval, m) if z else None
                   for t, z, m in zip(tangents, zero, mapped)]

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
                is_seq = isinstance(part, (tuple, list))
                got = f"{len(part)} values" if is_seq else type(part).__name__
                raise KernelError(
                    f"kernel {self.name!r}: the JVP rule {rule} must return {n_out} {what} "
                    f"(one per output, as a sequence); got {got}"
                )
            parts.append(list(part))
        return parts[0], parts[1]

    # ------------------------------------------------------------------ transpose
    def _transpose(self, cts, *args, batch=(), **params):
        if self._transpose_rule is None:
            raise NotImplementedError(
                f"kernel {self.name!r} has no transpose rule, so reverse-mode differentiation "
                f"(grad, vjp, linear_transpose) through it is not possible. Add one with "
                f"kernel.def_transpose_rule(fn)."
            )
        if batch:
            return self._transpose_batched(cts, args, batch, params)
        res = call_rule(self._transpose_rule, params, list(cts), *args)
        res = list(res) if isinstance(res, (list, tuple)) else [res]
        if len(res) != len(args):
            raise ValueError(
                f"kernel {self.name!r}: the transpose rule returned {len(res)} cotangents "
                f"for {len(args)} inputs"
            )
        return [r if _compat.is_undefined_primal(a) else None for r, a in zip(res, args)]

    def _transpose_batched(self, cts, args, batch, params):
        """The transpose of a natively batched bind: the outermost level under ``jax.vmap``.

        Cotangents of inputs the level does not map are summed over the level.
        """
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
            full = [_compat.UndefinedPrimal(av) if u else next(it_d)
                    for u, av in zip(undef, inner_avals)]
            full_ct = [_compat.Zero(av) if z else next(it_c) for z, av in zip(ct_zero, ct_avals)]
            res = self._transpose(full_ct, *full, batch=inner, **params)
            return tuple(
                _instantiate_like(r, None, aval=av) if u else None
                for r, u, av in zip(res, undef, inner_avals)
            )

        out = jax.vmap(per_example, in_axes=(d_axes, 0), out_axes=0, axis_size=size)(
            tuple(defined), tuple(live_ct)
        )
        return [
            None if not u else (r if m else jnp.sum(r, axis=0))
            for r, u, m in zip(out, undef, mapped)
        ]


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
