"""Transmission task construction rules: line ratings for cases without them, ramp rates for units without
ramp data, outage schedules, the start-of-day dispatch and the AC voltage set-points. Plain NumPy over a
`Case` (no env, no JAX state); `make_trans_params` applies them."""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from evogrid.case import Case
from evogrid.case.matpower import PD, PMAX, PMIN, QD, QG, VG, VMAX, VMIN
from evogrid.physics import host_float64, make_dc_network

SLOW_RAMP, FAST_RAMP = 0.03, 0.5  # share of Pmax per hour: the cheaper half of the fleet, the rest (merit_ramp_rates)
N1_RATING = 1.25      # post-contingency limit: this times the line rating (a short-term emergency rating)
RATING_MARGIN = 1.13  # derived ratings: this times the economic-dispatch flow at the case's own loads


def setpoints_in_band(case: Case) -> Case:
    """`case` with every unit's voltage set-point (VG) clipped into its bus's [VMIN, VMAX] (where the bus has
    a band, VMAX > VMIN > 0); the same case when nothing changes."""
    lo, hi = case.bus[case.gen_bus, VMIN], case.bus[case.gen_bus, VMAX]
    banded = (hi > lo) & (lo > 0)
    vg = np.where(banded, np.clip(case.gen[:, VG], lo, hi), case.gen[:, VG])
    if np.array_equal(vg, case.gen[:, VG]):
        return case
    gen = case.gen.copy()
    gen[:, VG] = vg
    return dataclasses.replace(case, gen=gen)


def outage_schedule_days(case, model, given, per_day, steps, max_out, n_days, max_steps, seed) -> np.ndarray:
    """[n_days, max_steps, k] branch indices out of service (-1 = none): `given`, checked, or random events."""
    if given is not None:
        given = np.asarray(given)
        if given.ndim != 3 or given.shape[:2] != (n_days, max_steps) or not np.issubdtype(given.dtype, np.integer):
            raise ValueError(f"outage_schedule must be integers of shape [{n_days}, {max_steps}, k], got {given.dtype} {given.shape}")
        if np.any((given < -1) | (given >= case.n_branch)):
            raise ValueError(f"outage_schedule holds branch indices outside [0, {case.n_branch}) (and -1 for none)")
        return given.astype(np.int32)
    if per_day < 0 or steps < 1 or max_out < 1:
        raise ValueError(f"need outages_per_day >= 0, outage_steps >= 1, max_outages >= 1; got {per_day}, {steps}, {max_out}")
    if not per_day:
        return np.full((n_days, max_steps, 0), -1, np.int32)
    candidates = np.flatnonzero(~np.asarray(model.bridge))
    rng = np.random.default_rng([seed, 17])
    schedule = np.full((n_days, max_steps, max_out), -1, np.int32)
    for day in range(n_days):
        for _ in range(rng.poisson(per_day)):
            branch, start = rng.choice(candidates), rng.integers(max_steps)
            span = schedule[day, start:start + steps]
            free = np.flatnonzero(np.all(span == -1, axis=0) & ~np.any(span == branch))
            if free.size:  # a slot free over the whole outage, and not the same branch again
                span[:, free[0]] = branch
    return schedule


def merit_ramp_rates(case: Case) -> np.ndarray:
    """Ramp rates (share of Pmax per hour) for a case without ramp data: the cheaper half of the units, by
    marginal cost at the middle of their range, ramp at SLOW_RAMP (baseload), the others at FAST_RAMP. The
    slack unit is ranked like the others (load following is shared by every unit, see `follow_load`): on
    case14 it is the cheapest, so it is slow there. A schedule that sees the evening peak coming raises the
    slow cheap units early; a myopic one meets the peak with the fast dear ones (docs/design/ratings.md)."""
    from evogrid.physics import generation_cost, make_gen_cost

    mid = 0.5 * (case.gen[:, PMIN] + case.gen[:, PMAX])
    with host_float64():
        cost = make_gen_cost(case)
        h = 1e-3 * np.maximum(case.gen[:, PMAX] - case.gen[:, PMIN], 1.0)
        marginal = (np.asarray(generation_cost(cost, jnp.asarray(mid + h))) - np.asarray(generation_cost(cost, jnp.asarray(mid - h)))) / (2 * h)
    cheap = np.argsort(marginal, kind="stable")[: case.n_units // 2]
    rates = np.full(case.n_units, FAST_RAMP)
    rates[cheap] = SLOW_RAMP
    return rates


def _economic_dispatch_flows(case: Case, ac: bool = False) -> np.ndarray:
    """Branch flows of the economic dispatch (no network limits) at the case's own loads: signed DC flows
    in MW, or with `ac` the AC flows' MVA (the larger end; the case's voltage set-points held, the slack
    unit covering the losses)."""
    from evogrid.physics import branch_flows, economic_dispatch, make_ac_network, newton_raphson

    with host_float64():
        net = make_dc_network(case)
        ptdf, flow0, gs = (np.asarray(x, np.float64) for x in (net.ptdf, net.flow0, net.gs_total))
        pd = case.bus[:, PD]
        pg = economic_dispatch(case.gencost, case.gen[:, PMIN], case.gen[:, PMAX], pd.sum() + float(gs))
        inj = np.zeros(case.n_bus)
        np.add.at(inj, case.gen_bus, pg)
        if not ac:
            return ptdf @ (inj - pd) + flow0
        acn = make_ac_network(case)
        q = np.zeros(case.n_bus)
        np.add.at(q, case.gen_bus, case.gen[:, QG])
        v, converged, _ = newton_raphson(acn, jnp.asarray((inj - pd + 1j * (q - case.bus[:, QD])) / case.base_mva), iters=20)
        if not bool(converged):
            raise ValueError(f"{case.name}: the economic dispatch at the case's loads has no AC solution; pass ratings='case'")
        s_from, s_to = branch_flows(acn, v)
        return np.maximum(np.abs(np.asarray(s_from)), np.abs(np.asarray(s_to))) * case.base_mva


def derived_ratings(case: Case, margin: float = RATING_MARGIN, floor: float = 0.05, ac: bool = False) -> np.ndarray:
    """Line ratings for a case without real ones: `margin` times the flow of the economic dispatch (no
    network limits, `physics.economic_dispatch`) at the case's own bus loads, DC in MW or with `ac` the AC
    flow in MVA (reactive flows included, so the AC tasks' limits hold the same margin), and at least `floor`
    times the largest such flow. Loads above the case's Pd (some days reach 1.10, a bus a little more)
    then meet these limits, so the optimal schedule must redispatch around them. The default margin
    RATING_MARGIN is the least at which every test day of case14 keeps a schedule within the ratings that
    an operator can reach without planning hours ahead (measured: docs/design/ratings.md)."""
    flow = np.abs(_economic_dispatch_flows(case, ac))
    return np.maximum(margin * flow, floor * flow.max())


def derived_n1_ratings(case: Case, model, contingencies, margin: float = RATING_MARGIN) -> np.ndarray:
    """Emergency (post-contingency) ratings for a case without real ones, derived as `derived_ratings`
    are: `margin` times the largest flow over the screened single outages of the economic dispatch at
    the case's own loads. That dispatch is then N-1 secure with the margin; heavier load days are not,
    so a secure schedule must redispatch (and on the -n1 tasks it can, as `evogrid baseline` shows)."""
    flow = _economic_dispatch_flows(case)
    lodf = np.asarray(model.lodf, np.float64)[:, contingencies]           # [n_branch, c]
    post = np.abs(flow[:, None] + lodf * flow[contingencies][None, :])     # every branch after each outage
    return margin * post.max(1)


def start_dispatch(case: Case, load_p: np.ndarray, gs_total: float, lines=None) -> np.ndarray:
    """Start-of-day dispatch [n_days, n_units]: the cheapest dispatch of each day's first interval, within
    the line ratings where `lines` = (ptdf [n_branch, n_bus], flow0 [n_branch], rate [n_branch]) is given (DC
    tasks). That is the economic dispatch where its flows meet every rating, as on every day of the IEEE
    cases, whose derived ratings leave it a margin; else (pglib-opf's real, tight ratings) the single-interval
    DC-OPF, a day starting within its limits. A proportional share of headroom where the costs are not
    polynomials of degree <= 2."""
    from evogrid.physics import economic_dispatch

    pmin, pmax = case.gen[:, PMIN], case.gen[:, PMAX]
    within = None if lines is None else _within_ratings(case, *lines)
    out = []
    for load in load_p[:, 0]:
        demand = load.sum() + gs_total
        try:
            pg = economic_dispatch(case.gencost, pmin, pmax, demand)
        except ValueError:
            share = np.clip((demand - pmin.sum()) / max((pmax - pmin).sum(), 1e-6), 0.0, 1.0)
            out.append(pmin + share * (pmax - pmin))
            continue
        out.append(pg if within is None else within(pg, load, demand))
    return np.array(out)


def _within_ratings(case: Case, ptdf, flow0, rate, max_rounds: int = 30):
    """`within(pg, load, demand)`: the economic dispatch `pg` where its DC flows meet `rate`, else the least-cost
    dispatch meeting `demand` that does: the QP with the balance row and the rows of the lines found over their
    rating, added round by round until no line is (a few hundred of thousands of lines ever bind). It is
    called only where `economic_dispatch` took the costs (polynomials of degree <= 2)."""
    from evogrid.baselines.solvers import solve_qp
    from evogrid.physics.cost import poly_coefficients

    gen_ptdf = ptdf[:, case.gen_bus]                   # [n_branch, n_units] MW of flow per MW of each unit
    limited = np.isfinite(rate)
    _, c1, c2 = poly_coefficients(case.gencost).T

    def within(pg, load, demand):
        const = flow0 - ptdf @ load
        rows = np.zeros(case.n_branch, bool)
        for _ in range(max_rounds):
            over = limited & (np.abs(gen_ptdf @ pg + const) > rate * (1 + 1e-9)) & ~rows
            if not over.any():
                return pg
            rows |= over
            a = np.vstack([np.ones((1, case.n_units)), gen_ptdf[rows]])
            lo = np.concatenate([[demand], -rate[rows] - const[rows]])
            up = np.concatenate([[demand], rate[rows] - const[rows]])
            sol = solve_qp(c1, a, lo, up, case.gen[:, PMIN], case.gen[:, PMAX], hess_diag=2 * c2)
            if not sol.ok:
                raise ValueError(f"{case.name}: no dispatch of a day's first interval meets the line ratings "
                                 f"({sol.status}); pass ratings='derived'")
            pg = sol.x
        raise ValueError(f"{case.name}: the start-of-day dispatch within the ratings did not settle in {max_rounds} rounds")
    return within
