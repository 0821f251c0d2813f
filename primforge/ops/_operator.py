"""One primitive per operation: its forms are static params of a single kernel.

An :class:`Operator` owns one :class:`~primforge.XLACustomKernel`. Each of its forms
(float or binary events, a spike list, packed words; a vector or a matrix right-hand side)
is a :class:`Form`: the values of the operator's form params (``events='bool',
matrix=False``) plus the generators and rules of that form. The kernel registers, per
backend and platform, one generator that reads the form params of the call and hands the
rest to the form's own generator; its shape, JVP, transpose, batching and sharding rules
do the same. A backend a form has no kernel for declines with
:class:`~primforge.kernel.errors.BackendDeclined` (an error naming the form and the
backends it has), which the benchmark runner and the autotuner pass over.

A :class:`Form` is built with the same ``def_*`` calls as a kernel and called like one
(``form(*args, backend=..., **params)`` binds the operator's kernel with the form params
added); attributes it does not hold (``primitive``, ``defaults``, ``clear_cache``...) are
the kernel's.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

from primforge import registry
from primforge.bench import BenchmarkConfig, benchmark_kernel
from primforge.kernel.batching import general_batching_rule
from primforge.kernel.checks import _keyword_only
from primforge.kernel.entry import GENERATOR_ARGS, KernelEntry, accepted_args
from primforge.kernel.errors import BackendDeclined
from primforge.kernel.kernel import XLACustomKernel
from primforge.kernel.registration import check_platform
from primforge.kernel.sharding_rules import ShardingRule, make_rule
from primforge.ops import _sharding

__all__ = ["Form", "Operator", "eqn_name", "forms_of"]

_RULES = ("abstract", "jvp", "transpose", "batch")
_SETTERS = {"abstract": "def_abstract_eval", "jvp": "def_jvp_rule",
            "transpose": "def_transpose_rule", "batch": "def_batching_rule"}
_INTERNAL = ("outs", "backend", "context", "batch", "debug")


class Form:
    """One form of an :class:`Operator`: its form params, generators and rules.

    Made by :meth:`Operator.form`; see the module docstring.

    Example:
        >>> from primforge.ops import csrmv_p
        >>> csrmv_p.name, csrmv_p.key, csrmv_p.kernel.name
        ('primforge.ops.csrmv', {'events': 'float', 'matrix': False}, 'primforge.ops.csr')
    """

    def __init__(self, operator: Operator, name: str, key: dict[str, Any], doc: str | None):
        self.operator, self.name, self.key, self.doc = operator, name, dict(key), doc
        self.entries: dict[tuple[str, str], KernelEntry] = {}
        self.own_defaults: dict[str, str] = {}  # platform -> this form's own default backend
        self.rules: dict[str, Callable | None] = dict.fromkeys(_RULES)
        self.sharding: Any = None
        self.tags: set[str] = set()
        self._call_fn: Callable | None = None
        self._benchmark_data_fn: Callable | None = None

    @property
    def kernel(self) -> XLACustomKernel:
        """The operator's kernel, shared by every form."""
        return self.operator.kernel

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__") or attr in ("operator", "entries", "rules", "own_defaults"):
            raise AttributeError(attr)
        return getattr(self.operator.kernel, attr)

    def __repr__(self) -> str:
        return f"Form({self.name!r} of {self.kernel.name!r}, {self.key})"

    def __call__(self, *inputs, backend: str | None = None, **params):
        """Bind the operator's kernel in this form."""
        return self.operator.kernel(*inputs, backend=backend, **params, **self.key)

    # ------------------------------------------------------------------ generators
    def def_kernel(self, backend: str, platform: str, kg: Callable[..., Any],
                   asdefault: bool = False) -> None:
        """Register this form's generator for ``backend`` on ``platform``."""
        platform = check_platform(self.name, backend, platform)
        self.entries[(backend, platform)] = KernelEntry(backend, platform, kg)
        if asdefault or platform not in self.own_defaults:
            self.own_defaults[platform] = backend
        self.operator._serve(backend, platform, asdefault)

    def def_numba_kernel(self, kg: Callable[..., Any], asdefault: bool = False) -> None:
        """This form's Numba generator (CPU)."""
        self.def_kernel("numba", "cpu", kg, asdefault)

    def def_pallas_kernel(self, platform: str, kg: Callable[..., Any],
                          asdefault: bool = False) -> None:
        """This form's Pallas generator on ``platform``."""
        self.def_kernel("pallas", platform, kg, asdefault)

    def def_cuda_raw_kernel(self, kg: Callable[..., Any], asdefault: bool = False,
                            platform: str = "gpu") -> None:
        """This form's nvcc-compiled generator on ``platform``."""
        self.def_kernel("cuda_raw", platform, kg, asdefault)

    def available_backends(self, platform: str) -> list[str]:
        """The backends with a kernel for this form on ``platform``, in the kernel's order.

        Example:
            >>> from primforge.ops import binary_csrmv_spikes_p
            >>> binary_csrmv_spikes_p.available_backends('cpu')
            ['jax', 'numba']
        """
        served = {b for b, p in self.entries if p == platform}
        return [b for b in self.kernel.available_backends(platform) if b in served]

    # ------------------------------------------------------------------ rules
    def _rule(self, rule: str, fn: Callable) -> Callable:
        self.rules[rule] = fn
        self.operator._dispatch(rule)
        return fn

    def def_abstract_eval(self, fn: Callable) -> Callable:
        """This form's shape rule."""
        return self._rule("abstract", fn)

    def def_jvp_rule(self, fn: Callable) -> Callable:
        """This form's JVP rule."""
        return self._rule("jvp", fn)

    def def_transpose_rule(self, fn: Callable) -> Callable:
        """This form's transpose rule."""
        return self._rule("transpose", fn)

    def def_batching_rule(self, fn: Callable) -> Callable:
        """This form's ``vmap`` rule."""
        return self._rule("batch", fn)

    def register_general_batching(self) -> None:
        """Batch this form by :func:`~primforge.kernel.batching.general_batching_rule`."""

        def batch(args, axes, **params):
            return general_batching_rule(self.kernel.primitive, args, axes, **params,
                                         **self.key)

        self._rule("batch", batch)

    def def_sharding_rule(self, rule: Any, *, reduction_factors: Sequence[str] = (),
                          need_replication_factors: Sequence[str] = ()) -> Any:
        """This form's sharding rule (as :meth:`primforge.XLACustomKernel.def_sharding_rule`
        takes it; None: every operand kept whole)."""
        self.sharding = make_rule(rule, reduction_factors, need_replication_factors)
        self.operator._share_sharding()
        return self.sharding

    @property
    def sharding_rule(self) -> Any:
        """This form's :class:`~primforge.kernel.sharding.ShardingRule` (None: none)."""
        return self.sharding

    def def_tags(self, *tags: str) -> None:
        """Tag this form (and the operator's kernel)."""
        self.tags.update(tags)
        self.kernel.def_tags(*tags)

    def params(self) -> set[str]:
        """The static params this form's generators and rules name (its own, no form params).

        Example:
            >>> from primforge.ops import csrmv_p
            >>> sorted(csrmv_p.params())
            ['shape', 'transpose']
        """
        named: set[str] = set()
        for entry in self.entries.values():
            named |= accepted_args(entry)[1] - GENERATOR_ARGS
        for rule in self.rules.values():
            named |= _keyword_only(rule)
        return named - set(_INTERNAL) - set(self.key)

    # ------------------------------------------------------------------ benchmarking
    def def_call(self, fn: Callable) -> Callable:
        """The public call of this form (used by :meth:`call` and :meth:`benchmark`)."""
        self._call_fn = fn
        return fn

    def has_call(self) -> bool:
        """Whether this form has a public call."""
        return self._call_fn is not None

    def call(self, *args, **kwargs):
        """Run this form's public call."""
        if self._call_fn is None:
            raise ValueError(f"kernel {self.name!r} has no call function")
        return self._call_fn(*args, **kwargs)

    def call_signature(self) -> inspect.Signature:
        """The signature of this form's public call."""
        if self._call_fn is None:
            raise ValueError(f"kernel {self.name!r} has no call function")
        return inspect.signature(self._call_fn)

    def def_benchmark_data(self, fn: Callable) -> Callable:
        """This form's benchmark cases, ``fn(*, platform) -> list[BenchmarkConfig]``."""
        self._benchmark_data_fn = fn
        return fn

    def has_benchmark_data(self) -> bool:
        """Whether this form has benchmark cases."""
        return self._benchmark_data_fn is not None

    def benchmark_data(self, *, platform: str) -> list:
        """This form's benchmark cases on ``platform``."""
        if self._benchmark_data_fn is None:
            raise ValueError(f"kernel {self.name!r} has no benchmark data")
        return list(self._benchmark_data_fn(platform=platform))

    def benchmark(self, *, platform: str, **options: Any) -> Any:
        """Time this form's backends on its cases (see :func:`primforge.bench.benchmark_kernel`)."""
        return benchmark_kernel(self, platform=platform, **options)


class _Dispatch:
    """One of the kernel's rules: picks the call's form and runs the form's rule.

    Its signature names the form params and every form's own params keyword-only, so the
    kernel declares them (an unknown param is refused when the call is bound).
    """

    def __init__(self, operator: Operator, rule: str):
        self.operator, self.rule = operator, rule

    @property
    def __signature__(self) -> inspect.Signature:
        names = sorted(set(self.operator.keys) | self.operator.params())
        kw = [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY) for n in names]
        return inspect.Signature([inspect.Parameter("args", inspect.Parameter.VAR_POSITIONAL),
                                  *kw, inspect.Parameter("rest", inspect.Parameter.VAR_KEYWORD)])

    def __call__(self, *args, **params):
        form, rest = self.operator.split(params)
        fn = form.rules[self.rule]
        if fn is None:
            raise NotImplementedError(f"kernel {form.name!r} has no {self.rule} rule; the "
                                      f"other forms of {self.operator.kernel.name!r} do")
        return fn(*args, **rest)


class Operator:
    """One operation's kernel and its forms.

    Args:
        name: the kernel's name after ``prefix`` (``primforge.ops.<name>``).
        keys: the form params, in order (``('events', 'matrix')``).
        doc: the kernel's description.
        prefix: what the kernel's and the forms' names start with.

    Example:
        >>> from primforge.ops.csr import api
        >>> sorted(form.name for form in api.FAMILY.operator.forms.values())[:2]
        ['primforge.ops.binary_csrmm', 'primforge.ops.binary_csrmm_spikes']
    """

    def __init__(self, name: str, *, keys: tuple[str, ...], doc: str = "",
                 prefix: str = "primforge.ops."):
        self.keys, self.prefix = tuple(keys), prefix
        self.forms: dict[tuple, Form] = {}
        self.kernel = XLACustomKernel(prefix + name, doc=doc, replace=True)
        _OPERATORS[self.kernel.name] = self
        self._dispatched: set[str] = set()
        self.kernel.def_call(self._call)
        self.kernel.def_benchmark_data(self._benchmark_data)

    def form(self, name: str, *, doc: str | None = None, **key: Any) -> Form:
        """A new form of this operator, named ``<prefix><name>``."""
        if set(key) != set(self.keys):
            raise TypeError(f"{self.kernel.name}: a form names {self.keys}, got {sorted(key)}")
        form = Form(self, self.prefix + name, key, doc)
        self.forms[tuple(key[k] for k in self.keys)] = form
        registry.register_alias(form.name, form)
        return form

    def params(self) -> set[str]:
        """Every form's own static params."""
        out: set[str] = set()
        for form in self.forms.values():
            out |= form.params()
        return out

    def split(self, params: dict[str, Any]) -> tuple[Form, dict[str, Any]]:
        """The form a call's params select, and the params left for its rules."""
        try:
            key = tuple(params[k] for k in self.keys)
        except KeyError:
            raise TypeError(f"kernel {self.kernel.name!r} needs the static params "
                            f"{list(self.keys)} (which form to run)") from None
        form = self.forms.get(key)
        if form is None:
            have = [dict(zip(self.keys, k)) for k in self.forms]
            raise ValueError(f"kernel {self.kernel.name!r} has no form "
                             f"{dict(zip(self.keys, key))}; it has {have}")
        rest = {k: v for k, v in params.items() if k not in self.keys}
        own = form.params()
        unknown = sorted(k for k in rest if k not in own and k not in _INTERNAL)
        if unknown:
            raise TypeError(f"kernel {form.name!r}: unknown static param(s) {unknown}; it "
                            f"takes {sorted(own)}")
        return form, rest

    # ------------------------------------------------------------------ the kernel's parts
    def _dispatch(self, rule: str) -> None:
        """Give the kernel the rule that dispatches ``rule`` by form, once: a rule no form
        defines stays the kernel's own (native batching, the missing-rule errors)."""
        if rule not in self._dispatched:
            self._dispatched.add(rule)
            getattr(self.kernel, _SETTERS[rule])(_Dispatch(self, rule))

    def _serve(self, backend: str, platform: str, asdefault: bool) -> None:
        """Give the kernel a dispatching generator for ``backend`` on ``platform`` once."""
        if backend in self.kernel.available_backends(platform):
            if asdefault and self.kernel.get_default(platform) != backend:
                self.kernel.set_default(platform, backend)
            return

        def generate(**params):
            form, rest = self.split({k: v for k, v in params.items()
                                     if k not in GENERATOR_ARGS})
            entry = form.entries.get((backend, platform))
            if entry is None:
                raise BackendDeclined(
                    f"{form.name}: backend {backend!r} has no kernel for this form on "
                    f"{platform!r}; it has {form.available_backends(platform)}",
                    fallback=form.own_defaults.get(platform))
            given = {k: v for k, v in params.items() if k in GENERATOR_ARGS}
            return entry.generate(**given, **rest)

        self.kernel.def_kernel(backend, platform, generate, asdefault)

    def _share_sharding(self) -> None:
        """Give the kernel a rule that runs each form's, made anew on every change (the
        resolved rules are cached by the rule object; jitted callers lower again); no rule
        while no form has one."""

        def rule(ins, outs, **params):
            form, rest = self.split(params)
            spec = form.sharding
            if spec is None:
                return _sharding.replicated_rule(ins, outs)
            if not callable(spec.rule):
                return spec
            got = spec.rule(ins, outs, **rest)
            if isinstance(got, str):  # the factors given beside a callable rule
                return ShardingRule(got, spec.reduction_factors, spec.need_replication_factors)
            return got

        ruled = any(form.sharding is not None for form in self.forms.values())
        self.kernel.def_sharding_rule(rule if ruled else None)

    def _call(self, *args, form: str, **kwargs):
        return self.forms_by_name()[form].call(*args, **kwargs)

    def forms_by_name(self) -> dict[str, Form]:
        """The forms by their names."""
        return {f.name: f for f in self.forms.values()}

    def _benchmark_data(self, *, platform: str) -> list:
        out = []
        for form in self.forms.values():
            if not form.has_benchmark_data():
                continue
            short = form.name.rsplit(".", 1)[-1]
            for c in form.benchmark_data(platform=platform):
                out.append(BenchmarkConfig(f"{short} {c.name}", c.args,
                                           dict(c.kwargs, form=form.name),
                                           dict(c.params, form=short)))
        return out


_OPERATORS: dict[str, Operator] = {}


def eqn_name(eqn: Any) -> str:
    """The name of the form a jaxpr equation binds; other primitives' own names.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from primforge.ops import csrmv
        >>> f = lambda x: csrmv(jnp.ones(2), jnp.array([0, 1]), jnp.array([0, 1, 2]), x,
        ...                     shape=(2, 2))
        >>> [eqn_name(e) for e in jax.make_jaxpr(f)(jnp.ones(2)).eqns][-1]
        'primforge.ops.csrmv'
    """
    name = eqn.primitive.name
    operator = _OPERATORS.get(name)
    if operator is None:
        return name
    key = tuple(eqn.params.get(k) for k in operator.keys)
    form = operator.forms.get(key)
    return name if form is None else form.name


def forms_of(kernel: Any) -> list:
    """The forms of an operator's kernel; any other kernel alone.

    Example:
        >>> from primforge import registry
        >>> len(forms_of(registry.get_kernel('primforge.ops.csr')))
        7
    """
    operator = _OPERATORS.get(getattr(kernel, "name", None))
    if operator is None or operator.kernel is not kernel:
        return [kernel]
    return list(operator.forms.values())
