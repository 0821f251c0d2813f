"""Install the two kernel.py hooks for sharding when XLACustomKernel does not have them yet.

The hooks (to live in primforge/kernel/kernel.py): ``XLACustomKernel.def_sharding_rule``
in ``XLACustomKernel._lower``, passing the built callable through
``sharding.partition_lowering``, and in ``_abstract_eval``, typing results with
``sharding.result_avals``. Until they exist, this patch wraps ``build`` at class
level for the lowering hook, which is equivalent for lowering (a nested build inside a
partition callback is lowered in a fully manual context, where custom_partitioning lowers the
callable as is).
"""

from __future__ import annotations

from primforge.kernel import sharding
from primforge.kernel.kernel import XLACustomKernel

HOOKED = hasattr(XLACustomKernel, "def_sharding_rule")


def install() -> bool:
    """Patch XLACustomKernel if needed; returns True when a patch was applied."""
    if HOOKED:
        return False
    K = XLACustomKernel

    def def_sharding_rule(self, rule, **kw):
        return sharding.def_sharding_rule(self, rule, **kw)

    orig_build = K.build

    def build(self, platform, *, ins, outs, batch=(), backend=None, context=(), **params):
        fn = orig_build(self, platform, ins=ins, outs=outs, batch=batch, backend=backend,
                        context=context, **params)
        return sharding.partition_lowering(
            self, fn, platform=platform, ins=ins, outs=outs, batch=batch, backend=backend,
            context=context, params=params,
        )

    orig_abstract_eval = K._abstract_eval

    def _abstract_eval(self, *avals, outs, backend=None, context=(), batch=(), **params):
        result = orig_abstract_eval(self, *avals, outs=outs, backend=backend,
                                    context=context, batch=batch, **params)
        return sharding.result_avals(self, avals, result, outs=outs, batch=batch,
                                     params=params)

    K.def_sharding_rule = def_sharding_rule
    K.build = build
    K._abstract_eval = _abstract_eval
    return True
