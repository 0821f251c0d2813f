"""The Numba backend served by the typed XLA FFI: results against jax.numpy references."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

numba = pytest.importorskip("numba")

from primforge.backends import numba as nb

S = jax.ShapeDtypeStruct


@numba.njit
def copy_scaled(x, out):
    # Works for every rank (including 0) and dtype: flat views of C-contiguous arrays.
    xf = x.reshape(x.size)
    of = out.reshape(out.size)
    for i in range(xf.size):
        of[i] = xf[i] + xf[i]


@numba.njit
def logical_not(x, out):
    xf = x.reshape(x.size)
    of = out.reshape(out.size)
    for i in range(xf.size):
        of[i] = not xf[i]


@numba.njit
def affine(x, out):
    for i in range(x.size):
        out[i] = 2 * x[i] + 1


def _call(kernel, ins, outs, *args, jit=True, **kw):
    f = nb.make_callable(kernel, ins=ins, outs=outs, platform="cpu", name="t", **kw)
    return (jax.jit(f) if jit else f)(*args)


def _data(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    dtype = jnp.dtype(dtype)
    if dtype == jnp.bool_:
        return jnp.asarray(rng.integers(0, 2, shape).astype(bool))
    if jnp.issubdtype(dtype, jnp.complexfloating):
        return jnp.asarray((rng.normal(size=shape) + 1j * rng.normal(size=shape)).astype(dtype))
    if jnp.issubdtype(dtype, jnp.floating):
        return jnp.asarray(rng.normal(size=shape)).astype(dtype)
    info = jnp.iinfo(dtype)
    lo, hi = max(int(info.min) // 4, -100), min(int(info.max) // 4, 100)
    return jnp.asarray(rng.integers(lo, hi, shape)).astype(dtype)


NUMERIC = [
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "complex64",
    "complex128",
]


@pytest.mark.parametrize("dtype", NUMERIC)
@pytest.mark.parametrize("shape", [(), (5,), (2, 0, 3), (2, 1, 2, 3)])
def test_every_dtype_and_rank_matches_jnp(dtype, shape):
    jax.config.update("jax_enable_x64", True)
    try:
        x = _data(shape, dtype)
        spec = S(shape, x.dtype)
        for jit in (True, False):
            (y,) = _call(copy_scaled, (spec,), (spec,), x, jit=jit)
            assert y.dtype == x.dtype and y.shape == x.shape
            np.testing.assert_array_equal(np.asarray(y), np.asarray(x + x))
    finally:
        jax.config.update("jax_enable_x64", False)


def test_bool_dtype():
    x = _data((7,), bool)
    (y,) = _call(logical_not, (S((7,), bool),), (S((7,), bool),), x)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(jnp.logical_not(x)))


@numba.njit
def flip_sign_bits(x, out):
    for i in range(x.size):
        out[i] = x[i] ^ np.uint16(0x8000)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_as_bits_gives_bit_patterns(dtype):
    x = _data((6,), dtype)
    k = nb.numba_kernel(flip_sign_bits, outs=S((6,), dtype), half_as="bits")
    y = jax.jit(k)(x)
    assert y.dtype == x.dtype
    np.testing.assert_array_equal(np.asarray(y), np.asarray(-x))


def test_scalar_kernel_sees_zero_d_arrays():
    @numba.njit
    def scalar(x, out):
        out[()] = x[()] * 3 + 1

    x = jnp.float32(2.5)
    (y,) = _call(scalar, (S((), jnp.float32),), (S((), jnp.float32),), x)
    assert y.shape == () and float(y) == 8.5


@numba.njit
def several(x, n, a, b, c):
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            a[i, j] = x[i, j] * n[j]
    for j in range(n.size):
        b[j] = n[j] - 1
    c[()] = x.sum()


def test_several_inputs_and_outputs():
    x = _data((3, 4), jnp.float32)
    n = jnp.arange(4, dtype=jnp.int32)
    ins = (S((3, 4), jnp.float32), S((4,), jnp.int32))
    outs = (S((3, 4), jnp.float32), S((4,), jnp.int32), S((), jnp.float32))
    a, b, c = _call(several, ins, outs, x, n)
    np.testing.assert_allclose(a, x * n, rtol=1e-6)
    np.testing.assert_array_equal(b, n - 1)
    np.testing.assert_allclose(c, x.sum(), rtol=1e-5)


def test_numba_kernel_single_and_tuple_outputs():
    spec = S((5,), jnp.float32)
    x = jnp.arange(5.0, dtype=jnp.float32)
    y = nb.numba_kernel(affine, outs=spec)(x)
    assert isinstance(y, jax.Array)
    np.testing.assert_allclose(y, 2 * x + 1)
    ys = jax.jit(nb.numba_kernel(affine, outs=[spec]))(x)
    assert isinstance(ys, tuple) and len(ys) == 1
    np.testing.assert_allclose(ys[0], 2 * x + 1)


@numba.njit
def add_into(acc, x, out):
    # `out` shares `acc`'s buffer: read before write, element by element.
    for i in range(acc.size):
        out[i] = acc[i] + x[i]


def test_aliasing_with_donation():
    spec = S((6,), jnp.float32)
    k = nb.numba_kernel(add_into, outs=spec, input_output_aliases={0: 0})
    f = jax.jit(k, donate_argnums=0)
    acc = jnp.arange(6.0, dtype=jnp.float32)
    x = jnp.ones(6, jnp.float32)
    expected = np.asarray(acc) + 1
    y = f(acc, x)
    np.testing.assert_allclose(y, expected)
    assert acc.is_deleted()  # the buffer was donated and reused
    hlo = jax.jit(k, donate_argnums=0).lower(jnp.zeros(6), x).as_text()
    assert "tf.aliasing_output" in hlo or "output_operand_alias" in hlo


def test_aliasing_without_donation_keeps_input():
    spec = S((3,), jnp.float32)
    k = nb.numba_kernel(add_into, outs=spec, input_output_aliases={0: 0})
    acc = jnp.array([1.0, 2.0, 3.0])
    y = jax.jit(k)(acc, jnp.ones(3))
    np.testing.assert_allclose(y, [2.0, 3.0, 4.0])
    np.testing.assert_allclose(acc, [1.0, 2.0, 3.0])


@numba.njit(parallel=True)
def par_affine(x, out):
    for i in numba.prange(x.size):
        out[i] = 2 * x[i] + 1


def test_parallel_kernel_at_large_size():
    n = 1_000_003
    x = _data((n,), jnp.float32)
    (y,) = _call(par_affine, (S((n,), jnp.float32),), (S((n,), jnp.float32),), x)
    np.testing.assert_allclose(y, 2 * x + 1, rtol=1e-6)


@numba.njit
def checked_sqrt(x, out):
    for i in range(x.size):
        if x[i] < 0:
            return 7
        out[i] = np.sqrt(x[i])
    return 0


@numba.njit
def raising(x, out):
    for i in range(x.size):
        if x[i] < 0:
            raise ValueError("negative input")
        out[i] = x[i]


@pytest.mark.parametrize(
    "kernel,label,ok",
    [
        (checked_sqrt, "non-zero status", [1.0, 2.0, 3.0]),
        (raising, "raised", [1.0, 4.0, 9.0]),
    ],
)
def test_failures_raise_and_next_call_works(kernel, label, ok):
    spec = S((3,), jnp.float32)
    f = jax.jit(nb.make_callable(kernel, ins=(spec,), outs=(spec,), platform="cpu", name="failing"))
    with pytest.raises(Exception, match=label) as info:
        jax.block_until_ready(f(jnp.array([1.0, -1.0, 4.0])))
    assert "failing" in str(info.value) and kernel.py_func.__name__ in str(info.value)
    (y,) = f(jnp.array([1.0, 4.0, 9.0]))
    np.testing.assert_allclose(y, ok)


@numba.njit
def scale_rows(x, w, out):
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            out[i, j] = x[i, j] * w[j] + 1


def _scale_rows_ref(x, w):
    return x * w[None, :] + 1


def test_one_batch_level_mixed_mapping():
    x = _data((4, 2, 3), jnp.float32)  # mapped
    w = _data((3,), jnp.float32, seed=1)  # not mapped
    ins = (S((2, 3), jnp.float32), S((3,), jnp.float32))
    outs = (S((2, 3), jnp.float32),)
    (y,) = _call(scale_rows, ins, outs, x, w, batch=((4, (True, False)),))
    ref = jax.vmap(_scale_rows_ref, in_axes=(0, None))(x, w)
    np.testing.assert_allclose(y, ref, rtol=1e-6)


@pytest.mark.parametrize("mapped", [(True, True), (False, True), (True, False)])
def test_two_batch_levels(mapped):
    # level 0 (outer, size 3) maps x only; level 1 (inner, size 2) maps per `mapped`.
    x_shape = (3,) + ((2,) if mapped[0] else ()) + (2, 3)
    w_shape = ((2,) if mapped[1] else ()) + (3,)
    x = _data(x_shape, jnp.float32)
    w = _data(w_shape, jnp.float32, seed=2)
    ins = (S((2, 3), jnp.float32), S((3,), jnp.float32))
    outs = (S((2, 3), jnp.float32),)
    batch = ((3, (True, False)), (2, mapped))
    (y,) = _call(scale_rows, ins, outs, x, w, batch=batch)
    inner = jax.vmap(
        _scale_rows_ref, in_axes=(0 if mapped[0] else None, 0 if mapped[1] else None), axis_size=2
    )
    ref = jax.vmap(inner, in_axes=(0, None))(x, w)
    assert y.shape == (3, 2, 2, 3)
    np.testing.assert_allclose(y, ref, rtol=1e-6)


def test_batch_of_scalars_and_zero_size_batch():
    @numba.njit
    def sq(x, out):
        out[()] = x[()] * x[()]

    x = jnp.arange(5.0, dtype=jnp.float32)
    spec = S((), jnp.float32)
    (y,) = _call(sq, (spec,), (spec,), x, batch=((5, (True,)),))
    np.testing.assert_allclose(y, x * x)
    (z,) = _call(sq, (spec,), (spec,), jnp.zeros((0,), jnp.float32), batch=((0, (True,)),))
    assert z.shape == (0,)


def test_numba_kernel_vmap_is_native_and_matches():
    spec = S((3,), jnp.float32)
    k = nb.numba_kernel(_mul, outs=spec)
    x = _data((4, 5, 3), jnp.float32)
    w = _data((5, 3), jnp.float32, seed=3)
    f = jax.jit(jax.vmap(jax.vmap(k, in_axes=(0, 0)), in_axes=(0, None)))
    y = f(x, w)
    np.testing.assert_allclose(y, x * w[None], rtol=1e-6)
    jaxpr = str(jax.make_jaxpr(f)(x, w))
    assert "scan" not in jaxpr and "while" not in jaxpr


@numba.njit
def _mul(x, w, out):
    for i in range(x.size):
        out[i] = x[i] * w[i]


def test_shape_mismatch_raises_at_trace_time():
    spec = S((4,), jnp.float32)
    f = nb.make_callable(affine, ins=(spec,), outs=(spec,), platform="cpu", name="affine")
    with pytest.raises(ValueError, match=r"input 0 has shape \(5,\)"):
        jax.jit(f).trace(jnp.zeros(5, jnp.float32))
    with pytest.raises(ValueError, match="dtype"):
        f(jnp.zeros(4, jnp.int32))
    with pytest.raises(TypeError, match="expected 1 input"):
        f(jnp.zeros(4), jnp.zeros(4))


def test_bad_arguments_are_named():
    spec = S((4,), jnp.float32)
    with pytest.raises(ValueError, match=r"the .numba. backend serves \[.cpu.\], not .gpu."):
        nb.make_callable(affine, ins=(spec,), outs=(spec,), platform="gpu", name="x")
    with pytest.raises(TypeError, match="numba.njit"):
        nb.make_callable(object(), ins=(spec,), outs=(spec,), platform="cpu", name="x")
    with pytest.raises(ValueError, match="batch"):
        nb.make_callable(
            affine, ins=(spec,), outs=(spec,), platform="cpu", name="x", batch=((2, (True, False)),)
        )
    with pytest.raises(ValueError, match="alias"):
        nb.numba_kernel(affine, outs=S((3,), jnp.float32), input_output_aliases={0: 0})(
            jnp.zeros(4, jnp.float32)
        )


def test_registration_does_not_grow_in_a_loop():
    spec = S((8,), jnp.float32)
    x = jnp.ones(8, jnp.float32)
    k = nb.numba_kernel(affine, outs=spec, name="loop")
    k(x)
    before = len(nb.registered_targets())
    for _ in range(20):
        jax.block_until_ready(k(x))
        jax.block_until_ready(nb.numba_kernel(affine, outs=spec, name="loop")(x))
        f = nb.make_callable(affine, ins=(spec,), outs=(spec,), platform="cpu", name="loop")
        jax.block_until_ready(jax.jit(f)(x))
    assert len(nb.registered_targets()) == before
    # a different shape of the same dtypes/ranks reuses the handler too
    k2 = nb.numba_kernel(affine, outs=S((3,), jnp.float32), name="loop")
    np.testing.assert_allclose(k2(jnp.ones(3)), 3.0)
    assert len(nb.registered_targets()) == before


def test_module_import_does_not_import_numba():
    code = (
        "import sys; import primforge.backends.numba as m; "
        "assert 'numba' not in sys.modules, 'numba imported'; "
        "assert m.is_available(); print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_missing_numba_gives_install_hint():
    code = textwrap.dedent("""
        import sys
        sys.modules['numba'] = None  # make `import numba` fail
        import jax
        import primforge.backends.numba as m
        assert m.is_available() is False and m.is_available('cpu') is False
        s = jax.ShapeDtypeStruct((2,), 'float32')
        try:
            m.make_callable(lambda x, o: None, ins=(s,), outs=(s,), platform='cpu', name='k')
        except ImportError as e:
            from primforge.backends._common import MissingPackageError
            assert isinstance(e, MissingPackageError), type(e)
            assert 'pip install -e ".[cpu]"' in str(e), str(e)
            print('ok')
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_is_available_answers_per_platform_and_is_cached():
    from primforge.backends import is_available_on

    assert nb.is_available() is True and nb.is_available("cpu") is True
    for other in ("gpu", "cuda", "rocm", "tpu"):
        assert nb.is_available(other) is False, other
        assert is_available_on(nb, other) is False, other
    assert is_available_on(nb, "cpu") is True
    hits = nb.is_available.cache_info().hits
    nb.is_available("cpu")
    assert nb.is_available.cache_info().hits == hits + 1


def test_numba_kernel_is_a_frozen_dataclass_compared_by_identity():
    import dataclasses

    spec = S((3,), jnp.float32)
    k = nb.numba_kernel(affine, outs=spec, name="frozen")
    assert dataclasses.is_dataclass(k)
    assert [f.name for f in dataclasses.fields(k)] == [
        "fn",
        "outs",
        "input_output_aliases",
        "name",
        "half_as",
        "single",
    ]
    with pytest.raises(dataclasses.FrozenInstanceError):
        k.name = "other"
    twin = nb.numba_kernel(affine, outs=spec, name="frozen")
    assert k != twin and len({k, twin}) == 2 and {k: 1}[k] == 1  # identity, as for functions
    x = jnp.arange(3.0, dtype=jnp.float32)
    f = jax.jit(k)
    np.testing.assert_allclose(f(x), 2 * np.arange(3.0) + 1)
    np.testing.assert_allclose(f(x + 1), 2 * np.arange(3.0) + 3)
    # replace() keeps the call returning one array, and may change the rest.
    renamed = dataclasses.replace(k, name="renamed")
    assert renamed.single and renamed.name == "renamed" and renamed.outs == k.outs
    np.testing.assert_allclose(renamed(x), 2 * np.arange(3.0) + 1)
    as_tuple = nb.numba_kernel(affine, outs=[spec])
    assert not as_tuple.single and isinstance(as_tuple(x), tuple)
    with pytest.raises(ValueError, match="single=True needs exactly one output"):
        nb.NumbaKernel(affine, [spec, spec], single=True)


_EXPORT_SCRIPT = textwrap.dedent("""
    import sys
    import jax, jax.numpy as jnp, numba
    from jax import export
    from primforge.backends import numba as nb

    @numba.njit
    def affine(x, out):
        for i in range(x.size):
            out[i] = 2 * x[i] + 1

    spec = jax.ShapeDtypeStruct((4,), jnp.float32)
    k = nb.numba_kernel(affine, outs=spec, name="exported")
    x = jnp.arange(4.0, dtype=jnp.float32)
    jax.block_until_ready(k(x))
    (target,) = nb.prepare(k, spec)
    exp = export.export(jax.jit(k), disabled_checks=nb.disabled_checks([target]))(spec)
    # exp.serialize() needs the optional flatbuffers package; the StableHLO bytecode is the
    # part that names the FFI target, and is what serialize() embeds.
    assert target in exp.mlir_module()
    sys.stdout.buffer.write(exp.mlir_module_serialized)
""")


def test_export_is_deterministic_across_processes(tmp_path):
    script = tmp_path / "export_me.py"
    script.write_text(_EXPORT_SCRIPT)
    root = os.path.dirname(os.path.dirname(os.path.abspath(nb.__file__)))
    root = os.path.dirname(os.path.dirname(root))  # the checkout holding primforge/
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, PRIMFORGE_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=path)
    blobs = []
    for _ in range(2):
        out = subprocess.run(
            [sys.executable, str(script)], capture_output=True, env=env, check=False
        )
        assert out.returncode == 0, out.stderr.decode()
        blobs.append(out.stdout)
    assert blobs[0] == blobs[1] and len(blobs[0]) > 100


def test_vmap_of_aliased_kernel_with_unmapped_accumulator():
    spec = S((3,), jnp.float32)
    k = nb.numba_kernel(add_into, outs=spec, input_output_aliases={0: 0})
    acc = jnp.array([1.0, 2.0, 3.0])
    xs = _data((4, 3), jnp.float32)
    y = jax.jit(jax.vmap(k, in_axes=(None, 0)))(acc, xs)
    np.testing.assert_allclose(y, acc[None] + xs, rtol=1e-6)
    np.testing.assert_allclose(acc, [1.0, 2.0, 3.0])


def test_half_precision_aliasing_is_converted_both_ways():
    spec = S((4,), jnp.bfloat16)
    k = nb.numba_kernel(add_into, outs=spec, input_output_aliases={0: 0})
    acc = jnp.arange(4).astype(jnp.bfloat16)
    x = jnp.full(4, 0.5, jnp.bfloat16)
    y = jax.jit(k, donate_argnums=0)(acc, x)
    assert y.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(y, np.float32), [0.5, 1.5, 2.5, 3.5])


def test_kernel_returning_a_float_is_a_clear_error():
    @numba.njit
    def returns_float(x, out):
        out[0] = x[0]
        return 1.5

    spec = S((1,), jnp.float32)
    with pytest.raises(Exception, match="integer status"):
        _call(returns_float, (spec,), (spec,), jnp.ones(1, jnp.float32))


def _make_scaler(c):
    @numba.njit
    def scale(x, out):
        for i in range(x.size):
            out[i] = x[i] * c

    return scale


def test_closures_with_different_constants_get_their_own_handler():
    spec = S((3,), jnp.float32)
    x = jnp.array([1.0, 2.0, 3.0])
    y2 = nb.numba_kernel(_make_scaler(2.0), outs=spec)(x)
    y3 = nb.numba_kernel(_make_scaler(3.0), outs=spec)(x)
    again = nb.numba_kernel(_make_scaler(2.0), outs=spec)(x)  # same identity: handler reused
    np.testing.assert_allclose(y2, 2 * x)
    np.testing.assert_allclose(y3, 3 * x)
    np.testing.assert_allclose(again, 2 * x)
