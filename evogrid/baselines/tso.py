"""Transmission dispatch (DC): the perfect-foresight multi-period DC-OPF of a day, and the myopic one-step policy.

The oracle of a day solves, with HiGHS, over every step t and unit g:

    min  sum_t sum_g cost_g(pg[t, g]) * dt * reward_scale          (gencost: polynomial -> QP, PWL -> LP epigraph)
    s.t. sum_g pg[t, g] = sum_b load[t, b] + shunt draw            (balance; the DC model is lossless)
         |PTDF (G' pg[t] - load[t]) + flow0| <= RATE_A              (every rated line)
         Pmin <= pg[t] <= Pmax,  |pg[t] - pg[t-1]| <= ramp           (pg[-1]: the day's start-of-day dispatch)

which is exactly what `TransGridEnv` (DC mode) simulates, so the schedule replayed through the
env returns minus the objective with zero cost channels. The myopic policy solves the same
problem for one step at a time: the load it observes, within ramp limits of its last dispatch;
where that one step has no feasible dispatch it takes the least violating one (soft limits), and
its replay through the env reports the violation in the cost channels.
"""
from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import scipy.sparse as sp

from evogrid.baselines.solvers import solve_qp

SOFT = 1e3  # penalty per MW of violation in the myopic policy's fall-back (reward units per MW per step)
BINDING = 1e-4  # relative closeness to a limit that counts as binding


@dataclass
class DaySchedule:
    day: int
    status: str                        # "optimal" or "infeasible" (no dispatch meets every limit)
    cost: float | None                 # objective in reward units (minus the return), None when infeasible
    pg: np.ndarray | None = None       # [T, n_units] MW
    line_binding: bool = False         # some line at its rating at some step
    ramp_binding: bool = False         # some unit at its ramp limit at some step


class _Problem:
    """The numeric data of a `TransParams` (DC), in float64 NumPy."""

    def __init__(self, params):
        if params.ac:
            raise ValueError("the DC-OPF oracle is for DC tasks; AC tasks use `ac_opf_reference`")
        g = lambda x: np.asarray(x, np.float64)  # noqa: E731
        self.params = params
        self.pmin, self.pmax, self.ramp = g(params.pmin), g(params.pmax), g(params.ramp)
        self.rate = g(params.rate)
        self.limited = np.isfinite(self.rate)
        ptdf = g(params.dc.ptdf)[self.limited]
        self.ptdf, self.flow0 = ptdf, g(params.dc.flow0)[self.limited]
        self.gen_ptdf = ptdf @ g(params.gen_incidence).T           # [n_lim, n_units] flow per MW of each unit
        self.shunt = float(g(params.dc.gs_total))
        self.load = g(params.load_p)                                # [days, T, n_bus]
        self.start = g(params.init.pg)                              # [days, n_units]
        self.scale = float(g(params.reward_scale)) * params.delta_t_hours
        cost = params.cost
        poly = g(cost.poly)
        if poly.shape[1] > 3 and np.any(poly[:, 3:] != 0):
            raise ValueError("polynomial generation costs above degree 2 are not a convex QP; the oracle needs degree <= 2")
        poly = np.pad(poly, ((0, 0), (0, max(0, 3 - poly.shape[1]))))
        self.c0, self.c1, self.c2 = poly[:, 0], poly[:, 1], poly[:, 2]
        self.is_poly = g(cost.is_poly) > 0
        self.slope, self.intercept = g(cost.slope), g(cost.intercept)
        self.n_units = self.pmin.shape[0]

    def build(self, load, start, soft_slack=None):
        """The QP of len(load) steps from dispatch `start`, as sparse blocks over the variables
        [pg (T x G, step-major) | PWL epigraph z (T x n_pwl) | soft violations]. With `soft_slack` (the
        slack unit's index) line limits and the slack's bounds and ramp become soft (penalised), so
        that a step always has an answer. Returns the `solve_qp` arguments."""
        T, G = load.shape[0], self.n_units
        eye_t = sp.identity(T, format="csr")
        pwl = np.flatnonzero(~self.is_poly)
        n_z = T * len(pwl)
        blocks, lo, up = [], [], []  # row blocks over [pg | z]

        def add(a_pg, a_z, low, high):
            blocks.append(sp.hstack([a_pg, a_z if a_z is not None else sp.csr_matrix((a_pg.shape[0], n_z))]))
            lo.append(np.broadcast_to(low, (a_pg.shape[0],)))
            up.append(np.broadcast_to(high, (a_pg.shape[0],)))

        demand = load.sum(1) + self.shunt
        add(sp.kron(eye_t, np.ones((1, G))), None, demand, demand)                                   # balance
        rate = self.rate[self.limited]
        base = (self.flow0[None] - load @ self.ptdf.T).ravel()                                       # [T * n_lim]
        lines = sp.kron(eye_t, sp.csr_matrix(self.gen_ptdf))
        n_line = lines.shape[0]
        # ramp rows pg[t] - pg[t-1] for t >= 1; the first step's ramp limit is a bound on pg[0] (HiGHS's QP
        # solver can cycle on singleton rows, measured on case14)
        diff = sp.kron(sp.identity(T) - sp.eye(T, k=-1), sp.identity(G)).tocsr()[G:]
        ramp = np.tile(self.ramp, T - 1)
        if soft_slack is None:
            add(lines, None, -np.tile(rate, T) - base, np.tile(rate, T) - base)
            add(diff, None, -ramp, ramp)
        else:
            add(lines, None, -np.inf, np.inf)  # placeholders for the soft rows below
            add(diff, None, -ramp, ramp)
        for s in range(self.slope.shape[1]):                                                         # PWL epigraph
            real = self.intercept[pwl, s] > -1e29
            if not np.any(real):
                continue
            pick = sp.identity(len(pwl), format="csr")[real]
            slope = sp.csr_matrix(np.eye(G)[pwl[real]] * -self.slope[pwl[real], s][:, None])
            add(sp.kron(eye_t, slope), sp.kron(eye_t, pick), np.tile(self.intercept[pwl[real], s], T), np.inf)
        A = sp.vstack(blocks, format="csr")
        lo, up = np.concatenate(lo), np.concatenate(up)
        col_lo = np.concatenate([np.tile(self.pmin, T), np.full(n_z, -np.inf)])
        col_up = np.concatenate([np.tile(self.pmax, T), np.full(n_z, np.inf)])
        col_lo[:G], col_up[:G] = np.maximum(self.pmin, start - self.ramp), np.minimum(self.pmax, start + self.ramp)
        if np.any(col_lo[:G] > col_up[:G]):
            raise ValueError("the start dispatch lies outside [Pmin, Pmax] by more than a ramp")
        c = np.concatenate([np.tile(np.where(self.is_poly, self.c1, 0.0), T), np.ones(n_z)]) * self.scale
        hess = np.concatenate([np.tile(np.where(self.is_poly, 2.0 * self.c2, 0.0), T), np.zeros(n_z)]) * self.scale
        offset = T * np.sum(np.where(self.is_poly, self.c0, 0.0)) * self.scale
        if soft_slack is not None:
            if T != 1:
                raise ValueError("the soft (least-violation) problem is one step")
            A, lo, up, c, hess, col_lo, col_up = self._soften(A, lo, up, c, hess, col_lo, col_up, soft_slack, n_line,
                                                              rate, base, start)
        return c, A, lo, up, col_lo, col_up, hess, offset

    def _soften(self, A, lo, up, c, hess, col_lo, col_up, slack, n_line, rate, base, start):
        """One step's least-violation LP: line limits and the slack unit's bounds and ramp get a violation
        variable >= 0 each, priced at SOFT; the quadratic cost is linearised at the start dispatch (an LP,
        which HiGHS's simplex solves robustly); other units keep their hard bounds."""
        lines = A[1:1 + n_line]
        keep = sp.vstack([A[:1], A[1 + n_line:]])
        keep_lo, keep_up = np.concatenate([lo[:1], lo[1 + n_line:]]), np.concatenate([up[:1], up[1 + n_line:]])
        n_var = A.shape[1]
        pick = sp.csr_matrix(([1.0], ([0], [slack])), shape=(1, n_var))
        s_lo, s_up = max(self.pmin[slack], start[slack] - self.ramp[slack]), min(self.pmax[slack], start[slack] + self.ramp[slack])
        soft_rows = [(lines, -np.inf, rate - base, -1.0), (lines, -rate - base, np.inf, 1.0),
                     (pick, s_lo, np.inf, 1.0), (pick, -np.inf, s_up, -1.0)]
        n_soft = sum(r[0].shape[0] for r in soft_rows)
        blocks = [sp.hstack([keep, sp.csr_matrix((keep.shape[0], n_soft))])]
        lo_parts, up_parts = [keep_lo], [keep_up]
        c = c + hess * np.concatenate([start, np.zeros(n_var - start.shape[0])])  # marginal cost at the start
        hess = np.zeros_like(hess)
        offset = 0
        for rows, low, high, sign in soft_rows:
            n = rows.shape[0]
            viol = sp.csr_matrix((np.full(n, sign), (np.arange(n), offset + np.arange(n))), shape=(n, n_soft))
            blocks.append(sp.hstack([rows, viol]))
            lo_parts.append(np.broadcast_to(low, (n,)))
            up_parts.append(np.broadcast_to(high, (n,)))
            offset += n
        col_lo, col_up = col_lo.copy(), col_up.copy()
        col_lo[slack], col_up[slack] = -np.inf, np.inf
        return (sp.vstack(blocks, format="csr"), np.concatenate(lo_parts), np.concatenate(up_parts),
                np.concatenate([c, np.full(n_soft, SOFT)]), np.concatenate([hess, np.zeros(n_soft)]),
                np.concatenate([col_lo, np.zeros(n_soft)]), np.concatenate([col_up, np.full(n_soft, np.inf)]))

    def binding(self, pg, load, start):
        flows = (pg @ self.gen_ptdf.T) - load @ self.ptdf.T + self.flow0          # [T, n_lim]
        rate = self.rate[self.limited]
        line = bool(np.any(np.abs(flows) >= rate * (1.0 - BINDING) - 1e-6)) if rate.size else False
        steps = np.diff(np.concatenate([start[None], pg]), axis=0)
        ramp = bool(np.any(np.abs(steps) >= self.ramp * (1.0 - BINDING) - 1e-6))
        return line, ramp


def dc_opf_oracle(params, days=None) -> list[DaySchedule]:
    """The perfect-foresight multi-period DC-OPF of each day (default: every day of `params`)."""
    prob = _Problem(params)
    out = []
    for d in range(prob.load.shape[0]) if days is None else days:
        sol = solve_qp(*prob.build(prob.load[d], prob.start[d]))
        if not sol.ok:
            out.append(DaySchedule(int(d), sol.status, None))
            continue
        T = prob.load.shape[1]
        pg = sol.x[:T * prob.n_units].reshape(T, prob.n_units)
        line, ramp = prob.binding(pg, prob.load[d], prob.start[d])
        out.append(DaySchedule(int(d), "optimal", float(sol.objective), pg, line, ramp))
    return out


def dispatch_action(params, pg):
    """The env action [..., n_units] that asks for dispatch `pg` (inverse of the env's mapping)."""
    span = np.asarray(params.pmax - params.pmin, np.float64)
    a = 2.0 * (np.asarray(pg, np.float64) - np.asarray(params.pmin, np.float64)) / np.where(span > 0, span, 1.0) - 1.0
    return np.clip(np.where(span > 0, a, 0.0), -1.0, 1.0)


def replay(env, params, day: int, actions):
    """Play `actions` [T, n_act] from the start of `day`: (return, summed costs per channel [C])."""
    from evogrid.rollout import collect

    @jax.jit
    def run(actions):
        obs, state = env.reset_to_day(jnp.int32(day), params)
        _, _, tr, _ = collect(env, params, lambda k, o, a: (a, None), jax.random.key(0), state, obs, actions.shape[0],
                              reset=False, inputs=actions)
        return tr.reward.sum(), tr.costs.sum(0)

    ret, costs = run(jnp.asarray(actions, params.pmin.dtype))
    return float(ret), np.asarray(costs, np.float64)


def myopic_policy(env, params, days=None):
    """Replayed figures of the myopic policy on each day: (returns [n], costs [n, C]). Each step it solves
    the one-step DC-OPF of the load it observes, within ramp limits of its last dispatch."""
    prob = _Problem(params)
    slack = int(np.argmax(np.asarray(params.slack)))
    step = jax.jit(env.step_no_reset)
    returns, costs = [], []
    for d in range(prob.load.shape[0]) if days is None else days:
        obs, state = env.reset_to_day(jnp.int32(d), params)
        total, cost = 0.0, 0.0
        for t in range(params.max_steps):
            prev = np.asarray(state.pg, np.float64)
            sol = solve_qp(*prob.build(prob.load[d, t:t + 1], prev))
            if not sol.ok:  # no dispatch meets every limit this step: the least violating one
                sol = solve_qp(*prob.build(prob.load[d, t:t + 1], prev, soft_slack=slack))
            if not sol.ok:
                raise RuntimeError(f"myopic dispatch, day {d} step {t}: HiGHS returned {sol.status!r}")
            pg = sol.x[:prob.n_units]
            action = jnp.asarray(dispatch_action(params, pg), params.pmin.dtype)
            obs, state, reward, c, _, _ = step(jax.random.key(t), state, action, params)
            total += float(reward)
            cost = cost + np.asarray(c, np.float64)
        returns.append(total)
        costs.append(cost)
    return np.array(returns), np.array(costs)
