"""Safety layers: controllers that correct a policy's action, reading the observation and nothing else.

A layer is a pure function `layer(obs, action) -> (action, moved)` over arrays: jit, vmap and grad go
through it. It holds a copy of the task's params with every time series removed (loads, PV, forecasts,
outage schedules, start-of-day states: `_grid_only`), so the future is out of its reach by construction;
what it knows of the present and of what comes is what the observation says (the interval's loads, the
units' last outputs, the noisy forecast, the lines' status). `moved` is the energy the layer moved in
the interval (MWh: the change in the units' outputs, or in shifted and curtailed load).

* `RedispatchLayer` (tso tasks, DC): the operator's security redispatch after a scheduler
  (`redispatch.secure_redispatch`): the policy's dispatch moved by about the least to one within the line
  ratings and the ramp windows, keeping the forecast demand of the next intervals in the ramps' reach and,
  on grids of at most PEAK_PLAN_UNITS units without line outages, planning the forecast peak (DC3's
  "correction" and E2ELR's repair layer are the learned-policy analogues).
* `ScheduleLayer` (AC tso tasks): the operator's voltage schedule: the generators' voltage set-points
  moved by about the least (`voltage.band_steps`, sensitivities from the Newton power flow's own
  derivative) so that every bus lies within its band, checked against the AC power flow at the interval's
  observed loads after each round; the active dispatch is the policy's, the slack unit's asked a tenth of
  its ramp inside its ramp window (it takes what the control's estimate of the losses misses).
* `VoltageLayer` (dso tasks): the DSO's voltage correction (`voltage.voltage_correction`): reactive power
  first, then shifting and curtailment, to bring every bus within the voltage band, checked against the
  sweep power flow after each round.

`Shielded(env, layer)` composes a layer with whatever acts on the env: it is an `Environment` whose state
carries the last observation beside the env's own, and whose step hands the layer that observation and
the policy's action, then steps the env with the layer's action. Workflows and baselines compose with it
(`make_layer`, the `safety` config field): one mechanism for every learned policy and baseline, and a
gradient learner sees the layer as part of its environment (its own action is the raw one).
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from evogrid.envs.dist import (
    DistGridEnv,
    DistParams,
    decode_controls,
    encode_controls,
    feeder_flow,
)
from evogrid.envs.dist import read_observation as read_feeder_observation
from evogrid.envs.environment import Environment, sanitize_action
from evogrid.envs.trans import (
    TransGridEnv,
    TransParams,
    TransState,
    _dc_flows,
    _solve,
    asked_dispatch,
    dispatch_action,
    follow_load,
    forecast_bus_loads,
    load_flows,
    read_observation,
    voltage_action,
    voltage_setpoints,
)
from evogrid.physics import outage_flows
from evogrid.safety.redispatch import (
    LOOKAHEAD_STEPS,
    PEAK_PLAN_UNITS,
    SECURE_ITERS,
    peak_plan,
    secure_redispatch,
)
from evogrid.safety.voltage import (
    SCHEDULE_BUSES,
    SCHEDULE_DERIVATIVE_ITERS,
    SCHEDULE_MARGIN,
    SCHEDULE_Q_RESERVE,
    SCHEDULE_REACH,
    SCHEDULE_ROUNDS,
    SCHEDULE_SLACK_MARGIN,
    SCHEDULE_TRIGGER,
    VOLT_ROUNDS,
    band_steps,
    voltage_correction,
)
from evogrid.utils.jax_utils import tree_where

SAFETY_CHOICES = ("auto", "on", "off")  # the `safety` config field: auto = on where the task has a layer
# the security redispatch's margins a workflow's config carries, each with its unit
MARGINS = {"reach_margin": "share of the forecast demand", "line_margin": "share of each line's rating"}
_SERIES = ("load_p", "load_q", "load_flow", "pv_avail", "forecast", "init", "init_obs", "outage_schedule", "price")


def _grid_only(params):
    """`params` with every time series removed: what a layer may know of the task without an observation."""
    return params.replace(**{k: None for k in _SERIES if hasattr(params, k)})


@struct.dataclass
class RedispatchLayer:
    """The transmission security redispatch, fed by the observation (see the module docstring)."""

    grid: TransParams            # the task's params less its time series
    forecast_steps: int = struct.field(pytree_node=False, default=0)   # F: forecast entries in the observation
    outage_slots: int = struct.field(pytree_node=False, default=0)     # lines out at once the task can have (0: none)
    iters: int = struct.field(pytree_node=False, default=SECURE_ITERS)
    lookahead: int = struct.field(pytree_node=False, default=0)        # forecast intervals kept within reach
    plan_peak: bool = struct.field(pytree_node=False, default=False)
    reach_margin: float = struct.field(pytree_node=False, default=0.0)   # the look-ahead's demands widened by this share
    line_margin: float = struct.field(pytree_node=False, default=0.0)    # each line's rating cut by this share

    def __call__(self, obs, action):
        """(the action [n_units] that asks for the secured dispatch, MWh moved) from the observation the
        policy acted on and its action."""
        g = self.grid
        action, _ = sanitize_action(action)
        seen = read_observation(obs, g, (self.forecast_steps, bool(self.outage_slots)))
        load_p, prev, t = seen["load_mw"], seen["last_pg"], seen["t"]
        asked, lo, hi = asked_dispatch(action, prev, g)
        demand = jnp.sum(load_p) + g.dc.gs_total
        pg = follow_load(asked, lo, hi, demand)
        out, sens = jnp.zeros(0, jnp.int32), g.gen_ptdf
        if self.outage_slots:   # the lines the observation shows out of service in the interval just past
            out = jnp.nonzero(seen["line_out"], size=self.outage_slots, fill_value=-1)[0].astype(jnp.int32)
            sens = jax.vmap(lambda col: outage_flows(g.outages, col, out)[0], 1, 1)(sens)
        flows_at = lambda x, load: _dc_flows(x, load, load_flows(load, g.dc), g, out)[0]  # noqa: E731
        ahead = peak = None
        if self.lookahead:
            steps = t + 1 + jnp.arange(self.lookahead)
            total = seen["forecast_mw"][:self.lookahead]
            future = jnp.where(steps < g.max_steps, total + g.dc.gs_total, jnp.nan)
            ahead = (future, g.pmin, g.pmax, g.ramp, self.reach_margin)
            if self.plan_peak:
                peak = peak_plan(pg, future, forecast_bus_loads(load_p, total), g.pmin, g.pmax, g.ramp, flows_at)
        rate = g.rate * (1.0 - self.line_margin)
        safe = secure_redispatch(pg, lo, hi, demand, flows_at(pg, load_p), sens, rate, self.iters, ahead,
                                 g.slack, peak)
        return dispatch_action(g, safe, prev), jnp.sum(jnp.abs(safe - pg)) * g.delta_t_hours


def redispatch_layer(params: TransParams, iters: int = SECURE_ITERS, lookahead: int | None = None,
                     plan_peak: bool | None = None, reach_margin: float = 0.0, line_margin: float = 0.0) -> RedispatchLayer:
    """The security redispatch of a DC transmission task. `lookahead` (default: LOOKAHEAD_STEPS or the
    observation's forecast steps, if fewer) forecast intervals kept within the ramps' reach, each forecast
    demand widened by `reach_margin` (a share: the forecast's error) on either side; each line held within its
    rating cut by `line_margin` (a share: room for what the redispatch of later intervals cannot undo within
    the ramps); `plan_peak` (default: on for grids of at most PEAK_PLAN_UNITS units without line outages)
    plans the forecast peak."""
    if params.ac:
        raise ValueError("the security redispatch works on the DC flows; the AC transmission tasks' layer is the "
                         "voltage schedule (schedule_layer)")
    n_forecast = params.forecast.shape[-1]
    lookahead = min(LOOKAHEAD_STEPS, n_forecast) if lookahead is None else lookahead
    if not isinstance(lookahead, int) or not 0 <= lookahead <= n_forecast:
        raise ValueError(f"lookahead must be an integer in [0, {n_forecast}] (the forecast steps the observation "
                         f"carries), got {lookahead!r}")
    if not isinstance(iters, int) or iters < 1:
        raise ValueError(f"iters must be an integer >= 1, got {iters!r}")
    if not 0.0 <= reach_margin < 1.0:
        raise ValueError(f"reach_margin must be a share in [0, 1) of the forecast demand, got {reach_margin!r}")
    if not 0.0 <= line_margin < 1.0:
        raise ValueError(f"line_margin must be a share in [0, 1) of each line's rating, got {line_margin!r}")
    slots = params.outage_schedule.shape[-1]
    n_units = params.pmax.shape[0]
    if plan_peak is None:   # it costs more with more units; a trip changes the grid it plans the peak on
        plan_peak = bool(lookahead) and n_units <= PEAK_PLAN_UNITS and not slots and params.contingencies is None
    if plan_peak and not lookahead:
        raise ValueError("plan_peak needs the look-ahead (a forecast in the observation and lookahead > 0)")
    return RedispatchLayer(grid=_grid_only(params),
                           forecast_steps=n_forecast, outage_slots=slots, iters=iters, lookahead=lookahead,
                           plan_peak=bool(plan_peak), reach_margin=float(reach_margin), line_margin=float(line_margin))


@struct.dataclass
class ScheduleLayer:
    """The transmission voltage schedule of an AC task, fed by the observation (see the module docstring).

    Each round solves the AC power flow at the interval's observed loads (each bus at its power factor
    `q_ratio`), the policy's dispatch (the slack taking the losses) and the set-points, warm-started from
    the observed |V|; where a bus lies within SCHEDULE_TRIGGER of its band or beyond it, `voltage.band_steps`
    moves the set-points (each by at most SCHEDULE_REACH a round, within its own band) towards every bus
    SCHEDULE_MARGIN inside the band, on the flow's derivative d|V| / d set-points (the Newton solution's
    own, so a unit at its reactive limit moves nothing). In the layer's flow a unit absorbs at most down to
    SCHEDULE_Q_RESERVE of its reactive range above its Qmin: one close to that limit, which the env's flow
    may find past it (its bus turning PQ and its voltage rising off the set-point), counts as at it. The
    reserve is on the absorbing side only, the side of over-voltage (what binds at light load); a reserve
    on the injecting side would have the layer's limited units inject less than the env's and see the
    voltages lower than they are.

    The slack unit takes what the load following's estimate of the losses misses (the env's control covers
    the last interval's losses, then shares the remainder by the units' room): a policy that asks the slack
    for the edge of its ramp window leaves that remainder past it (the `ramp` channel, by a fraction of a MW).
    The layer asks the slack SCHEDULE_SLACK_MARGIN of its ramp inside its window; the load following can
    still take it to the edge where the others' room runs out."""

    VERSION = 2   # bumped where the layer decides otherwise: it keys the caches of what the operator played behind it

    grid: TransParams            # the task's params less its time series
    q_ratio: jnp.ndarray         # [n_bus] each bus's reactive load per MW of active load (its power factor)
    forecast_steps: int = struct.field(pytree_node=False, default=0)
    rounds: int = struct.field(pytree_node=False, default=SCHEDULE_ROUNDS)

    def __call__(self, obs, action):
        """(the action with the corrected voltage set-points and the slack's asked output SCHEDULE_SLACK_MARGIN of
        its ramp inside its window, the MWh that moved it; every other unit's active set-point is left as asked)."""
        g = self.grid
        action, _ = sanitize_action(action)
        n_units = g.pmax.shape[0]
        seen = read_observation(obs, g, (self.forecast_steps, False))
        load_p, load_q = seen["load_mw"], seen["load_mw"] * self.q_ratio
        asked, lo, hi = asked_dispatch(action[:n_units], seen["last_pg"], g)
        # the slack takes what the control's estimate of the losses missed: asked SCHEDULE_SLACK_MARGIN of its ramp
        # inside its window, so that this remainder stays within its ramp
        edge = jnp.minimum(SCHEDULE_SLACK_MARGIN * g.ramp, 0.5 * (hi - lo))
        slack_asks = jnp.where(g.slack > 0, jnp.clip(asked, lo + edge, hi - edge), asked)
        dispatch = jnp.where(g.slack > 0, dispatch_action(g, slack_asks, seen["last_pg"]), action[:n_units])
        moved_mwh = jnp.sum(jnp.abs(slack_asks - asked)) * g.delta_t_hours
        asked = slack_asks
        pg = follow_load(asked, lo, hi, jnp.sum(load_p) + g.dc.gs_total)
        start = TransState(time_step=jnp.int32(0), day=jnp.int32(0), pg=pg, flow=g.rate, vm=seen["vm"],   # |V| warm start
                           va=jnp.angle(g.acn.v0).astype(pg.dtype), qg=g.v_set)
        no_outage = jnp.zeros(0, jnp.int32)

        def flow(vset):   # |V| [n_bus] of the AC power flow at the set-points, (|V|, solved) for has_aux
            _, _, vm, _, _, extra = _solve(pg, vset, load_p, load_q, None, start, g, no_outage)
            return vm, (vm, extra["converged"] > 0)

        def one_round(_, carry):   # an interval within the band (SCHEDULE_TRIGGER inside) is left as it is
            vset, touched = carry
            sens, (vm, solved) = jax.jacfwd(flow, has_aux=True)(vset)   # one solve (two side by side can deadlock XLA's CPU LU)
            near = solved & jnp.any((vm > g.vmax - SCHEDULE_TRIGGER) | (vm < g.vmin + SCHEDULE_TRIGGER))
            lo, hi = jnp.maximum(g.v_lo, vset - SCHEDULE_REACH), jnp.minimum(g.v_hi, vset + SCHEDULE_REACH)
            moved = band_steps(vm, sens, vset, lo, hi, g.vmin + SCHEDULE_MARGIN, g.vmax - SCHEDULE_MARGIN,
                               jnp.ones_like(vset), jnp.ones(vset.shape, bool), buses=SCHEDULE_BUSES)
            move = near & jnp.all(jnp.isfinite(moved))   # no solution: the policy's set-points
            return jnp.where(move, moved, vset), touched | move

        # a loop, not the rounds unrolled: one round's power flow and its derivatives traced and compiled once
        vset, touched = jax.lax.fori_loop(0, self.rounds, one_round, (voltage_setpoints(action[n_units:], g), jnp.asarray(False)))
        safe = jnp.concatenate([dispatch, jnp.where(touched, voltage_action(g, vset), action[n_units:])])
        return safe, moved_mwh


def schedule_layer(params: TransParams, rounds: int = SCHEDULE_ROUNDS) -> ScheduleLayer:
    """The voltage schedule of an AC transmission task with voltage set-point actions (`rounds`
    corrections, each against a Newton power flow)."""
    if not params.ac or not params.voltage_control:
        raise ValueError("the voltage schedule moves the units' voltage set-points: it needs an AC task with voltage "
                         "set-point actions (tso-caseN-ac)")
    if params.outage_schedule.shape[-1]:
        raise ValueError("the voltage schedule solves the intact grid; this AC task has line outages")
    if not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be an integer >= 1, got {rounds!r}")
    # each bus's power factor: a fact of the grid the observation's active loads need (one number per bus)
    p, q = np.asarray(params.load_p, float).reshape(-1, params.vmin.shape[0]), np.asarray(params.load_q, float).reshape(-1, params.vmin.shape[0])
    ratio = np.divide(q, p, out=np.zeros_like(p), where=p != 0)
    if np.any((p == 0) & (q != 0)) or np.any(np.abs(ratio - ratio[:1]) > 1e-6 * np.maximum(np.abs(ratio[:1]), 1.0)):
        raise ValueError("the voltage schedule reads each bus's reactive load as its active load times a fixed power "
                         "factor; this task's load_q does not keep one (build it with the default load_q)")
    ratio = ratio[0]
    grid = _grid_only(params).replace(ac_derivative_iters=SCHEDULE_DERIVATIVE_ITERS)
    if params.q_min is not None:   # a unit near its absorbing limit counts as at it (see the class docstring)
        grid = grid.replace(q_min=params.q_min + SCHEDULE_Q_RESERVE * (params.q_max - params.q_min))
    return ScheduleLayer(grid=grid, q_ratio=jnp.asarray(ratio, params.pmax.dtype),
                         forecast_steps=params.forecast.shape[-1], rounds=rounds)


@struct.dataclass
class VoltageLayer:
    """The feeder voltage correction, fed by the observation (see the module docstring)."""

    grid: DistParams             # the task's params less its time series
    rounds: int = struct.field(pytree_node=False, default=VOLT_ROUNDS)

    def __call__(self, obs, action):
        """(the action that asks for the corrected controls, MWh of load shifted or PV curtailed more or less)."""
        g = self.grid
        action, _ = sanitize_action(action)
        seen = read_feeder_observation(obs, g)
        vm, load_p, avail = seen["vm"], seen["load_mw"], seen["avail_mw"]
        load_q = load_p * g.q_ratio
        asked = controls = decode_controls(action, load_p, avail, g)
        v0 = vm.astype(g.net.z.dtype)
        flow, _ = feeder_flow(load_p, load_q, avail, v0, controls, g)
        for _ in range(self.rounds):   # correct against the latest sweep; a feeder within its band is left as it is
            moved = voltage_correction(controls, flow["vm"], load_p, load_q, avail, g)
            outside = jnp.any((flow["vm"] < g.v_min) | (flow["vm"] > g.v_max))
            controls = tuple(jnp.where(outside, m, x) for m, x in zip(moved, controls))
            flow = tree_where(outside, feeder_flow(load_p, load_q, avail, v0, controls, g)[0], flow)
        mwh = (jnp.sum(jnp.abs(controls[0] - asked[0])) + jnp.sum(jnp.abs(controls[1] - asked[1]))) * g.delta_t_hours
        return encode_controls(controls, action, load_p, avail, g), mwh


def voltage_layer(params: DistParams, rounds: int = VOLT_ROUNDS) -> VoltageLayer:
    """The voltage correction of a DSO feeder task (`rounds` corrections, each checked by a sweep)."""
    if not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be an integer >= 1, got {rounds!r}")
    return VoltageLayer(grid=_grid_only(params), rounds=rounds)


def make_layer(env, params, safety: str = "on", **margins):
    """The safety layer of a task, or None: `safety` "on" (a task without one is refused), "auto" (the
    layer where the task has one) or "off". `margins` (`MARGINS`: reach_margin, line_margin): the security
    redispatch's (`redispatch_layer`); refused where the layer is another."""
    if safety not in SAFETY_CHOICES:
        raise ValueError(f"safety must be one of {', '.join(SAFETY_CHOICES)}, got {safety!r}")
    if safety == "off":
        return None
    unknown = set(margins) - set(MARGINS)
    if unknown:
        raise TypeError(f"make_layer takes the margins {', '.join(MARGINS)}, not {', '.join(sorted(unknown))}")
    if type(env) is TransGridEnv and not params.ac:
        return redispatch_layer(params, **margins)
    asked = [name for name, value in margins.items() if value]
    if asked:
        raise ValueError(f"{asked[0]} is the security redispatch's (the DC transmission tasks' layer); "
                         f"{type(env).__name__}{' (AC mode)' if getattr(params, 'ac', False) else ''} has none: leave it at 0")
    if type(env) is TransGridEnv and params.voltage_control and not params.outage_schedule.shape[-1]:
        return schedule_layer(params)
    if type(env) is DistGridEnv:
        return voltage_layer(params)
    if safety == "on":
        raise ValueError(f"no safety layer for {type(env).__name__}{' (AC mode)' if getattr(params, 'ac', False) else ''}: "
                         "layers exist for the DC transmission tasks (tso-caseN, tso-caseN-n1: security redispatch), "
                         "the AC ones with voltage set-points (tso-caseN-ac: voltage schedule) and dso-case33bw "
                         "(voltage correction); use safety='off' or 'auto'")
    return None


@struct.dataclass
class ShieldedState:
    """The env's state and the observation the policy acts on next (all the layer reads)."""

    inner: Any
    obs: jnp.ndarray

    @property
    def time_step(self):
        return self.inner.time_step

    @property
    def day(self):
        return self.inner.day


class Shielded(Environment):
    """`env` with `layer` between the policy and the env: step(obs, action) applies layer(obs, action).
    `info` gains "layer_moved" (MWh the layer moved in the step)."""

    def __init__(self, env: Environment, layer):
        self.env, self.layer = env, layer
        self.ends_early = env.ends_early

    def reset_env(self, key, params):
        obs, state = self.env.reset_env(key, params)
        return obs, ShieldedState(state, obs)

    def reset_to_day(self, day, params):
        obs, state = self.env.reset_to_day(day, params)
        return obs, ShieldedState(state, obs)

    def num_days(self, params):
        return self.env.num_days(params)

    def step_env(self, key, state: ShieldedState, action, params):
        safe, moved = self.layer(state.obs, action)
        obs, inner, reward, costs, done, info = self.env.step_env(key, state.inner, safe, params)
        return obs, ShieldedState(inner, obs), reward, costs, done, {**info, "layer_moved": moved}

    def observation_space(self, params):
        return self.env.observation_space(params)

    def action_space(self, params):
        return self.env.action_space(params)

    def constraint_names(self, params):
        return self.env.constraint_names(params)

    def grid_view(self, state: ShieldedState, params):
        return self.env.grid_view(state.inner, params)

    def units(self, params):
        return self.env.units(params)

    def __getattr__(self, name):   # task-specific helpers (agent_specs, ...) of the env
        if name in ("env", "layer"):
            raise AttributeError(name)
        return getattr(self.env, name)


def shield(env, params, safety: str = "on", **margins):
    """`Shielded(env, make_layer(env, params, safety, **margins))`, or `env` itself where there is no layer."""
    layer = make_layer(env, params, safety, **margins)
    return env if layer is None else Shielded(env, layer)
