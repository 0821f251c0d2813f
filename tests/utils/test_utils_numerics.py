"""primforge.utils numerics: Kahan summation, key streams, integer membership."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from primforge.utils import isin, kahan_summation, key_chain


def _sequential_sums(values):
    """Kahan and naive left-to-right float32 sums of ``values`` in a lax.scan."""

    def kahan_step(carry, x):
        total, comp = carry
        return kahan_summation(total, x, compensate=comp), None

    def naive_step(total, x):
        return total + x, None

    zero = jnp.float32(0)
    (kahan, _), _ = jax.lax.scan(kahan_step, (zero, zero), values, unroll=8)
    naive, _ = jax.lax.scan(naive_step, zero, values, unroll=8)
    return kahan, naive


def test_kahan_beats_naive_float32_on_a_million_values():
    rng = np.random.default_rng(0)
    values = (rng.random(1_000_000) + 0.1).astype(np.float32)
    reference = np.sum(values.astype(np.float64))
    kahan, naive = jax.jit(_sequential_sums)(values)
    kahan_err = abs(float(kahan) - reference)
    naive_err = abs(float(naive) - reference)
    # Compensated: within one float32 ulp of the exact sum. Naive: orders of magnitude off.
    assert kahan_err <= np.spacing(np.float32(reference))
    assert naive_err > 100 * max(kahan_err, np.spacing(np.float32(reference)) / 2)


def test_kahan_on_pytrees_with_many_summands_and_carried_compensation():
    rng = np.random.default_rng(1)
    chunks = [
        {"a": rng.random(3, np.float32) * 1e4, "b": (rng.random(2, np.float32),)} for _ in range(50)
    ]
    total, comp = kahan_summation(*chunks[:25])
    total, comp = kahan_summation(total, *chunks[25:], compensate=comp)
    ref_a = np.sum([c["a"].astype(np.float64) for c in chunks], axis=0)
    ref_b = np.sum([c["b"][0].astype(np.float64) for c in chunks], axis=0)
    assert jax.tree_util.tree_structure(total) == jax.tree_util.tree_structure(chunks[0])
    assert jax.tree_util.tree_structure(comp) == jax.tree_util.tree_structure(chunks[0])
    # Kahan's bound for same-sign summands: relative error <= 2 eps (eps = 2**-24).
    np.testing.assert_allclose(total["a"], ref_a, rtol=2**-23, atol=0)
    np.testing.assert_allclose(total["b"][0], ref_b, rtol=2**-23, atol=0)
    single, zero = kahan_summation(jnp.float32(2.0))
    assert float(single) == 2.0 and float(zero) == 0.0
    with pytest.raises(ValueError, match="at least one"):
        kahan_summation()


def test_kahan_recovers_bits_lost_by_float32():
    big, one = np.float32(1e8), np.float32(1.0)
    total, comp = kahan_summation(big, *[one] * 16)
    assert float(big + one) == 1e8  # naive addition loses every 1.0
    assert float(total) - float(comp) == 1e8 + 16


def test_key_chain_is_fold_in_of_a_counter():
    root = jax.random.key(42)
    keys = list(itertools.islice(key_chain(root), 5))
    for n, k in enumerate(keys):
        np.testing.assert_array_equal(
            jax.random.key_data(k), jax.random.key_data(jax.random.fold_in(root, n))
        )
    again = list(itertools.islice(key_chain(jax.random.key(42)), 5))
    np.testing.assert_array_equal(
        jax.random.key_data(jnp.stack(keys)), jax.random.key_data(jnp.stack(again))
    )


def test_key_chain_shapes_and_uniqueness():
    root = jax.random.key(0)
    batches = list(itertools.islice(key_chain(root, shape=(2, 3)), 20))
    assert all(b.shape == (2, 3) for b in batches)
    np.testing.assert_array_equal(
        jax.random.key_data(batches[3]),
        jax.random.key_data(jax.random.split(jax.random.fold_in(root, 3), (2, 3))),
    )
    data = np.asarray(jax.random.key_data(jnp.stack(batches))).reshape(120, -1)
    assert len({tuple(row) for row in data}) == 120
    assert next(key_chain(root, shape=4)).shape == (4,)
    raw = next(key_chain(jax.random.PRNGKey(0)))  # legacy uint32 keys work too
    assert raw.dtype == jnp.uint32 and raw.shape == (2,)


def test_isin_matches_numpy_including_out_of_range_values():
    rng = np.random.default_rng(2)
    a = rng.integers(-5, 60, size=(7, 9))
    b = rng.integers(-5, 60, size=40)
    got = isin(jnp.asarray(a), jnp.asarray(b), max_item=50)
    in_range = (a >= 0) & (a < 50)
    b_in_range = b[(b >= 0) & (b < 50)]
    np.testing.assert_array_equal(got, np.isin(a, b_in_range) & in_range)
    assert got.shape == a.shape and got.dtype == jnp.bool_


def test_isin_under_jit_and_vmap():
    a = jnp.array([[0, 1, 2], [3, 4, 5]])
    b = jnp.array([[1, 5], [3, 3]])
    got = jax.jit(jax.vmap(lambda x, y: isin(x, y, 6)))(a, b)
    want = np.stack([np.isin(np.asarray(a[i]), np.asarray(b[i])) for i in range(2)])
    np.testing.assert_array_equal(got, want)


def test_isin_is_linear_not_quadratic():
    n, m, max_item = 3000, 2000, 5000
    jaxpr = jax.make_jaxpr(lambda a, b: isin(a, b, max_item))(
        jnp.zeros(n, jnp.int32), jnp.zeros(m, jnp.int32)
    )
    sizes = [int(np.prod(v.aval.shape)) for eqn in jaxpr.eqns for v in eqn.outvars if v.aval.shape]
    assert max(sizes) <= max(n, m, max_item)  # never an (n, m) comparison matrix


def test_isin_argument_errors():
    with pytest.raises(TypeError, match="max_item"):
        isin(jnp.arange(3), jnp.arange(3), 3.5)
    with pytest.raises(ValueError, match="max_item"):
        isin(jnp.arange(3), jnp.arange(3), 0)
    with pytest.raises(TypeError, match="integer"):
        isin(jnp.ones(3), jnp.arange(3), 4)
