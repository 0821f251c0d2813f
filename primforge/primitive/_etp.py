"""The ETP primitive: one method per JAX rule, clear missing-rule errors, rule slots.

:class:`ETPPrimitive` raises :class:`~primforge.primitive.MissingRuleError` for a rule not
set yet, and carries four extra rule slots and metadata for custom jaxpr interpreters.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from primforge._compat import Primitive, ad, batching, mlir
from primforge.primitive._errors import missing_rule_error
from primforge.primitive._static import static_param
from primforge.rules import RuleTable, as_primitive, rule_table

__all__ = [
    "ETP_RULE_TABLES",
    "ETPPrimitive",
    "etp_primitives",
    "get_etp_rule",
    "get_trainable_invars_fn",
    "get_x_invar_index",
    "get_y_outvar_index",
    "is_batched",
    "is_etp_primitive",
    "is_gradient_enabled",
]


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
        """The eager evaluation rule until :meth:`def_impl` sets one: raises an error
        naming the primitive and the missing rule.

        Example:
            >>> from primforge.primitive import ETPPrimitive
            >>> try:
            ...     ETPPrimitive('demo_no_impl').bind(1.0)
            ... except Exception as e:
            ...     print(type(e).__name__)
            MissingRuleError
        """
        raise missing_rule_error(self, "impl")

    def abstract_eval(self, *args: Any, **params: Any) -> Any:
        """The shape rule until :meth:`def_abstract_eval` sets one: raises an error
        naming the primitive and the missing rule.

        Example:
            >>> import jax
            >>> from primforge.primitive import ETPPrimitive
            >>> p = ETPPrimitive('demo_no_aval')
            >>> _ = p.def_impl(lambda x: x)
            >>> try:
            ...     jax.jit(p.bind)(1.0)
            ... except Exception as e:
            ...     print(type(e).__name__)
            MissingRuleError
        """
        raise missing_rule_error(self, "abstract_eval")

    def _missing_lowering(self, ctx: Any, *args: Any, **params: Any) -> Any:
        platforms = getattr(ctx.module_context, "platforms", None) or ("?",)
        raise missing_rule_error(self, "lowering", platform="/".join(platforms))

    def _missing_jvp(self, primals: Any, tangents: Any, **params: Any) -> Any:
        raise missing_rule_error(self, "jvp")

    def _missing_transpose(self, cts: Any, *args: Any, **params: Any) -> Any:
        raise missing_rule_error(self, "transpose")

    def _missing_batching(self, args: Any, dims: Any, **params: Any) -> Any:
        raise missing_rule_error(self, "batching")

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
        """Install the pp-prop (IO-dim) trace initialiser.

        The initialiser maps ``(x_var, y_var, weight_var, n)`` to zeros.

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
        """Whether the primitive operates on batched inputs (metadata for interpreters).

        Example:
            >>> from primforge.primitive import ETPPrimitive
            >>> p = ETPPrimitive('demo_flags', batched=True, x_invar_index=1, y_outvar_index=0)
            >>> p.batched
            True
        """
        return self._batched

    @property
    def gradient_enabled(self) -> bool:
        """Whether interpreters evaluate this primitive when walking ``y -> h``.

        Example:
            >>> from primforge.primitive import ETPPrimitive
            >>> p = ETPPrimitive('demo_flags', batched=True, x_invar_index=1, y_outvar_index=0)
            >>> p.gradient_enabled
            False
        """
        return self._gradient_enabled

    @property
    def trainable_invars_fn(self) -> Callable[[Mapping[str, Any]], Mapping[str, int]] | None:
        """``eqn.params -> {key: invar_index}`` for trainable inputs, or ``None``.

        Example:
            >>> from primforge.primitive import ETPPrimitive
            >>> p = ETPPrimitive('demo_flags', batched=True, x_invar_index=1, y_outvar_index=0)
            >>> p.trainable_invars_fn is None
            True
        """
        return self._trainable_invars_fn

    @property
    def x_invar_index(self) -> int | None:
        """Position of the input ``x`` in ``eqn.invars`` (``None`` if there is no ``x``).

        Example:
            >>> from primforge.primitive import ETPPrimitive
            >>> p = ETPPrimitive('demo_flags', batched=True, x_invar_index=1, y_outvar_index=0)
            >>> p.x_invar_index
            1
        """
        return self._x_invar_index

    @property
    def y_outvar_index(self) -> int:
        """Position of the output ``y`` in ``eqn.outvars``.

        Example:
            >>> from primforge.primitive import ETPPrimitive
            >>> p = ETPPrimitive('demo_flags', batched=True, x_invar_index=1, y_outvar_index=0)
            >>> p.y_outvar_index
            0
        """
        return self._y_outvar_index

    @property
    def num_inputs(self) -> int | None:
        """Number of operands, when known from the impl's signature, else ``None``.

        Example:
            >>> from primforge import register_primitive
            >>> register_primitive('demo_arity', lambda x, w: x * w).num_inputs
            2
        """
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
        >>> p = ETPPrimitive("demo_xi", x_invar_index=1)
        >>> get_x_invar_index(p), get_x_invar_index(lax.sin_p)
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
