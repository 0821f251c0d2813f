"""Primitives whose JAX rules come from one implementation function, and per-input JVPs.

Design:

* :class:`ETPPrimitive` is a ``jax.extend.core.Primitive`` with one method per rule JAX
  needs (``def_impl``, ``def_abstract_eval``, ``def_lowering``, ``def_jvp``,
  ``def_transpose``, ``def_batching``). Until a rule is set, using it raises
  :class:`MissingRuleError`, which names the rule, the primitive and the call that adds it.
  ``bind`` turns keyword params into hashable values first (see :func:`static_param`), so
  a fresh but identical lambda or list never causes a new trace.
* :func:`register_primitive` builds an :class:`ETPPrimitive` and derives every rule from a
  JAX-traceable ``impl_fn``: eager execution and lowering go through a ``jax.jit`` of the
  impl cached per params, abstract evaluation through ``jax.eval_shape``, the JVP through
  ``jax.jvp``, batching through ``jax.vmap`` and the transpose (for impls linear in the
  arguments being transposed) through ``jax.linear_transpose``. Single and multiple
  results are supported by every rule.
* :func:`defjvp` installs a JVP made of one rule per input, for any primitive or kernel.
* Four extra rule slots (``yw_to_w``, ``xy_to_dw``, ``init_drtrl``, ``init_pp``) and
  per-primitive metadata serve custom jaxpr interpreters. The slots are named
  :class:`~primforge.rules.RuleTable` objects, so :func:`~primforge.rules.iter_rule_eqns`
  finds the equations that have them.
"""

from __future__ import annotations

import functools
import inspect
import types
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from primforge._compat import (
    Primitive,
    ShapedArray,
    Zero,
    ad,
    batching,
    float0,
    instantiate_zeros,
    is_undefined_primal,
    mlir,
    varying_kwargs,
)
from primforge.rules import RuleTable, as_primitive, rule_table

__all__ = [
    "ETP_RULE_TABLES",
    "ETPPrimitive",
    "FrozenDict",
    "HashableCallable",
    "MissingRuleError",
    "defjvp",
    "etp_primitives",
    "get_etp_rule",
    "get_trainable_invars_fn",
    "get_x_invar_index",
    "get_y_outvar_index",
    "is_batched",
    "is_etp_primitive",
    "is_gradient_enabled",
    "per_input_jvp",
    "register_primitive",
    "static_param",
]


# --------------------------------------------------------------------------------------
# Static params: hashable conversions done by ETPPrimitive.bind
# --------------------------------------------------------------------------------------


class FrozenDict(Mapping):
    """An immutable, hashable mapping: what an impl receives for a ``dict`` param.

    Equality and hash ignore insertion order, like ``dict`` equality.

    Example:
        >>> from primforge.primitive import FrozenDict
        >>> d = FrozenDict({"b": 2, "a": 1})
        >>> d["a"], len(d), d == FrozenDict(a=1, b=2), hash(d) == hash(FrozenDict(a=1, b=2))
        (1, 2, True, True)
    """

    __slots__ = ("_data", "_hash")

    def __init__(self, *args: Any, **kwargs: Any):
        self._data = dict(*args, **kwargs)
        self._hash: int | None = None

    def __getitem__(self, key: Any) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(frozenset(self._data.items()))
        return self._hash

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FrozenDict):
            return self._data == other._data
        return NotImplemented

    def __repr__(self) -> str:
        return f"FrozenDict({self._data!r})"


class _ById:
    """Hashes and compares by identity: a safe key for values that cannot be hashed."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def __hash__(self) -> int:
        return id(self.value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _ById) and other.value is self.value


class HashableCallable:
    """A function param made hashable by what it computes rather than by identity.

    Two wrappers are equal when their functions share the code object, the closure
    contents, the defaults and the globals namespace, so re-creating an identical lambda
    (or closure over equal values) gives an equal key and hits the jit caches. Closure
    values that cannot be hashed (arrays) are compared by identity. Calling the wrapper
    calls the function; the function itself is ``.fn``.

    Example:
        >>> from primforge.primitive import HashableCallable
        >>> def make(k):
        ...     return lambda x: x * k
        >>> HashableCallable(make(2)) == HashableCallable(make(2))
        True
        >>> HashableCallable(make(2)) == HashableCallable(make(3))
        False
        >>> HashableCallable(make(2))(5)
        10
    """

    __slots__ = ("__weakref__", "_hash", "_key", "fn")

    def __init__(self, fn: types.FunctionType, _seen: frozenset[int] = frozenset()):
        if isinstance(fn, HashableCallable):
            fn = fn.fn
        self.fn = fn
        seen = _seen | {id(fn)}
        cells = []
        for cell in fn.__closure__ or ():
            try:
                value = cell.cell_contents
            except ValueError:  # an empty cell (variable not yet assigned)
                cells.append(_ById(cell))
                continue
            cells.append(_closure_key(value, seen))
        self._key = (
            fn.__code__,
            id(fn.__globals__),
            tuple(cells),
            _closure_key(fn.__defaults__, seen),
            _closure_key(fn.__kwdefaults__, seen),
        )
        self._hash = hash(self._key)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, HashableCallable):
            return NotImplemented
        return self._hash == other._hash and self._key == other._key

    def __repr__(self) -> str:
        return f"HashableCallable({getattr(self.fn, '__qualname__', self.fn)!r})"


_RECURSIVE = "<recursive reference>"


def _closure_key(value: Any, seen: frozenset[int]) -> Any:
    # Keys carry the type so that 1, 1.0 and True captured by a closure stay distinct.
    if isinstance(value, types.FunctionType):
        if id(value) in seen:  # a recursive closure refers to itself (or to an enclosing one)
            return (_RECURSIVE, value.__code__)
        return HashableCallable(value, seen)
    if isinstance(value, (list, tuple)):
        return (type(value), tuple(_closure_key(v, seen) for v in value))
    if isinstance(value, dict):
        return (dict, frozenset((k, _closure_key(v, seen)) for k, v in value.items()))
    try:
        hash(value)
    except TypeError:
        return _ById(value)
    return (type(value), value)


_ARRAY_PARAM_MSG = (
    "{where}: keyword param {name!r} is an array ({desc}). Keyword params of a primitive "
    "are static: they are part of the compiled program's cache key and must be hashable, "
    "and an array is neither hashable nor static. Pass it as a positional operand of "
    "`bind` instead (so it is traced and can be differentiated), or, if it really is a "
    "small compile-time constant, pass it as a (nested) tuple, e.g. "
    "tuple(np.asarray(value).tolist())."
)


def static_param(value: Any, *, name: str = "param", where: str = "static_param") -> Any:
    """Convert a keyword param of ``bind`` to an equivalent hashable value.

    * lists and tuples become tuples (converted element by element);
    * dicts become :class:`FrozenDict`, sets become frozensets;
    * plain Python functions (including lambdas and closures) become
      :class:`HashableCallable`, keyed by code, closure contents and defaults;
    * NumPy and JAX arrays are rejected with a ``TypeError`` (pass them as operands);
    * anything else must already be hashable.

    The conversion is idempotent, so converting converted params is cheap and harmless.

    Args:
        value: the param value.
        name: the param name, used in error messages.
        where: who is asking, used in error messages (e.g. the primitive name).

    Returns:
        A hashable value equivalent to ``value``.

    Raises:
        TypeError: for arrays and for values that cannot be made hashable.

    Example:
        >>> from primforge.primitive import static_param
        >>> static_param([1, [2, 3]])
        (1, (2, 3))
        >>> static_param({"axis": [0, 1]})
        FrozenDict({'axis': (0, 1)})
        >>> static_param(lambda x: x) == static_param(lambda x: x)
        False
        >>> f = lambda x: x + 1
        >>> static_param(f) == static_param(lambda x: x + 1)  # different code objects
        False
        >>> make = lambda: (lambda x: x + 1)
        >>> static_param(make()) == static_param(make())  # same code, re-created
        True
    """
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
        return value
    if isinstance(value, (HashableCallable, FrozenDict)):
        return value
    if isinstance(value, (np.ndarray, jax.Array)):
        desc = f"{type(value).__name__} of shape {getattr(value, 'shape', '?')}"
        raise TypeError(_ARRAY_PARAM_MSG.format(where=where, name=name, desc=desc))
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return tuple(static_param(v, name=f"{name}[{i}]", where=where) for i, v in enumerate(value))
    if isinstance(value, dict):
        return FrozenDict(
            {k: static_param(v, name=f"{name}[{k!r}]", where=where) for k, v in value.items()}
        )
    if isinstance(value, set):
        return frozenset(static_param(v, name=name, where=where) for v in value)
    if isinstance(value, types.FunctionType):
        return HashableCallable(value)
    try:
        hash(value)
    except TypeError:
        raise TypeError(
            f"{where}: keyword param {name!r} of type {type(value).__name__} is not "
            f"hashable. Keyword params of a primitive are static and must be hashable "
            f"(lists, tuples, dicts, sets and plain functions are converted for you). Make "
            f"the value hashable, or pass arrays as positional operands."
        ) from None
    return value


# --------------------------------------------------------------------------------------
# Missing-rule errors
# --------------------------------------------------------------------------------------


class MissingRuleError(NotImplementedError):
    """Raised when a transformation needs a rule that a primitive does not have yet.

    The message names the rule, the primitive and the call that installs the rule.

    Example:
        >>> import jax.numpy as jnp
        >>> from primforge.primitive import ETPPrimitive, MissingRuleError
        >>> p = ETPPrimitive("demo_missing_impl")
        >>> try:
        ...     p.bind(jnp.ones(2))
        ... except MissingRuleError as err:
        ...     print(str(err).splitlines()[0])
        primitive 'demo_missing_impl' has no evaluation (impl) rule, needed to run it eagerly.
    """


_RULE_HELP = {
    "impl": (
        "evaluation (impl) rule",
        "to run it eagerly",
        "{p}.def_impl(impl)",
        "impl(*args, **params) -> result (NumPy or jax.numpy code)",
    ),
    "abstract_eval": (
        "abstract evaluation rule",
        "to trace it (jax.jit, jax.make_jaxpr, jax.eval_shape, grad and vmap of it)",
        "{p}.def_abstract_eval(abstract_eval)",
        ("abstract_eval(*avals, **params) -> aval, e.g. avals[0].update(shape=..., dtype=...)"),
    ),
    "lowering": (
        "lowering rule for platform {platform}",
        "to compile it under jax.jit",
        (
            "{p}.def_lowering(rule, platform=None)  "
            "[same as jax.interpreters.mlir.register_lowering({p}, rule)]"
        ),
        (
            "rule(ctx, *mlir_values, **params) -> list of mlir values; "
            "mlir.lower_fun(jax_traceable_fn, multiple_results=...) builds one"
        ),
    ),
    "jvp": (
        "JVP rule",
        "for forward-mode and reverse-mode differentiation (jax.jvp, jax.grad, jax.vjp)",
        "{p}.def_jvp(jvp)  [same as jax.interpreters.ad.primitive_jvps[{p}] = jvp]",
        (
            "jvp(primals, tangents, **params) -> (primal_out, tangent_out); "
            "primforge.defjvp({p}, *per_input_rules) builds one"
        ),
    ),
    "transpose": (
        "transpose rule",
        (
            "for reverse-mode differentiation through it when it is used linearly "
            "(jax.grad of a JVP that calls it, jax.linear_transpose)"
        ),
        (
            "{p}.def_transpose(transpose)  "
            "[same as jax.interpreters.ad.primitive_transposes[{p}] = transpose]"
        ),
        (
            "transpose(cotangent, *args, **params) -> one cotangent or None per arg, where the "
            "linear args are jax.interpreters.ad.UndefinedPrimal"
        ),
    ),
    "batching": (
        "batching rule",
        "for jax.vmap",
        (
            "{p}.def_batching(batcher)  "
            "[same as jax.interpreters.batching.primitive_batchers[{p}] = batcher]"
        ),
        "batcher(args, batch_dims, **params) -> (out, out_batch_dim)",
    ),
}


def _missing_rule_error(prim: Primitive, rule: str, **fmt: Any) -> MissingRuleError:
    what, why, call, sig = _RULE_HELP[rule]
    pname = f"{prim.name}_p"
    return MissingRuleError(
        f"primitive {prim.name!r} has no {what.format(**fmt)}, needed {why}.\n"
        f"Add it with `{call.format(p=pname)}` (where {pname} is the primitive object),\n"
        f"with signature {sig.format(p=pname)}."
    )


# --------------------------------------------------------------------------------------
# The primitive class
# --------------------------------------------------------------------------------------

YW_TO_W = rule_table("etp.yw_to_w")
XY_TO_DW = rule_table("etp.xy_to_dw")
INIT_DRTRL = rule_table("etp.init_drtrl")
INIT_PP = rule_table("etp.init_pp")

#: The four ETP rule slots, by short name. Each is a named :class:`RuleTable`.
ETP_RULE_TABLES: dict[str, RuleTable] = {
    "yw_to_w": YW_TO_W,
    "xy_to_dw": XY_TO_DW,
    "init_drtrl": INIT_DRTRL,
    "init_pp": INIT_PP,
}

_ETP_PRIMITIVES: list[ETPPrimitive] = []


class ETPPrimitive(Primitive):
    """A JAX primitive with one method per rule, clear missing-rule errors and rule slots.

    Build one rule by rule (the seven steps in ``docs/primitives.md``) or let
    :func:`register_primitive` derive every rule from an implementation function.

    Args:
        name: the primitive's name (shown in jaxprs).
        multiple_results: whether it returns several arrays (``bind`` gives a tuple).
        batched: metadata for interpreters: the primitive works on batched inputs.
        gradient_enabled: metadata for interpreters: evaluate it when walking ``y -> h``.
        trainable_invars_fn: metadata: ``eqn.params -> {key: invar_index}`` for the
            trainable inputs, or ``None``.
        x_invar_index: metadata: position of the input ``x`` in ``eqn.invars``
            (``None`` when there is none).
        y_outvar_index: metadata: position of the output ``y`` in ``eqn.outvars``.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from jax.interpreters import mlir
        >>> from primforge.primitive import ETPPrimitive
        >>> twice_p = ETPPrimitive("demo_twice")
        >>> _ = twice_p.def_impl(lambda x: 2 * x)
        >>> _ = twice_p.def_abstract_eval(lambda a: a.update())
        >>> _ = twice_p.def_lowering(mlir.lower_fun(lambda x: 2 * x, multiple_results=False))
        >>> jax.jit(twice_p.bind)(jnp.arange(3.0))
        Array([0., 2., 4.], dtype=float32)
    """

    def __init__(
        self,
        name: str,
        *,
        multiple_results: bool = False,
        batched: bool = False,
        gradient_enabled: bool = False,
        trainable_invars_fn: Callable[[Mapping[str, Any]], Mapping[str, int]] | None = None,
        x_invar_index: int | None = 0,
        y_outvar_index: int = 0,
    ):
        if not isinstance(name, str) or not name:
            raise TypeError(f"ETPPrimitive: name must be a non-empty str; got {name!r}")
        if trainable_invars_fn is not None and not callable(trainable_invars_fn):
            raise TypeError(
                f"ETPPrimitive {name!r}: trainable_invars_fn must be callable or None; got "
                f"{type(trainable_invars_fn).__name__}"
            )
        super().__init__(name)
        self.multiple_results = bool(multiple_results)
        self._batched = bool(batched)
        self._gradient_enabled = bool(gradient_enabled)
        self._trainable_invars_fn = trainable_invars_fn
        self._x_invar_index = x_invar_index
        self._y_outvar_index = y_outvar_index
        self._num_inputs: int | None = None
        # Defaults that explain what is missing; each def_* call replaces one of them.
        mlir.register_lowering(self, self._missing_lowering)
        ad.primitive_jvps[self] = self._missing_jvp
        ad.primitive_transposes[self] = self._missing_transpose
        batching.primitive_batchers[self] = self._missing_batching
        _ETP_PRIMITIVES.append(self)

    # -- defaults ----------------------------------------------------------------------

    def impl(self, *args: Any, **params: Any) -> Any:
        raise _missing_rule_error(self, "impl")

    def abstract_eval(self, *args: Any, **params: Any) -> Any:
        raise _missing_rule_error(self, "abstract_eval")

    def _missing_lowering(self, ctx: Any, *args: Any, **params: Any) -> Any:
        platforms = getattr(ctx.module_context, "platforms", None) or ("?",)
        raise _missing_rule_error(self, "lowering", platform="/".join(platforms))

    def _missing_jvp(self, primals: Any, tangents: Any, **params: Any) -> Any:
        raise _missing_rule_error(self, "jvp")

    def _missing_transpose(self, cts: Any, *args: Any, **params: Any) -> Any:
        raise _missing_rule_error(self, "transpose")

    def _missing_batching(self, args: Any, dims: Any, **params: Any) -> Any:
        raise _missing_rule_error(self, "batching")

    # -- binding -----------------------------------------------------------------------

    def bind(self, *args: Any, **params: Any) -> Any:
        """Apply the primitive; keyword params are made hashable with :func:`static_param`.

        Example:
            >>> import jax.numpy as jnp
            >>> from primforge.primitive import register_primitive
            >>> take_p = register_primitive("demo_take", lambda x, *, idx: x[jnp.array(idx)])
            >>> take_p.bind(jnp.arange(5.0), idx=[4, 0])  # the impl sees idx=(4, 0)
            Array([4., 0.], dtype=float32)
        """
        n = self._num_inputs
        if n is not None and len(args) != n:
            raise TypeError(
                f"primitive {self.name!r} takes {n} positional operand(s) (from its impl's "
                f"signature) but bind got {len(args)}; keyword params must be passed by name"
            )
        if params:
            where = f"primitive {self.name!r}"
            params = {k: static_param(v, name=k, where=where) for k, v in params.items()}
        out = super().bind(*args, **params)
        # Several results come back as a tuple (JAX's bind gives a list): the structure a
        # Python function returning several arrays has, so cotangents given as a tuple to
        # jax.vjp / jax.linear_transpose match it.
        return tuple(out) if self.multiple_results else out

    # -- one method per rule -----------------------------------------------------------
    # def_impl and def_abstract_eval are inherited from Primitive.

    def def_lowering(self, rule: Callable[..., Any], platform: str | None = None) -> Callable:
        """Install an MLIR lowering rule (all platforms, or one of 'cpu', 'cuda', 'rocm', 'tpu').

        Same as ``jax.interpreters.mlir.register_lowering(self, rule, platform=platform)``.
        ``mlir.lower_fun(fn, multiple_results=...)`` turns a JAX-traceable ``fn`` into a rule.

        Example:
            >>> import jax, jax.numpy as jnp
            >>> from jax.interpreters import mlir
            >>> from primforge.primitive import ETPPrimitive
            >>> p = ETPPrimitive("demo_def_lowering")
            >>> _ = p.def_abstract_eval(lambda a: a.update())
            >>> _ = p.def_lowering(mlir.lower_fun(jnp.negative, multiple_results=False), "cpu")
            >>> jax.jit(p.bind)(1.0)
            Array(-1., dtype=float32, weak_type=True)
        """
        if not callable(rule):
            raise TypeError(f"{self.name}.def_lowering: rule must be callable; got {rule!r}")
        mlir.register_lowering(self, rule, platform=platform)
        return rule

    def def_jvp(self, jvp: Callable[..., Any]) -> Callable:
        """Install a JVP rule ``jvp(primals, tangents, **params) -> (out, tangent_out)``.

        Same as ``jax.interpreters.ad.primitive_jvps[self] = jvp``; :func:`defjvp` builds
        one from per-input rules.

        Example:
            >>> import jax, jax.numpy as jnp
            >>> from primforge.primitive import ETPPrimitive
            >>> p = ETPPrimitive("demo_def_jvp")
            >>> _ = p.def_impl(jnp.sin)
            >>> _ = p.def_jvp(lambda xs, ts: (p.bind(*xs), jnp.cos(xs[0]) * ts[0]))
            >>> jax.jvp(p.bind, (0.0,), (2.0,))[1]
            Array(2., dtype=float32, weak_type=True)
        """
        if not callable(jvp):
            raise TypeError(f"{self.name}.def_jvp: jvp must be callable; got {jvp!r}")
        ad.primitive_jvps[self] = jvp
        return jvp

    def def_transpose(self, transpose: Callable[..., Any]) -> Callable:
        """Install a transpose rule ``transpose(ct, *args, **params) -> cotangents``.

        Same as ``jax.interpreters.ad.primitive_transposes[self] = transpose``. Args that
        are being transposed arrive as ``ad.UndefinedPrimal``; return one cotangent per
        arg (``None`` for the others).

        Example:
            >>> import jax, jax.numpy as jnp
            >>> from jax.interpreters import ad
            >>> from primforge.primitive import ETPPrimitive
            >>> p = ETPPrimitive("demo_def_transpose")
            >>> _ = p.def_impl(lambda x: 3 * x)
            >>> _ = p.def_abstract_eval(lambda a: a.update())
            >>> _ = p.def_transpose(lambda ct, x: [3 * ct])
            >>> jax.linear_transpose(p.bind, 1.0)(jnp.float32(1.0))
            (Array(3., dtype=float32),)
        """
        if not callable(transpose):
            raise TypeError(
                f"{self.name}.def_transpose: transpose must be callable; got {transpose!r}"
            )
        ad.primitive_transposes[self] = transpose
        return transpose

    def def_batching(self, batcher: Callable[..., Any]) -> Callable:
        """Install a batching rule ``batcher(args, dims, **params) -> (out, out_dim)``.

        Same as ``jax.interpreters.batching.primitive_batchers[self] = batcher``. Unmapped
        args have dim ``None``.

        Example:
            >>> import jax, jax.numpy as jnp
            >>> from primforge.primitive import ETPPrimitive
            >>> p = ETPPrimitive("demo_def_batching")
            >>> _ = p.def_impl(jnp.cumsum)
            >>> _ = p.def_batching(lambda xs, ds: (jnp.cumsum(xs[0], axis=1 - ds[0]), ds[0]))
            >>> jax.vmap(p.bind)(jnp.ones((2, 3)))
            Array([[1., 2., 3.],
                   [1., 2., 3.]], dtype=float32)
        """
        if not callable(batcher):
            raise TypeError(f"{self.name}.def_batching: batcher must be callable; got {batcher!r}")
        batching.primitive_batchers[self] = batcher
        return batcher

    # -- ETP rule slots ----------------------------------------------------------------

    def register_yw_to_w(self, fn: Callable[..., Any]) -> None:
        """Install the D-RTRL trace propagation rule ``(hidden_dim, trace, **params) -> trace``.

        Example:
            >>> from primforge.primitive import ETPPrimitive, get_etp_rule
            >>> p = ETPPrimitive("demo_yw_to_w")
            >>> p.register_yw_to_w(lambda h, trace: trace)
            >>> get_etp_rule(p, "yw_to_w")(None, 5)
            5
        """
        YW_TO_W.register(self, _check_rule(self, "yw_to_w", fn))

    def register_xy_to_dw(self, fn: Callable[..., Any]) -> None:
        """Install the weight-gradient rule ``(x, hidden_dim, w, **params) -> dw``.

        Example:
            >>> from primforge.primitive import ETPPrimitive, get_etp_rule
            >>> p = ETPPrimitive("demo_xy_to_dw")
            >>> p.register_xy_to_dw(lambda x, h, w: x * h)
            >>> get_etp_rule(p, "xy_to_dw")(2, 3, None)
            6
        """
        XY_TO_DW.register(self, _check_rule(self, "xy_to_dw", fn))

    def register_init_drtrl(self, fn: Callable[..., Any]) -> None:
        """Install the D-RTRL trace initialiser ``(x_var, y_var, weight_var, num_hidden) -> zeros``.

        Example:
            >>> from primforge.primitive import ETPPrimitive, get_etp_rule
            >>> p = ETPPrimitive("demo_init_drtrl")
            >>> p.register_init_drtrl(lambda x, y, w, n: n)
            >>> get_etp_rule(p, "init_drtrl")(None, None, None, 4)
            4
        """
        INIT_DRTRL.register(self, _check_rule(self, "init_drtrl", fn))

    def register_init_pp(self, fn: Callable[..., Any]) -> None:
        """Install the pp-prop (IO-dim) trace initialiser ``(x_var, y_var, weight_var, n) -> zeros``.

        Example:
            >>> from primforge.primitive import ETPPrimitive, get_etp_rule
            >>> p = ETPPrimitive("demo_init_pp")
            >>> p.register_init_pp(lambda x, y, w, n: 0)
            >>> get_etp_rule(p, "init_pp")(None, None, None, 1)
            0
        """
        INIT_PP.register(self, _check_rule(self, "init_pp", fn))

    def register_etp_rules(
        self,
        yw_to_w: Callable[..., Any] | None = None,
        xy_to_dw: Callable[..., Any] | None = None,
        init_drtrl: Callable[..., Any] | None = None,
        init_pp: Callable[..., Any] | None = None,
    ) -> None:
        """Install several ETP rules at once; arguments left ``None`` are skipped.

        Example:
            >>> from primforge.primitive import ETPPrimitive, get_etp_rule
            >>> p = ETPPrimitive("demo_etp_rules")
            >>> p.register_etp_rules(xy_to_dw=lambda x, h, w: 1, init_pp=lambda *a: 0)
            >>> get_etp_rule(p, "xy_to_dw") is not None, get_etp_rule(p, "yw_to_w")
            (True, None)
        """
        for key, fn in (
            ("yw_to_w", yw_to_w),
            ("xy_to_dw", xy_to_dw),
            ("init_drtrl", init_drtrl),
            ("init_pp", init_pp),
        ):
            if fn is not None:
                ETP_RULE_TABLES[key].register(self, _check_rule(self, key, fn))

    # -- metadata ----------------------------------------------------------------------

    @property
    def batched(self) -> bool:
        """Whether the primitive operates on batched inputs (metadata for interpreters)."""
        return self._batched

    @property
    def gradient_enabled(self) -> bool:
        """Whether interpreters evaluate this primitive when walking ``y -> h``."""
        return self._gradient_enabled

    @property
    def trainable_invars_fn(self) -> Callable[[Mapping[str, Any]], Mapping[str, int]] | None:
        """``eqn.params -> {key: invar_index}`` for trainable inputs, or ``None``."""
        return self._trainable_invars_fn

    @property
    def x_invar_index(self) -> int | None:
        """Position of the input ``x`` in ``eqn.invars`` (``None`` if there is no ``x``)."""
        return self._x_invar_index

    @property
    def y_outvar_index(self) -> int:
        """Position of the output ``y`` in ``eqn.outvars``."""
        return self._y_outvar_index

    @property
    def num_inputs(self) -> int | None:
        """Number of operands, when known from the impl's signature, else ``None``."""
        return self._num_inputs


def _check_rule(prim: Primitive, key: str, fn: Any) -> Any:
    if not callable(fn):
        raise TypeError(f"{prim.name}: the {key} rule must be callable; got {fn!r}")
    return fn


# --------------------------------------------------------------------------------------
# Module-level queries
# --------------------------------------------------------------------------------------


def _etp(primitive: Any) -> ETPPrimitive | None:
    try:
        prim = as_primitive(primitive)
    except TypeError:
        return None
    return prim if isinstance(prim, ETPPrimitive) else None


def etp_primitives() -> tuple[ETPPrimitive, ...]:
    """Every :class:`ETPPrimitive` created so far, in creation order.

    Example:
        >>> from primforge.primitive import ETPPrimitive, etp_primitives
        >>> p = ETPPrimitive("demo_listed")
        >>> p in etp_primitives()
        True
    """
    return tuple(_ETP_PRIMITIVES)


def is_etp_primitive(primitive: Any) -> bool:
    """Whether ``primitive`` (or a kernel's ``.primitive``) is an :class:`ETPPrimitive`.

    Example:
        >>> from jax import lax
        >>> from primforge.primitive import ETPPrimitive, is_etp_primitive
        >>> is_etp_primitive(ETPPrimitive("demo_is_etp")), is_etp_primitive(lax.sin_p)
        (True, False)
    """
    return _etp(primitive) is not None


def is_batched(primitive: Any) -> bool:
    """The ``batched`` flag of an :class:`ETPPrimitive`; ``False`` for other primitives.

    Example:
        >>> from primforge.primitive import ETPPrimitive, is_batched
        >>> is_batched(ETPPrimitive("demo_batched", batched=True))
        True
    """
    p = _etp(primitive)
    return p is not None and p.batched


def is_gradient_enabled(primitive: Any) -> bool:
    """The ``gradient_enabled`` flag of an :class:`ETPPrimitive`; ``False`` otherwise.

    Example:
        >>> from primforge.primitive import ETPPrimitive, is_gradient_enabled
        >>> is_gradient_enabled(ETPPrimitive("demo_ge"))
        False
    """
    p = _etp(primitive)
    return p is not None and p.gradient_enabled


def get_trainable_invars_fn(primitive: Any) -> Callable | None:
    """The ``trainable_invars_fn`` of an :class:`ETPPrimitive`; ``None`` otherwise.

    Example:
        >>> from primforge.primitive import ETPPrimitive, get_trainable_invars_fn
        >>> p = ETPPrimitive("demo_tif", trainable_invars_fn=lambda params: {"weight": 1})
        >>> get_trainable_invars_fn(p)({})
        {'weight': 1}
    """
    p = _etp(primitive)
    return None if p is None else p.trainable_invars_fn


def get_x_invar_index(primitive: Any) -> int | None:
    """Position of ``x`` in the invars of an :class:`ETPPrimitive`; ``None`` otherwise.

    Example:
        >>> from jax import lax
        >>> from primforge.primitive import ETPPrimitive, get_x_invar_index
        >>> get_x_invar_index(ETPPrimitive("demo_xi", x_invar_index=1)), get_x_invar_index(lax.sin_p)
        (1, None)
    """
    p = _etp(primitive)
    return None if p is None else p.x_invar_index


def get_y_outvar_index(primitive: Any) -> int | None:
    """Position of ``y`` in the outvars of an :class:`ETPPrimitive`; ``None`` otherwise.

    Example:
        >>> from primforge.primitive import ETPPrimitive, get_y_outvar_index
        >>> get_y_outvar_index(ETPPrimitive("demo_yo"))
        0
    """
    p = _etp(primitive)
    return None if p is None else p.y_outvar_index


def get_etp_rule(primitive: Any, kind: str) -> Callable | None:
    """The ETP rule of ``kind`` ('yw_to_w', 'xy_to_dw', 'init_drtrl', 'init_pp'), or ``None``.

    Example:
        >>> from primforge.primitive import ETPPrimitive, get_etp_rule
        >>> get_etp_rule(ETPPrimitive("demo_no_rule"), "init_pp") is None
        True
    """
    table = ETP_RULE_TABLES.get(kind)
    if table is None:
        raise ValueError(
            f"get_etp_rule: kind must be one of {sorted(ETP_RULE_TABLES)}; got {kind!r}"
        )
    return table.get(primitive)


# --------------------------------------------------------------------------------------
# Rules derived from an implementation function
# --------------------------------------------------------------------------------------


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


def _is_float(dtype: Any) -> bool:
    return jax.dtypes.issubdtype(dtype, np.inexact)


def _is_symbolic_zero(t: Any) -> bool:
    return type(t) is Zero or getattr(t, "dtype", None) == float0


def _spec_of(aval: Any) -> jax.ShapeDtypeStruct:
    # Keep shard_map's varying-manual-axes type, or the cotangents come back mistyped.
    mat = varying_kwargs(aval)
    if not mat:
        return jax.ShapeDtypeStruct(aval.shape, aval.dtype)
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype, sharding=aval.sharding, **mat)


def _zero_tangent_like(x: Any) -> Zero:
    return Zero(jax.typeof(x).to_tangent_aval())


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
        active = [i for i, t in enumerate(tangents) if not _is_symbolic_zero(t)]
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
            return out, (t_out if _is_float(out.dtype) else _zero_tangent_like(out))
        out = list(out)
        t_out = [t if _is_float(o.dtype) else _zero_tangent_like(o) for o, t in zip(out, t_out)]
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
    prim._derived = rules
    prim.def_impl(rules.impl)
    prim.def_abstract_eval(rules.abstract_eval)
    prim.def_lowering(mlir.lower_fun(rules.lowering_fn, multiple_results=prim.multiple_results))
    prim.def_jvp(rules.jvp)
    prim.def_transpose(rules.transpose)
    prim.def_batching(rules.batch)
    return prim


# --------------------------------------------------------------------------------------
# Per-input JVP rules
# --------------------------------------------------------------------------------------


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
            if rule is None or _is_symbolic_zero(t):
                continue
            contrib = rule(t, *primals, **params)
            if prim.multiple_results:
                if len(outs) == 1 and not isinstance(contrib, (tuple, list)):
                    contrib = [contrib]  # one output: a bare tangent is that output's
                if not isinstance(contrib, (tuple, list)) or len(contrib) != len(outs):
                    raise TypeError(
                        f"JVP rule {i} ({_rule_name(rule)}) of primitive {prim.name!r}, which "
                        f"has {len(outs)} outputs, must return a sequence of {len(outs)} "
                        f"tangents (one per output, None for zero); got "
                        f"{type(contrib).__name__}"
                        + (
                            f" of length {len(contrib)}"
                            if isinstance(contrib, (tuple, list))
                            else ""
                        )
                    )
                contribs = list(contrib)
            else:
                contribs = [contrib]
            for k, (c, o) in enumerate(zip(contribs, outs)):
                if c is None or type(c) is Zero:
                    continue
                if np.shape(c) != np.shape(o):
                    raise ValueError(
                        f"JVP rule {i} of primitive {prim.name!r} returned a tangent of shape "
                        f"{np.shape(c)} for output {k}, whose shape is {np.shape(o)}"
                    )
                acc[k] = _add(acc[k], _as_tangent(c, o))
        t_outs = [
            _zero_tangent_like(o) if a is None or not _is_float(jax.typeof(o).dtype) else a
            for a, o in zip(acc, outs)
        ]
        if prim.multiple_results:
            return outs, t_outs
        return out, t_outs[0]

    jvp.rules = rules  # type: ignore[attr-defined]
    return jvp


def _rule_name(rule: Callable[..., Any]) -> str:
    return getattr(rule, "__qualname__", None) or type(rule).__name__


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
