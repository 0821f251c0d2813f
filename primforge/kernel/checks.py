"""What a call is checked against: declared params, ``outs``, abstract evaluation.

``outs`` is checked against the shape rule at call time and against the ``jax`` reference
under ``jax.eval_shape`` at trace time (once per signature).
"""

from __future__ import annotations

import inspect
import numbers
import operator
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from primforge import _compat
from primforge.backends import REFERENCE, get_backend
from primforge.kernel import _lru
from primforge.kernel import batching as _batching
from primforge.kernel import selection as _selection
from primforge.kernel import sharding as _sharding
from primforge.kernel.autodiff import INTERNAL_PARAMS
from primforge.kernel.entry import GENERATOR_ARGS, KernelEntry, accepted_args
from primforge.kernel.errors import KernelError
from primforge.kernel.state import KernelState

__all__ = ["ChecksMixin", "as_struct", "fmt_structs", "normalize_outs"]

_MATCHES = object()  # _ref_cache value: outs agreed with the reference


class ChecksMixin(KernelState):
    """The shape rule, params and ``outs`` checks, and abstract evaluation.

    Part of :class:`primforge.XLACustomKernel`; owns ``_shape_rule``, ``_ref_cache`` and
    ``_memo``. Uses ``_generate`` (lowering).
    """

    _generate: Callable[..., Any]

    def _init_state(self) -> None:
        super()._init_state()
        self._shape_rule: Callable | None = None
        self._ref_cache: dict[Any, Any] = _lru.LRUCache()  # signature -> reference outs
        self._memo: dict[str, Any] = {}  # 'params', 'reference': derived from registration

    def _drop_derived(self) -> None:
        super()._drop_derived()
        self._ref_cache.clear()
        self._memo.clear()

    def _declared_rules(self) -> tuple[Callable | None, ...]:
        return (*super()._declared_rules(), self._shape_rule)

    def def_abstract_eval(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Register a shape rule ``fn(*inputs, **params) -> outs``.

        ``fn`` receives ``jax.ShapeDtypeStruct`` inputs (per-example shapes) and the call's
        static params; it may raise to reject inputs, and returns the output struct(s).
        With a shape rule ``outs`` may be omitted at call time; when given it must agree.

        Example:
            >>> import jax, jax.numpy as jnp, primforge
            >>> k = primforge.XLACustomKernel('doc_shape_rule')
            >>> k.def_kernel('jax', 'cpu', lambda **kw: lambda a, b: a @ b)
            >>> @k.def_abstract_eval
            ... def _(a, b, **kw):
            ...     if a.shape[1] != b.shape[0]:
            ...         raise ValueError(f'inner dims differ: {a.shape} @ {b.shape}')
            ...     return jax.ShapeDtypeStruct((a.shape[0], b.shape[1]), a.dtype)
            >>> k(jnp.ones((2, 3)), jnp.ones((3, 4))).shape
            (2, 4)
        """
        if not callable(fn):
            raise TypeError("def_abstract_eval: fn must be callable")
        self._shape_rule = fn
        self._changed()
        return fn

    def _resolve_outs(self, arrays, outs, params):
        if self._shape_rule is not None:
            ins = tuple(jax.ShapeDtypeStruct(jnp.shape(a), jnp.result_type(a)) for a in arrays)
            expected = self._shape_rule(*ins, **params)
            exp_structs, exp_container = normalize_outs(expected)
            if outs is None:
                return exp_structs, exp_container
            structs, container = normalize_outs(outs)
            if structs != exp_structs:
                raise ValueError(
                    f"kernel {self.name!r}: outs {fmt_structs(structs)} do not match what its "
                    f"shape rule infers from the inputs, {fmt_structs(exp_structs)}"
                )
            return structs, container
        if outs is None:
            raise TypeError(
                f"kernel {self.name!r} needs outs=jax.ShapeDtypeStruct(shape, dtype) (or a "
                f"sequence of them), or a shape rule registered with def_abstract_eval"
            )
        return normalize_outs(outs)

    def accepted_params(self) -> tuple[frozenset[str], bool]:
        """The static params this kernel declares, and whether any others pass.

        Declared: the keyword parameters its generators name, and the keyword-only ones of
        its shape, JVP, transpose and batching rules. Others pass only when nothing is
        declared and a generator takes ``**kwargs``.

        Example:
            >>> import primforge
            >>> k = primforge.XLACustomKernel('doc_accepted_params')
            >>> k.def_kernel('jax', 'cpu', lambda factor=1.0, **kw: lambda x: factor * x)
            >>> k.accepted_params()
            (frozenset({'factor'}), False)
        """
        declared: set[str] = set()
        var_kw = False
        for entry in self._all_entries():
            takes_any, named = accepted_args(entry)
            var_kw = var_kw or takes_any
            declared.update(named - GENERATOR_ARGS)
        for rule in self._declared_rules():
            declared.update(_keyword_only(rule) - set(INTERNAL_PARAMS))
        return frozenset(declared), var_kw and not declared

    def _check_params(self, params: dict) -> None:
        if not params or not self._all_entries():
            return
        accepted = self._memo.get("params")
        if accepted is None:
            accepted = self._memo["params"] = self.accepted_params()
        declared, open_ = accepted
        unknown = sorted(set(params) - declared)
        if unknown and not open_:
            raise TypeError(
                f"kernel {self.name!r}: unknown static param(s) {unknown}; it declares "
                f"{sorted(declared) or 'no params'} (named by its kernel generators or, "
                f"keyword-only, by its rules)"
            )

    def _reference_entry(self) -> KernelEntry | None:
        cached = self._memo.get("reference")
        if cached is not None:
            return cached or None
        refs = [e for e in self._all_entries() if e.backend == REFERENCE]
        if not refs:
            self._memo["reference"] = False
            return None
        try:
            here = _selection.canonical_platform(jax.default_backend())
        except ValueError:
            here = None
        found = next((r for r in refs if r.platform == here), refs[0])
        self._memo["reference"] = found
        return found

    def _reference_structs(self, entry, ins, outs, params):
        """What the ``jax`` reference returns for ``ins`` (structs), or the error to raise."""
        extra = {"batch_shape": ()} if entry.wants_batch_shape else {}
        try:
            product = self._generate(
                entry, ins=ins, outs=outs, platform=entry.platform, **extra, **params
            )
            fn = get_backend(REFERENCE).make_callable(
                product, ins=ins, outs=outs, platform=entry.platform, name=self.name
            )
            got = jax.eval_shape(fn, *ins)
        except Exception as e:  # noqa: BLE001 - reported to the caller with the kernel's name
            err = KernelError(
                f"kernel {self.name!r}: its 'jax' reference backend, used to check outs, "
                f"failed on inputs {fmt_structs(ins)}: {type(e).__name__}: {e}"
            )
            err.__cause__ = e
            return err
        return tuple(jax.ShapeDtypeStruct(tuple(g.shape), jnp.dtype(g.dtype)) for g in got)

    def _check_against_reference(self, sig, structs, params) -> None:
        """``outs`` must be what the ``jax`` reference returns (``jax.eval_shape``).

        ``sig`` holds each input's per-example ``(shape, dtype)``. Runs when the call is
        traced (abstract evaluation), once per signature.
        """
        entry = self._reference_entry()
        if entry is None:
            return
        key = (sig, structs, tuple(sorted(params.items())) if params else ())
        got = self._ref_cache.get(key)
        if got is None:
            ins = tuple(jax.ShapeDtypeStruct(tuple(shape), dtype) for shape, dtype in sig)
            got = self._reference_structs(entry, ins, structs, params)
            self._ref_cache[key] = got
        if isinstance(got, Exception):
            raise got
        if got is _MATCHES:
            return
        ins = tuple(jax.ShapeDtypeStruct(tuple(shape), dtype) for shape, dtype in sig)
        if len(got) != len(structs):
            raise ValueError(
                f"kernel {self.name!r}: outs describes {len(structs)} output(s) but its 'jax' "
                f"reference backend returns {len(got)} for inputs {fmt_structs(ins)}: "
                f"{fmt_structs(got)}"
            )
        for i, (want, have) in enumerate(zip(got, structs)):
            if (tuple(want.shape), jnp.dtype(want.dtype)) != (tuple(have.shape), have.dtype):
                raise ValueError(
                    f"kernel {self.name!r}: outs[{i}] is {fmt_structs([have])[1:-1]} but its 'jax' "
                    f"reference backend returns {fmt_structs([want])[1:-1]} for inputs "
                    f"{fmt_structs(ins)} "
                    f"(jax.eval_shape); fix outs (or the reference)"
                )
        self._ref_cache[key] = _MATCHES  # checked once per signature

    def _abstract_eval(
        self, *avals, outs, backend=None, context=(), batch=(), debug=False, **params
    ):
        sizes = tuple(size for size, _ in batch)
        sig = []
        for i, aval in enumerate(avals):
            n_lead = _batching.n_mapped(batch, i)
            lead = aval.shape[:n_lead]
            expected = tuple(s for s, m in batch if m[i])
            if tuple(lead) != expected:
                raise ValueError(
                    f"kernel {self.name!r}: input {i} of shape {aval.shape} does not carry the "
                    f"batch dimensions {expected} its batch levels require"
                )
            sig.append((tuple(aval.shape[n_lead:]), aval.dtype))
        self._check_against_reference(tuple(sig), outs, params)
        result = [_compat.ShapedArray(sizes + tuple(o.shape), o.dtype) for o in outs]
        # Rebuilt from an input aval so shard_map's varying-axes types and explicit-mesh
        # shardings carry over to the results.
        return _sharding.result_avals(self, avals, result, outs=outs, batch=batch, params=params)



_OUTS_HINT = ("describe each output by its shape and dtype, e.g. "
              "outs=jax.ShapeDtypeStruct(x.shape, x.dtype)")


def as_struct(x, what: str) -> jax.ShapeDtypeStruct:
    """``x`` as a ``jax.ShapeDtypeStruct`` with int dimensions; errors name it ``what``.

    Example:
        >>> import numpy as np
        >>> as_struct(np.zeros((2, 3), np.float32), 'outs')
        ShapeDtypeStruct(shape=(2, 3), dtype=float32)
    """
    if not (hasattr(x, "shape") and hasattr(x, "dtype")):
        raise TypeError(
            f"{what} must be a jax.ShapeDtypeStruct (or have .shape and .dtype), got "
            f"{type(x).__name__}: {x!r}; {_OUTS_HINT}"
        )
    try:
        shape = tuple(operator.index(d) for d in x.shape)
    except TypeError:
        raise TypeError(
            f"{what} has a non-integer shape {tuple(x.shape)!r}: every dimension must be an "
            f"int"
        ) from None
    if any(d < 0 for d in shape):
        raise ValueError(f"{what} has a negative dimension: {shape}")
    try:
        dtype = jnp.dtype(x.dtype)
    except TypeError:
        raise TypeError(f"{what} has an invalid dtype {x.dtype!r}") from None
    return jax.ShapeDtypeStruct(shape, dtype)


def normalize_outs(outs) -> tuple[tuple[jax.ShapeDtypeStruct, ...], type | None]:
    """Return (structs, container) where container is None for a single output.

    Example:
        >>> import jax
        >>> normalize_outs([jax.ShapeDtypeStruct((2,), 'float32')])[1]
        <class 'list'>
    """
    if isinstance(outs, (list, tuple)):
        if not outs:
            raise ValueError("outs must describe at least one output, got an empty sequence")
        if all(isinstance(d, numbers.Integral) and not isinstance(d, bool) for d in outs):
            shape = tuple(int(d) for d in outs)
            raise TypeError(
                f"outs={outs!r} is a shape, but outs describes each output's shape and dtype: "
                f"write outs=jax.ShapeDtypeStruct({shape!r}, dtype), e.g. "
                f"jax.ShapeDtypeStruct(x.shape, x.dtype), or a list of them for several outputs"
            )
        return tuple(as_struct(o, f"outs[{i}]") for i, o in enumerate(outs)), type(outs)
    return (as_struct(outs, "outs"),), None


def _keyword_only(fn) -> set[str]:
    if fn is None:
        return set()
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return set()
    return {p.name for p in params if p.kind is p.KEYWORD_ONLY}


def fmt_structs(structs) -> str:
    """Structs as ``[float32[2, 3], ...]`` for error messages.

    Example:
        >>> import jax
        >>> fmt_structs([jax.ShapeDtypeStruct((2, 3), 'float32')])
        '[float32[2, 3]]'
    """
    return "[" + ", ".join(f"{s.dtype}{list(s.shape)}" for s in structs) + "]"
