"""Market clearing: uniform-price merit order (copper plate) and DC optimal power flow with line limits.

Offers are segments k with a price c_k ($/MWh) and a capacity u_k (MW) at a bus. Both clearings
are pure functions of fixed shapes, so they jit and vmap.

Merit order: sort by price and fill the demand; the marginal segment sets the price.

DC-OPF (the linear programme an operator solves for nodal prices)

    min  c'g   s.t.  1'g = 1'd                         (balance, dual lambda)
                     -F <= PTDF (A g - d) + f0 <= F     (line limits, duals mu- , mu+ >= 0)
                     0 <= g <= u

is solved with a fixed number of primal-dual hybrid gradient iterations (Chambolle-Pock, the
method of PDLP) with restarts to the running average, which converges linearly on LPs. The
nodal prices are  LMP_n = lambda - [PTDF' (mu+ - mu-)]_n. Variables are scaled internally (MW
by `base_mva`, prices by their largest magnitude). Accuracy against HiGHS is tested in
tests/test_market.py; iterations are a static argument (more = closer).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from evogrid.physics._common import as_float


def merit_order(prices, caps, demand):
    """Uniform-price clearing on a copper plate: (dispatch [K] MW, clearing price $/MWh, unserved MW).

    The price is the offer price of the marginal segment (the last one needed); when the offers
    cannot cover the demand, the last segment's price is returned and the shortfall as unserved.
    """
    order = jnp.argsort(prices)
    cap_sorted = caps[order]
    before = jnp.cumsum(cap_sorted) - cap_sorted
    take = jnp.clip(demand - before, 0.0, cap_sorted)
    dispatch = jnp.zeros_like(caps).at[order].set(take)
    marginal = jnp.clip(jnp.sum(before < demand) - 1, 0, caps.shape[0] - 1)
    unserved = jnp.maximum(demand - jnp.sum(caps), 0.0)
    return dispatch, prices[order][marginal], unserved


@struct.dataclass
class DCOPF:
    """Static structure of the DC-OPF for a fixed set of offer segments (see `make_dcopf`)."""

    seg_ptdf: jnp.ndarray   # [n_lim, K] flow on each limited line per MW from segment k
    ptdf: jnp.ndarray       # [n_lim, n_bus]
    f0: jnp.ndarray         # [n_lim]
    f_max: jnp.ndarray      # [n_lim] MW
    tau: jnp.ndarray
    sigma: jnp.ndarray
    base: float = struct.field(pytree_node=False, default=100.0)


def make_dcopf(ptdf: np.ndarray, f0: np.ndarray, rate: np.ndarray, seg_bus: np.ndarray, base: float = 100.0,
               primal_weight: float = 0.01) -> DCOPF:
    """`ptdf` [n_line, n_bus], `f0` [n_line] (flows at zero injection), `rate` [n_line] MW (0 or inf =
    unlimited; those lines are left out), `seg_bus` [K] bus index of each offer segment."""
    ptdf, rate = np.asarray(ptdf, float), np.asarray(rate, float)
    limited = np.isfinite(rate) & (rate > 0)
    seg_ptdf = ptdf[limited][:, seg_bus]
    k = np.vstack([np.ones((1, seg_ptdf.shape[1])), seg_ptdf, -seg_ptdf])  # rows in scaled units alike
    step = 0.95 / np.linalg.norm(k, 2)
    return DCOPF(seg_ptdf=as_float(seg_ptdf), ptdf=as_float(ptdf[limited]), f0=as_float(np.asarray(f0)[limited]),
                 f_max=as_float(rate[limited]), tau=as_float(step / primal_weight), sigma=as_float(step * primal_weight),
                 base=base)


def dc_opf(opf: DCOPF, prices, caps, load_bus, iters: int = 20000, restart: int = 200, warm=None, tol=None):
    """Solve the DC-OPF. `prices`, `caps` [K]; `load_bus` [n_bus] MW. Returns (dispatch [K] MW,
    LMP [n_bus] $/MWh, line flows [n_lim] MW, (x, y) to warm-start the next call).

    Restart blocks of `restart` iterations repeat (a `lax.while_loop`) until the restarted point moves by
    less than `tol` (scaled units; default 1e-10 in float64, 1e-5 in float32, where round-off keeps the
    restart point moving by ~1e-6: prices then differ by ~1e-3 $/MWh from a 20,000-iteration solve) or `iters` is reached: a
    congested hour near capacity needed 8000 iterations to match HiGHS where an easy one needs ~1000
    (measured on case5 at 1.15 x its loads). Under vmap the loop runs until the slowest member converges.
    Make demand always coverable by offering load shedding as segments at a price cap.
    """
    scale_c = jnp.maximum(jnp.max(jnp.abs(prices)), 1.0)
    c, u = prices / scale_c, caps / opf.base
    d = load_bus / opf.base
    base_flow = (opf.f0 - opf.ptdf @ load_bus) / opf.base            # flow with no generation
    fmax = opf.f_max / opf.base
    # K x >= q rows: balance (equality), -flow >= -F (upper limit), flow >= -F (lower limit)
    q = jnp.concatenate([jnp.sum(d)[None], -fmax + base_flow, -fmax - base_flow])
    n_lim = opf.f_max.shape[0]

    def kx(x):
        f = opf.seg_ptdf @ x
        return jnp.concatenate([jnp.sum(x)[None], -f, f])

    def kty(y):
        return y[0] + opf.seg_ptdf.T @ (y[1 + n_lim:] - y[1:1 + n_lim])

    def iterate(carry, _, c=c, q=q):
        x, y, xs, ys = carry
        x1 = jnp.clip(x - opf.tau * (c - kty(y)), 0.0, u)
        y1 = y + opf.sigma * (q - kx(2 * x1 - x))
        y1 = y1.at[1:].set(jnp.maximum(y1[1:], 0.0))
        return (x1, y1, xs + x1, ys + y1), None

    def restart_block(carry, _, c=c, q=q):
        x, y = carry
        step = lambda carry, _: iterate(carry, _, c, q)  # noqa: E731
        (x, y, xs, ys), _ = jax.lax.scan(step, (x, y, jnp.zeros_like(x), jnp.zeros_like(y)), None, length=restart)
        return (xs / restart, ys / restart), None

    x0, y0 = (jnp.zeros_like(u), jnp.zeros(1 + 2 * n_lim, u.dtype)) if warm is None else warm
    tol = (1e-10 if jnp.finfo(u.dtype).bits == 64 else 1e-5) if tol is None else tol

    def moving(carry):
        k, _, _, change = carry
        return (k < max(iters // restart, 1)) & (change >= tol)

    # the loop runs on constants; one more iteration after it, from its point, carries derivatives
    c_fixed, q_fixed = jax.lax.stop_gradient((c, q))

    def block(carry, c=c_fixed, q=q_fixed):
        k, x, y, _ = carry
        (x1, y1), _ = restart_block((x, y), None, c, q)
        return k + 1, x1, y1, jnp.maximum(jnp.max(jnp.abs(x1 - x)), jnp.max(jnp.abs(y1 - y)))

    start = jax.lax.stop_gradient((x0, y0))
    _, x, y, _ = jax.lax.while_loop(moving, block, (jnp.int32(0), *start, jnp.asarray(jnp.inf, u.dtype)))
    (x, y, _, _), _ = iterate((x, y, x, y), None, c, q)
    # duals back in $/MWh: the objective was scaled by 1 / (scale_c * base) and each row by 1 / base
    lam, mu_up, mu_dn = y[0] * scale_c, y[1:1 + n_lim] * scale_c, y[1 + n_lim:] * scale_c
    lmp = lam - opf.ptdf.T @ (mu_up - mu_dn)
    dispatch = x * opf.base
    flows = opf.seg_ptdf @ dispatch + base_flow * opf.base
    return dispatch, lmp, flows, (x, y)
