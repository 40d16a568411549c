"""Reading traced programs: every equation of a jaxpr, inner ones included (what a step is made of)."""
from __future__ import annotations


def equations(jaxpr):
    """Every equation of a (closed) jaxpr, those of the jaxprs inside it (loop bodies, branches, calls) included."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    for eqn in jaxpr.eqns:
        yield eqn
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                if hasattr(sub, "eqns") or hasattr(getattr(sub, "jaxpr", None), "eqns"):
                    yield from equations(sub)
