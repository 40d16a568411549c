"""Transmission dispatch (DC): the perfect-foresight multi-period DC-OPF of a day, and the myopic one-step policy.

The oracle of a day solves, with HiGHS, over every step t and unit g:

    min  sum_t sum_g cost_g(pg[t, g]) * dt * reward_scale          (gencost: polynomial -> QP, PWL -> LP epigraph)
    s.t. sum_g pg[t, g] = sum_b load[t, b] + shunt draw            (balance; the DC model is lossless)
         |PTDF (G' pg[t] - load[t]) + flow0| <= RATE_A              (every rated line)
         Pmin <= pg[t] <= Pmax,  |pg[t] - pg[t-1]| <= ramp           (pg[-1]: the day's start-of-day dispatch)

which is exactly what `TransGridEnv` (DC mode) simulates, so the schedule replayed through the
env returns minus the objective with zero cost channels. On tasks with line outages (-n1) each step's
line rows use the PTDF of the grid as it is that step (the day's outage schedule is foreseen too),
and with the N-1 channel the problem is security-constrained (preventive N-1): every screened
single outage's post-contingency flows within `n1_rate`. Those rows are many (177 x 186 per step on
case118), so they are added by constraint generation: solve, add the violated rows, solve again,
until none is violated (each round's objective is a lower bound; the last is optimal). The myopic policy solves the same
problem for one step at a time: the load it observes, within ramp limits of its last dispatch;
where that one step has no feasible dispatch it takes the least violating one (soft limits), and
its replay through the env reports the violation in the cost channels.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np
import scipy.sparse as sp

from evogrid.baselines.report import Reference, binding_rows, percent, register_reference, schedule_report
from evogrid.baselines.solvers import solve_qp
from evogrid.envs.trans import dispatch_action

N1_TOL = 1e-6  # MW a post-contingency flow may exceed its limit before a row is added
LINE_TOL = 1e-6  # MW a line's flow may exceed its limit before its row is added (constraint generation)
SOFT = 1e3  # penalty per MW of violation in the myopic policy's fall-back (reward units per MW per step)
BINDING = 1e-4  # relative closeness to a limit that counts as binding
AC_RATING_AIM = 0.97  # AC tasks: share of each MVA rating the rolling DC-OPF holds its MW flows to (reactive flows)


@dataclass
class DaySchedule:
    day: int
    status: str                        # "optimal" or "infeasible" (no dispatch meets every limit)
    cost: float | None                 # objective in reward units (minus the return), None when infeasible
    pg: np.ndarray | None = None       # [T, n_units] MW
    binding: dict = field(default_factory=dict)   # limit name -> whether it binds at some step ("line", "ramp", ...)
    n1_rows: int = 0                   # N-1 rows constraint generation added
    vm: np.ndarray | None = None       # [T, n_vbus] p.u. voltages of the voltage-controlled buses (AC reference)
    ask: np.ndarray | None = None      # [T, n_units] MW the set-points to ask for to get `pg` (AC reference; else `pg`)
    seconds: float | None = None       # wall time of the day's solve (every constraint-generation round), where timed


def step_rows(coef, steps, T: int):
    """Sparse rows over a T-step dispatch (step-major, G units a step): row i holds `coef[i]` [G] at the
    units of step `steps[i]` (a line's flow per MW of each unit, or an N-1 row). Built from the rows asked
    only: the rows of every (step, line) pair of 9241pegase would be 1.1 billion entries."""
    n, G = coef.shape
    cols = np.asarray(steps)[:, None] * G + np.arange(G)
    rows = sp.csr_matrix((coef.ravel(), cols.ravel(), np.arange(n + 1) * G), shape=(n, T * G))
    rows.eliminate_zeros()
    return rows


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
        self.full_ptdf, self.full_flow0, self.gen_inc = g(params.dc.ptdf), g(params.dc.flow0), g(params.gen_incidence)
        self.schedule = np.asarray(params.outage_schedule)                          # [days, T, k]
        self.isf = None if params.outages is None else g(params.outages.isf)
        self.contingencies = None if params.contingencies is None else np.asarray(params.contingencies)
        self.n1_rate = None if params.n1_rate is None else g(params.n1_rate)

    def grid(self, out):
        """The DC model with the branches `out` out of service: (ptdf [n_branch, n_bus], flow0, isf), the
        outaged branches' rows (and isf columns) at 0, by the low-rank update of `physics.security`; None
        when the set islands the grid."""
        k = sorted({int(o) for o in out if o >= 0})
        if not k:
            return self.full_ptdf, self.full_flow0, self.isf
        m = np.eye(len(k)) - self.isf[np.ix_(k, k)]
        if abs(np.linalg.det(m)) < 1e-9:
            return None
        update = lambda x: x + self.isf[:, k] @ np.linalg.solve(m, x[k])  # noqa: E731
        ptdf, flow0, isf = update(self.full_ptdf), update(self.full_flow0), update(self.isf)
        ptdf[k], flow0[k], isf[k], isf[:, k] = 0.0, 0.0, 0.0, 0.0
        return ptdf, flow0, isf

    def step_grids(self, day: int, steps=None):
        """Per step of `day` (or of `steps`, indices into it): (the grid of its outages, or None where they
        island it; whether a line trips that step, when the env holds flows to the emergency ratings)."""
        steps = range(self.schedule.shape[1]) if steps is None else steps
        cache, out = {}, []
        for t in steps:
            now = self.schedule[day, t]
            before = set(self.schedule[day, t - 1].tolist()) if t > 0 else set()
            grid = cache.setdefault(tuple(sorted(set(now.tolist()))), self.grid(now))
            out.append(None if grid is None else (*grid, any(o >= 0 and o not in before for o in now.tolist())))
        return out

    def step_rates(self, grids, T: int):
        """[T, n_lim] line limits per step: the emergency ratings in the step a line trips, else RATE_A."""
        rate = self.rate[self.limited]
        if grids is None or self.n1_rate is None:
            return np.broadcast_to(rate, (T, rate.size))
        return np.stack([self.n1_rate[self.limited] if trip else rate for *_, trip in grids])

    def solve(self, load, start, grids=None, max_rounds: int = 50, where: str = "", soft_slack=None):
        """The (multi-period) problem from dispatch `start`, N-1 secure where the task screens outages, by
        constraint generation: the line rows of (step, line) pairs start empty and every flow found over its
        limit adds its row, then (once every base-case flow is within) every violated post-contingency row,
        and the problem is solved again until nothing is violated. The answer is the full problem's (a
        relaxation whose optimum meets every row); few lines ever bind, so on grids of thousands of lines
        each solve is a fraction of the full one. With `soft_slack`, one step's least-violation LP
        (`build`), its line rows generated the same way (no N-1 rows): at 9,241 buses the LP of every line
        was 46M nonzeros and 5 s a decision. Returns (solution, number of N-1 rows added)."""
        extra, T = [], load.shape[0]
        watch = np.zeros((T, int(self.limited.sum())), bool)
        for _ in range(max_rounds):
            sol = solve_qp(*self.build(load, start, soft_slack=soft_slack, grids=grids, extra=extra, watch=watch))
            if not sol.ok:
                return sol, len(extra)
            pg = sol.x[:T * self.n_units].reshape(T, self.n_units)
            over = self.line_violations(pg, load, grids) & ~watch
            if over.any():
                watch |= over
                continue
            new = [] if self.contingencies is None or soft_slack is not None else self.n1_violations(pg, load, grids)
            if not new:
                return sol, len(extra)
            extra += new
        raise RuntimeError(f"{where}constraint generation did not settle in {max_rounds} rounds")

    def flows(self, pg, load, grids=None):
        """[T, n_lim] DC flows (MW) of the limited lines for dispatch `pg` [T, G]."""
        if grids is None:
            return (pg @ self.gen_ptdf.T) - load @ self.ptdf.T + self.flow0
        return np.stack([(ptdf @ (self.gen_inc.T @ pg[t] - load[t]) + f0)[self.limited]
                         for t, (ptdf, f0, *_) in enumerate(grids)])

    def line_violations(self, pg, load, grids=None):
        """[T, n_lim] whether each limited line's flow is over its step's limit (beyond LINE_TOL MW)."""
        return np.abs(self.flows(pg, load, grids)) > self.step_rates(grids, pg.shape[0]) + LINE_TOL

    def n1_violations(self, pg, load, grids):
        """Rows (t, coef [G], lo, hi) of every post-contingency flow of `pg` [T, G] above `n1_rate`."""
        rows = []
        for t, (ptdf, flow0, isf, _) in enumerate(grids):
            const = flow0 - ptdf @ load[t]                     # flow with no generation, every branch
            gen = ptdf @ self.gen_inc.T                         # [n_branch, G]
            f = gen @ pg[t] + const
            for c in self.contingencies:
                denom = 1.0 - isf[c, c]
                if abs(denom) < 1e-9:  # a bridge of the grid as it is, or already out: void, as in the env
                    continue
                lodf = isf[:, c] / denom
                post = f + lodf * f[c]
                post[c] = 0.0
                for line in np.flatnonzero(np.abs(post) > self.n1_rate + N1_TOL):
                    if line == c:
                        continue
                    coef = gen[line] + lodf[line] * gen[c]
                    base = const[line] + lodf[line] * const[c]
                    rows.append((t, coef, -self.n1_rate[line] - base, self.n1_rate[line] - base))
        return rows

    def build(self, load, start, soft_slack=None, grids=None, extra=(), watch=None):
        """The QP of len(load) steps from dispatch `start`, as sparse blocks over the variables
        [pg (T x G, step-major) | PWL epigraph z (T x n_pwl) | soft violations]. With `soft_slack` (the
        slack unit's index) line limits and the slack's bounds and ramp become soft (penalised), so
        that a step always has an answer. `grids`: per step, the grid as it is (`step_grids`; default the
        intact grid every step); `extra`: rows (t, coef [G], lo, hi) over step t's dispatch (N-1); `watch`
        ([T, n_lim] bool): the line rows to include (default every one).
        Returns the `solve_qp` arguments."""
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
        rate = self.step_rates(grids, T).ravel()
        n_lim = self.gen_ptdf.shape[0]
        keep = np.arange(T * n_lim) if watch is None else np.flatnonzero(watch.ravel())   # (step, line) rows
        steps, line = np.divmod(keep, n_lim)
        if grids is None:
            base = (self.flow0[None] - load @ self.ptdf.T).ravel()                                   # [T * n_lim]
            coef = self.gen_ptdf[line]
        else:  # each step's own grid (outages)
            lim = self.limited
            base = np.concatenate([f0[lim] - ptdf[lim] @ load[t] for t, (ptdf, f0, *_) in enumerate(grids)])
            gen = [ptdf[lim] @ self.gen_inc.T for ptdf, *_ in grids]                                # [n_lim, G] a step
            coef = np.array([gen[t][i] for t, i in zip(steps, line)]).reshape(-1, G)
        lines, base, rate = step_rows(coef, steps, T), base[keep], rate[keep]
        n_line = lines.shape[0]
        # ramp rows pg[t] - pg[t-1] for t >= 1; the first step's ramp limit is a bound on pg[0] (HiGHS's QP
        # solver can cycle on singleton rows, measured on case14)
        diff = sp.kron(sp.identity(T) - sp.eye(T, k=-1), sp.identity(G)).tocsr()[G:]
        ramp = np.tile(self.ramp, T - 1)
        if soft_slack is None:
            add(lines, None, -rate - base, rate - base)
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
        if extra:
            rows = step_rows(np.stack([r[1] for r in extra]), np.array([r[0] for r in extra]), T)
            add(rows, None, np.array([r[2] for r in extra]), np.array([r[3] for r in extra]))
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

    def binding(self, pg, load, start, grids=None):
        """(some line at its limit at some step, some unit at its ramp limit at some step)."""
        flows = self.flows(pg, load, grids)
        rate = self.step_rates(grids, flows.shape[0])
        line = bool(np.any(np.abs(flows) >= rate * (1.0 - BINDING) - 1e-6)) if rate.size else False
        steps = np.diff(np.concatenate([start[None], pg]), axis=0)
        ramp = bool(np.any(np.abs(steps) >= self.ramp * (1.0 - BINDING) - 1e-6))
        return line, ramp


def each_day(days, progress=None):
    """The days one by one, calling `progress(done, total)` after each (whatever the loop body does with
    `continue`)."""
    days = list(days)
    for k, d in enumerate(days):
        yield d
        if progress:
            progress(k + 1, len(days))


def dc_opf_oracle(params, days=None, max_rounds: int = 50, progress=None) -> list[DaySchedule]:
    """The perfect-foresight multi-period DC-OPF of each day (default: every day of `params`); on tasks
    with outages and N-1 screening, security-constrained (rows added by constraint generation, at most
    `max_rounds` solves a day). `progress(done, total)` is called after each day."""
    import time

    prob = _Problem(params)
    out = []
    for d in each_day(range(prob.load.shape[0]) if days is None else days, progress):
        grids = prob.step_grids(d) if prob.isf is not None else None
        if grids is not None and any(g is None for g in grids):
            out.append(DaySchedule(int(d), "islanded", None))
            continue
        t0 = time.perf_counter()
        sol, n1_rows = prob.solve(prob.load[d], prob.start[d], grids, max_rounds, where=f"day {d}: ")
        seconds = time.perf_counter() - t0
        if not sol.ok:
            out.append(DaySchedule(int(d), sol.status, None, seconds=seconds))
            continue
        T = prob.load.shape[1]
        pg = sol.x[:T * prob.n_units].reshape(T, prob.n_units)
        line, ramp = prob.binding(pg, prob.load[d], prob.start[d], grids)
        out.append(DaySchedule(int(d), "optimal", float(sol.objective), pg, {"line": line, "ramp": ramp}, n1_rows,
                               seconds=seconds))
    return out


def setpoint_action(params, want, prev, vm=None):
    """The env action that asks for active outputs `want` [n_units] from the units' last output `prev`
    (`dispatch_action`) and, given `vm` [n_vbus], for those voltage set-points (`voltage_action`)."""
    from evogrid.envs.trans import voltage_action

    action = dispatch_action(params, want, prev)
    return action if vm is None else jnp.concatenate([action, voltage_action(params, vm)])


def replay_program(env, params):
    """One compiled `run(day, pg, vm=None) -> (return, summed costs per channel [C])` that plays the schedule
    `pg` [T, n_units] from the start of `day`, each step asking for `pg[t]` from the units' actual last
    output (`dispatch_action`) and, on AC tasks with voltage control, for the voltage set-points `vm[t]`
    [n_vbus] (`voltage_action`)."""

    @jax.jit
    def run(day, pg, vm=None):
        _, state = env.reset_to_day(day, params)

        def step(state, x):
            want, v = x
            action = setpoint_action(params, want, state.pg, v)
            _, state, reward, costs, _, _ = env.step_no_reset(jax.random.key(0), state, action, params)
            return state, (reward, costs)

        _, (reward, costs) = jax.lax.scan(step, state, (pg, vm))
        return reward.sum(), costs.sum(0)

    return run


def replay(env, params, day: int, pg):
    """Play the dispatch schedule `pg` [T, n_units] from the start of `day` (`replay_program`): (return,
    summed costs per channel [C])."""
    dtype = jax.dtypes.canonicalize_dtype(jnp.float64)   # float64 under x64
    ret, costs = replay_program(env, params)(jnp.int32(day), jnp.asarray(pg, dtype))
    return float(ret), np.asarray(costs, np.float64)


def myopic_policy(env, params, days=None, progress=None):
    """Replayed figures of the myopic policy on each day: (returns [n], costs [n, C]) (`rolling_policy` with
    a horizon of one interval: the one-step DC-OPF of the load it observes)."""
    returns, costs, _, _ = rolling_policy(env, params, 1, days, progress)
    return returns, costs


def rolling_policy(env, params, horizon: int = 1, days=None, progress=None, record=None):
    """Replayed figures of the rolling-horizon DC-OPF (model-predictive control) on each day: every interval
    it solves the multi-period problem of that interval (the bus loads it observes) and the next
    `horizon - 1` (the observation's forecast of their total load, spread over the buses as the present
    loads are: `forecast_bus_loads`), within ramp limits of its last dispatch, and applies the first
    interval's dispatch; where the forecast has no schedule within every limit, it solves half the horizon,
    then the interval alone. `horizon=1` is the myopic policy. On -n1 tasks it solves on the grid as it is, N-1
    secure, by the same constraint generation; where no dispatch meets every limit it takes the least
    violating one of the first interval alone. On AC tasks (an operator's DC market dispatch) every interval's
loads are raised by the share of the load the units' last outputs carried beyond the loads they met (the
losses, as observed), the MW flows held to AC_RATING_AIM of the MVA ratings, and the voltage-controlled
buses asked to hold their last |V|: the voltages are the voltage schedule's (`evogrid.safety`) to correct.
`env` may be `Shielded` (the action then passes through
    the safety layer). `record`, a list, receives each interval's (observation, action). Returns (returns [n],
    costs [n, C], MWh the layer moved per day [n], mean seconds per decision)."""
    from evogrid.envs.trans import forecast_bus_loads, observation_layout, read_observation

    layout = observation_layout(params)
    if not isinstance(horizon, int) or not 1 <= horizon <= 1 + layout[0]:
        raise ValueError(f"horizon must be an integer in [1, {1 + layout[0]}]: the interval itself and the "
                         f"{layout[0]} the observation forecasts, got {horizon!r}")
    prob = _Problem(params.replace(ac=False, rate=params.rate * AC_RATING_AIM) if params.ac else params)
    slack = int(np.argmax(np.asarray(params.slack)))
    read = jax.jit(lambda obs: read_observation(obs, params, layout))
    dtype = params.pmin.dtype
    to_action = jax.jit(lambda pg, last, vm: setpoint_action(params, pg.astype(dtype), last.astype(dtype),
                                                           vm.astype(dtype) if params.voltage_control else None))
    seen_load = {}   # AC tasks: the loads of the interval just past, whose losses the last outputs carried

    def decide(d, t, seen):
        # a slack that the last step left outside its range by more than a ramp returns to its nearest bound
        prev = np.clip(seen["last_pg"], prob.pmin - prob.ramp, prob.pmax + prob.ramp)
        grids = prob.step_grids(d, [t]) if prob.isf is not None else None
        if grids is not None and grids[0] is None:
            raise RuntimeError(f"rolling dispatch, day {d} step {t}: the scheduled outages island the grid")
        k = min(horizon, params.max_steps - t)
        load = np.concatenate([seen["load_mw"][None], forecast_bus_loads(seen["load_mw"], seen["forecast_mw"][:k - 1])])
        if params.ac:   # the losses' share of the load, as the last interval carried it, added to every interval's
            before = seen_load.get(d, seen["load_mw"]).sum()
            load = load * (1.0 + (seen["last_pg"].sum() - prob.shunt - before) / before)
            seen_load[d] = seen["load_mw"]
        for k in dict.fromkeys((k, max(1, k // 2), 1)):   # a forecast no schedule meets: a shorter horizon
            ahead = None if grids is None else grids + [(*grids[0][:3], False)] * (k - 1)   # the grid as it is
            sol, _ = prob.solve(load[:k], prev, ahead, where=f"rolling dispatch, day {d} step {t}: ")
            if sol.ok:
                break
        if not sol.ok:  # no dispatch meets every limit: the least violating one of this interval
            sol, _ = prob.solve(load[:1], prev, grids, soft_slack=slack, where=f"rolling dispatch, day {d} step {t}: ")
        if not sol.ok:
            raise RuntimeError(f"rolling dispatch, day {d} step {t}: the solver returned {sol.status!r}")
        vm = np.asarray(params.vbus_incidence) @ seen["vm"] if params.voltage_control else np.zeros(0)
        return to_action(np.asarray(sol.x[:prob.n_units]), seen["last_pg"], vm)

    days = range(prob.load.shape[0]) if days is None else days
    return play_decisions(env, params, days, read, decide, progress, record)


def play_decisions(env, params, days, read, decide, progress=None, record=None):
    """Each of `days` played from its start through `env` (with its safety layer when `Shielded`), every
    interval's action chosen on the host by `decide(day, t, seen) -> action` (an optimiser's controller)
    from what it observes, `seen` = `read(obs)` as float64 NumPy arrays. `record`, a list, receives each
    interval's (observation, action). Returns (returns [n], costs [n, C], MWh the layer moved per day [n],
    mean seconds per decision: `decide` alone, after the first, which also compiles its jitted helpers)."""
    import time

    step = jax.jit(env.step_no_reset)
    returns, costs, moved, seconds = [], [], [], []
    for d in each_day(days, progress):
        obs, state = env.reset_to_day(jnp.int32(d), params)
        total, cost, mwh = 0.0, 0.0, 0.0
        for t in range(params.max_steps):
            seen = {k: np.asarray(v, np.float64) for k, v in read(obs).items()}
            t0 = time.perf_counter()
            action = decide(d, t, seen)
            seconds.append(time.perf_counter() - t0)
            if record is not None:
                record.append((np.asarray(obs), np.asarray(action)))
            obs, state, reward, c, _, info = step(jax.random.key(t), state, action, params)
            total += float(reward)
            cost = cost + np.asarray(c, np.float64)
            mwh += float(info.get("layer_moved", 0.0))
        returns.append(total)
        costs.append(cost)
        moved.append(mwh)
    timed = seconds[1:] or seconds   # the first decision also compiles the controller's jitted helpers
    return np.array(returns), np.array(costs), np.array(moved), float(np.mean(timed)) if timed else 0.0


def _reference_report(env, params, task, progress) -> dict:
    oracle = dc_opf_oracle(params, progress=progress("multi-period DC-OPF"))
    returns, costs, _, seconds = rolling_policy(env, params, 1, progress=progress("myopic policy"))
    return schedule_report(oracle, "schedule", returns, costs, seconds)


def _reference_words(task) -> str:
    secure = "security-constrained (N-1, outages foreseen) " if task.options.get("n1") else ""
    return (f"oracle: perfect-foresight {secure}multi-period DC-OPF, Clarabel/HiGHS; myopic: the same for one "
            "step, within ramp limits")


def _reference_rows(s) -> list[tuple[str, str]]:
    timed = [("oracle solve time, s/day", f"{s['oracle_seconds_per_day']:.2f}")] if "oracle_seconds_per_day" in s else []
    return [("oracle mean return", f"{s['oracle_return']:.4f}"), ("oracle infeasible days", f"{s['infeasible_days']}"), *timed,
            *binding_rows(s), ("myopic mean return", f"{s['myopic_return']:.4f}"),
            ("myopic feasible days", percent(s["myopic_feasible_share"])),
            ("myopic gap to the oracle", f"{s['myopic_gap_pct']:.3f}% of cost")]


register_reference("tso", Reference(_reference_report, _reference_words, _reference_rows, operators=True))
