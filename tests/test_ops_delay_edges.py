"""Steps and delays at the edges of their integer types, against a NumPy ring buffer.

The reference is written here: every stored synapse ``k`` (padding past ``indptr[-1]``
excluded) whose source is active adds its weight (times the input) into
``buffer[(t + d_k) mod D, target]``, the row computed with Python integers. Every public
call that takes a step or a delay is compared with it for Python ints, NumPy scalars of
every integer width and 0-d arrays, eagerly and with a traced step under ``jax.jit``, on
both backends. A bad step is an error naming ``t``; a bad delay an error naming
``delays`` when it is known at trace time and NaN (where a synapse with it is visited)
when traced; padding is never looked at.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from primforge.ops import (
    CSC,
    CSR,
    binary_delayed_csrmv,
    binary_delayed_jitc_matvec,
    delay_buffer,
    delay_read,
    delayed_csrmv,
    delayed_matvec,
    jitc_delays_todense,
    jitc_todense,
)

BACKENDS = ("numba", "jax")
I32_MAX, I32_MIN = 2**31 - 1, -(2**31)
SIGNED = (np.int8, np.int16, np.int32, np.int64)
UNSIGNED = (np.uint8, np.uint16, np.uint32, np.uint64)
#: Edge values of a step, kept where the dtype represents them (beside its own min/max).
EDGES = (0, 1, -1, I32_MAX, I32_MAX + 1, I32_MIN, I32_MIN - 1, 2**32 + 5, 2**32 - 1,
         2**63 - 1, 2**63 + 7, 2**64 - 1, -(2**63))
PY_STEPS = (0, 7, -7, I32_MAX, I32_MAX + 1, I32_MIN, I32_MIN - 1, 2**32 + 5, 2**63 - 1,
            2**64 + 7, -(2**70) - 1)

# W = [[1, 2], [0, 3]] stored as CSR: synapses 0->0, 0->1, 1->1.
DATA = np.array([1.0, 2.0, 3.0], np.float32)
INDICES = np.array([0, 1, 1], np.int32)
INDPTR = np.array([0, 2, 3], np.int32)
SHAPE = (2, 2)
DENSE = np.array([[1.0, 2.0], [0.0, 3.0]], np.float32)
DELAYS = np.array([0, 2, 1], np.int32)
DEPTH = 3  # 2**31 - 1, 2**31 and -2**31 fall in three different rows mod 3


def _fits(value, dtype) -> bool:
    info = np.iinfo(dtype)
    return info.min <= value <= info.max


def _numpy_steps(dtypes=SIGNED + UNSIGNED, edges=EDGES):
    """``(label, step)``: each dtype's min and max and the edges it represents, as NumPy
    scalars, plus a 0-d array of each width."""
    out = []
    for dt in dtypes:
        info = np.iinfo(dt)
        values = sorted({int(info.min), int(info.max), *(v for v in edges if _fits(v, dt))})
        out += [(f"{np.dtype(dt).name}({v})", dt(v)) for v in values]
        out.append((f"{np.dtype(dt).name}[0-d]({int(info.max)})", np.array(info.max, dt)))
    return out


ALL_STEPS = [(f"int({v})", v) for v in PY_STEPS] + _numpy_steps()
FEW_STEPS = [(f"int({v})", v) for v in (I32_MAX + 1, -(2**70) - 1)] + _numpy_steps(
    (np.int64, np.uint64), (I32_MAX, I32_MAX + 1, I32_MIN, 2**32 + 5))


# ----------------------------------------------------------------------------- the reference
def ring_reference(data, indices, indptr, delays, x, depth, n_dst, t, *, transpose,
                   binary, buffer=None):
    """The buffer after the synapses of active inputs add into row ``(t + d) mod D``."""
    buf = np.zeros((depth, n_dst)) if buffer is None else np.array(buffer, np.float64)
    delays = np.asarray(delays)
    data = np.broadcast_to(np.asarray(data, np.float64).reshape(-1), (len(indices),))
    for i in range(len(indptr) - 1):
        for k in range(int(indptr[i]), int(indptr[i + 1])):
            j = int(indices[k])
            src, dst = (i, j) if transpose else (j, i)
            if x[src] == 0:
                continue
            d = int(delays) if delays.ndim == 0 else int(delays[k])
            assert 0 <= d < depth, "the reference takes valid delays only"
            buf[(int(t) + d) % depth, dst] += data[k] * (1.0 if binary else float(x[src]))
    return buf


def dense_reference(dense, delays, x, depth, t, *, binary):
    """``delayed_matvec``'s buffer from the dense matrix; ``delays`` one int or dense."""
    buf = np.zeros((depth, dense.shape[1]))
    for i, j in zip(*np.nonzero(dense)):
        if x[i] == 0:
            continue
        d = int(delays) if np.ndim(delays) == 0 else int(delays[i, j])
        buf[(int(t) + d) % depth, j] += dense[i, j] * (1.0 if binary else float(x[i]))
    return buf


def read_reference(buffer, t):
    buf = np.array(buffer, np.float64)
    row = int(t) % buf.shape[0]
    now = buf[row].copy()
    buf[row] = 0
    return now, buf


def _close(got, want):
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=1e-6, atol=1e-6)


def _dense_delays(delays):
    """The per-synapse DELAYS of W = DENSE laid out densely (for dense_reference)."""
    out = np.zeros(DENSE.shape, np.int64)
    for i in range(SHAPE[0]):
        for k in range(INDPTR[i], INDPTR[i + 1]):
            out[i, INDICES[k]] = delays[k]
    return out


# ----------------------------------------------------------------------------- the step calls
EV = np.array([True, True])
XF = np.array([0.5, -2.0], np.float32)
W_CSR = CSR(DATA, INDICES, INDPTR, shape=SHAPE)


def _step_calls(backend):
    """``name -> (call(t), reference(t))`` for every public call that takes a step."""
    buf0 = np.arange(DEPTH * 2, dtype=np.float32).reshape(DEPTH, 2) + 1
    jshape, jprob, jrange, jseed = (5, 4), 0.5, (0, DEPTH - 1), 7
    jev = np.array([True, False, True, True, False])
    jw, jd = jitc_todense(jseed, jshape, jprob, 0.5), jitc_delays_todense(jseed, jshape, jprob,
                                                                          jrange)

    def jitc_ref(t):
        buf = np.zeros((DEPTH, jshape[1]))
        for i, j in zip(*np.nonzero(jw * jev[:, None])):
            buf[(int(t) + int(jd[i, j])) % DEPTH, j] += jw[i, j]
        return buf

    def csr(binary, transpose):
        call = binary_delayed_csrmv if binary else delayed_csrmv
        x = EV if binary else XF
        return (lambda t: call(DATA, INDICES, INDPTR, DELAYS, x, np.zeros((DEPTH, 2),
                                                                          np.float32),
                               t, shape=SHAPE, transpose=transpose, backend=backend),
                lambda t: ring_reference(DATA, INDICES, INDPTR, DELAYS, x, DEPTH, 2, t,
                                         transpose=transpose, binary=binary))

    return {
        "delay_read": (lambda t: delay_read(buf0, t, backend=backend),
                       lambda t: read_reference(buf0, t)),
        "binary_delayed_csrmv": csr(True, True),
        "binary_delayed_csrmv_T": csr(True, False),
        "delayed_csrmv": csr(False, False),
        "delayed_matvec": (
            lambda t: delayed_matvec(W_CSR, EV, DELAYS, delay_buffer(DEPTH - 1, 2), t,
                                     backend=backend),
            lambda t: dense_reference(DENSE, _dense_delays(DELAYS), EV, DEPTH, t, binary=True)),
        "delayed_matvec_one_delay": (
            lambda t: delayed_matvec(W_CSR, XF, 2, delay_buffer(DEPTH - 1, 2), t,
                                     backend=backend),
            lambda t: dense_reference(DENSE, 2, XF, DEPTH, t, binary=False)),
        "binary_delayed_jitc_matvec": (
            lambda t: binary_delayed_jitc_matvec(0.5, jseed, jev, delay_buffer(DEPTH - 1, 4), t,
                                                 shape=jshape, prob=jprob, delay_range=jrange,
                                                 backend=backend),
            jitc_ref),
    }


def _check_steps(backend, steps):
    for name, (call, ref) in _step_calls(backend).items():
        for label, t in steps:
            got, want = call(t), ref(t)
            if name == "delay_read":
                _close(got[0], want[0])
                _close(got[1], want[1])
            else:
                try:
                    _close(got, want)
                except AssertionError as err:
                    raise AssertionError(f"{name}, t = {label}") from err


# ----------------------------------------------------------------------------- item tests
def test_numpy_int64_step_past_int32_delivers_the_spike():
    W = CSR.from_dense(np.array([[1.0]], np.float32))
    t = np.int64(I32_MAX)
    b = delayed_matvec(W, np.array([True]), np.array([1]), delay_buffer(2, 1), t)
    _, b = delay_read(b, t)
    now, b = delay_read(b, t + 1)
    np.testing.assert_array_equal(now, [1.0])
    np.testing.assert_array_equal(b, np.zeros((3, 1)))


def test_one_delay_for_all_at_the_int32_edge_under_jit():
    W = CSR.from_dense(np.array([[1.0]], np.float32))
    for d in (1, np.array([1])):
        got = jax.jit(lambda t, d=d: delayed_matvec(W, np.array([True]), d, delay_buffer(2, 1),
                                                    t))(jnp.int32(I32_MAX))
        # (2**31 - 1 + 1) mod 3 = 2
        np.testing.assert_array_equal(np.ravel(got), [0.0, 0.0, 1.0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_traced_one_delay_outside_the_buffer_gives_nan(backend):
    W2 = CSR.from_dense(DENSE)
    g = jax.jit(lambda d, x: delayed_matvec(W2, x, d, delay_buffer(2, 2), 0, backend=backend))
    for d in (4, 3, -1, I32_MAX, I32_MIN):
        assert np.isnan(np.asarray(g(jnp.int32(d), EV))).all(), d
        # Nothing visited (no input active): nothing poisoned, as in the per-synapse kernels.
        np.testing.assert_array_equal(g(jnp.int32(d), np.array([False, False])),
                                      np.zeros((3, 2)))
        per_synapse = jax.jit(lambda d, x: binary_delayed_csrmv(
            DATA, INDICES, INDPTR, d, x, np.zeros((3, 2), np.float32), 0, shape=SHAPE,
            backend=backend))
        assert np.isnan(np.asarray(per_synapse(jnp.int32(d), EV))).all(), d
    np.testing.assert_array_equal(g(jnp.int32(2), EV),
                                  dense_reference(DENSE, 2, EV, 3, 0, binary=True))


def test_padding_delays_are_ignored_by_both_backends_under_jit():
    d, i, p = (np.array([1, 2, 3, 9.0], np.float32), np.array([0, 1, 1, 0], np.int32),
               np.array([0, 2, 3], np.int32))

    def h(be):
        return jax.jit(lambda dl: binary_delayed_csrmv(
            d, i, p, dl, EV, np.zeros((3, 2), np.float32), 0, shape=(2, 2), transpose=False,
            backend=be))(np.array([0, 1, 2, -1], np.int32))

    want = ring_reference(d, i, p, [0, 1, 2, -1][:3], EV, 3, 2, 0, transpose=False, binary=True)
    _close(h("numba"), want)
    _close(h("jax"), want)


@pytest.mark.parametrize("transpose", [True, False])
def test_padding_delays_are_ignored_eagerly(transpose):
    d, i, p = (np.array([1, 2, 3, 9.0], np.float32), np.array([0, 1, 1, 0], np.int32),
               np.array([0, 2, 3], np.int32))
    want = ring_reference(d, i, p, [0, 1, 2], EV, 3, 2, 0, transpose=transpose, binary=True)
    for be in BACKENDS:
        for pad in (-1, 3, 2**31, 2**63 - 1):
            dl = np.array([0, 1, 2, pad], np.int64)
            got = binary_delayed_csrmv(d, i, p, dl, EV, np.zeros((3, 2), np.float32), 0,
                                       shape=(2, 2), transpose=transpose, backend=be)
            _close(got, want)


# ----------------------------------------------------------------------------- steps: the class
@pytest.mark.parametrize("backend", BACKENDS)
def test_concrete_steps_reduce_exactly(backend):
    _check_steps(backend, FEW_STEPS)


@pytest.mark.exhaustive
@pytest.mark.parametrize("backend", BACKENDS)
def test_concrete_steps_reduce_exactly_every_width(backend):
    _check_steps(backend, ALL_STEPS)


def _check_traced_steps(backend, dtypes):
    for name, (call, ref) in _step_calls(backend).items():
        f = jax.jit(call)
        for dt in dtypes:
            info = np.iinfo(dt)
            for v in sorted({int(info.min), int(info.max), 0, 1, -1 if info.min else 2}):
                got, want = f(jnp.asarray(v, dt)), ref(v)
                if name == "delay_read":
                    got, want = got[1], want[1]
                try:
                    _close(got, want)
                except AssertionError as err:
                    raise AssertionError(f"{name}, traced {np.dtype(dt).name}({v})") from err


@pytest.mark.parametrize("backend", BACKENDS)
def test_traced_int32_steps_reduce_without_overflow(backend):
    _check_traced_steps(backend, (np.int32,))


@pytest.mark.exhaustive
@pytest.mark.parametrize("backend", BACKENDS)
def test_traced_steps_of_every_jax_width(backend):
    _check_traced_steps(backend, (np.int8, np.int16, np.uint8, np.uint16, np.uint32))


BAD_STEPS = [1.0, np.float32(3.0), np.float64(2**40), True, np.bool_(False), np.array(2.5),
             np.array([3]), "3", None]


@pytest.mark.parametrize("backend", ["numba"])
def test_non_integer_steps_are_refused_naming_t(backend):
    for call, _ in _step_calls(backend).values():
        for t in BAD_STEPS:
            with pytest.raises(TypeError, match="'t'"):
                call(t)
        for t in (jnp.float32(1.0), jnp.bool_(True)):
            with pytest.raises(TypeError, match="'t'"):
                jax.jit(call)(t)


# ----------------------------------------------------------------------------- delays: the class
def _delay_arrays(n, values, dtypes=SIGNED + UNSIGNED):
    """1-d delay arrays of length ``n`` holding ``values`` in every integer width."""
    return [(np.dtype(dt).name, np.resize(np.array(values, dt), n)) for dt in dtypes]


def _delay_scalars(value, dtypes=SIGNED + UNSIGNED):
    """``value`` as a Python int, a NumPy scalar and a 0-d array of every width."""
    out = [("int", value)]
    for dt in dtypes:
        if _fits(value, dt):
            out += [(np.dtype(dt).name, dt(value)), (f"{np.dtype(dt).name}[0-d]",
                                                     np.array(value, dt))]
    return out


T_EDGE = I32_MAX  # the step beside the valid delays: (t + d) must not wrap


def _check_valid_delays(backend, dtypes):
    for transpose in (True, False):
        for label, dl in _delay_arrays(3, [2, 0, 1], dtypes):
            for call, x, binary in ((binary_delayed_csrmv, EV, True),
                                    (delayed_csrmv, XF, False)):
                got = call(DATA, INDICES, INDPTR, dl, x, np.zeros((DEPTH, 2), np.float32),
                           T_EDGE, shape=SHAPE, transpose=transpose, backend=backend)
                want = ring_reference(DATA, INDICES, INDPTR, dl, x, DEPTH, 2, T_EDGE,
                                      transpose=transpose, binary=binary)
                _close(got, want)
        for d in (0, 2):
            for label, dl in _delay_scalars(d, dtypes):
                got = binary_delayed_csrmv(DATA, INDICES, INDPTR, dl, EV,
                                           np.zeros((DEPTH, 2), np.float32), T_EDGE,
                                           shape=SHAPE, transpose=transpose, backend=backend)
                _close(got, ring_reference(DATA, INDICES, INDPTR, d, EV, DEPTH, 2, T_EDGE,
                                           transpose=transpose, binary=True))
                W = W_CSR if transpose else CSC.from_dense(DENSE)  # stored rows: pre or post
                got = delayed_matvec(W, EV, dl, delay_buffer(DEPTH - 1, 2), T_EDGE,
                                     backend=backend)
                _close(got, dense_reference(DENSE, d, EV, DEPTH, T_EDGE, binary=True))


@pytest.mark.parametrize("backend", BACKENDS)
def test_valid_delays_of_the_wide_widths(backend):
    _check_valid_delays(backend, (np.int64, np.uint64, np.uint32))


@pytest.mark.exhaustive
@pytest.mark.parametrize("backend", BACKENDS)
def test_valid_delays_of_every_width(backend):
    _check_valid_delays(backend, SIGNED + UNSIGNED)


BAD_DELAY_VALUES = (-1, DEPTH, I32_MAX, I32_MAX + 1, I32_MIN, 2**32 + 1, 2**63 - 1, 2**64 - 1,
                    2**70)


@pytest.mark.parametrize("backend", ["jax"])
def test_bad_concrete_delays_are_refused_naming_delays(backend):
    # 2**32 + 1 and 2**64 - 1 wrap onto valid rows (1, -1 -> ...) when cast to int32.
    for bad in BAD_DELAY_VALUES:
        for label, dl in _delay_scalars(bad):
            with pytest.raises(ValueError, match="'delays'"):
                delayed_matvec(W_CSR, EV, dl, delay_buffer(DEPTH - 1, 2), 0, backend=backend)
            with pytest.raises(ValueError, match="'delays'"):
                binary_delayed_csrmv(DATA, INDICES, INDPTR, dl, EV,
                                     np.zeros((DEPTH, 2), np.float32), 0, shape=SHAPE,
                                     backend=backend)
        for dt in SIGNED + UNSIGNED:
            if not _fits(bad, dt):
                continue
            dl = np.array([0, bad, 1], dt)  # on a real synapse, inactive or not
            for call in (lambda dl=dl: delayed_matvec(W_CSR, EV, dl, delay_buffer(DEPTH - 1, 2),
                                                       0),
                         lambda dl=dl: jax.jit(lambda b: delayed_csrmv(
                             DATA, INDICES, INDPTR, dl, XF, b, 0, shape=SHAPE,
                             backend=backend))(np.zeros((DEPTH, 2), np.float32))):
                with pytest.raises(ValueError, match="'delays'"):
                    call()
    for dl in (1.0, True, np.array([0.0, 1.0, 1.0]), np.array([True, False, True])):
        with pytest.raises(TypeError, match="'delays'"):
            delayed_matvec(W_CSR, EV, dl, delay_buffer(DEPTH - 1, 2), 0, backend=backend)


def _traced_bad_delay_cases():
    """``(label, delays)`` with a bad delay on synapse 1 (0 -> 1), as JAX arrays (traced)."""
    out = []
    for bad in (-1, DEPTH, I32_MAX, I32_MIN):
        out.append((f"int32({bad})", jnp.array([0, bad, 1], jnp.int32)))
    for bad in (DEPTH, 2**31, 2**32 - 1):
        out.append((f"uint32({bad})", jnp.array([0, bad, 1], jnp.uint32)))
    out.append(("int8(-128)", jnp.array([0, -128, 1], jnp.int8)))
    out.append(("uint8(255)", jnp.array([0, 255, 1], jnp.uint8)))
    return out


def _check_traced_bad_delays(jit_of):
    """Both backends, both directions: NaN when the source of synapse 1 (0 -> 1) fires; the
    reference when it is silent (synapse 1 is not visited, its delay not looked at)."""
    for transpose in (True, False):
        src_of_1 = 0 if transpose else 1  # row 0 are the sources, or column 1
        fs = {be: jit_of(be, transpose) for be in BACKENDS}
        for label, dl in _traced_bad_delay_cases():
            for x in (EV, np.array([False, True]), np.array([True, False])):
                for be in BACKENDS:
                    got = np.asarray(fs[be](dl, x))
                    if x[src_of_1]:
                        assert np.isnan(got).all(), (label, be, transpose, x)
                    else:
                        _close(got, ring_reference(DATA, INDICES, INDPTR, [0, 0, 1], x, DEPTH,
                                                   2, 5, transpose=transpose, binary=True))


def test_traced_bad_delays_give_nan_on_both_backends():
    def jit_of(be, transpose):
        return jax.jit(lambda dl, x: binary_delayed_csrmv(
            DATA, INDICES, INDPTR, dl, x, np.zeros((DEPTH, 2), np.float32), 5, shape=SHAPE,
            transpose=transpose, backend=be))

    _check_traced_bad_delays(jit_of)


def test_traced_one_delay_of_every_jax_width():
    cases = [("int32", jnp.int32, (-1, 3, I32_MAX, I32_MIN)),
             ("uint32", jnp.uint32, (3, 2**32 - 1)),
             ("int8", jnp.int8, (-128, 127)), ("uint8", jnp.uint8, (255,))]
    for be in BACKENDS:
        f = jax.jit(lambda d, x, be=be: delayed_matvec(W_CSR, x, d, delay_buffer(DEPTH - 1, 2),
                                                        T_EDGE, backend=be))
        g = jax.jit(lambda d, x, be=be: binary_delayed_csrmv(
            DATA, INDICES, INDPTR, d, x, np.zeros((DEPTH, 2), np.float32), T_EDGE, shape=SHAPE,
            backend=be))
        for label, dt, bads in cases:
            for bad in bads:
                for h in (f, g):
                    assert np.isnan(np.asarray(h(jnp.asarray(bad, dt), EV))).all(), (label, bad)
            for good in (0, 2):
                want = dense_reference(DENSE, good, EV, DEPTH, T_EDGE, binary=True)
                _close(f(jnp.asarray(good, dt), EV), want)
                _close(g(jnp.asarray(good, dt), EV), want)


# ----------------------------------------------------------------------------- padding: the class
# Row blocks of 4 entries, the last padded: indptr[-1] = 3 < nnz = 4.
PD = np.array([1.0, 2.0, 3.0, 9.0], np.float32)
PI = np.array([0, 1, 1, 0], np.int32)
PP = np.array([0, 2, 3], np.int32)


def _padded_cases():
    for pad in (-1, DEPTH, I32_MAX, I32_MIN):
        yield f"int32({pad})", np.array([0, 2, 1, pad], np.int32)
    for pad in (2**31, 2**63 - 1):
        yield f"int64({pad})", np.array([0, 2, 1, pad], np.int64)
    yield "uint64(2**64-1)", np.array([0, 2, 1, 2**64 - 1], np.uint64)


def _check_padding(transposes, jit_modes, inputs=((EV, True), (XF, False))):
    for transpose in transposes:
        for x, binary in inputs:
            call = binary_delayed_csrmv if binary else delayed_csrmv
            want = ring_reference(PD, PI, PP, [0, 2, 1], x, DEPTH, 2, T_EDGE,
                                  transpose=transpose, binary=binary)
            for be in BACKENDS:
                def f(dl, p, call=call, x=x, be=be, transpose=transpose):
                    return call(PD, PI, p, dl, x, np.zeros((DEPTH, 2), np.float32), T_EDGE,
                                shape=SHAPE, transpose=transpose, backend=be)

                traced = jax.jit(f)
                for label, dl in _padded_cases():
                    for mode in jit_modes:
                        if mode == "eager":
                            got = f(dl, PP)
                        elif mode == "jit":  # the delays concrete (captured), indptr traced
                            got = jax.jit(lambda p, dl=dl: f(dl, p))(PP)
                        elif dl.dtype.itemsize > 4:  # JAX holds no 64-bit ints to trace
                            continue
                        else:  # the delays traced
                            got = traced(dl, PP)
                        try:
                            _close(got, want)
                        except AssertionError as err:
                            raise AssertionError(f"{label} {be} {mode} transpose={transpose} "
                                                 f"x={x}") from err


def test_padding_is_ignored_everywhere():
    _check_padding((True, False), ("eager", "traced"))


@pytest.mark.exhaustive
def test_padding_is_ignored_everywhere_with_a_traced_indptr():
    _check_padding((True, False), ("eager", "traced", "jit"),
                   ((EV, True), (np.array([False, True]), True), (XF, False)))


def test_bad_delay_on_a_real_synapse_beside_padding_is_still_caught():
    dl = np.array([0, 7, 1, -1], np.int32)  # 7: synapse 0 -> 1, a real one
    for be in BACKENDS:
        for transpose in (True, False):
            with pytest.raises(ValueError, match="'delays' holds 7"):
                binary_delayed_csrmv(PD, PI, PP, dl, EV, np.zeros((DEPTH, 2), np.float32), 0,
                                     shape=SHAPE, transpose=transpose, backend=be)
            got = jax.jit(lambda d, transpose=transpose, be=be: binary_delayed_csrmv(
                PD, PI, PP, d, EV, np.zeros((DEPTH, 2), np.float32), 0, shape=SHAPE,
                transpose=transpose, backend=be))(dl)
            assert np.isnan(np.asarray(got)).all(), (be, transpose)


# ----------------------------------------------------------------------------- jitc and buffers
def test_delay_range_and_max_delay_take_integers_of_any_kind_but_bool():
    for dmin, dmax in ((np.int64(0), np.uint64(2)), (np.uint8(0), 2), (0, np.int32(2))):
        got = binary_delayed_jitc_matvec(0.5, 7, np.ones(5, bool), delay_buffer(2, 4), 0,
                                         shape=(5, 4), prob=0.5, delay_range=(dmin, dmax))
        w = jitc_todense(7, (5, 4), 0.5, 0.5)
        d = jitc_delays_todense(7, (5, 4), 0.5, (int(dmin), int(dmax)))
        want = np.zeros((3, 4))
        for i, j in zip(*np.nonzero(w)):
            want[d[i, j], j] += w[i, j]
        _close(got, want)
    for bad in ((True, 2), (0, np.bool_(True)), (0.0, 2)):
        with pytest.raises(TypeError, match="'delay_range'"):
            binary_delayed_jitc_matvec(0.5, 7, np.ones(5, bool), delay_buffer(2, 4), 0,
                                       shape=(5, 4), prob=0.5, delay_range=bad)
        with pytest.raises(TypeError, match="'delay_range'"):
            jitc_delays_todense(7, (5, 4), 0.5, bad)
    assert delay_buffer(np.uint64(2), np.int8(3)).shape == (3, 3)
    for bad in (True, np.bool_(True), 2.0):
        with pytest.raises(TypeError, match="'max_delay'"):
            delay_buffer(bad, 3)
