"""An event-driven dense mat-vec written the brainevent way; only the import changed.

Was:
    from brainevent import XLACustomKernel, numba_kernel
"""

import jax
import jax.numpy as jnp
import numba
from jax.interpreters import ad

from primforge import XLACustomKernel, numba_kernel


# -- kernel generators -------------------------------------------------------------------
def _event_mv_numba(spk_info, **kwargs):
    # weights[m, k], spikes[k] -> out[m]: add column i of weights for every active spike i.
    if spk_info.dtype == jnp.bool_:
        @numba.njit
        def kernel(weights, spikes, out):
            out[:] = 0.0
            for i in range(spikes.shape[0]):
                if spikes[i]:
                    out += weights[:, i]
    else:
        @numba.njit
        def kernel(weights, spikes, out):
            out[:] = 0.0
            for i in range(spikes.shape[0]):
                if spikes[i] != 0.0:
                    out += weights[:, i] * spikes[i]

    # The generator returns a JAX-traceable function of the inputs, for every backend.
    def run(weights, spikes):
        return numba_kernel(kernel, outs=kwargs["outs"])(weights, spikes)

    return run


def _event_mv_jax(**kwargs):
    def kernel(weights, spikes):
        return (weights @ spikes.astype(weights.dtype),)

    return kernel


# -- rules ---------------------------------------------------------------------------------
def _jvp_weights(w_dot, weights, spikes, **kwargs):
    return event_mv_p_call(w_dot, spikes, backend=kwargs["backend"])


def _jvp_spikes(spk_dot, weights, spikes, **kwargs):
    return [weights @ spk_dot]


def _transpose(ct, weights, spikes, **kwargs):
    ct = ct[0]
    if ad.is_undefined_primal(spikes):
        ct_spikes = ad.Zero(spikes.aval) if type(ct) is ad.Zero else ct @ weights
        return weights, ct_spikes
    ct_weights = ad.Zero(weights.aval) if type(ct) is ad.Zero else jnp.outer(ct, spikes)
    return ct_weights, spikes


def event_mv_p_call(weights, spikes, *, backend=None):
    out = jax.ShapeDtypeStruct([weights.shape[0]], weights.dtype)
    return event_mv_p(
        weights,
        spikes,
        outs=[out],
        spk_info=jax.ShapeDtypeStruct(spikes.shape, spikes.dtype),
        backend=backend,
    )


event_mv_p = XLACustomKernel("migrated_event_mv")
event_mv_p.def_numba_kernel(_event_mv_numba)
event_mv_p.def_kernel("jax_raw", "cpu", _event_mv_jax)
event_mv_p.def_jvp_rule2(_jvp_weights, _jvp_spikes)
event_mv_p.def_transpose_rule(_transpose)
event_mv_p.def_call(event_mv_p_call)
event_mv_p.def_tags("dense", "event")


# -- a second kernel whose numba generator returns numba_kernel(...) itself ---------------
def _scale_numba(**kwargs):
    @numba.njit
    def kernel(x, factor, out):
        for i in range(x.size):
            out[i] = x[i] * factor[0]

    return numba_kernel(kernel, outs=kwargs["outs"])


def _scale_jax(**kwargs):
    return lambda x, factor: [x * factor[0]]


scale_p = XLACustomKernel("migrated_scale")
scale_p.def_numba_kernel(_scale_numba)
scale_p.def_kernel("jax_raw", "cpu", _scale_jax)
# One output: a per-input JVP rule may return the bare tangent.
scale_p.def_jvp_rule2(
    lambda t, x, factor, **kw: t * factor[0],
    lambda t, x, factor, **kw: x * t[0],
)


def scale(x, factor, backend=None):
    return scale_p(x, factor, outs=[jax.ShapeDtypeStruct(x.shape, x.dtype)], backend=backend)[0]
