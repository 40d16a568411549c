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


def poly_coefficients(gencost: np.ndarray, k: int = 3) -> np.ndarray:
    """[n_units, k] coefficients of the polynomial rows of MATPOWER `gencost`, lowest power first (c0, c1, ...);
    zero rows for the other units."""
    coef = np.zeros((gencost.shape[0], k))
    for i, row in enumerate(gencost):
        if row[0] == POLYNOMIAL:
            coef[i, :int(row[3])] = row[4:4 + int(row[3])][::-1]
    return coef


def make_gen_cost(case_or_gencost) -> GenCost:
    """Build from a `Case` (its gencost rows) or from a raw gencost matrix."""
    gencost = case_or_gencost.gencost if isinstance(case_or_gencost, Case) else np.asarray(case_or_gencost, float)
    if gencost is None:
        raise ValueError(f"{case_or_gencost.name} has no mpc.gencost; generation cost needs one row per generator")
    n_units = gencost.shape[0]
    npoly = int(max([r[3] for r in gencost if r[0] == POLYNOMIAL], default=1))
    nseg = int(max([r[3] - 1 for r in gencost if r[0] != POLYNOMIAL], default=1))
    poly = poly_coefficients(gencost, npoly)
    slope = np.zeros((n_units, nseg))
    intercept = np.full((n_units, nseg), -1e30)
    for i, row in enumerate(gencost):
        n = int(row[3])
        if row[0] != POLYNOMIAL:
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


def economic_dispatch(gencost: np.ndarray, pmin: np.ndarray, pmax: np.ndarray, demand: float) -> np.ndarray:
    """Least-cost outputs [n_units] MW meeting `demand` MW on a copper plate (no network), NumPy float64.

    Equal incremental cost: every unit not at a bound runs at the system price lambda, found by
    bisection; a polynomial of degree <= 2 gives P = (lambda - c1) / (2 c2), a linear one (c2 = 0)
    runs fully below lambda and not at all above, and the units at exactly lambda share what is left.
    PWL costs are refused (use an optimiser). Raises when demand is outside [sum Pmin, sum Pmax].
    """
    gencost = np.asarray(gencost, float)
    if np.any(gencost[:, 0] != POLYNOMIAL) or np.any(gencost[:, 3] > 3):
        raise ValueError("economic_dispatch takes polynomial costs of degree <= 2")
    _, c1, c2 = poly_coefficients(gencost).T
    if not pmin.sum() - 1e-9 <= demand <= pmax.sum() + 1e-9:
        raise ValueError(f"demand {demand:.6g} MW is outside the fleet's range [{pmin.sum():.6g}, {pmax.sum():.6g}] MW")

    def output(lam):
        quad = np.clip((lam - c1) / np.where(c2 > 0, 2 * c2, 1.0), pmin, pmax)
        return np.where(c2 > 0, quad, np.where(lam > c1, pmax, pmin))

    lo, hi = float(np.min(c1 + 2 * c2 * pmin)) - 1.0, float(np.max(c1 + 2 * c2 * pmax)) + 1.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if output(mid).sum() < demand else (lo, mid)
    # linear units whose price is the system price (within the bisection's resolution) may take any share
    marginal = (c2 == 0) & (np.abs(c1 - hi) <= 1e-9 * max(1.0, abs(hi)))
    p_lo = np.where(marginal, pmin, output(hi))
    room = np.where(marginal, pmax - pmin, 0.0)
    share = (demand - p_lo.sum()) / room.sum() if room.sum() > 0 else 0.0
    return p_lo + np.clip(share, 0.0, 1.0) * room
