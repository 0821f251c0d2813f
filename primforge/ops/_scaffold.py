"""What every operator family of :mod:`primforge.ops` shares: kernel wiring, rules, checks.

:class:`Family` holds a family's four kernels, keyed ``(binary, matrix)``, registers their
backends, shape rule and rules (:meth:`Family.build`) and their benchmark hooks
(:meth:`Family.install`), and makes their public calls (:meth:`Family.public`) from one
argument check per family; the checks here name the operation and the argument.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import math
import operator
import textwrap
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from primforge import _compat
from primforge._compat import Tracer
from primforge.ops._operator import Form, Operator
from primforge.ops.packed import PackedEvents, as_events

__all__ = [
    "BENCH_COLS",
    "BENCH_RATE",
    "Family",
    "bench_input",
    "check_shape",
    "float_weights",
    "index_array",
    "lazy_benchmark_data",
    "promote_input",
    "unit_weight_cotangent",
]

VARIANTS = ((False, False), (True, False), (False, True), (True, True))  # (binary, matrix)
BENCH_RATE = 0.05  # fraction of active (non-zero) inputs in the benchmark cases
BENCH_COLS = 8  # columns of the input for the matrix kernels' benchmark cases
PACKED_BACKENDS = (None, "numba")  # the backends of the kernels that read packed words


# ----------------------------------------------------------------------------- argument checks
def check_shape(shape: Any, who: str, *, int32: bool | None = None) -> tuple[int, int]:
    """``shape`` as a pair of non-negative ints; below ``2**31 - 1`` with ``int32``, which
    by default holds while ``jax_enable_x64`` is off (the indices are then int32, and a
    larger extent could only be reached through wrapped ones).

    Example:
        >>> check_shape((3, 4), 'csrmv')
        (3, 4)
        >>> check_shape((3, -1), 'csrmv')
        Traceback (most recent call last):
        ...
        ValueError: csrmv: 'shape' must be non-negative, got (3, -1)
        >>> check_shape((1, 2**33), 'csrmv', int32=True)
        Traceback (most recent call last):
        ...
        ValueError: csrmv: 'shape' must be non-negative and below 2**31 - 1, got (1, 8589934592)
    """
    if int32 is None:
        int32 = not jax.config.jax_enable_x64
    try:  # operator.index: an int or integer scalar, never a float silently truncated
        m, n = (operator.index(s) for s in shape)
    except (TypeError, ValueError):
        raise TypeError(
            f"{who}: 'shape' must be a pair of ints (rows, cols), got {shape!r}") from None
    m, n = int(m), int(n)  # NumPy scalars (uint64 included) as Python ints
    if m < 0 or n < 0:
        raise ValueError(f"{who}: 'shape' must be non-negative, got {(m, n)!r}")
    if int32 and max(m, n) >= 2**31 - 1:
        raise ValueError(f"{who}: 'shape' must be non-negative and below 2**31 - 1, got "
                         f"{(m, n)!r}")
    return m, n


def check_int32(x: Any, who: str, name: str) -> None:
    """Raise when a concrete 64-bit integer array holds values past int32 while
    ``jax_enable_x64`` is off (JAX would wrap them when it converts the array). JAX
    arrays and tracers were converted already and pass.

    Example:
        >>> check_int32(np.array([2**31]), 'CSR', 'indptr')  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: CSR: 'indptr' holds 2147483648, outside the int32 range ...
    """
    if isinstance(x, (jax.Array, Tracer)) or jax.config.jax_enable_x64:
        return
    a = np.asarray(x)
    if a.size and a.dtype.kind in "iu" and a.dtype.itemsize > 4:
        lo, hi = a.min(), a.max()
        if lo < -(2**31) or hi >= 2**31:
            bad = int(hi if hi >= 2**31 else lo)
            raise ValueError(
                f"{who}: {name!r} holds {bad}, outside the int32 range that JAX uses for "
                f"64-bit integers while jax_enable_x64 is off")


def check_count(value: Any, who: str, name: str) -> int:
    """A non-negative integer size or count (Python or NumPy integer) below ``2**31 - 1``.

    Example:
        >>> check_count(np.uint64(5), 'fixed_num', 'k')
        5
        >>> check_count(2**32, 'fixed_num', 'k')
        Traceback (most recent call last):
        ...
        ValueError: fixed_num: 'k' must be a non-negative int below 2**31 - 1, got 4294967296
    """
    try:
        v = int(operator.index(value))
    except TypeError:
        raise TypeError(f"{who}: {name!r} must be an int, got {value!r}") from None
    if not 0 <= v < 2**31 - 1:
        raise ValueError(f"{who}: {name!r} must be a non-negative int below 2**31 - 1, "
                         f"got {v}")
    return v


def index_array(x: Any, who: str, name: str) -> jax.Array:
    """``x`` as a JAX integer array, after checking concrete 64-bit values fit in int32.

    With ``jax_enable_x64`` off, JAX converts a 64-bit integer array to int32 and wraps
    values outside that range onto valid-looking indices; this raises instead, naming the
    argument. Tracers and JAX arrays (already converted) pass unchanged.

    Example:
        >>> index_array(np.array([0, 2**32 + 1]), 'csrmv', 'indices')  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: csrmv: 'indices' holds 4294967297, outside the int32 range ...
    """
    check_int32(x, who, name)
    return jnp.asarray(x)


def take_fill(arr: Any, idx: Any, fill_value: Any = 0) -> jax.Array:
    """``arr[idx]`` along the first axis, ``fill_value`` where ``idx`` is outside it; an
    empty ``arr`` (a matrix with no rows or no columns) gives ``fill_value`` everywhere,
    where XLA's gather would refuse the zero-size operand.

    Example:
        >>> take_fill(jnp.arange(3.0), jnp.array([2, 5])).tolist()
        [2.0, 0.0]
        >>> take_fill(jnp.zeros((0,)), jnp.array([0, 1])).tolist()
        [0.0, 0.0]
    """
    if arr.shape[0] == 0:
        return jnp.full(tuple(idx.shape) + tuple(arr.shape[1:]), fill_value, arr.dtype)
    return arr.at[idx].get(mode="fill", fill_value=fill_value)


def _reject_complex(a: Any, who: str, name: str) -> None:
    if jnp.issubdtype(a.dtype, jnp.complexfloating):
        raise TypeError(
            f"{who}: {name!r} is complex ({a.dtype}); the operators compute in real floating "
            f"point. Pass the real and imaginary parts in two calls, or a real array."
        )


def float_weights(weights: Any, *, scalar_as_vector: bool = True, who: str = "weights",
                  name: str = "weights") -> jax.Array:
    """``weights`` as a floating JAX array; a scalar becomes shape ``(1,)`` (one shared weight).

    Integer and bool weights are promoted to JAX's default float dtype; complex ones raise
    ``TypeError`` naming the argument (``who``: the operator, ``name``: the argument).

    Example:
        >>> float_weights(2)
        Array([2.], dtype=float32)
    """
    weights = jnp.asarray(weights)
    _reject_complex(weights, who, name)
    if scalar_as_vector and weights.ndim == 0:
        weights = weights.reshape(1)
    if not jnp.issubdtype(weights.dtype, jnp.floating):
        weights = weights.astype(jnp.result_type(float))
    return weights


def promote_input(weights: jax.Array, x: Any, binary: bool, *, who: str = "input",
                  name: str = "x") -> tuple[jax.Array, jax.Array]:
    """Give a float product's input and weights one floating dtype (binary input is kept).

    As in ``jnp.matmul``, an integer or bool input of a float product is promoted to the
    weights' dtype, and a float input of another precision promotes both to the wider one.
    A complex input raises ``TypeError`` naming the argument (``name``), in float and
    binary products alike. Bit-packed events (:class:`~primforge.ops.PackedEvents`) are
    unpacked to bool here.

    Example:
        >>> w, x = promote_input(jnp.ones(2, jnp.float32), [1, 0], binary=False)
        >>> w.dtype, x.dtype
        (dtype('float32'), dtype('float32'))
    """
    x = jnp.asarray(as_events(x))
    _reject_complex(x, who, name)
    if not binary:
        if not jnp.issubdtype(x.dtype, jnp.floating):
            x = x.astype(weights.dtype)
        elif x.dtype != weights.dtype:
            x = x.astype(jnp.promote_types(x.dtype, weights.dtype))
            weights = weights.astype(x.dtype)
    return weights, x


# ----------------------------------------------------------------------------- public calls
def public_function(name: str, module: str, signature: inspect.Signature,
                    body: Callable[[dict], Any], doc: str) -> Callable:
    """A function ``name`` of ``module`` with ``signature`` and the docstring ``doc``: a call
    binds its arguments to ``signature`` (defaults filled in) and returns ``body`` of them,
    a dict by name. The operators' public calls are made so, from one body per family.

    Example:
        >>> f = public_function('f', __name__, inspect.signature(lambda a, *, b=2: None),
        ...                     lambda args: args['a'] + args['b'], 'Add.')
        >>> f(1), f(a=1, b=5), str(inspect.signature(f))
        (3, 6, '(a, *, b=2)')
        >>> f()
        Traceback (most recent call last):
        ...
        TypeError: f() missing a required argument: 'a'
    """

    def call(*args, **kwargs):
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as e:  # as Python words it, with the function's name
            raise TypeError(f"{name}() {e}") from None
        bound.apply_defaults()
        return body(bound.arguments)

    call.__name__ = call.__qualname__ = name
    call.__module__, call.__doc__, call.__signature__ = module, doc, signature
    return call


def document(doc: str, signature: inspect.Signature, entries: dict[str, str]) -> str:
    """``doc`` with ``{args}`` replaced by the Args section of ``signature`` (its parameters'
    entries from ``entries``) and the Returns section ``entries['returns']``.

    Example:
        >>> print(document('''Scale.
        ...
        ...     {args}''', inspect.signature(lambda x, *, n=1: None),
        ...     {'x': 'the input.', 'n': 'how often.', 'returns': 'The result.'}))
        Scale.
        <BLANKLINE>
        Args:
            x: the input.
            n: how often.
        <BLANKLINE>
        Returns:
            The result.
    """
    wrap = functools.partial(textwrap.wrap, width=88, initial_indent=" " * 4,
                             break_long_words=False, break_on_hyphens=False)
    lines = ["Args:"]
    for name in signature.parameters:
        lines += wrap(f"{name}: {entries[name]}", subsequent_indent=" " * 8)
    lines += ["", "Returns:", *wrap(entries["returns"], subsequent_indent=" " * 8)]
    return inspect.cleandoc(doc).replace("{args}", "\n".join(lines))


# ----------------------------------------------------------------------------- autodiff helpers
def unit_weight_cotangent(product: Callable, ct: jax.Array, dtype, size: int) -> jax.Array:
    """``d<ct, A(w) x>/dw`` for ``A`` linear in the ``size`` weight parameters ``w``.

    ``product(e)`` is the kernel call with the parameter vector ``e``; the cotangent of
    parameter ``k`` is ``<ct, product(e_k)>`` (one kernel call each: for one shared weight,
    a single event-driven call with unit weight).
    """
    grads = []
    for k in range(size):
        e_k = jnp.ones((1,), dtype) if size == 1 else jnp.zeros((size,), dtype).at[k].set(1)
        grads.append(jnp.sum(ct * product(e_k)))
    return jnp.stack(grads).astype(dtype)


# ----------------------------------------------------------------------------- benchmark data
def bench_input(rs: np.random.RandomState, rows: int, binary: bool, matrix: bool) -> np.ndarray:
    """A benchmark input: ``BENCH_RATE`` of its entries active (bool, or float32 normal)."""
    shape = (rows, BENCH_COLS) if matrix else (rows,)
    active = rs.random_sample(shape) < BENCH_RATE
    if binary:
        return active
    return np.where(active, rs.standard_normal(shape), 0.0).astype(np.float32)


def bench_grad_inputs(rs: np.random.RandomState, n: int):
    """The weight gradients' benchmark inputs of a square matrix of ``n`` rows: ``(x, ct,
    flags)`` for each variant (``flags``: ``binary``, ``matrix``, ``transpose``), a tenth
    of the sources silent."""
    for binary in (True, False):
        for matrix in (False, True):
            for transpose in (False, True):
                x = bench_input(rs, n, binary, matrix)
                x[: n // 10] = 0
                ct = rs.standard_normal(x.shape).astype(np.float32)
                yield x, ct, {"binary": binary, "matrix": matrix, "transpose": transpose}


# ----------------------------------------------------------------------------- the family
class Family:
    """The forms of one operator family's kernel and the rules they share.

    The family's one kernel (:attr:`operator`) takes the static params ``events``
    (``'float'``, ``'bool'``, ``'spikes'``, ``'packed'``) and ``matrix``; :meth:`build`
    adds the four dense forms and :meth:`public` their public calls,
    :mod:`primforge.ops._spikes` the spike-list and packed forms and their calls.

    Args:
        op: the kernel's name (``'csr'``: ``primforge.ops.csr``).
        stems: the names of the vector and the matrix product (``'csrmv', 'csrmm'``); binary
            products get the prefix ``binary_``.
        params: the static params every kernel call takes (forwarded by the rules).
        what: how error messages name the family's products (``'CSR products'``).
        weights: how they name the weights (``'data'``); ``structure``: the structure
            arguments (``"'indices' or 'indptr'"``; empty for none).
        letter, cols, ops: how shape errors name the matrix, the input's columns and the
            two directions (``'W @ x'``, ``'W.T @ x'``).
        dims: how the docstrings name the matrix's rows and columns.
        inputs: the name of the float input of the vector and of the matrix product (a
            binary product's is ``events``).
        doc: the kernels' description (the defining module's docstring).
    """

    def __init__(self, op: str, stems: tuple[str, str], *, params: Sequence[str], what: str,
                 weights: str = "weights", structure: str = "", letter: str = "W",
                 cols: str = "k", ops: tuple[str, str] = ("W @ x", "W.T @ x"),
                 dims: tuple[str, str] = ("rows", "cols"),
                 inputs: tuple[str, str] = ("vector", "matrix"), doc: str = ""):
        self.stems, self.params, self.what = stems, tuple(params), what
        self.weights, self.structure = weights, structure
        self.letter, self.cols, self.ops, self.doc = letter, cols, ops, doc
        self.dims, self.inputs = dims, inputs
        self.operator = Operator(op, keys=("events", "matrix"), doc=doc)
        self.kernels: dict[tuple[bool, bool], Form] = {}
        #: The call of the kernel reading packed events (:func:`~primforge.ops._spikes.packed`)
        self.packed_product: Callable[[dict], jax.Array] | None = None

    def name(self, binary: bool, matrix: bool) -> str:
        """The public name of one variant (``binary_csrmm``)."""
        return ("binary_" if binary else "") + self.stems[int(bool(matrix))]

    def call(self, binary: bool, matrix: bool, *args, backend=None, **params):
        """Bind one variant's kernel."""
        return self.kernels[(binary, matrix)](*args, backend=backend, **params)

    def own_params(self, kw: dict) -> dict:
        """The family's static params among ``kw``."""
        return {k: kw[k] for k in self.params if k in kw}  # optional params may be absent

    # ------------------------------------------------------------------ shape rule
    def output(self, who: str, x, shape: tuple[int, int], dtype, *, binary: bool,
               matrix: bool, transpose: bool) -> jax.ShapeDtypeStruct:
        """Check the input against ``A`` of ``shape``; the output's shape and dtype."""
        m, n = shape
        rows_in, rows_out = (m, n) if transpose else (n, m)
        if len(x.shape) != (2 if matrix else 1) or x.shape[0] != rows_in:
            what = f"({rows_in}, {self.cols})" if matrix else f"({rows_in},)"
            raise ValueError(
                f"{who}: for {self.ops[bool(transpose)]} with {self.letter} of shape {(m, n)} "
                f"the input must have shape {what}, got {tuple(x.shape)}"
            )
        if not binary and not jnp.issubdtype(x.dtype, jnp.floating):
            raise TypeError(f"{who}: the input must be floating point, got {x.dtype}; use "
                            f"binary_{who} for bool or integer events")
        return jax.ShapeDtypeStruct((rows_out,) + tuple(x.shape[1:]), dtype)

    # ------------------------------------------------------------------ rules
    def jvp_rule(self, binary: bool, matrix: bool):
        """Bilinear JVP: ``A(dw) x + A(w) dx`` (the tangent of ``x`` through the float kernel)."""

        def jvp(primals, tangents, *, outs, backend=None, **kw):
            kw = self.own_params(kw)
            w, *structure, x = primals
            d_w, d_x = tangents[0], tangents[-1]
            y = self.call(binary, matrix, w, *structure, x, backend=backend, **kw)
            t = None
            if type(d_w) is not _compat.Zero:
                t = self.call(binary, matrix, d_w, *structure, x, backend=backend, **kw)
            if type(d_x) is not _compat.Zero:
                tx = self.call(False, matrix, w, *structure, d_x.astype(w.dtype),
                               backend=backend, **kw)
                t = tx if t is None else t + tx
            return [y], [t]

        return jvp

    def transpose_rule(self, binary: bool, matrix: bool, weight_cotangent: Callable):
        """Transpose w.r.t. ``x`` (flipped float kernel) or ``w`` (``weight_cotangent``).

        ``weight_cotangent(binary, matrix, ct, w_aval, structure, x, backend=..., **params)``
        returns the weights' cotangent.
        """

        def transpose_rule(cts, *args, outs, backend=None, **kw):
            kw = self.own_params(kw)
            (ct,), (w, *structure, x) = cts, args
            none = [None] * len(args)
            if type(ct) is _compat.Zero:
                return none
            if any(_compat.is_undefined_primal(s) for s in structure):
                raise ValueError(f"{self.what} are not linear in {self.structure}")
            ct = jnp.asarray(ct)
            if _compat.is_undefined_primal(x):
                if _compat.is_undefined_primal(w):
                    raise ValueError(f"{self.what} are bilinear: transpose w.r.t. "
                                     f"{self.weights} or x, not both")
                flipped = dict(kw, transpose=not kw["transpose"])
                ct_x = self.call(False, matrix, w, *structure, ct.astype(w.dtype),
                                 backend=backend, **flipped)
                return none[:-1] + [ct_x.astype(x.aval.dtype)]
            if _compat.is_undefined_primal(w):
                ct_w = weight_cotangent(binary, matrix, ct, w.aval, structure, jnp.asarray(x),
                                        backend=backend, **kw)
                return [ct_w] + none[1:]
            return none

        return transpose_rule

    def batching_rule(self, binary: bool, matrix: bool):
        """``vmap``: one matrix call when only ``x`` is batched, else ``lax.map``."""

        def batch(args, axes, *, outs, backend=None, **kw):
            kw = self.own_params(kw)
            *fixed, x = args
            if all(ax is None for ax in axes[:-1]):
                # Only the input is batched: the batch becomes extra columns of one call.
                xb = jnp.moveaxis(x, axes[-1], 1)  # (rows_in, batch) or (rows_in, batch, k)
                size = xb.shape[1]
                # Explicit sizes: a reshape with -1 is undefined when a dimension is zero.
                flat = xb.reshape(xb.shape[0], math.prod(xb.shape[1:]))
                y = self.call(binary, True, *fixed, flat, backend=backend, **kw)
                return [y.reshape((y.shape[0], size) + tuple(xb.shape[2:]))], [1]
            # Batched weights or structure: one kernel call per batch element.
            moved = [a if ax is None else jnp.moveaxis(a, ax, 0) for a, ax in zip(args, axes)]
            mapped = [ax is not None for ax in axes]

            def one(sliced):
                it = iter(sliced)
                full = [next(it) if mp else a for a, mp in zip(moved, mapped)]
                return self.call(binary, matrix, *full, backend=backend, **kw)

            return [jax.lax.map(one, [a for a, mp in zip(moved, mapped) if mp])], [0]

        return batch

    # ------------------------------------------------------------------ building
    def build(self, *, jax_gen: Callable, numba_gen: Callable, shape_rule: Callable,
              weight_cotangent: Callable, tags: Sequence[str], cuda_gen: Callable | None = None,
              pallas_module: str | None = None) -> tuple[Form, ...]:
        """Make the four dense forms (float vector, binary vector, float matrix, binary matrix).

        The generator arguments are factories ``gen(binary, matrix)``; ``pallas_module``
        names the module whose ``generator`` makes the opt-in Pallas kernels.
        """
        # The packed form (primforge.ops._spikes.packed) is built on these.
        self.jax_gen, self.shape_rule, self.weight_cotangent = jax_gen, shape_rule, weight_cotangent
        for binary, matrix in VARIANTS:
            kernel = self.operator.form(self.name(binary, matrix), doc=self.doc,
                                        events="bool" if binary else "float", matrix=matrix)
            reference = jax_gen(binary, matrix)
            for platform in ("cpu", "gpu", "tpu"):
                kernel.def_kernel("jax", platform, reference)
            kernel.def_numba_kernel(numba_gen(binary, matrix), asdefault=True)
            if cuda_gen is not None:  # CUDA C++ on the GPU, its C++ twin on the CPU; opt-in
                for platform in ("gpu", "cpu"):
                    kernel.def_cuda_raw_kernel(cuda_gen(binary, matrix), platform=platform)
            if pallas_module is not None:  # Triton on the GPU, interpreted on the CPU; opt-in
                for platform in ("gpu", "cpu"):
                    kernel.def_pallas_kernel(
                        platform, _deferred(pallas_module, binary, matrix, jax_gen))
            kernel.def_abstract_eval(shape_rule(binary, matrix))
            kernel.def_jvp_rule(self.jvp_rule(binary, matrix))
            kernel.def_transpose_rule(self.transpose_rule(binary, matrix, weight_cotangent))
            kernel.def_batching_rule(self.batching_rule(binary, matrix))
            kernel.def_tags(*tags, "event" if binary else "float", "matmat" if matrix else "matvec")
            self.kernels[(binary, matrix)] = kernel
        return tuple(self.kernels[v] for v in VARIANTS)

    # ------------------------------------------------------------------ public calls
    def def_public(self, signature: Callable, operands: Callable, args: dict[str, str]) -> None:
        """How the family's public calls take their arguments (:meth:`public`,
        :func:`~primforge.ops._spikes.forms`, :func:`~primforge.ops._spikes.packed`).

        Args:
            signature: a function with the signature of the vector and matrix products,
                their input named ``x``.
            operands: ``operands(who, arguments) -> (weights, structure, params)``: checks
                every argument but the input (``who`` names the call, ``arguments`` is a
                dict by name) and gives the kernel's operands and static params.
            args: the entry of each parameter in the docstrings' Args section, and
                ``'returns'``, their Returns section.
        """
        self.signature, self.operands, self.args = inspect.signature(signature), operands, args

    def input_name(self, binary: bool, matrix: bool) -> str:
        """The name of a product's input argument (``vector``, ``matrix``, ``events``)."""
        return "events" if binary else self.inputs[int(bool(matrix))]

    def input_entry(self, binary: bool, matrix: bool) -> str:
        """The docstrings' entry of a product's input argument."""
        m, n = self.dims
        kind = "bool (or numeric: non-zero is active)" if binary else "float"
        if matrix:
            return (f"{kind} matrix ``({n}, {self.cols})`` (``({m}, {self.cols})`` with "
                    f"``transpose``).")
        return f"{kind} vector of length ``{n}`` (``{m}`` with ``transpose``)."

    def named(self, xname: str) -> inspect.Signature:
        """The products' signature with their input named ``xname``."""
        params = self.signature.parameters.values()
        return self.signature.replace(
            parameters=[p.replace(name=xname) if p.name == "x" else p for p in params])

    def public(self, binary: bool, matrix: bool, module: str, doc: str) -> Callable:
        """The public call of one product (``csrmv``), a function of ``module`` whose
        docstring is ``doc`` with the family's Args section in place of ``{args}``, and the
        kernel's call function.

        The binary vector product hands a :class:`~primforge.ops.PackedEvents` vector to
        the kernel reading the words (:func:`~primforge.ops._spikes.packed`) on the
        backends it has.
        """
        who, xname = self.name(binary, matrix), self.input_name(binary, matrix)

        def product(args: dict) -> jax.Array:
            x, backend = args[xname], args["backend"]
            if (binary and not matrix and self.packed_product is not None
                    and backend in PACKED_BACKENDS and isinstance(x, PackedEvents)
                    and x.words.ndim == 1):
                return self.packed_product(args)
            weights, structure, params = self.operands(who, args)
            weights, x = promote_input(weights, x, binary, who=who, name=xname)
            return self.call(binary, matrix, weights, *structure, x, backend=backend, **params)

        sig = self.named(xname)
        entries = dict(self.args, **{xname: self.input_entry(binary, matrix)})
        call = public_function(who, module, sig, product, document(doc, sig, entries))
        self.kernels[(binary, matrix)].def_call(call)  # kernel.call, kernel.benchmark
        return call

    def install(self, bench: str) -> None:
        """Give each kernel its benchmark data: ``bench`` names the module of the cases,
        imported only when benchmark data is asked for. A kernel's data is one config per
        entry of its ``CASES``, ``case(rs, entry, binary, matrix) -> (args, kwargs,
        params)`` with ``rs`` a ``RandomState(SEED + i)``."""
        for (binary, matrix), kernel in self.kernels.items():
            kernel.def_benchmark_data(_configs(bench, binary, matrix))


def _deferred(module: str, binary: bool, matrix: bool, reference: Callable):
    """A generator that imports ``module`` (Pallas, Triton) when first used: its
    ``generator(binary, matrix, fallback)``, ``fallback`` the ``jax`` one."""

    def generate(**kw):
        make = importlib.import_module(module).generator
        return make(binary, matrix, reference(binary, matrix))(**kw)

    return generate


def _configs(bench, binary, matrix):
    def configs(*, platform: str) -> list:
        del platform  # the same small cases everywhere
        from primforge.bench import BenchmarkConfig

        cases = importlib.import_module(bench)
        out = []
        for i, entry in enumerate(cases.CASES):
            rs = np.random.RandomState(cases.SEED + i)
            args, kwargs, params = cases.case(rs, entry, binary, matrix)
            out.append(BenchmarkConfig(args=args, kwargs=kwargs, params=params))
        return out

    return configs


def lazy_benchmark_data(module: str, name: str) -> Callable[..., list]:
    """Benchmark data ``fn(*, platform)`` that imports ``module`` on first use and calls its
    function ``name``: the cases stay out of the operators' import path.

    Example:
        >>> fn = lazy_benchmark_data("primforge.ops.plasticity.bench", "dense")
        >>> [config.params["n"] for config in fn(platform="cpu")]
        [500, 500, 2000, 2000]
    """

    def configs(*, platform: str) -> list:
        return getattr(importlib.import_module(module), name)(platform=platform)

    return configs
