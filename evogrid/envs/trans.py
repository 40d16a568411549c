"""TSO task: transmission dispatch on a MATPOWER case (PowerZooJax `TransGridEnv`).

Each step the agent sets every generating unit's set-point for the next interval
of `delta_t_hours`; actions in [-1, 1] map linearly onto the unit's ramp window,
the outputs within [Pmin, Pmax] and within a ramp of its last output
(`ramp_window`; -1 the lowest, 1 the highest, `dispatch_action` the inverse), so
every action is a different set-point and none breaks a unit's own limits. (Mapped
onto [Pmin, Pmax] and then clipped, a unit ramping 1.5% of Pmax a step reached its
whole window with 1.5% of the action range and every action outside it gave the
same output: evolution strategies saw flat fitness. On the window, the bench's
Open_ES gap to the oracle fell from 10.8% to 4.5% on tso-case5 and from 3.2% to
0.7% on tso-case14.) The load the set-points
miss is shared by every unit in proportion to its remaining room within its
output and ramp limits in the direction needed (automatic generation control,
`_follow_load`); what that room cannot cover falls on the slack unit (the first
in-service unit at the reference bus), as on the power flow's slack bus, and is
seen in the `balance` and `ramp` channels. A schedule that meets the load is
taken as it is.

Security redispatch (DC mode, on by default: `secure_iters`, `secure_redispatch`): a
schedule that would overload a line is moved, as a system operator redispatches, by about
the least (Gauss-Newton least-norm steps on the flows' sensitivities) to one within the
line ratings, the units' ramp windows and the balance. A policy then proposes a schedule
and the grid stays within its ratings wherever its windows allow; what cannot be met (the
units were left where their ramps cannot reach a secure dispatch) is still seen in the
`thermal` channel. Measured with the bench's budgets (Open_ES, 3 seeds): the tso-case5 gap
to the oracle 4.5% -> 3.4%, tso-case14 0.72% -> 0.21% with 93% of the solvable test days
feasible (was 89%); PPO on tso-case14 33.9% -> 6.6%, 42% -> 96% feasible. It costs about 30x
the env's own step (benchmarks/env_throughput.py); `secure_iters=0` gives the raw schedule.
Physics per step:

* DC mode (default): DC power flow through a PTDF built once at set-up.
* AC mode (`ac=True`): the Newton-Raphson kernel, at most `ac_iters` iterations
  (stopping when the mismatch meets the dtype's tolerance), warm started from the
  previous step's voltages; losses are borne by the slack. `ac_method="chord"`
  (default) keeps the Jacobian fixed at the case's solved base point, so an
  iteration is a matrix-vector product rather than an LU factorisation; "newton"
  refactorises every iteration. Both stop at the same solution; `info["converged"]`
  and the `ac_diverged` cost say if not, and a step without a solution keeps the
  previous voltages so that every output stays finite. `enforce_q_limits=True` (full
  Newton) switches PV buses whose units reach their reactive limits to PQ
  (`physics.newton_raphson_q_limits`, checked against pandapower's enforce_q_lims).

reward = -(generation cost in $ over the step) * reward_scale, every unit's cost
curve taken at its actual output (the slack's too, also outside [Pmin, Pmax], so
a slack pushed below its minimum is credited at its marginal cost and neither
over- nor under-generation pays); the shortfall or surplus itself is the
`balance` cost channel.
Cost channels (p.u. on the case's baseMVA, never folded into the reward):
  thermal      sum over branches of flow above RATE_A (MW in DC, MVA in AC)
  balance      slack unit output outside [Pmin, Pmax] (beyond ROUNDOFF_ULPS ulps of the demand: the
               slack is the balance's remainder, whose round-off at a limit is not a violation)
  ramp         slack unit ramp beyond its limit (likewise)
  voltage      (AC) sum of |V| outside [Vmin, Vmax]
  ac_diverged  (AC) 1.0 when Newton-Raphson did not converge
  n1_thermal   (`n1=True`) sum over the screened single outages (every non-bridge branch by default;
               `n1_contingencies` to screen fewer on large cases) of the post-outage flow above the
               emergency rating, i.e. preventive N-1 security, screened by LODF (`physics.security`).
               Emergency ratings: `n1_rating` x RATE_A where the case has ratings, derived ones
               (`derived_n1_ratings`) where the line ratings are derived.

Outages as events (DC mode) are surprises: the observation shows each line's status in the interval
just past, so a trip is seen once it has happened. In the step a line trips the `thermal` channel
holds the post-trip flows to the emergency ratings (short-term ratings; with `n1=True`); from the next
step on, the operator knows and must bring them within the normal ratings (corrective redispatch).

Outage events: `outages_per_day` random outages a day of `outage_steps` steps each on non-bridge
branches (seeded per day, at most `max_outages` at once), or a schedule of your own
(`outage_schedule`, a params leaf); the flows are the post-outage flows and N-1 screening starts from
the grid as it is.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from evogrid.case import Case, load_case
from evogrid.case.matpower import GS, PD, PG, PMAX, PMIN, QD, QG, QMAX, QMIN, RAMP_30, VG, VMAX, VMIN
from evogrid.envs.environment import Environment, EnvParams, EnvState, money_unit, sanitize_action
from evogrid.envs.profiles import (
    bus_load_days,
    check_days,
    forecast_features,
    source_days,
    split_days,
    time_features,
)
from evogrid.envs.spaces import Box
from evogrid.physics import (
    ACNetwork,
    DCNetwork,
    GenCost,
    OutageModel,
    as_float,
    branch_flows,
    bus_injections,
    contingency_flows,
    dc_line_flows,
    generation_cost,
    jacobian,
    make_ac_network,
    make_dc_network,
    make_gen_cost,
    make_outage_model,
    newton_raphson,
    newton_raphson_q_limits,
    outage_flows,
)
from evogrid.utils.jax_utils import held_least_norm_step, held_projection_step

SLOW_RAMP, FAST_RAMP = 0.03, 0.5  # share of Pmax per hour: the cheaper half of the fleet, the rest (merit_ramp_rates)
N1_RATING = 1.25      # post-contingency limit: this times the line rating (a short-term emergency rating)
# security redispatch (`secure_redispatch`), DC mode
SECURE_ITERS = 8       # Gauss-Newton steps per env step
SECURE_LINES = 3       # lines handled together in a step (the worst three; a 4x4 system with the balance)
SECURE_MARGIN = 3e-3   # aim this share below each rating: float rounding and a least-squares compromise
                       # between rows at their limits (more rows than free units) stay within it
SECURE_BAND = 1e-3     # lines within this share of their rating stay at it (not pushed back over)
WINDOW_MARGIN = 1e-4   # and this share of the slack unit's window inside its ends (its output is rounded)
SECURE_DAMPING = 1e-6  # Levenberg-Marquardt damping, relative to the system's mean diagonal
ROUNDOFF_ULPS = 4      # the balance and ramp channels ignore the slack's excess below this many ulps of the demand
LOOKAHEAD_STEPS = 8    # the redispatch keeps the next this many intervals' loads within the units' ramps' reach
PLAN_ITERS = 8         # Gauss-Newton steps of the peak plan (before the SECURE_ITERS of the interval alone)
SECURE_ROWS_PEAK = 6   # rows handled together with the look-ahead's peak plan (its lines and ramps too)
PLAN_SWEEPS = 12       # with the plan, each step's rows are inequalities: Hildreth passes per solve
PLAN_MARGIN = 1e-4     # and this interval's lines are aimed this share inside (the rows met exactly, not in least squares)
PEAK_PLAN_UNITS = 10   # peak_plan's default: on for grids of at most this many units (its cost grows with them)
RATING_MARGIN = 1.13   # derived ratings: this times the economic-dispatch flow at the case's own loads (see
                       # `derived_ratings` for why 1.13)


@struct.dataclass
class TransState(EnvState):
    day: jnp.ndarray      # int32 index into the params' load days
    pg: jnp.ndarray       # [n_units] MW dispatched in the last interval
    flow: jnp.ndarray     # [n_branch] MW (DC, signed from->to) or MVA (AC, larger end)
    vm: jnp.ndarray       # [n_bus] p.u. in AC mode (warm start of the next solve); empty in DC mode
    va: jnp.ndarray       # [n_bus] rad in AC mode; empty in DC mode


@struct.dataclass
class TransParams(EnvParams):
    """Everything a user may sweep is a leaf; `ac`, `ac_iters` and the horizon are static."""

    load_p: jnp.ndarray = None     # [n_days, max_steps, n_bus] MW
    load_q: jnp.ndarray = None     # [n_days, max_steps, n_bus] MVAr
    pmin: jnp.ndarray = None       # [n_units] MW
    pmax: jnp.ndarray = None       # [n_units] MW
    ramp: jnp.ndarray = None       # [n_units] MW per step
    qg: jnp.ndarray = None         # [n_units] MVAr used for units at PQ buses (AC)
    rate: jnp.ndarray = None       # [n_branch] MVA, inf = unlimited
    vmin: jnp.ndarray = None       # [n_bus] p.u.
    vmax: jnp.ndarray = None       # [n_bus] p.u.
    gen_bus: jnp.ndarray = None    # [n_units] int32
    gen_incidence: jnp.ndarray = None  # [n_units, n_bus] 1.0 where a unit connects (a matmul, not a scatter)
    slack: jnp.ndarray = None      # [n_units] one-hot of the slack unit
    reward_scale: jnp.ndarray = None
    cost: GenCost = None
    dc: DCNetwork = None
    acn: ACNetwork | None = None
    ac_jinv: jnp.ndarray | None = None  # chord method's fixed inverse Jacobian (None: full Newton)
    init: TransState = None        # [n_days] cached start-of-day states (see make_trans_params)
    init_obs: jnp.ndarray = None   # [n_days, obs_dim] their observations
    inv_pmax: jnp.ndarray = None   # [n_units] 1 / Pmax (observation scaling)
    inv_rate: jnp.ndarray = None   # [n_branch] 1 / RATE_A, or 1 / baseMVA for unlimited branches
    outage_schedule: jnp.ndarray = None  # [n_days, max_steps, k] int32 branches out of service, -1 = none
    outages: OutageModel | None = None   # LODF model (outage events or N-1 screening only)
    contingencies: jnp.ndarray | None = None  # [c] int32 single outages N-1 screens (None: no n1_thermal)
    n1_rate: jnp.ndarray | None = None   # [n_branch] MW post-contingency limit
    q_min: jnp.ndarray | None = None     # [n_bus] MVAr units' summed reactive limits (enforce_q_limits)
    q_max: jnp.ndarray | None = None
    gen_ptdf: jnp.ndarray | None = None  # [n_branch, n_units] MW of flow per MW of each unit's output (slack balancing)
    base_mva: float = struct.field(pytree_node=False, default=100.0)
    ac: bool = struct.field(pytree_node=False, default=False)
    ac_iters: int = struct.field(pytree_node=False, default=10)
    secure_iters: int = struct.field(pytree_node=False, default=0)  # security redispatch steps (0: off)
    lookahead: int = struct.field(pytree_node=False, default=0)  # intervals whose loads the redispatch keeps in reach
    peak_plan: bool = struct.field(pytree_node=False, default=False)  # the redispatch plans the look-ahead's peak too


class TransGridEnv(Environment):
    """Transmission dispatch. Use with `make_trans_params(case)`."""

    def num_days(self, params: TransParams) -> int:
        return params.load_p.shape[0]

    def reset_to_day(self, day, params: TransParams):
        return params.init_obs[day], jax.tree_util.tree_map(lambda x: x[day], params.init)

    def step_env(self, key, state: TransState, action, params: TransParams):
        action, n_bad = sanitize_action(action)
        t = state.time_step
        load_p = params.load_p[state.day, t]
        load_q = params.load_q[state.day, t]
        lo, hi = ramp_window(state.pg, params)
        demand = jnp.sum(load_p) + params.dc.gs_total
        pg = _follow_load(lo + 0.5 * (action + 1.0) * (hi - lo), lo, hi, demand)
        out = params.outage_schedule[state.day, t]
        rate = params.rate
        if params.n1_rate is not None and out.shape[0]:  # a trip this step: flows within emergency ratings
            rate = jnp.where(_new_outage(params.outage_schedule, state.day, t), params.n1_rate, rate)
        if params.secure_iters:
            sens = params.gen_ptdf
            if out.shape[0]:  # the outaged grid's sensitivities: the same low-rank update as its flows
                sens = jax.vmap(lambda col: outage_flows(params.outages, col, out)[0], 1, 1)(sens)
            flow = _dc_flows(pg, load_p, params, out)[0]
            ahead = peak = None
            if params.lookahead:   # the loads of the next intervals of the day (the operator's forecast)
                steps = t + 1 + jnp.arange(params.lookahead)
                future = jnp.sum(params.load_p[state.day, jnp.minimum(steps, params.max_steps - 1)], -1) + params.dc.gs_total
                future = jnp.where(steps < params.max_steps, future, jnp.nan)
                ahead = (future, params.pmin, params.pmax, params.ramp)
                peak = _peak_plan(pg, state.day, steps, future, params, out) if params.peak_plan else None
            pg = secure_redispatch(pg, lo, hi, demand, flow, sens, rate, params.secure_iters, ahead, params.slack, peak)
        pg, flow, vm, va, extra = _solve(pg, load_p, load_q, state, params, out)

        # every unit, the slack included, is charged its cost curve at its actual output, also outside
        # [Pmin, Pmax] (a slack pushed below its minimum is credited at its marginal cost), so neither
        # over- nor under-generation is cheaper than balancing; the infeasibility is the `balance` channel
        gen_cost = jnp.sum(generation_cost(params.cost, pg)) * params.delta_t_hours  # $
        reward = -gen_cost * params.reward_scale
        ps, ps_prev = jnp.sum(pg * params.slack), jnp.sum(state.pg * params.slack)
        smin, smax, sramp = (jnp.sum(x * params.slack) for x in (params.pmin, params.pmax, params.ramp))
        # the slack's output is the balance's remainder: at a limit it reads a few ulps of the demand beyond it
        # (float32: 1e-5 MW, enough to fail FEASIBLE_TOL over a day); only what lies beyond that resolution counts
        ulps = ROUNDOFF_ULPS * jnp.finfo(pg.dtype).eps * demand
        costs = [
            jnp.sum(jnp.maximum(jnp.abs(flow) - rate, 0.0)),
            jnp.maximum(ps - smax - ulps, 0.0) + jnp.maximum(smin - ps - ulps, 0.0),
            jnp.maximum(jnp.abs(ps - ps_prev) - sramp - ulps, 0.0),
        ]
        if params.ac:
            costs += [
                jnp.sum(jnp.maximum(vm - params.vmax, 0.0) + jnp.maximum(params.vmin - vm, 0.0)) * params.base_mva,
                (1.0 - extra["converged"]) * params.base_mva,
            ]
        if params.contingencies is not None:
            post, void = contingency_flows(params.outages, flow, out, params.contingencies)
            over = jnp.sum(jnp.maximum(jnp.abs(post) - params.n1_rate, 0.0), axis=1)
            costs.append(jnp.sum(jnp.where(void, 0.0, over)))
        costs = jnp.stack(costs) / params.base_mva
        next_t = t + 1
        new_state = TransState(time_step=next_t, day=state.day, pg=pg, flow=flow, vm=vm, va=va)
        done = next_t >= params.max_steps
        info = {
            "gen_cost": gen_cost,
            "slack_mw": ps,
            "losses_mw": jnp.sum(pg) - jnp.sum(load_p),
            "nonfinite_actions": n_bad,
            "converged": extra["converged"],
            "islanded": extra["islanded"],
        }
        return self._obs(new_state, params), new_state, reward, costs, done, info

    def _obs(self, state: TransState, params: TransParams):
        """[loads p.u. (n_bus), pg / Pmax (n_units), |flow| / rating (n_branch), sin, cos time of day, progress,
        and with outage events each branch's status in the interval just past (1 in service, 0 out; n_branch):
        a trip is a surprise, seen once it has happened]."""
        t = jnp.minimum(state.time_step, params.max_steps - 1)
        parts = [
            params.load_p[state.day, t] * (1.0 / params.base_mva),
            state.pg * params.inv_pmax,
            jnp.abs(state.flow) * params.inv_rate,
            self.time_obs(state, params),
        ]
        if params.outage_schedule.shape[-1]:  # what the operator knows: the lines out in the interval just past
            last = jnp.maximum(state.time_step - 1, 0)
            out = _outaged(params.outage_schedule[state.day, last], params.rate.shape[0]) & (state.time_step > 0)
            parts.append(1.0 - out.astype(state.pg.dtype))
        return jnp.concatenate(parts)

    def observation_space(self, params: TransParams) -> Box:
        n = params.load_p.shape[-1] + params.pmax.shape[0] + params.rate.shape[0] + self.time_obs_size(params)
        n += params.rate.shape[0] if params.outage_schedule.shape[-1] else 0
        return Box(-jnp.inf, jnp.inf, (n,))

    def action_space(self, params: TransParams) -> Box:
        return Box(-1.0, 1.0, (params.pmax.shape[0],))

    def grid_view(self, state: TransState, params: TransParams) -> dict:
        t = jnp.clip(state.time_step - 1, 0, params.max_steps - 1)  # the interval just dispatched
        view = {"dispatch_mw": state.pg, "load_mw": jnp.sum(params.load_p[state.day, t]),
                "loading_pct": 100.0 * jnp.abs(state.flow) / params.rate}
        if params.ac:
            view.update(vm_pu=state.vm, v_band=jnp.stack([jnp.min(params.vmin), jnp.max(params.vmax)]))
        return view

    def units(self, params: TransParams) -> dict[str, str]:
        steps = "p.u. of baseMVA x steps"
        return {"return": f"{money_unit(params.reward_scale)} per day (minus generation cost)",
                "thermal": f"flow over rating, {steps}", "balance": f"slack output outside its limits, {steps}",
                "ramp": f"slack ramp beyond its limit, {steps}", "voltage": "p.u. of |V| outside its band x buses x steps",
                "ac_diverged": "steps without a power-flow solution",
                "n1_thermal": f"post-outage flow over the N-1 rating, summed over outages, {steps}"}

    def constraint_names(self, params: TransParams) -> tuple[str, ...]:
        return (("thermal", "balance", "ramp") + (("voltage", "ac_diverged") if params.ac else ())
                + (("n1_thermal",) if params.contingencies is not None else ()))


def _new_outage(schedule, day, t):
    """Whether step t of `day` brings an outage not in force at step t-1 (a trip; step 0: any outage)."""
    out, before = schedule[day, t], schedule[day, jnp.maximum(t - 1, 0)]
    before = jnp.where(t > 0, before, -1)
    return jnp.any((out >= 0) & ~jnp.any(out[:, None] == before[None, :], axis=1))


def _outaged(out, n_branch):
    """[n_branch] bool: the branches listed in `out` (-1 entries ignored)."""
    return jnp.any(jnp.arange(n_branch)[:, None] == out[None, :], axis=1)


def ramp_window(prev, params: TransParams):
    """[lo, hi] per unit: the outputs reachable from `prev` within output and ramp limits (what actions map onto)."""
    return jnp.maximum(params.pmin, prev - params.ramp), jnp.minimum(params.pmax, prev + params.ramp)


def dispatch_action(params: TransParams, pg, prev):
    """The env action [..., n_units] that asks for dispatch `pg` after the units' last output `prev` (the
    inverse of the env's mapping onto the ramp window; outputs outside the window ask for its nearest end)."""
    lo, hi = ramp_window(jnp.asarray(prev), params)
    span = hi - lo
    a = 2.0 * (jnp.asarray(pg) - lo) / jnp.where(span > 0, span, 1.0) - 1.0
    return jnp.clip(jnp.where(span > 0, a, 0.0), -1.0, 1.0)


def _follow_load(pg, lo, hi, demand):
    """Automatic generation control: the demand the set-points `pg` miss is shared by every unit (the slack
    too) in proportion to its room within [lo, hi] (output and ramp limits) in the direction needed; what
    that room cannot cover is left to the slack (`_solve`), where the `balance` and `ramp` channels see it."""
    miss = demand - jnp.sum(pg)
    room = jnp.where(miss > 0, hi - pg, pg - lo)
    share = jnp.minimum(jnp.abs(miss) / jnp.maximum(jnp.sum(room), jnp.finfo(pg.dtype).tiny), 1.0)
    return pg + jnp.sign(miss) * share * room


def _dc_flows(pg, load_p, params: TransParams, out):
    """DC flows of dispatch `pg` (its slack entry ignored: the slack balances) with the branches `out` out
    of service. Returns (flow [n_branch] MW, slack output MW, islanded)."""
    p_bus = (pg * (1.0 - params.slack)) @ params.gen_incidence - load_p
    flow, p_ref = dc_line_flows(params.dc, p_bus)
    ps = p_ref - jnp.sum(p_bus * params.dc.ref_mask)
    post, islanded = (outage_flows(params.outages, flow, out) if out.shape[0] else (flow, jnp.asarray(False)))
    return post, ps, islanded


def secure_redispatch(pg, lo, hi, demand, flow, sens, rate, iters: int, ahead=None, slack=1.0, peak=None):
    """Security redispatch: move the balanced dispatch `pg` by about the least to bring the DC flows within
    `rate`, every unit kept within its window [lo, hi] and the total at `demand`, as a system operator
    redispatches a schedule that would overload a line. `flow` [n_branch] is the dispatch's flow, `sens`
    [n_branch, n_units] the flows' sensitivity to each unit's output (the flows are affine in the dispatch);
    at most `iters` Gauss-Newton steps (static; they stop once no row is over, with the same result). A
    dispatch within the ratings is returned as it is; where no dispatch within the windows meets the
    ratings (the units were left where the ramps cannot reach one), or `iters` is too few, what is left
    is seen in the `thermal` channel.

    Look-ahead (`ahead` = (future demand [K] MW, NaN past the day's end; pmin, pmax, ramp per step)): the
    dispatch is also kept where the units' ramps can reach the next K intervals' demand: for each k,
    sum max(pmin, pg - k ramp) <= demand[k] <= sum min(pmax, pg + k ramp), as a look-ahead dispatch keeps
    ramp capability (a policy that loads the slow cheap units to the evening peak leaves the system unable
    to follow the evening's drop: the slack was pushed below its minimum, the `balance` channel). The
    furthest out of these 2K conditions is one more candidate row, its excess in MW like a line's, aimed
    SECURE_MARGIN x the demand inside. A dispatch that breaks no rating and keeps every future demand in
    reach is returned as it is.

    Peak plan (`peak`, from `_peak_plan`; `make_trans_params(peak_plan=...)`, by default on for grids of at
    most PEAK_PLAN_UNITS units): the look-ahead's interval of highest demand, k intervals on. The total's
    reach is not enough where lines bind at the peak: on tso-case14's test day 13 trained policies left the
    system two intervals before its 291 MW evening peak where the peak had no secure dispatch within k ramps
    of theirs (HiGHS: the slack unit ramps 5 MW a step, the unit at bus 3 1.5 MW, four lines bind), and a
    line was overloaded there. The plan first moves [pg | x] together for PLAN_ITERS steps, x a plan of the
    peak's dispatch: x's lines within the ratings (the same aim), |x - pg| <= k ramp per unit, x within
    [pmin, pmax] and at the peak's demand (a second balance row), SECURE_ROWS_PEAK rows a step; pg moves
    only where a ramp row binds (the peak's lines' rows involve x alone). Then the `iters` steps of this
    interval's own rows alone, so the plan never leaves this interval over a rating. The plan is a
    relaxation of the multi-period dispatch: the intervals between are not planned, each is secured when
    it comes. With the plan every row is an inequality (`held_projection_step`, PLAN_SWEEPS Hildreth
    passes): a line below its aim may stay below it, so at the peak, where four lines and the slack's
    window bind with five units, every row can be met where a dispatch meets them; the least-squares
    (equality) step left a line 0.002 MW over there, and, so met, this interval's lines are aimed only
    PLAN_MARGIN inside (from that state no dispatch had 0.3% to spare: HiGHS, 0.08%). Measured on
    tso-case14 (`evogrid bench`, 3 seeds): with the equality step Open_ES was feasible on every test day
    in 2 of 3 seeds (1 of 3 without the plan), Sep_CMA_ES 3 of 3 (0 of 3); one Open_ES policy's test days
    evaluated with each step: 16 of 16 feasible with the inequality step, 15 with the equality step, 12 with
    an active set instead (one pass dropping the rows of wrong-sign multiplier, then an equality solve);
    see the README's Results for the bench with this step. Cost: 2-3x the env step (256 envs x 48
    random steps, side by side, both stopping once secure: tso-case5 285k against 812k env-steps/s,
    tso-case14 105k against 242k; before the early stop 18.0k against 97.7k, 16.9k against 50.3k); on
    tso-case118's 54 units it is off by default (before the early stop and the inequality step already
    6.0k against 22.1k, and its bench rows take most of the table's time), and with line
    outages (the -n1 tasks) too: it plans the peak on today's grid, which a trip changes. It can move a
    schedule that is secure now but leaves the peak less than SECURE_MARGIN inside the ratings: the DC-OPF
    oracle's, which runs its lines at their ratings, replays 0.3% dearer with it on tso-case5 (still
    within every limit; tests/test_baselines.py).

    Each step takes the SECURE_LINES rows furthest over (or at) their limit, lines or the reach, and the
    balance, and moves the units by the least-norm change that puts those at their limit less SECURE_MARGIN
    and keeps the total: d = -J^T (J J^T + damping)^-1 r, J their gradients and a row of ones, over the
    units free to move (a unit at a window end that d would push out is held there and d solved again);
    then clips to the windows and rebalances as the automatic generation control does (`_follow_load`).
    Only the slack keeps a hair inside its window (`slack`); the others may use all of theirs. On
    tso-case14's evening peaks three or four lines reach their ratings together with a slow unit at its
    window's end: two rows at a time cycled and left 0.08 MW over a rating where a secure dispatch was in
    reach (HiGHS found one with 1% to spare; measured on trained policies' test days, tests/test_envs.py);
    with three rows, more than the free units, the least-squares step settles a hair from the aim, and
    SECURE_MARGIN keeps that inside the ratings (0.1% left 0.01 MW over in one such state, 1% 0.7 MW in
    another: the aim moves which lines bind; 0.3% secured both, measured).
    The system is 4x4, solved by an unrolled elimination (`held_least_norm_step`, `spd_solve`): a batched
    LAPACK call per env would not vectorise, and its Gram product is an elementwise sum (XLA's CPU batched
    [m, n] @ [n, m] product is 20x slower from m = 4, measured).
    Checked against scipy's trust-constr projection in tests/test_envs.py; cost measured in
    benchmarks/env_throughput.py (the tso rows as made against the "raw" ones)."""
    return _redispatch_until_secure(iters, pg, lo, hi, demand, flow, sens, rate, ahead, slack, peak)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _redispatch_until_secure(iters, *args):
    """`_redispatch` stopping once no row is over: the same dispatch, and differentiable (the JVP below)."""
    return _redispatch(iters, True, *args)


@_redispatch_until_secure.defjvp
def _redispatch_until_secure_jvp(iters, primals, tangents):
    # reverse mode cannot go through a while_loop: the derivative is that of the fixed count of steps, whose
    # result is the same dispatch (a dispatch with no row over is a fixed point of the steps)
    return jax.jvp(lambda *a: _redispatch(iters, False, *a), primals, tangents)


def _redispatch(iters: int, early: bool, pg, lo, hi, demand, flow, sens, rate, ahead, slack, peak):
    """`secure_redispatch`'s steps; `early`: a while_loop that stops once no row is over (see until_secure)."""
    # a hair inside the slack's window (`slack`: 1 for it, 0 for the others; default every unit's): its output
    # is recomputed from the balance, and float rounding at the very edge would read as a ramp or balance
    # violation; the others may go to their ends (a secure dispatch can need a slow unit at its ramp limit)
    inner = WINDOW_MARGIN * (hi - lo) * slack
    lo, hi = lo + inner, hi - inner
    if ahead is not None:   # the reach with the ramps these windows leave (the slack's, less its margin)
        future, pmin, pmax, ramp = ahead
        ahead = (future, pmin, pmax, ramp * (1.0 - 2.0 * WINDOW_MARGIN * slack))
    n, n_line = pg.shape[0], rate.shape[0]
    k = min(SECURE_LINES, n_line + (ahead is not None))
    f0, pg0 = flow, pg
    target = rate * (1.0 - SECURE_MARGIN)
    if peak is not None:   # the plan's constants: its variables' windows, its ramp rows, its row count
        fx0, x0, peak_demand, reach, valid = peak
        lo_z, hi_z = jnp.concatenate([lo, pmin]), jnp.concatenate([hi, pmax])
        eye = jnp.eye(n, dtype=pg.dtype)
        ramp_rows = jnp.concatenate([jnp.concatenate([-eye, eye], 1), jnp.concatenate([eye, -eye], 1)])
        k_plan = min(SECURE_ROWS_PEAK, 2 * n_line + 2 * n + 1)

    def flows(z, plan: bool):   # the lines' flows at z's pg (and at its plan x): affine in the dispatch
        return (f0 + sens @ (z[:n] - pg0),) + ((fx0 + sens @ (z[n:] - x0),) if plan else ())

    def measure(z, fz, plan: bool, target):
        """The candidate rows at z (flows fz): excess over the aim, the aim, the gradients, whether any is over."""
        pg, f = z[:n], fz[0]
        resid, aim = jnp.abs(f) - target, target
        rows = jnp.sign(f)[:, None] * sens   # [n_line, n_units] d|f|/d output
        # within the ratings (to 1e-9, round-off of a schedule at its limits; float32 sees the rating itself)
        short = jnp.any(jnp.abs(f) > rate * (1.0 + 1e-9))
        if ahead is not None:   # the reach: one more candidate, after the lines
            reach_row, gap, scale = _reach_row(pg, *ahead)
            resid = jnp.concatenate([resid, (gap + SECURE_MARGIN * scale)[None]])
            aim = jnp.concatenate([aim, scale[None]])
            rows = jnp.concatenate([rows, reach_row[None]])
            short = short | (gap > 0)
        if plan:   # the peak's lines at x, and x within the ramps' reach of pg: |x - pg| <= reach
            x, fx = z[n:], fz[1]
            cap, step_ = reach * (1.0 - SECURE_MARGIN), x - pg
            later = jnp.concatenate([jnp.abs(fx) - target, step_ - cap, -step_ - cap])
            resid = jnp.concatenate([resid, jnp.where(valid, later, -jnp.inf)])
            aim = jnp.concatenate([aim, target, cap, cap])
            rows = jnp.concatenate([jnp.concatenate([rows, jnp.zeros_like(rows)], 1),
                                    jnp.concatenate([jnp.zeros_like(sens), jnp.sign(fx)[:, None] * sens], 1), ramp_rows])
            short = short | (valid & (jnp.any(jnp.abs(fx) > rate * (1.0 + 1e-9))
                                      | jnp.any(jnp.abs(step_) > reach * (1.0 + 1e-9))))
        return resid, aim, rows, short

    def step(z, plan: bool, measured):
        resid, aim, rows, _ = measured
        pg, x = z[:n], z[n:]
        worst, idx = jax.lax.top_k(resid, k_plan if plan else k)
        if peak is None:
            active = worst > -SECURE_BAND * aim[idx]   # over, or at the limit (kept there, not pushed back over)
        else:   # inequalities: every row taken, those inside may stay inside
            active = jnp.isfinite(worst)
        balance = jnp.ones((1, n), pg.dtype)       # the balance row(s): the total of pg (and of x) kept
        if plan:
            balance = jnp.kron(jnp.eye(2, dtype=pg.dtype), balance)
        r = jnp.concatenate([-jnp.where(active, worst, 0.0), jnp.zeros(balance.shape[0], pg.dtype)])
        jac = jnp.concatenate([jnp.where(active[:, None], rows[idx], 0.0), balance])
        # units d pushes out of their window stay
        if peak is None:
            d = held_least_norm_step(jac, r, z, lo, hi, jnp.ones(z.shape, bool), 1.0, SECURE_DAMPING)
        else:
            d = held_projection_step(jac, r, balance.shape[0], z, *((lo_z, hi_z) if plan else (lo, hi)),
                                     SECURE_DAMPING, PLAN_SWEEPS)
        moved = _follow_load(jnp.clip(pg + d[:n], lo, hi), lo, hi, demand)
        if plan:
            moved = jnp.concatenate([moved, _follow_load(jnp.clip(x + d[n:], pmin, pmax), pmin, pmax, peak_demand)])
        return moved

    def until_secure(z, plan: bool, steps: int, target=target):
        # a dispatch with no row over is a fixed point of the steps. With `early` the loop stops there (exactly
        # the same result), a batch (vmap) once every env's is: most env steps need none or a few of the steps
        # (random actions, 256 envs: tso-case5 5x and, with the peak plan, 6x as many env-steps/s; Open_ES
        # generations on tso-case5 7x, tso-case14-n1 1.6x as fast). On tso-case118 some env of a batch is over a
        # rating at nearly every step: its Open_ES generations take as long, random actions 20% longer (the
        # batched loop's selects). The flows are carried: a batched loop evaluates `more` twice a step, and the
        # rows are not needed there.
        def more(c):
            return (c[0] < steps) & measure(*c[1:], plan, target)[3]

        def body(c):
            measured = measure(*c[1:], plan, target)
            z = jnp.where(measured[3], step(c[1], plan, measured), c[1])
            return c[0] + 1, z, flows(z, plan)

        c = (0, z, flows(z, plan))
        c = jax.lax.while_loop(more, body, c) if early else jax.lax.fori_loop(0, steps, lambda _, c: body(c), c)
        return c[1]

    if peak is None:
        return until_secure(pg, False, iters)
    # the plan first; then this interval's own rows have the last word
    pg = until_secure(jnp.concatenate([pg, x0]), True, PLAN_ITERS)[:n]
    return until_secure(pg, False, iters, rate * (1.0 - PLAN_MARGIN))


def _peak_plan(pg, day, steps, future, params: TransParams, out):
    """The look-ahead's peak interval for `secure_redispatch`: of the next intervals (`steps`, their demand
    `future`, NaN past the day's end), the one of highest demand, k intervals on, and a start for its plan x:
    the dispatch `pg` carried there within the ramps' reach (k ramps) and balanced at its demand
    (`_follow_load`). Returns (x's DC flows at that interval's loads, x, its demand, the reach k ramp [n_units],
    whether there is such an interval)."""
    i = jnp.argmax(jnp.where(jnp.isnan(future), -jnp.inf, future))
    reach = (i + 1).astype(pg.dtype) * params.ramp
    demand = jnp.nan_to_num(future[i])
    x0 = _follow_load(pg, jnp.maximum(params.pmin, pg - reach), jnp.minimum(params.pmax, pg + reach), demand)
    load = params.load_p[day, jnp.minimum(steps[i], params.max_steps - 1)]
    return _dc_flows(x0, load, params, out)[0], x0, demand, reach, ~jnp.isnan(future[i])


def _reach_row(pg, future, pmin, pmax, ramp):
    """The look-ahead row of `secure_redispatch`: of the 2K reach conditions (k = 1..K, the lowest and the
    highest total output k intervals on, against future[k - 1]), the one furthest out: (its gradient in the
    dispatch [n_units], its excess MW (> 0: out of reach; -inf: no future within the day), its demand MW)."""
    k = jnp.arange(1, future.shape[0] + 1, dtype=pg.dtype)[:, None]
    low, high = pg - k * ramp, pg + k * ramp                         # [K, n_units]
    gaps = jnp.concatenate([jnp.sum(jnp.maximum(pmin, low), 1) - future, future - jnp.sum(jnp.minimum(pmax, high), 1)])
    grads = jnp.concatenate([(low > pmin).astype(pg.dtype), -(high < pmax).astype(pg.dtype)])
    gaps = jnp.where(jnp.isnan(gaps), -jnp.inf, gaps)              # intervals past the day's end never bind
    i = jnp.argmax(gaps)
    return grads[i], gaps[i], jnp.abs(jnp.nan_to_num(future[i % future.shape[0]]))


def _solve(pg, load_p, load_q, state, params: TransParams, out):
    """Power flow for a dispatch whose slack entry is to be determined, with the branches `out` out of
    service (DC). Returns (pg, flow, vm, va, extra)."""
    others = pg * (1.0 - params.slack)
    one = jnp.asarray(1.0, pg.dtype)
    if not params.ac:
        post, ps, islanded = _dc_flows(pg, load_p, params, out)
        extra = {"converged": one, "islanded": islanded.astype(pg.dtype)}
        return others + ps * params.slack, post, state.vm, state.va, extra
    gen_p = others @ params.gen_incidence
    gen_q = params.qg @ params.gen_incidence
    s_bus = ((gen_p - load_p) + 1j * (gen_q - load_q)) / params.base_mva
    v0 = (state.vm * jnp.exp(1j * state.va)).astype(params.acn.v0.dtype)
    if params.q_min is not None:  # PV -> PQ switching at the units' reactive limits
        q_lo, q_hi = ((q - load_q) / params.base_mva for q in (params.q_min, params.q_max))
        v, converged, _, _ = newton_raphson_q_limits(params.acn, s_bus, q_lo, q_hi, v0, iters=params.ac_iters)
    else:
        v, converged, _ = newton_raphson(params.acn, s_bus, v0, iters=params.ac_iters, jacobian_inverse=params.ac_jinv)
    # no solution (or a non-finite one): keep the previous voltages, so every output stays finite and the
    # next step starts from a sane point; the step is reported by `ac_diverged`
    converged = converged & jnp.all(jnp.isfinite(v.real) & jnp.isfinite(v.imag))
    v = jnp.where(converged, v, v0)
    s_inj = bus_injections(params.acn, v)
    ref = params.slack @ params.gen_incidence  # [n_bus] one-hot of the ref bus
    ps = jnp.sum((s_inj.real + load_p - gen_p) * ref)
    s_from, s_to = branch_flows(params.acn, v)
    flow = jnp.maximum(jnp.abs(s_from), jnp.abs(s_to))
    extra = {"converged": converged.astype(pg.dtype), "islanded": 0.0 * one}
    return others + ps * params.slack, flow, jnp.abs(v), jnp.angle(v), extra


def make_trans_params(case: Case | str, max_steps: int = 48, delta_t_hours: float = 0.5, *, ac: bool = False,
                      ac_method: str | None = None, ac_iters: int | None = None, enforce_q_limits: bool = False, n_days: int | None = None, seed: int = 0,
                      split: str = "all", profiles: str = "synthetic", reward_scale: float = 1e-3, default_ramp_per_hour: float | None = None,
                      ratings: str = "auto", rating_margin: float = RATING_MARGIN, load_p=None, load_q=None,
                      n1: bool = False, n1_rating: float = N1_RATING, n1_contingencies=None, outages_per_day: float = 0.0,
                      outage_steps: int = 4, max_outages: int = 1, outage_schedule=None,
                      forecast_steps: int = 0, forecast_error: float = 0.02, voltage_setpoints: str = "band",
                      secure_iters: int | None = None, lookahead: int | None = None, peak_plan: bool | None = None) -> TransParams:
    """Parameters of `TransGridEnv` for a case.

    Loads (`profiles`): "synthetic", `n_days` (default 64) seeded days ([n_days, max_steps, n_bus]:
    weekday and weekend shapes, day levels from 0.85 to 1.10 of the case's Pd, per-bus noise;
    `profiles.daily_load_profiles`); "real", the 366 days of 2016 from SimBench's HV/MV substation profiles,
    a seeded mix per bus peaking at 1.1 x its Pd (`evogrid.data.bus_loads`); or pass `load_p` (and
    `load_q`; without it each bus keeps the case's power factor) yourself. `split` keeps the "train",
    "val" or "test" days (`profiles.source_days`: a seeded split of synthetic days, a calendar split
    of real ones; default all).
    Ramp limits: MATPOWER's RAMP_30 where the case has it (scaled to the step), else
    `default_ramp_per_hour` * Pmax per hour, or by default `merit_ramp_rates` (cheap baseload units
    slow, the others fast: ramps bind around the peaks and foresight pays). Line ratings (`ratings`): "case" uses RATE_A; "derived" uses `derived_ratings`;
    "auto" (default) derives them only for cases without real ones (every RATE_A 0 or >= 9900:
    case14, case57, case118).

    AC mode holds every unit's bus at its voltage set-point. `voltage_setpoints="band"` (default) clips
    the set-points into their bus's [VMIN, VMAX] (`setpoints_in_band`): IEEE 14's units at buses 6 and 8
    are set to 1.07 and 1.09 p.u. against a VMAX of 1.06, which would put the `voltage` channel above
    zero at every step whatever the dispatch; "case" keeps the file's set-points.

    Security (DC mode only): `n1=True` adds the `n1_thermal` channel, screening `n1_contingencies`
    (branch indices; default every branch whose loss does not island the grid) against `n1_rating` x the
    line rating (short-term emergency ratings are commonly 1.2-1.5 x the normal one). Outage events:
    `outages_per_day` random outages a day (seeded by `seed`, uniform over non-bridge branches), each
    `outage_steps` steps long, at most `max_outages` at once (later ones are dropped); or pass
    `outage_schedule` [n_days, max_steps, k] of branch indices (-1 = none), drawn before the `split`.

    Security redispatch: `secure_iters` Gauss-Newton steps per env step (default SECURE_ITERS in DC mode;
    0 turns it off, and AC mode has none: it works on the DC flows), see `secure_redispatch`; with it the
    dispatch keeps the next `lookahead` intervals' loads within the ramps' reach (default LOOKAHEAD_STEPS
    with the redispatch, 0 without; the operator's forecast is the day's load itself); `peak_plan` also
    keeps the look-ahead's peak interval within the ratings in the ramps' reach, the step's rows solved as
    inequalities (default None: on with the look-ahead for grids of at most PEAK_PLAN_UNITS units, every
    shipped transmission case but case118, where it would cost most, and without line outages, whose
    trips change the grid the plan assumes at the peak; see `secure_redispatch`).

    Forecasts: `forecast_steps` > 0 appends to the observation a noisy forecast of the next
    `forecast_steps` intervals' total load (share of the case's total Pd) (`profiles.forecast_features`: error `forecast_error` x sqrt(lead)).

    `init` caches, per day, the start-of-day state (the economic dispatch of the first interval's
    load and its power flow), so `reset` costs an index instead of a power flow. It is derived from
    the loads: after changing load leaves, rebuild the params with this function (passing `load_p`/`load_q`).
    """
    case = load_case(case) if not isinstance(case, Case) else case
    if ac_method not in (None, "chord", "newton"):
        raise ValueError(f"ac_method must be 'chord' or 'newton', got {ac_method!r}")
    if enforce_q_limits and (not ac or ac_method == "chord"):
        raise ValueError("enforce_q_limits needs the AC model with full Newton (ac=True, ac_method='newton' or unset): "
                         "the chord method's fixed Jacobian assumes fixed bus types")
    ac_method = ac_method or ("newton" if enforce_q_limits else "chord")
    if voltage_setpoints not in ("band", "case"):
        raise ValueError(f"voltage_setpoints must be 'band' or 'case', got {voltage_setpoints!r}")
    if ac and voltage_setpoints == "band":
        case = setpoints_in_band(case)
    ac_iters = ac_iters or {"chord": 30, "newton": 10}[ac_method]  # maxima: the solver stops when converged
    secure_iters = (0 if ac else SECURE_ITERS) if secure_iters is None else secure_iters
    if not isinstance(secure_iters, (int, np.integer)) or secure_iters < 0 or (ac and secure_iters):
        raise ValueError(f"secure_iters must be an integer >= 0 (0 in AC mode: the redispatch uses the DC flows), "
                         f"got {secure_iters!r}")
    lookahead = (LOOKAHEAD_STEPS if secure_iters else 0) if lookahead is None else lookahead
    if not isinstance(lookahead, (int, np.integer)) or lookahead < 0 or (lookahead and not secure_iters):
        raise ValueError(f"lookahead must be an integer >= 0 (0 without the security redispatch, secure_iters=0, "
                         f"which applies it), got {lookahead!r}")
    security = n1 or outages_per_day or outage_schedule is not None
    if peak_plan is None:   # by default where it is cheap enough and the grid at the peak is today's (see `secure_redispatch`)
        peak_plan = bool(lookahead) and case.n_units <= PEAK_PLAN_UNITS and not security
    if not isinstance(peak_plan, (bool, np.bool_)) or (peak_plan and not lookahead):
        raise ValueError(f"peak_plan must be True, False or None (the default: on for grids of at most "
                         f"{PEAK_PLAN_UNITS} units), and True needs the look-ahead (lookahead > 0, with the security "
                         f"redispatch), got peak_plan={peak_plan!r} with lookahead={lookahead!r}")
    check_days(max_steps, delta_t_hours, n_days)
    if ratings not in ("auto", "case", "derived"):
        raise ValueError(f"ratings must be 'auto', 'case' or 'derived', got {ratings!r}")
    if load_p is None:
        days = source_days(profiles, n_days, split, seed)[1]   # every day first: outages are drawn before the split
        load_p = bus_load_days(profiles, "transmission", case.bus[:, PD], n_days, "all", max_steps, delta_t_hours, seed)
        source = (profiles, n_days)
    else:
        load_p = np.asarray(load_p, float)
        days = split_days(load_p.shape[0], split, seed) if load_p.ndim == 3 else None
        source = ("synthetic", load_p.shape[0] if load_p.ndim == 3 else 1)
    load_p = np.asarray(load_p, float)
    if load_q is None:  # each bus keeps the case's own power factor (Qd / Pd; 0 where Pd is 0)
        load_q = load_p * np.divide(case.bus[:, QD], case.bus[:, PD], out=np.zeros(case.n_bus), where=case.bus[:, PD] != 0)
    load_q = np.asarray(load_q, float)
    if security and ac:
        raise ValueError("line outages and N-1 screening use the DC model's outage factors; they are not "
                         "available with ac=True (use the DC task)")
    model = make_outage_model(case) if security else None
    schedule = _outage_schedule(case, model, outage_schedule, outages_per_day, outage_steps, max_outages,
                                load_p.shape[0] if load_p.ndim == 3 else 1, max_steps, seed)
    if days is not None:
        load_p, load_q, schedule = load_p[days], load_q[days] if load_q.ndim == 3 else load_q, schedule[days]
    want = (max_steps, case.n_bus)
    if load_p.ndim != 3 or load_p.shape[1:] != want or load_q.shape != load_p.shape:
        raise ValueError(f"load_p and load_q must have shape [n_days, {want[0]}, {want[1]}], got {load_p.shape} and {load_q.shape}")
    contingencies = None
    if n1:
        bridge = np.asarray(model.bridge)
        contingencies = np.flatnonzero(~bridge) if n1_contingencies is None else np.asarray(n1_contingencies, int)
        if contingencies.ndim != 1 or contingencies.size == 0 or np.any((contingencies < 0) | (contingencies >= case.n_branch)):
            raise ValueError(f"n1_contingencies must be a non-empty list of branch indices in [0, {case.n_branch}), "
                             f"got {n1_contingencies!r}")
        if n1_rating <= 0:
            raise ValueError(f"n1_rating must be positive, got {n1_rating}")
    gen = case.gen
    per_hour = merit_ramp_rates(case) if default_ramp_per_hour is None else np.full(case.n_units, default_ramp_per_hour)
    ramp = np.where(gen[:, RAMP_30] > 0, gen[:, RAMP_30] * delta_t_hours / 0.5, per_hour * gen[:, PMAX] * delta_t_hours)
    at_ref = np.flatnonzero(case.gen_bus == case.ref_bus)
    if at_ref.size == 0:
        raise ValueError(f"{case.name}: the reference bus {case.bus_ids[case.ref_bus]} has no in-service generator; "
                         "the dispatch task needs one there to balance the system (the slack unit)")
    slack = np.zeros(case.n_units)
    slack[at_ref[0]] = 1.0
    real = np.isfinite(case.rate_a) & (case.rate_a < 9900)
    derive = ratings == "derived" or (ratings == "auto" and not real.any())
    rate = derived_ratings(case, rating_margin) if derive else case.rate_a
    params = TransParams(
        max_steps=max_steps, delta_t_hours=delta_t_hours, base_mva=case.base_mva, ac=ac, ac_iters=ac_iters,
        secure_iters=int(secure_iters), lookahead=int(lookahead), peak_plan=bool(peak_plan),
        load_p=as_float(load_p), load_q=as_float(load_q),
        pmin=as_float(gen[:, PMIN]), pmax=as_float(gen[:, PMAX]), ramp=as_float(ramp), qg=as_float(gen[:, QG]),
        rate=as_float(rate), vmin=as_float(case.bus[:, VMIN]), vmax=as_float(case.bus[:, VMAX]),
        gen_bus=jnp.asarray(case.gen_bus), gen_incidence=as_float(np.eye(case.n_bus)[case.gen_bus]), slack=as_float(slack), reward_scale=as_float(reward_scale),
        cost=make_gen_cost(case), dc=make_dc_network(case), acn=make_ac_network(case) if ac else None,
    )
    if enforce_q_limits:
        q_min, q_max = np.zeros(case.n_bus), np.zeros(case.n_bus)
        np.add.at(q_min, case.gen_bus, gen[:, QMIN])
        np.add.at(q_max, case.gen_bus, gen[:, QMAX])
        params = params.replace(q_min=as_float(q_min), q_max=as_float(q_max))
    if ac and ac_method == "chord":
        params = params.replace(ac_jinv=_base_case_jacobian_inverse(case, params.acn))
    params = params.replace(
        inv_pmax=as_float(1.0 / np.maximum(gen[:, PMAX], 1e-6)),
        inv_rate=as_float(np.where(np.isfinite(rate), 1.0 / rate, 1.0 / case.base_mva)),
        time_features=as_float(time_features(max_steps, delta_t_hours)),
        forecast=as_float(forecast_features(load_p.sum(-1, keepdims=True) / max(case.bus[:, PD].sum(), 1e-9), *source,
                                            split, forecast_steps, forecast_error, seed)),
        outage_schedule=jnp.asarray(schedule, jnp.int32), outages=model,
        contingencies=None if contingencies is None else jnp.asarray(contingencies, jnp.int32),
        n1_rate=None if contingencies is None else as_float(
            np.maximum(rate, derived_n1_ratings(case, model, contingencies, rating_margin)) if derive else n1_rating * rate),
    )
    if secure_iters:  # column i: the flows when unit i injects 1 MW that the slack takes back (`_dc_flows`'
        # Jacobian, written out: a jacfwd at set-up costs 0.25-0.5 s a make; tests/test_envs.py compares the two)
        gen_ptdf = np.asarray(params.dc.ptdf) @ (np.eye(case.n_bus)[case.gen_bus] * (1.0 - slack)[:, None]
                                                  * (1.0 - np.asarray(params.dc.ref_mask))[None, :]).T
        params = params.replace(gen_ptdf=as_float(gen_ptdf))
    init = _initial_states(params, _start_dispatch(case, load_p, float(case.bus[:, GS].sum())))
    return params.replace(init=init, init_obs=_day_obs(init, params))  # compiled: eager ops cost 0.8 s


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


def _outage_schedule(case, model, given, per_day, steps, max_out, n_days, max_steps, seed) -> np.ndarray:
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
    slack unit is ranked like the others (load following is shared by every unit, see `_follow_load`): on
    case14 it is the cheapest, so it is slow there. A schedule that sees the evening peak coming raises the
    slow cheap units early; a myopic one meets the peak with the fast dear ones (`evogrid baseline`: the
    myopic gap is 0.30% on case14, 0.27% on case118; with the slack fast, as before, 0.00% on case14)."""
    from evogrid.physics import generation_cost, make_gen_cost

    mid = 0.5 * (case.gen[:, PMIN] + case.gen[:, PMAX])
    with jax.enable_x64(True):
        cost = make_gen_cost(case)
        h = 1e-3 * np.maximum(case.gen[:, PMAX] - case.gen[:, PMIN], 1.0)
        marginal = (np.asarray(generation_cost(cost, jnp.asarray(mid + h))) - np.asarray(generation_cost(cost, jnp.asarray(mid - h)))) / (2 * h)
    cheap = np.argsort(marginal, kind="stable")[: case.n_units // 2]
    rates = np.full(case.n_units, FAST_RAMP)
    rates[cheap] = SLOW_RAMP
    return rates


def _economic_dispatch_flows(case: Case) -> np.ndarray:
    """Signed DC branch flows (MW) of the economic dispatch (no network limits) at the case's own loads."""
    from evogrid.physics import economic_dispatch

    with jax.enable_x64(True):
        net = make_dc_network(case)
        ptdf, flow0, gs = (np.asarray(x, np.float64) for x in (net.ptdf, net.flow0, net.gs_total))
    pd = case.bus[:, PD]
    pg = economic_dispatch(case.gencost, case.gen[:, PMIN], case.gen[:, PMAX], pd.sum() + float(gs))
    inj = np.zeros(case.n_bus)
    np.add.at(inj, case.gen_bus, pg)
    return ptdf @ (inj - pd) + flow0


def derived_ratings(case: Case, margin: float = RATING_MARGIN, floor: float = 0.05) -> np.ndarray:
    """Line ratings (MW) for a case without real ones: `margin` times the DC flow of the economic dispatch
    (no network limits, `physics.economic_dispatch`) at the case's own bus loads, and at least `floor`
    times the largest such flow. Loads above the case's Pd (some days reach 1.10, a bus a little more)
    then meet these limits, so the optimal schedule must redispatch around them. The default margin
    (RATING_MARGIN, 1.13) is the least in steps of 0.01 at which an operator without foresight, the myopic
    baseline, keeps every one of case14's 64 synthetic days within the ratings (measured with
    `evogrid.baselines.tso.myopic_policy`); the oracle's lines still bind on 31% of them. At 1.10 three
    days (test day 13 among them) had no dispatch within the ratings at their peaks whatever the ramps;
    at 1.11 and 1.12 test day 13 had one, but only for a schedule that raises the slow unit at bus 3
    (1.5 MW a step) from 0 to 10.5 MW over the 7 steps before the peak (the oracle's): the myopic dispatch
    did not get there, nor did the trained Open_ES policies (HiGHS found no secure dispatch within the
    ramps' reach of the state they met the peak in)."""
    flow = np.abs(_economic_dispatch_flows(case))
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


def _base_case_jacobian_inverse(case: Case, acn: ACNetwork) -> jnp.ndarray:
    """Inverse power-flow Jacobian at the case's own solved operating point (full Newton from its data)."""
    s_gen = np.zeros(case.n_bus, complex)
    np.add.at(s_gen, case.gen_bus, case.gen[:, PG] + 1j * case.gen[:, QG])
    s_bus = (s_gen - case.bus[:, PD] - 1j * case.bus[:, QD]) / case.base_mva
    v, converged, _ = newton_raphson(acn, jnp.asarray(s_bus, acn.v0.dtype), iters=10)
    if not bool(converged):
        raise ValueError(f"{case.name}: the case's own operating point has no AC solution; use ac_method='newton'")
    return jnp.linalg.inv(jacobian(acn, v))


def _start_dispatch(case: Case, load_p: np.ndarray, gs_total: float) -> np.ndarray:
    """Start-of-day dispatch [n_days, n_units]: the economic dispatch of each day's first interval (a
    proportional share of headroom where the costs are not polynomials of degree <= 2)."""
    from evogrid.physics import economic_dispatch

    pmin, pmax = case.gen[:, PMIN], case.gen[:, PMAX]
    out = []
    for load in load_p[:, 0]:
        demand = load.sum() + gs_total
        try:
            out.append(economic_dispatch(case.gencost, pmin, pmax, demand))
        except ValueError:
            share = np.clip((demand - pmin.sum()) / max((pmax - pmin).sum(), 1e-6), 0.0, 1.0)
            out.append(pmin + share * (pmax - pmin))
    return np.array(out)


def _day_start(pg, load_p, load_q, out, params: TransParams) -> TransState:
    """One day's start state: the power flow of dispatch `pg` at the first interval's loads."""
    empty = jnp.zeros(0, pg.dtype)
    start = TransState(time_step=jnp.int32(0), day=jnp.int32(0), pg=pg, flow=jnp.zeros_like(params.rate),
                       vm=jnp.abs(params.acn.v0).astype(pg.dtype) if params.ac else empty,
                       va=jnp.angle(params.acn.v0).astype(pg.dtype) if params.ac else empty)
    # a cold start: full Newton (set-up cost only), not the warm-started steps' method
    params_cold = params.replace(ac_iters=10, ac_jinv=None) if params.ac else params
    pg, flow, vm, va, _ = _solve(pg, load_p, load_q, start, params_cold, out)
    return start.replace(pg=pg, flow=flow, vm=vm, va=va)


# module-level, so that every `make` of the same task and split reuses the compiled set-up
_day_starts = jax.jit(jax.vmap(_day_start, in_axes=(0, 0, 0, 0, None)))
_day_obs = jax.jit(jax.vmap(TransGridEnv()._obs, in_axes=(0, None)))


def _initial_states(params: TransParams, start_pg) -> TransState:
    """Start-of-day states [n_days] from the start dispatch [n_days, n_units] and its power flow."""
    states = _day_starts(as_float(start_pg), params.load_p[:, 0], params.load_q[:, 0], params.outage_schedule[:, 0], params)
    return states.replace(day=jnp.arange(params.load_p.shape[0], dtype=jnp.int32))
