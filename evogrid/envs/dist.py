"""DSO task: voltage control on a radial distribution feeder (PowerZooJax `DistGridEnv`).

Controllable resources at configurable buses:
* flexible loads: action a in [-1, 1] scales the bus load by (1 + shift_max * u), u the
  action beyond a dead band, u = sign(a) max(|a| - flex_deadband, 0) / (1 - flex_deadband)
  (`flex_share`; `flex_action` the inverse); any change costs `discomfort_price` per MWh moved.
  The dead band (default 0.4) makes "no shift" a region of the action space rather than a point,
  so a smooth policy can hold it where no shift is needed (measured: docs/design/voltage_correction.md);
* PV inverters: two actions each, curtailment of max(a, 0) of the available
  power and reactive power q = a_q * sqrt(S^2 - P^2) within the inverter rating S.
The zero action is "no control": no shift, no curtailment, unity power factor.
Each step solves the radial AC power flow by backward/forward sweep with the controls the action asks
for; nothing in the step corrects them (the DSO's voltage correction is a controller, in
`evogrid.safety`: `VoltageLayer`). `info["controls"]` holds the controls applied.

reward = -(loss energy * loss_price + curtailed energy * curtail_price
           + shifted energy * discomfort_price) * reward_scale   ($ before scaling)
Cost channels (never folded into the reward):
  voltage      sum over buses of |V| outside [v_min, v_max] (p.u., default 0.95-1.05)
  thermal      sum of branch current above its rating (p.u. of base; 33bw has no ratings)
  ac_diverged  1 when the sweeps did not converge (a feeder loaded beyond what it can carry)
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from evogrid.case import Case, load_case
from evogrid.case.matpower import PD, QD
from evogrid.envs.environment import Environment, EnvParams, EnvState, money_unit, sanitize_action
from evogrid.envs.profiles import (
    FORECAST_ERROR,
    bus_load_days,
    check_days,
    forecast_features,
    pv_days,
    time_features,
)
from evogrid.envs.spaces import Box
from evogrid.physics import (
    RadialNetwork,
    as_float,
    host_setup,
    backward_forward_sweep,
    make_radial_network,
)
from evogrid.utils.jax_utils import day_row, day_rows, take_rows


@struct.dataclass
class DistState(EnvState):
    """The last solved step's bus voltages, kept rectangular (the next step's sweeps start from them;
    polar form would cost an exp and an atan2 per bus and step, 20% of a ders-case141 step)."""

    day: jnp.ndarray    # int32
    v_re: jnp.ndarray   # [n_bus] p.u.
    v_im: jnp.ndarray   # [n_bus] p.u.

    @property
    def vm(self):
        """[n_bus] |V| p.u."""
        return jnp.hypot(self.v_re, self.v_im)

    @property
    def va(self):
        """[n_bus] voltage angle, rad."""
        return jnp.arctan2(self.v_im, self.v_re)


@struct.dataclass
class DistParams(EnvParams):
    load_p: jnp.ndarray = None       # [n_days, T, n_bus] MW
    load_q: jnp.ndarray = None       # [n_days, T, n_bus] MVAr
    pv_avail: jnp.ndarray = None     # [n_days, T, n_pv] share of rating
    pv_rating: jnp.ndarray = None    # [n_pv] MW (inverter S = pv_rating * inverter_oversize)
    inverter_s: jnp.ndarray = None   # [n_pv] MVA
    pv_incidence: jnp.ndarray = None    # [n_pv, n_bus]
    flex_incidence: jnp.ndarray = None  # [n_flex, n_bus]
    shift_max: jnp.ndarray = None
    flex_deadband: jnp.ndarray = None  # |action| up to which a flexible load does not move
    v_min: jnp.ndarray = None
    v_max: jnp.ndarray = None
    volt_sens_p: jnp.ndarray = None  # [n_bus, n_flex + n_pv] d|V|^2 per MW of net load at the flexible, then PV buses
    volt_sens_q: jnp.ndarray = None  # [n_bus, n_flex + n_pv] the same per MVAr
    q_ratio: jnp.ndarray = None      # [n_bus] Q / P of each bus load (the case's power factor)
    i_max: jnp.ndarray = None        # [n_branch] p.u. current rating, inf = unlimited
    loss_price: jnp.ndarray = None   # $/MWh
    curtail_price: jnp.ndarray = None
    discomfort_price: jnp.ndarray = None
    reward_scale: jnp.ndarray = None
    net: RadialNetwork = None
    init: DistState = None           # [n_days] start-of-day states
    init_obs: jnp.ndarray = None     # [n_days, obs_dim]
    base_mva: float = struct.field(pytree_node=False, default=10.0)
    sweeps: int = struct.field(pytree_node=False, default=30)


class DistGridEnv(Environment):
    """Distribution voltage control. Use with `make_dist_params(case)`."""

    def num_days(self, params: DistParams) -> int:
        return params.load_p.shape[0]

    def reset_to_day(self, day, params: DistParams):
        return take_rows(params.init_obs, day), jax.tree_util.tree_map(lambda x: take_rows(x, day), params.init)

    def step_env(self, key, state: DistState, action, params: DistParams):
        action, n_bad = sanitize_action(action)
        flow, info = self._solve_feeder(state, action, params)
        dollars = (info["losses_mw"] * params.loss_price + info["curtailed_mw"] * params.curtail_price
                   + flow["shift_abs_mw"] * params.discomfort_price) * params.delta_t_hours
        new = DistState(time_step=state.time_step + 1, day=state.day, v_re=flow["v"].real, v_im=flow["v"].imag)
        info = dict(info, nonfinite_actions=n_bad, cost_dollars=dollars)
        done = new.time_step >= params.max_steps
        return self._obs(new, params), new, -dollars * params.reward_scale, flow["costs"], done, info

    def _solve_feeder(self, state, action, params: DistParams, p_inject=0.0):
        """Apply the flexible-load and PV actions (the first n_flex + 2 n_pv entries of `action`) and any
        further active injection `p_inject` ([n_bus] MW), then solve the feeder by backward/forward sweep
        (`feeder_flow`). Returns (flow, info) as `feeder_flow` does, info["controls"] the applied controls."""
        load_p, load_q, avail = interval(state, params)
        controls = decode_controls(action, load_p, avail, params)
        v0 = jax.lax.complex(state.v_re, state.v_im)
        flow, info = feeder_flow(load_p, load_q, avail, v0, controls, params, p_inject)
        return flow, dict(info, controls=jnp.concatenate(controls))

    def start_state(self, day, params: DistParams) -> DistState:
        """A day's state before its power flow is solved (flat voltage)."""
        n_bus = params.load_p.shape[-1]
        return DistState(time_step=jnp.int32(0), day=day, v_re=jnp.ones(n_bus), v_im=jnp.zeros(n_bus))

    def _obs(self, state: DistState, params: DistParams):
        """[|V| (n_bus), loads p.u. (n_bus), PV availability (n_pv), sin, cos time of day, progress]."""
        t = jnp.minimum(state.time_step, params.max_steps - 1)
        load_p, pv = day_rows((params.load_p, params.pv_avail), state.day, t)
        return jnp.concatenate([state.vm, load_p / params.base_mva, pv, self.time_obs(state, params)])

    def observation_space(self, params: DistParams) -> Box:
        n = 2 * params.load_p.shape[-1] + params.pv_avail.shape[-1] + self.time_obs_size(params)
        return Box(-jnp.inf, jnp.inf, (n,))

    def action_space(self, params: DistParams) -> Box:
        return Box(-1.0, 1.0, (params.flex_incidence.shape[0] + 2 * params.pv_incidence.shape[0],))

    def grid_view(self, state: DistState, params: DistParams) -> dict:
        t = jnp.clip(state.time_step - 1, 0, params.max_steps - 1)
        return {"load_mw": jnp.sum(day_row(params.load_p, state.day, t)), "vm_pu": state.vm,
                "v_band": jnp.stack([jnp.min(params.v_min), jnp.max(params.v_max)])}

    def units(self, params: DistParams) -> dict[str, str]:
        return {"return": f"{money_unit(params.reward_scale)} per day (minus losses, curtailment, discomfort)",
                "voltage": "p.u. of |V| outside its band x buses x steps", "thermal": "p.u. current over rating x steps",
                "ac_diverged": "steps without a power-flow solution", "soc": "MWh of battery energy clipped or not restored"}

    def constraint_names(self, params: DistParams) -> tuple[str, ...]:
        return ("voltage", "thermal", "ac_diverged")

    def agent_specs(self, params: DistParams) -> dict:
        """One agent per resource: name -> (action indices, observation indices), for `GridMARLEnv`.

        An agent sees its bus voltage and load, its PV availability (PV agents) and
        the time features; flexible loads act with one value, PV inverters with two
        (curtailment, reactive power). Call outside jit (params must be concrete).
        """
        flex_bus = np.argmax(np.asarray(params.flex_incidence), axis=1)
        pv_bus = np.argmax(np.asarray(params.pv_incidence), axis=1)
        n_bus, n_flex, n_pv = params.load_p.shape[-1], len(flex_bus), len(pv_bus)
        time_idx = list(range(2 * n_bus + n_pv, 2 * n_bus + n_pv + 3))
        specs = {}
        for i, b in enumerate(flex_bus):
            specs[f"flex_{i}"] = (np.array([i]), np.array([b, n_bus + b, *time_idx]))
        for k, b in enumerate(pv_bus):
            specs[f"pv_{k}"] = (np.array([n_flex + k, n_flex + n_pv + k]), np.array([b, n_bus + b, 2 * n_bus + k, *time_idx]))
        return specs


FLEX_DEADBAND = 0.4


def headroom(params: DistParams, pv_p):
    """[n_pv] MVAr the inverters can give or take at active output `pv_p` MW."""
    return jnp.sqrt(jnp.maximum(params.inverter_s**2 - pv_p**2, 0.0))


def interval(state, params: DistParams):
    """The loads (P MW, Q MVAr, [n_bus]) and the PV power available ([n_pv] MW) of the state's interval."""
    load_p, load_q, pv = day_rows((params.load_p, params.load_q, params.pv_avail), state.day, state.time_step)
    return load_p, load_q, pv * params.pv_rating


def read_observation(obs, params: DistParams) -> dict:
    """What a feeder observation says of its interval (`DistGridEnv._obs`): "vm" [n_bus] |V| p.u. after the
    last interval, "load_mw" [n_bus] and "avail_mw" [n_pv] the bus loads and PV power available in the
    interval to be played."""
    n_bus, n_pv = params.flex_incidence.shape[-1], params.pv_incidence.shape[0]
    return {"vm": obs[:n_bus], "load_mw": obs[n_bus:2 * n_bus] * params.base_mva,
            "avail_mw": obs[2 * n_bus:2 * n_bus + n_pv] * params.pv_rating}


def decode_controls(action, load_p, avail, params: DistParams):
    """The controls the first n_flex + 2 n_pv entries of `action` ask for at bus loads `load_p` [n_bus] MW
    and PV power available `avail` [n_pv] MW: (shift [n_flex] MW added (+) or removed (-) at the flexible
    buses, curtail [n_pv] MW, q [n_pv] MVAr injected within the inverters' headroom)."""
    n_flex, n_pv = params.flex_incidence.shape[0], params.pv_incidence.shape[0]
    a_flex, a_curt, a_q = action[:n_flex], action[n_flex:n_flex + n_pv], action[n_flex + n_pv:n_flex + 2 * n_pv]
    flex_p = params.flex_incidence @ load_p
    shift = params.shift_max * flex_share(a_flex, params.flex_deadband) * flex_p
    curtail = jnp.maximum(a_curt, 0.0) * avail
    return shift, curtail, a_q * headroom(params, avail - curtail)


def encode_controls(controls, action, load_p, avail, params: DistParams):
    """The action that asks for `controls` (the inverse of `decode_controls`); where a control has no range
    (no flexible load, no PV), the entry of `action` is kept."""
    shift, curtail, q = controls
    n = shift.shape[0] + 2 * curtail.shape[0]
    flex_room = params.shift_max * (params.flex_incidence @ load_p)
    share = shift / jnp.where(flex_room > 0, flex_room, 1.0)
    d = params.flex_deadband
    a_flex = jnp.where(share == 0.0, 0.0, jnp.sign(share) * (d + (1.0 - d) * jnp.abs(share)))
    a_curt = curtail / jnp.where(avail > 0, avail, 1.0)
    room = headroom(params, avail - curtail)
    a_q = q / jnp.where(room > 0, room, 1.0)
    old = action[:n]
    new = jnp.concatenate([jnp.where(flex_room > 0, a_flex, old[:shift.shape[0]]),
                           jnp.where(avail > 0, a_curt, old[shift.shape[0]:shift.shape[0] + curtail.shape[0]]),
                           jnp.where(room > 0, a_q, old[shift.shape[0] + curtail.shape[0]:])])
    return action.at[:n].set(jnp.clip(new, -1.0, 1.0))


def feeder_flow(load_p, load_q, avail, v0, controls, params: DistParams, p_inject=0.0):
    """The sweep power flow of an interval (bus loads `load_p` MW / `load_q` MVAr [n_bus], PV available
    `avail` [n_pv] MW) with `controls` = (shift [n_flex] MW, P and Q scaling together; curtail [n_pv] MW;
    q [n_pv] MVAr) and `p_inject` [n_bus] MW more, warm started from `v0` [n_bus] complex p.u.

    Returns (flow, info): flow has vm, v (complex), costs (voltage, thermal, ac_diverged) and shift_abs_mw;
    info has losses_mw, substation_mw (import at the root = load + losses - PV - p_inject), pv_mw,
    curtailed_mw, shifted_mw (net MW moved by the flexible loads) and converged."""
    shift, curtail, q = controls
    flex_p = params.flex_incidence @ load_p
    scale = 1.0 + jnp.where(flex_p > 0, shift / jnp.where(flex_p > 0, flex_p, 1.0), 0.0) @ params.flex_incidence
    load_p, load_q = load_p * scale, load_q * scale
    pv_p = avail - curtail
    net_p = load_p - pv_p @ params.pv_incidence - p_inject
    s_load = (net_p + 1j * (load_q - q @ params.pv_incidence)) / params.base_mva
    v0 = v0.astype(params.net.z.dtype)
    v, i_br, converged = backward_forward_sweep(params.net, s_load, v0, iters=params.sweeps)
    # an unconverged but finite iterate is kept (flagged; its losses and voltages count); a non-finite one
    # is replaced by the previous voltages and no current, so every output stays finite
    finite = jnp.all(jnp.isfinite(v.real) & jnp.isfinite(v.imag)) & jnp.all(jnp.isfinite(i_br.real) & jnp.isfinite(i_br.imag))
    v, i_br = jnp.where(finite, v, v0), jnp.where(finite, i_br, 0.0)
    converged = converged & finite
    losses = jnp.sum(jnp.abs(i_br) ** 2 * params.net.z.real) * params.base_mva   # MW
    vm = jnp.abs(v)
    costs = jnp.stack([
        jnp.sum(jnp.maximum(vm - params.v_max, 0.0) + jnp.maximum(params.v_min - vm, 0.0)),
        jnp.sum(jnp.maximum(jnp.abs(i_br) - params.i_max, 0.0)),
        1.0 - converged.astype(vm.dtype),
    ])
    flow = {"vm": vm, "v": v, "costs": costs, "shift_abs_mw": jnp.sum(jnp.abs(shift))}
    info = {"losses_mw": losses, "substation_mw": jnp.sum(net_p) + losses, "pv_mw": jnp.sum(pv_p),
            "curtailed_mw": jnp.sum(curtail), "shifted_mw": jnp.sum(shift), "converged": converged.astype(vm.dtype)}
    return flow, info


def flex_share(action, deadband):
    """The flexible loads' shift, in units of shift_max, that `action` [-1, 1] asks for: 0 within the dead band."""
    return jnp.sign(action) * jnp.maximum(jnp.abs(action) - deadband, 0.0) / (1.0 - deadband)


def flex_action(share, deadband):
    """The action that asks for `share` (inverse of `flex_share`; numpy in, numpy out)."""
    share = np.asarray(share, np.float64)
    return np.where(share == 0.0, 0.0, np.sign(share) * (deadband + (1.0 - deadband) * np.abs(share)))


@host_setup
def make_dist_params(case: Case | str = "33bw", max_steps: int = 48, delta_t_hours: float = 0.5, *,
                     pv_buses=(18, 22, 25, 33), pv_rating_mw: float = 0.4, inverter_oversize: float = 1.1,
                     flex_buses=(7, 8, 24, 25, 30, 32), shift_max: float = 0.2, flex_deadband: float = FLEX_DEADBAND, n_days: int | None = None, seed: int = 0,
                     split: str = "all", profiles: str = "synthetic",
                     v_min: float = 0.95, v_max: float = 1.05, loss_price: float = 50.0, curtail_price: float = 40.0,
                     discomfort_price: float = 20.0, reward_scale: float = 0.1, sweeps: int = 30, forecast_steps: int = 0,
                     forecast_error: float = FORECAST_ERROR) -> DistParams:
    """Parameters of `DistGridEnv`. Bus numbers are the case file's (1-based for 33bw).

    Days (`profiles`): "synthetic", `n_days` (default 64) seeded days scaled from the case's Pd/Qd
    (`profiles.daily_load_profiles`) with clear-sky PV and cloudiness; "real", the 366 days of 2016:
    a seeded mix of SimBench's LV/MV substation, commerce and industry profiles per bus peaking at
    1.1 x its Pd (`evogrid.data.bus_loads`), and one of SimBench's PV profiles per unit. `split`
    keeps the train, val or test days (`profiles.source_days`). The start-of-day states are solved once here (cached).
    Forecasts: `forecast_steps` > 0 appends to the observation a noisy forecast of the next
    `forecast_steps` intervals' total load (share of the feeder's total Pd) and mean PV availability (`profiles.forecast_features`: error `forecast_error` x sqrt(lead)).

    `sweeps`: the most backward/forward sweeps per step, warm-started from the previous step's
    voltages; they stop once their error estimate is below the dtype's tolerance (`backward_forward_sweep`;
    4 to 5 sweeps on random-action days of 141).
    """
    case, fields = feeder_fields(case, max_steps, delta_t_hours, pv_buses=pv_buses, pv_rating_mw=pv_rating_mw,
                                 inverter_oversize=inverter_oversize, flex_buses=flex_buses, shift_max=shift_max,
                                 flex_deadband=flex_deadband, n_days=n_days, seed=seed, split=split, profiles=profiles, v_min=v_min, v_max=v_max, loss_price=loss_price,
                                 curtail_price=curtail_price, discomfort_price=discomfort_price,
                                 reward_scale=reward_scale, sweeps=sweeps, forecast_steps=forecast_steps,
                                 forecast_error=forecast_error)
    return with_initial_states(DistGridEnv(), DistParams(**fields))


def bus_rows(case: Case, name: str, buses) -> list[int]:
    """Row indices of case buses (file numbering), refusing unknown buses and the substation."""
    index = {int(b): i for i, b in enumerate(case.bus_ids)}
    missing = [b for b in buses if b not in index or index[b] == case.ref_bus]
    if missing:
        raise ValueError(f"{name}: bus {missing[0]} is not a non-substation bus of {case.name} "
                         f"(buses {int(min(case.bus_ids))}..{int(max(case.bus_ids))}, substation {int(case.bus_ids[case.ref_bus])})")
    return [index[b] for b in buses]


def feeder_fields(case, max_steps, delta_t_hours, *, pv_buses, pv_rating_mw, inverter_oversize, flex_buses,
                  shift_max, flex_deadband, n_days, seed, split, profiles, v_min, v_max, loss_price, curtail_price, discomfort_price,
                  reward_scale, sweeps, forecast_steps=0, forecast_error=FORECAST_ERROR):
    """The `DistParams` fields shared by the feeder tasks (DSO and DERs): (case, fields dict)."""
    check_days(max_steps, delta_t_hours, n_days)
    if not 0.0 <= flex_deadband < 1.0:
        raise ValueError(f"flex_deadband must be in [0, 1), got {flex_deadband}")
    case = load_case(case) if not isinstance(case, Case) else case
    net = make_radial_network(case)  # refuses meshed cases with a clear message
    eye = np.eye(case.n_bus)
    pv_rows, flex_rows = bus_rows(case, "pv_buses", pv_buses), bus_rows(case, "flex_buses", flex_buses)
    load_p = bus_load_days(profiles, "feeder", case.bus[:, PD], n_days, split, max_steps, delta_t_hours, seed)
    ratio = np.divide(case.bus[:, QD], case.bus[:, PD], out=np.zeros(case.n_bus), where=case.bus[:, PD] != 0)
    pv = pv_days(profiles, len(pv_buses), n_days, split, max_steps, delta_t_hours, seed)
    pv_rating = np.broadcast_to(np.asarray(pv_rating_mw, float), (len(pv_buses),))
    # LinDistFlow: d|V_j|^2 / d(net load at m) = -2 sum over the branches on both paths of r (x for Q) / base, per MW
    down, z = np.asarray(net.down, np.float64), np.asarray(net.z, np.complex128)
    at = np.concatenate([eye[flex_rows], eye[pv_rows]]).T
    sens_p, sens_q = (-2.0 * down.T @ (w[:, None] * down) @ at / case.base_mva for w in (z.real, z.imag))
    return case, dict(
        max_steps=max_steps, delta_t_hours=delta_t_hours, base_mva=case.base_mva, sweeps=sweeps,
        load_p=as_float(load_p), load_q=as_float(load_p * ratio), q_ratio=as_float(ratio), pv_avail=as_float(pv),
        pv_rating=as_float(pv_rating), inverter_s=as_float(pv_rating * inverter_oversize),
        pv_incidence=as_float(eye[pv_rows]), flex_incidence=as_float(eye[flex_rows]),
        shift_max=as_float(shift_max), flex_deadband=as_float(flex_deadband), v_min=as_float(v_min), v_max=as_float(v_max),
        i_max=as_float(case.rate_a / case.base_mva), loss_price=as_float(loss_price),
        curtail_price=as_float(curtail_price), discomfort_price=as_float(discomfort_price),
        reward_scale=as_float(reward_scale), net=net,
        volt_sens_p=as_float(sens_p), volt_sens_q=as_float(sens_q),
        time_features=as_float(time_features(max_steps, delta_t_hours)),
        forecast=as_float(forecast_features(np.stack([load_p.sum(-1) / max(case.bus[:, PD].sum(), 1e-9), pv.mean(-1)], axis=-1),
                                            profiles, n_days, split, forecast_steps, forecast_error, seed)),
    )


def with_initial_states(env: DistGridEnv, params):
    """Cache each day's state before its first step: the power flow of its first interval with no
    control (all-zero action), solved with extra sweeps. Sets `params.init` and `params.init_obs`."""
    neutral = jnp.zeros(env.action_space(params).shape)
    solve = params.replace(sweeps=max(params.sweeps, 60))

    def one_day(day):
        flat = env.start_state(day, params)
        _, solved, *_ = env.step_env(jax.random.key(0), flat, neutral, solve)
        state = flat.replace(v_re=solved.v_re, v_im=solved.v_im)
        return state, env._obs(state, params)

    states, obs = jax.jit(jax.vmap(one_day))(jnp.arange(params.load_p.shape[0], dtype=jnp.int32))
    return params.replace(init=states, init_obs=obs)
