"""ETP primitives written the braintrace way; only the import changed.

Was:
    import braintrace
"""

import jax.numpy as jnp

import primforge as braintrace


# A single-result primitive, exactly as braintrace documents it.
def mm_impl(x, w):
    return x @ w


mm_p = braintrace.register_primitive("migrated_etp_mm", mm_impl, batched=True)


# The weight-gradient and trace rules an online-learning compiler reads.
def _mm_xy_to_dw(x, hidden_dim, w, **params):
    return jnp.outer(x, hidden_dim)


def _mm_yw_to_w(hidden_dim, trace, **params):
    return trace * hidden_dim


mm_p.register_xy_to_dw(_mm_xy_to_dw)
mm_p.register_yw_to_w(_mm_yw_to_w)


# A layer with several results (primforge also derives these): the affine output and its
# tanh, with a {weight, bias} trainable layout.
def dense_impl(x, w, b, *, scale):
    y = scale * (x @ w) + b
    return y, jnp.tanh(y)


dense_p = braintrace.register_primitive(
    "migrated_etp_dense",
    dense_impl,
    multiple_results=True,
    trainable_invars_fn=lambda params: {"weight": 1, "bias": 2},
    x_invar_index=0,
    y_outvar_index=0,
)


def dense(x, w, b, scale=1.0):
    y, h = dense_p.bind(x, w, b, scale=scale)
    return y, h
