"""What a jaxpr binds, for the tests that count kernel calls."""

from __future__ import annotations

from primforge.ops._operator import eqn_name


def eqn_names(jaxpr) -> list[str]:
    """The names of the equations of ``jaxpr`` and of the jaxprs inside them, in order;
    an operator's kernel is named by the form it runs (``primforge.ops.csrmm``)."""
    names = []
    for eqn in jaxpr.eqns:
        names.append(eqn_name(eqn))
        for v in eqn.params.values():
            inner = getattr(v, "jaxpr", None)
            if inner is not None:
                names.extend(eqn_names(getattr(inner, "jaxpr", inner)))
    return names
