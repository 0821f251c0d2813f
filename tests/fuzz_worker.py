"""Worker process for the kernel fuzz test: runs one case per request, Numba vs ``jax``.

Run as a script by :mod:`test_fuzz_kernels` (through :class:`subproc_utils.Worker`), so a
kernel that takes the process down is reported with its case instead of killing pytest.
A request is a JSON case: ``op`` (``axpy``, ``square``, ``sum_all``, ``sum_last``),
``dtype``, ``shape`` (the logical input shape), ``layout`` (how the input is produced
inside ``jax.jit`` from a base array: ``contig``, ``transpose``, ``slice``, ``reverse``,
``broadcast``), ``perm``/``axis`` for the layout, ``seed``, ``factors`` (values of a
static param that the ``axpy`` and ``square`` Numba kernels hold in their closure, run
in this order; ``vmap`` uses the first), and ``vmap`` (``null`` or ``[batch size, whether
the second input is batched]``). The reply is ``{"ok": bool,
"detail": str}``: the primitive's ``numba`` backend against its ``jax`` backend, which is
plain ``jax.numpy`` written independently here, both jitted, and both under ``jax.vmap``.

Importing this module does nothing but define functions (pytest imports it for doctests).
"""

from __future__ import annotations

import json
import sys
import traceback
import warnings

import numpy as np

_KERNELS: dict = {}


def _numba_generators():
    """op -> generator; ``axpy`` and ``square`` close over their ``factor`` param."""
    import numba

    # Each kernel sees C-contiguous arrays of any rank; it works on flat views.
    def gen_axpy(factor, **_):
        @numba.njit
        def nb_axpy(x, y, out):
            xf = x.reshape(x.size)
            yf = y.reshape(y.size)
            of = out.reshape(out.size)
            for i in range(of.size):
                of[i] = xf[i] * factor + yf[i]

        return nb_axpy

    def gen_square(factor, **_):
        @numba.njit
        def nb_square(x, out):
            xf = x.reshape(x.size)
            of = out.reshape(out.size)
            for i in range(of.size):
                of[i] = factor * xf[i] * xf[i]

        return nb_square

    @numba.njit
    def nb_sum_all(x, out):
        xf = x.reshape(x.size)
        of = out.reshape(1)
        of[0] = 0
        for i in range(xf.size):
            of[0] += xf[i]

    @numba.njit
    def nb_sum_last(x, out):
        xf = x.reshape(x.size)
        of = out.reshape(out.size)
        n = x.shape[-1]
        for i in range(of.size):
            of[i] = 0
            for j in range(n):
                of[i] += xf[i * n + j]

    return {
        "axpy": gen_axpy,
        "square": gen_square,
        "sum_all": lambda **_: nb_sum_all,
        "sum_last": lambda **_: nb_sum_last,
    }


def _acc(dtype):
    """Dtype the reference computes in: what the Numba kernel sees (float16 as float32)."""
    import jax.numpy as jnp

    dtype = jnp.dtype(dtype)
    if dtype == jnp.float16:
        return jnp.float32
    if dtype == jnp.bool_:
        return jnp.int32
    return dtype


def _reference(op):
    import jax.numpy as jnp

    def gen(outs, factor=None, **_):
        od = outs[0].dtype
        if op == "axpy":
            return lambda x, y: (factor * x.astype(_acc(x.dtype)) + y.astype(_acc(y.dtype))).astype(
                od
            )
        if op == "square":
            return lambda x: (factor * x.astype(_acc(x.dtype)) * x.astype(_acc(x.dtype))).astype(od)
        if op == "sum_all":
            return lambda x: jnp.sum(x.astype(_acc(x.dtype))).astype(od)
        return lambda x: jnp.sum(x.astype(_acc(x.dtype)), axis=-1).astype(od)

    return gen


def kernel(op):
    """The fuzzed primitive for ``op``: a ``numba`` and a ``jax`` backend on CPU."""
    if op not in _KERNELS:
        import primforge

        k = primforge.XLACustomKernel(f"fuzz_{op}")
        k.def_numba_kernel(_numba_generators()[op])
        k.def_kernel("jax", "cpu", _reference(op))
        _KERNELS[op] = k
    return _KERNELS[op]


def out_struct(op, shape, dtype):
    """Output shape and dtype of ``op`` on an input of ``shape`` and ``dtype``.

    Example:
        >>> out_struct("sum_last", [2, 3], "bool")
        ShapeDtypeStruct(shape=(2,), dtype=int32)
    """
    import jax

    shape = tuple(shape)
    od = "int32" if (dtype == "bool" and op.startswith("sum")) else dtype
    if op == "sum_all":
        shape = ()
    elif op == "sum_last":
        shape = shape[:-1]
    return jax.ShapeDtypeStruct(shape, od)


def layout_plan(case):
    """(base shape, function base -> input of the case's logical shape) for its layout.

    Example:
        >>> import numpy as np
        >>> base, lay = layout_plan({"shape": [2, 3], "layout": "slice", "axis": 1})
        >>> base, lay(np.zeros(base)).shape
        ((2, 7), (2, 3))
    """
    import jax.numpy as jnp

    shape, kind = list(case["shape"]), case["layout"]
    if kind == "transpose":
        perm = case["perm"]
        base = [0] * len(shape)
        for i, p in enumerate(perm):
            base[p] = shape[i]
        return tuple(base), lambda b: jnp.transpose(b, perm)
    if kind == "slice":
        a = case["axis"]
        base = list(shape)
        base[a] = 2 * shape[a] + 1
        idx = tuple(slice(1, None, 2) if i == a else slice(None) for i in range(len(shape)))
        return tuple(base), lambda b: b[idx]
    if kind == "reverse":
        a = case["axis"]
        return tuple(shape), lambda b: jnp.flip(b, axis=a)
    if kind == "broadcast":
        a = case["axis"]
        base = list(shape)
        base[a] = 1
        return tuple(base), lambda b: jnp.broadcast_to(b, tuple(shape))
    return tuple(shape), lambda b: b


def random_array(rng, shape, dtype):
    """Random values of ``dtype`` small enough that no sum here overflows or rounds badly."""
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype.startswith("int"):
        return rng.integers(-20, 21, size=shape).astype(dtype)
    if dtype.startswith("complex"):
        return (rng.normal(size=shape) + 1j * rng.normal(size=shape)).astype(dtype)
    return rng.normal(size=shape).astype(dtype)


_RTOL = {"float16": 2e-3, "float32": 1e-5, "complex64": 1e-5, "float64": 1e-12}


def compare(got, want, scale, what):
    """'' when equal (exactly for ints/bools, to a dtype tolerance for floats), else why.

    Example:
        >>> compare(np.array([1, 2]), np.array([1, 2]), 0.0, "t")
        ''
        >>> compare(np.array([1.0, 2.5]), np.array([1.0, 2.0]), 0.0, "t").split(";")[0]
        't: 1 of 2 elements differ'
    """
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape or got.dtype != want.dtype:
        return (
            f"{what}: numba gave {got.dtype}{list(got.shape)}, "
            f"jax {want.dtype}{list(want.shape)}"
        )
    if got.dtype.kind in "biu":
        bad = got != want
    else:
        rtol = _RTOL[got.dtype.name]
        g, w = got.astype(np.complex128), want.astype(np.complex128)
        bad = ~(np.abs(g - w) <= rtol * (np.abs(w) + scale)) | (np.isnan(g) != np.isnan(w))
    if not bad.any():
        return ""
    first = tuple(int(i) for i in np.argwhere(bad)[0])
    return (
        f"{what}: {int(bad.sum())} of {bad.size} elements differ; first at index {first}: "
        f"numba {got[first]!r} vs jax {want[first]!r}"
    )


def run_case(case):
    """Run one case; return ``(ok, detail)``."""
    import jax

    op, dtype = case["op"], case["dtype"]
    k = kernel(op)
    rng = np.random.default_rng(case["seed"])
    base_shape, lay = layout_plan(case)
    n_in = 2 if op == "axpy" else 1
    spec = out_struct(op, case["shape"], dtype)
    factors = case["factors"] if op in ("axpy", "square") else [None]

    def call(backend, factor):
        params = {} if factor is None else {"factor": factor}
        return lambda *bs: k(*(lay(b) for b in bs), outs=spec, backend=backend, **params)

    problems = []
    bases = [random_array(rng, base_shape, dtype) for _ in range(n_in)]
    scale = 5.0 * sum(float(np.abs(b.astype(np.complex128)).sum()) for b in bases) + 1.0
    for f in factors:
        got = jax.jit(call("numba", f))(*bases)
        want = jax.jit(call("jax", f))(*bases)
        problems.append(compare(got, want, scale * 1e-3, f"jit, factor={f}"))
    if case["vmap"] is not None:
        size, second = case["vmap"]
        axes = (0, 0 if second else None)[:n_in]
        bb = [
            random_array(rng, ((size,) if ax == 0 else ()) + base_shape, dtype)
            for ax in axes
        ]
        scale = 5.0 * sum(float(np.abs(b.astype(np.complex128)).sum()) for b in bb) + 1.0
        got = jax.jit(jax.vmap(call("numba", factors[0]), in_axes=axes))(*bb)
        want = jax.jit(jax.vmap(call("jax", factors[0]), in_axes=axes))(*bb)
        problems.append(compare(got, want, scale * 1e-3, f"vmap(in_axes={axes}, size={size})"))
    problems = [p for p in problems if p]
    return not problems, "; ".join(problems)


def main():
    import jax

    jax.config.update("jax_enable_x64", True)  # int64 / float64 cases keep their dtype
    for line in sys.stdin:
        case = json.loads(line)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                ok, detail = run_case(case)
            except Exception as e:  # noqa: BLE001  (reported to the test with the case)
                ok, detail = False, f"raised {type(e).__name__}: {e}\n{traceback.format_exc()}"
        relevant = [w for w in caught if not issubclass(w.category, DeprecationWarning)]
        if relevant:
            ok = False
            detail += "; warnings: " + "; ".join(
                f"{w.category.__name__}: {w.message}" for w in relevant
            )
        print("PFREPLY " + json.dumps({"ok": ok, "detail": detail}), flush=True)


if __name__ == "__main__":
    main()
