"""Generation cost with MATPOWER's gencost conventions ($/h for P in MW).

Model 2 (polynomial): row [2, startup, shutdown, n, c_{n-1}, ..., c_0].
Model 1 (piecewise linear): row [1, startup, shutdown, n, x_1, y_1, ..., x_n, y_n];
MATPOWER treats it as the convex function max_i(segment_i), extended beyond the
end points by the first and last segments; we evaluate exactly that.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from flax import struct

from evogrid.case.matpower import POLYNOMIAL, Case
from evogrid.physics._common import as_float


@struct.dataclass
class GenCost:
    """poly: [n_units, K] coefficients, lowest power first (zero rows for PWL units);
    slope, intercept: [n_units, S] PWL segments ($/MWh, $/h); padded with slope 0 and a very
    negative intercept; is_poly: [n_units] 1.0 for polynomial units."""

    poly: jnp.ndarray
    slope: jnp.ndarray
    intercept: jnp.ndarray
    is_poly: jnp.ndarray
    any_poly: bool = struct.field(pytree_node=False, default=True)
    any_pwl: bool = struct.field(pytree_node=False, default=True)


def make_gen_cost(case_or_gencost) -> GenCost:
    """Build from a `Case` (its gencost rows) or from a raw gencost matrix."""
    gencost = case_or_gencost.gencost if isinstance(case_or_gencost, Case) else np.asarray(case_or_gencost, float)
    if gencost is None:
        raise ValueError(f"{case_or_gencost.name} has no mpc.gencost; generation cost needs one row per generator")
    n_units = gencost.shape[0]
    npoly = int(max([r[3] for r in gencost if r[0] == POLYNOMIAL], default=1))
    nseg = int(max([r[3] - 1 for r in gencost if r[0] != POLYNOMIAL], default=1))
    poly = np.zeros((n_units, npoly))
    slope = np.zeros((n_units, nseg))
    intercept = np.full((n_units, nseg), -1e30)
    for i, row in enumerate(gencost):
        n = int(row[3])
        if row[0] == POLYNOMIAL:
            poly[i, :n] = row[4 : 4 + n][::-1]
        else:
            x, y = row[4 : 4 + 2 * n : 2], row[5 : 5 + 2 * n : 2]
            m = np.diff(y) / np.diff(x)
            slope[i, : n - 1] = m
            intercept[i, : n - 1] = y[:-1] - m * x[:-1]
    big = np.finfo(np.float32).max / 4  # padding that stays finite in float32
    intercept = np.maximum(intercept, -big)
    return GenCost(
        poly=as_float(poly),
        slope=as_float(slope),
        intercept=as_float(intercept),
        is_poly=as_float(gencost[:, 0] == POLYNOMIAL),
        any_poly=bool(np.any(gencost[:, 0] == POLYNOMIAL)),
        any_pwl=bool(np.any(gencost[:, 0] != POLYNOMIAL)),
    )


def generation_cost(cost: GenCost, pg_mw: jnp.ndarray) -> jnp.ndarray:
    """Cost rate of each unit in $/h. pg_mw: [..., n_units] -> [..., n_units].

    Polynomials by Horner's rule (multiply-adds, no powers); the PWL maximum is
    only evaluated when some unit has a PWL cost (a static property of the case).
    """
    poly = jnp.zeros_like(pg_mw)
    if cost.any_poly:
        for k in range(cost.poly.shape[-1] - 1, -1, -1):
            poly = poly * pg_mw + cost.poly[..., k]
    if not cost.any_pwl:
        return poly
    pwl = jnp.max(cost.slope * pg_mw[..., None] + cost.intercept, axis=-1)
    return pwl if not cost.any_poly else jnp.where(cost.is_poly > 0, poly, pwl)
