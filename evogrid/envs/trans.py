"""TSO task: transmission dispatch on a MATPOWER case (PowerZooJax `TransGridEnv`).

Each step the agent sets every generating unit's set-point for the next interval of `delta_t_hours`;
actions in [-1, 1] map linearly onto the unit's ramp window, the outputs within [Pmin, Pmax] and within
a ramp of its last output (`ramp_window`; -1 the lowest, 1 the highest, `dispatch_action` the inverse),
so every action is a different set-point and none breaks a unit's own limits. The load the set-points
miss is shared by every unit in proportion to its room within its output and ramp limits in the
direction needed (automatic generation control, `follow_load`); what that room cannot cover falls on
the slack unit (the first in-service unit at the reference bus), as on the power flow's slack bus, and
is seen in the `balance` and `ramp` channels. Nothing in the step chooses or corrects the policy's
set-points: the security redispatch that an operator runs after a scheduler is a controller, in
`evogrid.safety` (`RedispatchLayer`), fed by the observation only. `info["dispatch_mw"]` is the dispatch
the step applied (every unit, the slack's output from the balance).

Observation: the interval's bus loads, the units' last outputs, the line loadings, time of day and a
noisy forecast of the next `forecast_steps` intervals' total load (FORECAST_STEPS by default: what the
safety layer's look-ahead and a learned policy plan on), and with outage events each line's status.
Physics per step:

* DC mode (default): DC power flow through a PTDF built once at set-up: the loads' flows of every day and
  step computed then (`load_flow`); a step adds the units' share (one product with `gen_ptdf`).
* AC mode (`ac=True`): the Newton-Raphson kernel, at most `ac_iters` iterations
  (stopping when the mismatch meets the dtype's tolerance), warm started from the
  previous step's voltages; losses are borne by the slack. `ac_method="chord"`
  (default) keeps the Jacobian fixed at the case's solved base point, so an
  iteration is a matrix-vector product rather than an LU factorisation; "newton"
  refactorises every iteration. Both stop at the same solution; `info["converged"]`
  and the `ac_diverged` cost say if not, and a step without a solution keeps the
  previous voltages so that every output stays finite. `enforce_q_limits=True` (the
  tso-caseN-ac tasks) switches PV buses whose units reach their reactive limits to PQ:
  with the chord method by `physics.chord_q_limits` (a fixed count of matrix-vector
  iterations, no factorisation: the accelerator's shape), with "newton" by
  `physics.newton_raphson_q_limits` (the reference); both checked against pandapower's
  enforce_q_lims.

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


import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from evogrid.case import Case, load_case
from evogrid.case.matpower import GS, PD, PG, PMAX, PMIN, QD, QG, QMAX, QMIN, RAMP_30, VMAX, VMIN
from evogrid.envs.environment import Environment, EnvParams, EnvState, money_unit, sanitize_action
from evogrid.envs.profiles import (
    FORECAST_ERROR,
    bus_load_days,
    check_days,
    forecast_features,
    source_days,
    split_days,
    time_features,
)
from evogrid.envs.spaces import Box
from evogrid.envs.trans_rules import (
    N1_RATING,
    RATING_MARGIN,
    derived_n1_ratings,
    derived_ratings,
    merit_ramp_rates,
    outage_schedule_days,
    setpoints_in_band,
    start_dispatch,
)
from evogrid.physics.ac import CHORD_Q_ITERS, DERIVATIVE_ITERS, bus_types
from evogrid.physics import (
    ACNetwork,
    ChordQLimits,
    DCNetwork,
    GenCost,
    OutageModel,
    as_float,
    branch_flows,
    bus_injections,
    chord_q_limits,
    contingency_flows,
    dc_line_flows,
    generation_cost,
    host_setup,
    injection_flows,
    make_ac_network,
    make_chord_q_limits,
    make_dc_network,
    make_gen_cost,
    make_outage_model,
    newton_raphson,
    newton_raphson_q_limits,
    outage_flows,
)
from evogrid.utils.jax_utils import day_row, day_rows, take_rows

ROUNDOFF_ULPS = 4      # the balance and ramp channels ignore the slack's excess below this many ulps of the demand
FORECAST_STEPS = 8     # intervals of load forecast in the observation by default (4 h at 30 min)


@struct.dataclass
class TransState(EnvState):
    day: jnp.ndarray      # int32 index into the params' load days
    pg: jnp.ndarray       # [n_units] MW dispatched in the last interval
    flow: jnp.ndarray     # [n_branch] MW (DC, signed from->to) or MVA (AC, larger end)
    vm: jnp.ndarray       # [n_bus] p.u. in AC mode (warm start of the next solve); empty in DC mode
    va: jnp.ndarray       # [n_bus] rad in AC mode; empty in DC mode
    qg: jnp.ndarray       # [n_vbus] MVAr the units of each voltage-controlled bus produce (AC); empty in DC mode


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
    gen_ptdf: jnp.ndarray = None   # [n_branch, n_units] MW of flow per MW of each unit (0 for the slack and at the reference bus)
    load_flow: jnp.ndarray = None  # [n_days, max_steps, n_branch] MW the DC flows of the loads alone, flow0 included
    acn: ACNetwork | None = None
    ac_chord: ChordQLimits | None = None  # the chord method's fixed matrices at the case's base point (None: full Newton)
    init: TransState = None        # [n_days] cached start-of-day states (see make_trans_params)
    init_obs: jnp.ndarray = None   # [n_days, obs_dim] their observations
    inv_pmax: jnp.ndarray = None   # [n_units] 1 / Pmax (observation scaling)
    pd_total: jnp.ndarray = None   # MW, the case's total load: the unit of the load forecast
    inv_rate: jnp.ndarray = None   # [n_branch] 1 / RATE_A, or 1 / baseMVA for unlimited branches
    outage_schedule: jnp.ndarray = None  # [n_days, max_steps, k] int32 branches out of service, -1 = none
    outages: OutageModel | None = None   # LODF model (outage events or N-1 screening only)
    contingencies: jnp.ndarray | None = None  # [c] int32 single outages N-1 screens (None: no n1_thermal)
    n1_rate: jnp.ndarray | None = None   # [n_branch] MW post-contingency limit
    q_min: jnp.ndarray | None = None     # [n_bus] MVAr units' summed reactive limits (enforce_q_limits)
    q_max: jnp.ndarray | None = None
    v_set: jnp.ndarray | None = None     # [n_vbus] p.u. the case's voltage set-points of the buses with units (AC)
    v_lo: jnp.ndarray | None = None      # [n_vbus] p.u. the band voltage actions map onto (the bus's VMIN, VMAX)
    v_hi: jnp.ndarray | None = None
    vbus_incidence: jnp.ndarray | None = None  # [n_vbus, n_bus] 1.0 at each voltage-controlled bus
    base_mva: float = struct.field(pytree_node=False, default=100.0)
    ac: bool = struct.field(pytree_node=False, default=False)
    voltage_control: bool = struct.field(pytree_node=False, default=False)
    ac_iters: int = struct.field(pytree_node=False, default=10)
    ac_derivative_iters: int = struct.field(pytree_node=False, default=DERIVATIVE_ITERS)   # chord_q_limits' own


class TransGridEnv(Environment):
    """Transmission dispatch. Use with `make_trans_params(case)`."""

    def num_days(self, params: TransParams) -> int:
        return params.load_p.shape[0]

    def reset_to_day(self, day, params: TransParams):
        return take_rows(params.init_obs, day), jax.tree_util.tree_map(lambda x: take_rows(x, day), params.init)

    def step_env(self, key, state: TransState, action, params: TransParams):
        action, n_bad = sanitize_action(action)
        t = state.time_step
        # the step's rows of the day's tables, in one pick on an accelerator (the loads' flows: DC; Q: AC)
        load_p, other = day_rows((params.load_p, params.load_q if params.ac else params.load_flow), state.day, t)
        load_q, load_flow = (other, None) if params.ac else (None, other)
        n_units = params.pmax.shape[0]
        asked, lo, hi = asked_dispatch(action[:n_units], state.pg, params)
        demand = jnp.sum(load_p) + params.dc.gs_total
        if params.ac:   # the control also covers the losses: the last interval's, scaled as the load squared
            last_load = jnp.sum(day_row(params.load_p, state.day, jnp.maximum(t - 1, 0)))
            losses = jnp.sum(state.pg) - last_load - params.dc.gs_total
            demand = demand + losses * (jnp.sum(load_p) / last_load) ** 2
        pg = follow_load(asked, lo, hi, demand)
        vset = voltage_setpoints(action[n_units:], params) if params.voltage_control else params.v_set
        out = day_row(params.outage_schedule, state.day, t)
        rate = params.rate
        if params.n1_rate is not None and out.shape[0]:  # a trip this step: flows within emergency ratings
            rate = jnp.where(_new_outage(params.outage_schedule, state.day, t), params.n1_rate, rate)
        solved = _solve(pg, vset, load_p, load_q, load_flow, state, params, out)
        if params.ac:   # the control then shares what the estimate missed (the slack's excess) and the grid settles
            pg = follow_load(pg, lo, hi, jnp.sum(solved[0]))
            solved = _solve(pg, vset, load_p, load_q, load_flow, state.replace(vm=solved[2], va=solved[3]), params, out)
        pg, flow, vm, va, qg, extra = solved

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
        new_state = TransState(time_step=next_t, day=state.day, pg=pg, flow=flow, vm=vm, va=va, qg=qg)
        done = next_t >= params.max_steps
        info = {
            "dispatch_mw": pg,   # [n_units] the dispatch applied (the slack's from the balance)
            "gen_cost": gen_cost,
            "slack_mw": ps,
            "losses_mw": jnp.sum(pg) - jnp.sum(load_p),
            "peak_loading": jnp.max(jnp.abs(flow) / rate),   # the most loaded line's flow over its rating
            "nonfinite_actions": n_bad,
            "converged": extra["converged"],
            "islanded": extra["islanded"],
        }
        if params.ac:
            info["voltage_setpoints"] = vset   # [n_vbus] p.u. the set-points applied
        return self._obs(new_state, params), new_state, reward, costs, done, info

    def _obs(self, state: TransState, params: TransParams):
        """[loads p.u. (n_bus), pg / Pmax (n_units), |flow| / rating (n_branch), sin, cos time of day, progress,
        the forecast, with outage events each branch's status in the interval just past (1 in service, 0 out;
        n_branch: a trip is a surprise, seen once it has happened), and in AC mode the bus voltages |V| (p.u.,
        n_bus) and the reactive output of each voltage-controlled bus's units (p.u. of baseMVA, n_vbus)]."""
        t = jnp.minimum(state.time_step, params.max_steps - 1)
        parts = [
            day_row(params.load_p, state.day, t) * (1.0 / params.base_mva),
            state.pg * params.inv_pmax,
            jnp.abs(state.flow) * params.inv_rate,
            self.time_obs(state, params),
        ]
        if params.outage_schedule.shape[-1]:  # what the operator knows: the lines out in the interval just past
            last = jnp.maximum(state.time_step - 1, 0)
            out = _outaged(day_row(params.outage_schedule, state.day, last), params.rate.shape[0]) & (state.time_step > 0)
            parts.append(1.0 - out.astype(state.pg.dtype))
        if params.ac:
            parts += [state.vm, state.qg * (1.0 / params.base_mva)]
        return jnp.concatenate(parts)

    def observation_space(self, params: TransParams) -> Box:
        n = params.load_p.shape[-1] + params.pmax.shape[0] + params.rate.shape[0] + self.time_obs_size(params)
        n += params.rate.shape[0] if params.outage_schedule.shape[-1] else 0
        n += params.load_p.shape[-1] + params.v_set.shape[0] if params.ac else 0
        return Box(-jnp.inf, jnp.inf, (n,))

    def action_space(self, params: TransParams) -> Box:
        """Every unit's active set-point, then (with `voltage_control`) each voltage-controlled bus's |V| set-point."""
        return Box(-1.0, 1.0, (params.pmax.shape[0] + (params.v_set.shape[0] if params.voltage_control else 0),))

    def grid_view(self, state: TransState, params: TransParams) -> dict:
        t = jnp.clip(state.time_step - 1, 0, params.max_steps - 1)  # the interval just dispatched
        view = {"dispatch_mw": state.pg, "load_mw": jnp.sum(day_row(params.load_p, state.day, t)),
                "loading_pct": 100.0 * jnp.abs(state.flow) / params.rate}
        if params.ac:
            view.update(vm_pu=state.vm, v_band=jnp.stack([jnp.min(params.vmin), jnp.max(params.vmax)]))
        return view

    def units(self, params: TransParams) -> dict[str, str]:
        steps = "p.u. of baseMVA x steps"
        return {"return": f"{money_unit(params.reward_scale)} per day (minus generation cost)",
                "thermal": f"{'MVA' if params.ac else 'MW'} flow over rating, {steps}", "balance": f"slack output outside its limits, {steps}",
                "ramp": f"slack ramp beyond its limit, {steps}", "voltage": "p.u. of |V| outside its band x buses x steps",
                "ac_diverged": "steps without a power-flow solution",
                "n1_thermal": f"post-outage flow over the N-1 rating, summed over outages, {steps}"}

    def constraint_names(self, params: TransParams) -> tuple[str, ...]:
        return (("thermal", "balance", "ramp") + (("voltage", "ac_diverged") if params.ac else ())
                + (("n1_thermal",) if params.contingencies is not None else ()))


def observation_layout(params: TransParams) -> tuple[int, bool]:
    """(forecast entries F, whether each line's status follows) of the task's observations (`_obs`)."""
    return params.forecast.shape[-1], bool(params.outage_schedule.shape[-1])


def read_observation(obs, params: TransParams, layout: tuple[int, bool]) -> dict:
    """The parts of an observation a controller reads: load_mw [n_bus] of the interval to dispatch, last_pg
    [n_units] MW, t (the interval's index, float), forecast_mw [F] (total load of the next F intervals, the
    case's shunts excluded) and line_out [n_branch] bool (out of service in the interval just past; all
    False without outage events) and, in AC mode, vm [n_bus] (the bus voltages of the interval just past,
    p.u.). `layout` from `observation_layout`. Reads `params` only for sizes and fixed scales (no time
    series), so a safety layer may call it with its grid-only params."""
    n_forecast, status = layout
    n_bus, n_units, n_line = params.dc.ptdf.shape[1], params.pmax.shape[0], params.rate.shape[0]
    tail = n_bus + n_units + n_line + 3   # after the time of day (sin, cos, progress): the forecast, the status
    line_out = obs[tail + n_forecast:tail + n_forecast + n_line] < 0.5 if status else jnp.zeros(n_line, bool)
    seen = {"load_mw": obs[:n_bus] * params.base_mva, "last_pg": _observed_pg(obs, params),
            "t": jnp.round(obs[tail - 1] * params.max_steps), "forecast_mw": obs[tail:tail + n_forecast] * params.pd_total,
            "line_out": line_out}
    if params.ac:   # after the status: |V| [n_bus], then the voltage-controlled buses' reactive outputs
        end = obs.shape[0] - params.v_set.shape[0]
        seen["vm"] = obs[end - n_bus:end]
    return seen


def forecast_bus_loads(load_mw, forecast_mw):
    """[F, n_bus] MW: the bus loads of the forecast intervals, today's pattern `load_mw` [n_bus] scaled to each
    forecast total `forecast_mw` [F] (the observation forecasts the total only)."""
    scale = forecast_mw / jnp.maximum(jnp.sum(load_mw), jnp.finfo(load_mw.dtype).tiny)
    return load_mw[None, :] * scale[:, None]


def _new_outage(schedule, day, t):
    """Whether step t of `day` brings an outage not in force at step t-1 (a trip; step 0: any outage)."""
    out, before = day_row(schedule, day, t), day_row(schedule, day, jnp.maximum(t - 1, 0))
    before = jnp.where(t > 0, before, -1)
    return jnp.any((out >= 0) & ~jnp.any(out[:, None] == before[None, :], axis=1))


def _outaged(out, n_branch):
    """[n_branch] bool: the branches listed in `out` (-1 entries ignored)."""
    return jnp.any(jnp.arange(n_branch)[:, None] == out[None, :], axis=1)


def ramp_window(prev, params: TransParams):
    """[lo, hi] per unit: the outputs reachable from `prev` within output and ramp limits (what actions map onto)."""
    return jnp.maximum(params.pmin, prev - params.ramp), jnp.minimum(params.pmax, prev + params.ramp)


def asked_dispatch(action, prev, params: TransParams):
    """(the outputs [n_units] MW the active actions in [-1, 1] ask for, each mapped linearly onto its ramp
    window from the last output `prev`; the window's lo, hi): `dispatch_action`'s inverse."""
    lo, hi = ramp_window(prev, params)
    return lo + 0.5 * (action + 1.0) * (hi - lo), lo, hi


def dispatch_action(params: TransParams, pg, prev):
    """The env action [..., n_units] that asks for dispatch `pg` after the units' last output `prev` (the
    inverse of the env's mapping onto the ramp window; outputs outside the window ask for its nearest end)."""
    lo, hi = ramp_window(jnp.asarray(prev), params)
    span = hi - lo
    a = 2.0 * (jnp.asarray(pg) - lo) / jnp.where(span > 0, span, 1.0) - 1.0
    return jnp.clip(jnp.where(span > 0, a, 0.0), -1.0, 1.0)


def setpoint_output_action(out, obs, params: TransParams):
    """The env action [..., n_act] of a policy that outputs set-points: the first n_units entries of `out`
    (in [-1, 1]) mapped linearly onto each unit's [Pmin, Pmax] and asked for from the last outputs the
    observation `obs` shows (`dispatch_action`: a set-point out of the ramps' reach asks for the window's
    nearest end); the rest (AC voltage set-points) passed as they are. The head `policy_output="setpoint"`
    of the evolved and gradient-trained MLPs puts after the network: a unit's economic set-point depends on
    the loads, its position in a ramp window also on its last output to a fraction of the ramp."""
    n = params.pmax.shape[0]
    pg = params.pmin + 0.5 * (out[..., :n] + 1.0) * (params.pmax - params.pmin)
    return jnp.concatenate([dispatch_action(params, pg, _observed_pg(obs, params)), out[..., n:]], axis=-1)


def setpoint_output(action, obs, params: TransParams):
    """The output [..., n_act] for which `setpoint_output_action` gives `action` after observation `obs` (the
    set-point the action asks for, on the [-1, 1] scale of [Pmin, Pmax]): what an MLP with that head is fitted
    to when it imitates the operator's actions."""
    n = params.pmax.shape[0]
    pg = asked_dispatch(action[..., :n], _observed_pg(obs, params), params)[0]
    span = params.pmax - params.pmin
    out = jnp.where(span > 0, 2.0 * (pg - params.pmin) / jnp.where(span > 0, span, 1.0) - 1.0, 0.0)
    return jnp.concatenate([out, action[..., n:]], axis=-1)


def _observed_pg(obs, params: TransParams):
    """The units' last outputs [..., n_units] MW in observations `obs` [..., obs_dim] (`_obs`'s layout)."""
    n_bus, n_units = params.dc.ptdf.shape[1], params.pmax.shape[0]
    return obs[..., n_bus:n_bus + n_units] / params.inv_pmax


def follow_load(pg, lo, hi, demand):
    """Automatic generation control: the demand the set-points `pg` miss is shared by every unit (the slack
    too) in proportion to its room within [lo, hi] (output and ramp limits) in the direction needed; what
    that room cannot cover is left to the slack (`_solve`), where the `balance` and `ramp` channels see it."""
    miss = demand - jnp.sum(pg)
    room = jnp.where(miss > 0, hi - pg, pg - lo)
    total = jnp.sum(room)
    some = total >= jnp.finfo(pg.dtype).tiny   # without room, nothing moves (and the derivative stays finite)
    share = jnp.where(some, jnp.minimum(jnp.abs(miss) / jnp.where(some, total, 1.0), 1.0), 1.0)
    return pg + jnp.sign(miss) * share * room


def _dc_flows(pg, load_p, load_flow, params: TransParams, out):
    """DC flows of dispatch `pg` (its slack entry ignored: the slack balances) at loads `load_p` [n_bus] MW,
    whose flows alone are `load_flow` [n_branch] (`load_flows`), with the branches `out` out of service: the
    units' share is one [n_branch, n_units] product (at 9,241 buses a seventh of the whole PTDF's).
    Returns (flow [n_branch] MW, slack output MW, islanded)."""
    others = pg * (1.0 - params.slack)
    flow = params.gen_ptdf @ others + load_flow
    ps = params.dc.gs_total + jnp.sum(load_p) - jnp.sum(others)
    post, islanded = (outage_flows(params.outages, flow, out) if out.shape[0] else (flow, jnp.asarray(False)))
    return post, ps, islanded


def load_flows(load_p, dc: DCNetwork):
    """The DC flows [..., n_branch] MW of the loads `load_p` [..., n_bus] alone (the units at zero, flow0 included)."""
    return dc_line_flows(dc, -load_p)[0]


def voltage_setpoints(action, params: TransParams):
    """[n_vbus] p.u.: voltage actions in [-1, 1] mapped linearly onto each bus's [VMIN, VMAX]."""
    return params.v_lo + 0.5 * (jnp.clip(action, -1.0, 1.0) + 1.0) * (params.v_hi - params.v_lo)


def voltage_action(params: TransParams, vm):
    """The voltage actions [..., n_vbus] that ask for set-points `vm` (the inverse of `voltage_setpoints`)."""
    span = params.v_hi - params.v_lo
    return jnp.clip(2.0 * (jnp.asarray(vm) - params.v_lo) / jnp.where(span > 0, span, 1.0) - 1.0, -1.0, 1.0)


def _solve(pg, vset, load_p, load_q, load_flow, state, params: TransParams, out):
    """Power flow for a dispatch whose slack entry is to be determined, with the branches `out` out of
    service (DC: `load_flow` the loads' flows, `_dc_flows`), or (AC) the voltage-controlled buses held at
    `vset` [n_vbus]. Returns (pg, flow, vm, va, qg [n_vbus] MVAr, extra)."""
    others = pg * (1.0 - params.slack)
    one = jnp.asarray(1.0, pg.dtype)
    if not params.ac:
        post, ps, islanded = _dc_flows(pg, load_p, load_flow, params, out)
        extra = {"converged": one, "islanded": islanded.astype(pg.dtype)}
        return others + ps * params.slack, post, state.vm, state.va, state.qg, extra
    gen_p = others @ params.gen_incidence
    gen_q = params.qg @ params.gen_incidence
    s_bus = ((gen_p - load_p) + 1j * (gen_q - load_q)) / params.base_mva
    held = jnp.sum(params.vbus_incidence, axis=0)                       # [n_bus] 1 at voltage-controlled buses
    vm0 = state.vm * (1.0 - held) + vset.astype(state.vm.dtype) @ params.vbus_incidence
    v0 = (vm0 * jnp.exp(1j * state.va)).astype(params.acn.v0.dtype)
    if params.q_min is not None:  # PV -> PQ switching at the units' reactive limits
        q_lo, q_hi = ((q - load_q) / params.base_mva for q in (params.q_min, params.q_max))
        if params.ac_chord is None:
            v, converged, _, _ = newton_raphson_q_limits(params.acn, s_bus, q_lo, q_hi, v0, iters=params.ac_iters, v_set=v0)
        else:
            v, converged, _, _ = chord_q_limits(params.acn, s_bus, q_lo, q_hi, params.ac_chord, v0, iters=params.ac_iters,
                                                 derivative_iters=params.ac_derivative_iters)
    else:
        jinv = None if params.ac_chord is None else params.ac_chord.jinv
        v, converged, _ = newton_raphson(params.acn, s_bus, v0, iters=params.ac_iters, jacobian_inverse=jinv)
    # no solution (or a non-finite one): keep the previous voltages, so every output stays finite and the
    # next step starts from a sane point; the step is reported by `ac_diverged`
    converged = converged & jnp.all(jnp.isfinite(v.real) & jnp.isfinite(v.imag))
    v = jnp.where(converged, v, v0)
    s_inj = bus_injections(params.acn, v)
    ref = params.slack @ params.gen_incidence  # [n_bus] one-hot of the ref bus
    ps = jnp.sum((s_inj.real + load_p - gen_p) * ref)
    s_from, s_to = branch_flows(params.acn, v)
    flow = jnp.maximum(jnp.abs(s_from), jnp.abs(s_to))
    qg = params.vbus_incidence @ (s_inj.imag + load_q)   # s_inj is in MVA
    extra = {"converged": converged.astype(pg.dtype), "islanded": 0.0 * one}
    return others + ps * params.slack, flow, jnp.abs(v), jnp.angle(v), qg.astype(pg.dtype), extra


@host_setup
def make_trans_params(case: Case | str, max_steps: int = 48, delta_t_hours: float = 0.5, *, ac: bool = False,
                      ac_method: str | None = None, ac_iters: int | None = None, enforce_q_limits: bool = False, n_days: int | None = None, seed: int = 0,
                      split: str = "all", profiles: str = "synthetic", reward_scale: float = 1e-3, default_ramp_per_hour: float | None = None,
                      ratings: str = "auto", rating_margin: float = RATING_MARGIN, load_p=None, load_q=None,
                      n1: bool = False, n1_rating: float = N1_RATING, n1_contingencies=None, outages_per_day: float = 0.0,
                      outage_steps: int = 4, max_outages: int = 1, outage_schedule=None,
                      forecast_steps: int | None = None, forecast_error: float = FORECAST_ERROR,
                      voltage_setpoints: str = "band", voltage_control: bool | None = None) -> TransParams:
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

    AC mode holds every unit's bus (PV and reference) at a voltage set-point. With `voltage_control`
    (default in AC mode) the policy chooses it: the action gains one entry per such bus after the units'
    active set-points, mapped linearly onto the bus's [VMIN, VMAX] (`voltage_setpoints`; the inverse is
    `voltage_action`), as an operator sets generator voltages. Without it the case's set-points hold;
    `voltage_setpoints="band"` (default) clips them into their bus's [VMIN, VMAX] (`setpoints_in_band`):
    IEEE 14's units at buses 6 and 8 are set to 1.07 and 1.09 p.u. against a VMAX of 1.06, which would
    put the `voltage` channel above zero at every step whatever the dispatch; "case" keeps the file's.
    Derived ratings (below) are MVA in AC mode: `derived_ratings` of the AC flows. In AC mode the load
    following control balances the load plus its estimate of the losses (the last interval's, scaled by
    the square of the load's change), then shares what the power flow shows the estimate missed (the
    slack's excess) among the units as it shares the load, and the grid is solved again (warm-started);
    the slack unit takes the small remainder.

    Security (DC mode only): `n1=True` adds the `n1_thermal` channel, screening `n1_contingencies`
    (branch indices; default every branch whose loss does not island the grid) against `n1_rating` x the
    line rating (short-term emergency ratings are commonly 1.2-1.5 x the normal one). Outage events:
    `outages_per_day` random outages a day (seeded by `seed`, uniform over non-bridge branches), each
    `outage_steps` steps long, at most `max_outages` at once (later ones are dropped); or pass
    `outage_schedule` [n_days, max_steps, k] of branch indices (-1 = none), drawn before the `split`.

    Forecasts: the observation carries a noisy forecast of the next `forecast_steps` intervals' total load
    (share of the case's total Pd; default FORECAST_STEPS or the day's length if shorter, 0 for none) with error `forecast_error` x
    sqrt(lead) (`profiles.forecast_features`, FORECAST_ERROR by default).

    `init` caches, per day, the start-of-day state (the economic dispatch of the first interval's
    load and its power flow), so `reset` costs an index instead of a power flow. It is derived from
    the loads: after changing load leaves, rebuild the params with this function (passing `load_p`/`load_q`).
    """
    case = load_case(case) if not isinstance(case, Case) else case
    if forecast_steps is None:
        forecast_steps = min(FORECAST_STEPS, max_steps) if isinstance(max_steps, (int, np.integer)) else FORECAST_STEPS
    if ac_method not in (None, "chord", "newton"):
        raise ValueError(f"ac_method must be 'chord' or 'newton', got {ac_method!r}")
    if enforce_q_limits and not ac:
        raise ValueError("enforce_q_limits needs the AC model (ac=True, the tso-caseN-ac tasks): the DC model has "
                         "no reactive power")
    ac_method = ac_method or "chord"
    if voltage_setpoints not in ("band", "case"):
        raise ValueError(f"voltage_setpoints must be 'band' or 'case', got {voltage_setpoints!r}")
    voltage_control = ac if voltage_control is None else bool(voltage_control)
    if voltage_control and not ac:
        raise ValueError("voltage set-point actions need the AC model (ac=True, the tso-caseN-ac tasks); the DC "
                         "model has no voltages")
    if ac and not (np.any(case.bus[:, QD] != 0) or np.any(case.gen[:, QMAX] != case.gen[:, QMIN])):
        raise ValueError(f"{case.name} has no reactive data (every bus's QD is 0 and every unit's QMIN equals its "
                         "QMAX): an AC task would hold no reactive power; use the DC task")
    if ac and voltage_setpoints == "band":
        case = setpoints_in_band(case)
    # chord: the maximum (it stops when converged); with reactive limits, the fixed count of iterations;
    # newton: the maximum per solve
    if not ac_iters:
        ac_iters = 10 if ac_method == "newton" else CHORD_Q_ITERS if enforce_q_limits else 30
    security = n1 or outages_per_day or outage_schedule is not None
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
    schedule = outage_schedule_days(case, model, outage_schedule, outages_per_day, outage_steps, max_outages,
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
    rate = derived_ratings(case, rating_margin, ac=ac) if derive else case.rate_a
    params = TransParams(
        max_steps=max_steps, delta_t_hours=delta_t_hours, base_mva=case.base_mva, ac=ac, ac_iters=ac_iters,
        voltage_control=voltage_control,
        load_p=as_float(load_p), load_q=as_float(load_q),
        pmin=as_float(gen[:, PMIN]), pmax=as_float(gen[:, PMAX]), ramp=as_float(ramp), qg=as_float(gen[:, QG]),
        rate=as_float(rate), vmin=as_float(case.bus[:, VMIN]), vmax=as_float(case.bus[:, VMAX]),
        gen_bus=jnp.asarray(case.gen_bus), gen_incidence=as_float(np.eye(case.n_bus)[case.gen_bus]), slack=as_float(slack), reward_scale=as_float(reward_scale),
        cost=make_gen_cost(case), dc=make_dc_network(case), acn=make_ac_network(case) if ac else None,
    )
    at_units = np.asarray(params.dc.ptdf)[:, case.gen_bus] * ((1.0 - slack) * (case.gen_bus != case.ref_bus))
    params = params.replace(gen_ptdf=as_float(at_units),
                            load_flow=as_float(injection_flows(case, -load_p) + np.asarray(params.dc.flow0)))
    if enforce_q_limits:
        q_min, q_max = np.zeros(case.n_bus), np.zeros(case.n_bus)
        np.add.at(q_min, case.gen_bus, gen[:, QMIN])
        np.add.at(q_max, case.gen_bus, gen[:, QMAX])
        params = params.replace(q_min=as_float(q_min), q_max=as_float(q_max))
    if ac:
        ref, pv, _ = bus_types(case)
        vbus = np.sort(np.concatenate([ref, pv]))   # the voltage-controlled buses: reference and PV
        params = params.replace(v_set=as_float(np.abs(np.asarray(params.acn.v0))[vbus]), v_lo=as_float(case.bus[vbus, VMIN]),
                                v_hi=as_float(case.bus[vbus, VMAX]), vbus_incidence=as_float(np.eye(case.n_bus)[vbus]))
    if ac and ac_method == "chord":
        params = params.replace(ac_chord=_base_case_chord(case, params.acn))
    params = params.replace(
        inv_pmax=as_float(1.0 / np.maximum(gen[:, PMAX], 1e-6)), pd_total=as_float(max(case.bus[:, PD].sum(), 1e-9)),
        inv_rate=as_float(np.where(np.isfinite(rate), 1.0 / rate, 1.0 / case.base_mva)),
        time_features=as_float(time_features(max_steps, delta_t_hours)),
        forecast=as_float(forecast_features(load_p.sum(-1, keepdims=True) / max(case.bus[:, PD].sum(), 1e-9), *source,
                                            split, forecast_steps, forecast_error, seed)),
        outage_schedule=jnp.asarray(schedule, jnp.int32), outages=model,
        contingencies=None if contingencies is None else jnp.asarray(contingencies, jnp.int32),
        n1_rate=None if contingencies is None else as_float(
            np.maximum(rate, derived_n1_ratings(case, model, contingencies, rating_margin)) if derive else n1_rating * rate),
    )
    lines = None if ac else tuple(np.asarray(x, np.float64) for x in (params.dc.ptdf, params.dc.flow0, rate))
    init = _initial_states(params, start_dispatch(case, load_p, float(case.bus[:, GS].sum()), lines))
    return params.replace(init=init, init_obs=_day_obs(init, params))  # compiled: eager ops cost 0.8 s


def _base_case_chord(case: Case, acn: ACNetwork) -> ChordQLimits:
    """The chord method's matrices (inverse power-flow Jacobian, and for reactive limits the PV buses'
    couplings) at the case's own solved operating point (full Newton from its data)."""
    s_gen = np.zeros(case.n_bus, complex)
    np.add.at(s_gen, case.gen_bus, case.gen[:, PG] + 1j * case.gen[:, QG])
    s_bus = (s_gen - case.bus[:, PD] - 1j * case.bus[:, QD]) / case.base_mva
    v, converged, _ = newton_raphson(acn, jnp.asarray(s_bus, acn.v0.dtype), iters=10)
    if not bool(converged):
        raise ValueError(f"{case.name}: the case's own operating point has no AC solution; use ac_method='newton'")
    return make_chord_q_limits(acn, v)


def _day_start(pg, load_p, load_q, load_flow, out, params: TransParams) -> TransState:
    """One day's start state: the power flow of dispatch `pg` at the first interval's loads."""
    empty = jnp.zeros(0, pg.dtype)
    start = TransState(time_step=jnp.int32(0), day=jnp.int32(0), pg=pg, flow=jnp.zeros_like(params.rate),
                       vm=jnp.abs(params.acn.v0).astype(pg.dtype) if params.ac else empty,
                       va=jnp.angle(params.acn.v0).astype(pg.dtype) if params.ac else empty,
                       qg=jnp.zeros_like(params.v_set) if params.ac else empty)
    # a cold start: full Newton (set-up cost only), not the warm-started steps' method
    params_cold = params.replace(ac_iters=10, ac_chord=None) if params.ac else params
    pg, flow, vm, va, qg, _ = _solve(pg, params.v_set, load_p, load_q, load_flow, start, params_cold, out)
    return start.replace(pg=pg, flow=flow, vm=vm, va=va, qg=qg)


# module-level, so that every `make` of the same task and split reuses the compiled set-up
_day_starts = jax.jit(jax.vmap(_day_start, in_axes=(0, 0, 0, 0, 0, None)))
_day_obs = jax.jit(jax.vmap(TransGridEnv()._obs, in_axes=(0, None)))


def _initial_states(params: TransParams, start_pg) -> TransState:
    """Start-of-day states [n_days] from the start dispatch [n_days, n_units] and its power flow."""
    states = _day_starts(as_float(start_pg), params.load_p[:, 0], params.load_q[:, 0], params.load_flow[:, 0],
                         params.outage_schedule[:, 0], params)
    return states.replace(day=jnp.arange(params.load_p.shape[0], dtype=jnp.int32))
