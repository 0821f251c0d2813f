"""Code written with kups's JAX utilities runs on primforge with only its import changed.

The example (tests/migration/kups_example.py) is checked against NumPy; the scatter
follows kups: a node's ``scatter_args`` are defaults that the caller's ``args`` override.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from migration._load import load

ku = load("kups_example")

RNG = np.random.default_rng(2)


def _particles(n, seed):
    r = np.random.default_rng(seed)
    return ku.Particles(jnp.asarray(r.normal(size=(n, 3)), jnp.float32),
                        jnp.asarray(r.normal(size=n), jnp.float32))


def test_insert_drops_padding_slots_by_the_buffers_own_args():
    buf = ku.Buffer(_particles(5, 0))
    new = _particles(3, 1)
    slots = jnp.array([1, 9, 3])  # 9 is past the end: dropped
    out = ku.insert(buf, new, slots)
    want_pos, want_q = np.array(buf.particles.positions), np.array(buf.particles.charges)
    want_pos[[1, 3]] = np.asarray(new.positions)[[0, 2]]
    want_q[[1, 3]] = np.asarray(new.charges)[[0, 2]]
    np.testing.assert_array_equal(out.particles.positions, want_pos)
    np.testing.assert_array_equal(out.particles.charges, want_q)
    assert type(out) is ku.Buffer and out.mode == "drop"


def test_callers_args_override_the_nodes_scatter_args():
    buf = ku.Buffer(_particles(5, 0))
    new = _particles(3, 1)
    slots = np.array([1, 9, 3])
    out = ku.insert_clamped(buf, new, jnp.asarray(slots))
    # NumPy: clip the indices, then assign in order (the last write to a slot wins).
    want_pos, want_q = np.array(buf.particles.positions), np.array(buf.particles.charges)
    clipped = np.clip(slots, 0, 4)
    for j, i in enumerate(clipped):
        want_pos[i] = np.asarray(new.positions)[j]
        want_q[i] = np.asarray(new.charges)[j]
    np.testing.assert_array_equal(out.particles.positions, want_pos)
    np.testing.assert_array_equal(out.particles.charges, want_q)


def test_nested_nodes_the_outer_args_win_over_the_inner():
    from primforge.utils import dataclass, field, tree_scatter_set

    @dataclass
    class Outer:
        inner: ku.Buffer
        mode: str = field(default="clip", static=True)

        @property
        def scatter_args(self):
            return {"mode": self.mode}

    item = Outer(ku.Buffer(_particles(4, 3)))
    value = Outer(ku.Buffer(_particles(1, 4)))
    out = tree_scatter_set(item, value, jnp.array([7]), {})
    # The outer "clip" reaches the buffer before its own "drop": index 7 becomes 3.
    np.testing.assert_array_equal(out.inner.particles.charges[3], value.inner.particles.charges[0])
    np.testing.assert_array_equal(out.inner.particles.charges[:3],
                                  item.inner.particles.charges[:3])


def test_scatter_under_jit_matches_eager():
    buf = ku.Buffer(_particles(5, 0))
    new = _particles(2, 1)
    slots = jnp.array([4, 6])
    eager = ku.insert(buf, new, slots)
    jitted = jax.jit(ku.insert)(buf, new, slots)
    np.testing.assert_array_equal(jitted.particles.charges, eager.particles.charges)
    np.testing.assert_array_equal(jitted.particles.charges[4], new.charges[0])


def test_accept_moves_selects_whole_rows():
    old, prop = _particles(4, 5), _particles(4, 6)
    accept = np.array([True, False, False, True])
    out = ku.accept_moves(old, prop, jnp.asarray(accept))
    want = np.where(accept[:, None], np.asarray(prop.positions), np.asarray(old.positions))
    np.testing.assert_array_equal(out.positions, want)
    np.testing.assert_array_equal(out.charges,
                                  np.where(accept, np.asarray(prop.charges),
                                           np.asarray(old.charges)))


def test_stack_concat_zeros_match_numpy():
    a, b = _particles(2, 7), _particles(3, 8)
    h = ku.history(a, a)
    np.testing.assert_array_equal(h.positions, np.stack([np.asarray(a.positions)] * 2))
    m = ku.merged(a, b)
    np.testing.assert_array_equal(m.charges, np.concatenate([np.asarray(a.charges),
                                                             np.asarray(b.charges)]))
    z = ku.empty_like(b)
    assert z.positions.shape == (3, 3) and not np.any(np.asarray(z.positions))
    assert z.charges.dtype == jnp.float32


def test_dataclasses_are_frozen_like_kups():
    p = _particles(1, 9)
    with pytest.raises(Exception, match="(?i)frozen|cannot assign"):
        p.charges = jnp.zeros(1)
