"""DERs task: batteries, PV and flexible loads on a radial feeder, one agent per resource
(PowerZooJax `DEREnv`). Default feeder: MATPOWER's 141-bus Caracas system.

Actions in [-1, 1], laid out as in `DistGridEnv` with the batteries appended:
  [flexible loads (n_flex) | PV curtailment (n_pv) | PV reactive power (n_pv) | batteries (n_bat)]
A battery action a asks for p = a * p_max MW (+ discharge, - charge); `physics.battery_step`
clips it to the SOC-dependent limits (energy headroom and taper) and the clipped amount
is reported in `info["battery_clipped_mw"]` and in the `soc` cost channel.

Shared objective (every agent gets the same reward):
  reward = -(substation import * price(t) + losses * loss_price + |load shifted| * discomfort_price)
           * dt * reward_scale                                          ($ before scaling)
Exported energy (negative import) earns the same price. Cost channels:
  voltage   sum over buses of |V| outside [v_min, v_max] (p.u.)
  thermal   sum of branch current above its rating (p.u.)
  soc       clipped battery energy (MWh) this step, plus at the end of the day the energy by which
            the batteries end below their starting charge (so a policy cannot sell the stored
            energy it was given and call it profit)
  ac_diverged  1 when the feeder's power flow did not converge
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from flax import struct

from evogrid.case import Case
from evogrid.envs.dist import (
    FLEX_DEADBAND,
    DistGridEnv,
    DistParams,
    DistState,
    bus_rows,
    feeder_fields,
    with_initial_states,
)
from evogrid.envs.environment import money_unit, sanitize_action
from evogrid.envs.profiles import FORECAST_ERROR, price_days
from evogrid.envs.spaces import Box
from evogrid.physics import Battery, as_float, host_setup, battery_step, make_battery
from evogrid.utils.jax_utils import day_row


@struct.dataclass
class DERState(DistState):
    soc: jnp.ndarray   # [n_bat] fraction of capacity


@struct.dataclass
class DERParams(DistParams):
    battery: Battery = None
    battery_incidence: jnp.ndarray = None   # [n_bat, n_bus]
    soc_init: jnp.ndarray = None            # [n_bat]
    price: jnp.ndarray = None               # [n_days, T] $/MWh


class DEREnv(DistGridEnv):
    """Distributed energy resources on a feeder. Use with `make_der_params(case)`."""

    def step_env(self, key, state: DERState, action, params: DERParams):
        action, n_bad = sanitize_action(action)
        n_bat = params.battery_incidence.shape[0]
        bat, dt = params.battery, params.delta_t_hours
        soc, p_bat, clipped = battery_step(bat, state.soc, action[action.shape[0] - n_bat:] * bat.p_max_mw, dt)
        flow, info = self._solve_feeder(state, action, params, p_inject=p_bat @ params.battery_incidence)
        t = state.time_step
        price = day_row(params.price, state.day, t)
        dollars = (info["substation_mw"] * price + info["losses_mw"] * params.loss_price
                   + flow["shift_abs_mw"] * params.discomfort_price) * dt
        done = t + 1 >= params.max_steps
        shortfall = jnp.sum(jnp.maximum(params.soc_init - soc, 0.0) * bat.capacity_mwh)
        soc_cost = jnp.sum(clipped) * dt + jnp.where(done, shortfall, 0.0)
        new = DERState(time_step=t + 1, day=state.day, v_re=flow["v"].real, v_im=flow["v"].imag, soc=soc)
        info = dict(info, battery_mw=jnp.sum(p_bat), battery_each_mw=p_bat, battery_clipped_mw=jnp.sum(clipped), price=price,
                    nonfinite_actions=n_bad, cost_dollars=dollars)
        costs = jnp.concatenate([flow["costs"][:2], soc_cost[None], flow["costs"][2:]])
        return self._obs(new, params), new, -dollars * params.reward_scale, costs, done, info

    def start_state(self, day, params: DERParams) -> DERState:
        base = super().start_state(day, params)
        return DERState(time_step=base.time_step, day=day, v_re=base.v_re, v_im=base.v_im, soc=params.soc_init)

    def _obs(self, state: DERState, params: DERParams):
        """[DSO observation (|V|, loads, PV availability, time features), SOC (n_bat), price / 100]."""
        t = jnp.minimum(state.time_step, params.max_steps - 1)
        return jnp.concatenate([super()._obs(state, params), state.soc, day_row(params.price, state.day, t)[None] / 100.0])

    def observation_space(self, params: DERParams) -> Box:
        n = super().observation_space(params).shape[0] + params.battery_incidence.shape[0] + 1
        return Box(-jnp.inf, jnp.inf, (n,))

    def action_space(self, params: DERParams) -> Box:
        n = super().action_space(params).shape[0] + params.battery_incidence.shape[0]
        return Box(-1.0, 1.0, (n,))

    def grid_view(self, state: DERState, params: DERParams) -> dict:
        return {**super().grid_view(state, params), "soc": state.soc}

    def units(self, params: DERParams) -> dict[str, str]:
        return {**super().units(params),
                "return": f"{money_unit(params.reward_scale)} per day (minus import cost, losses, discomfort)"}

    def constraint_names(self, params: DERParams) -> tuple[str, ...]:
        return ("voltage", "thermal", "soc", "ac_diverged")

    def agent_specs(self, params: DERParams) -> dict:
        """DistGridEnv's flexible-load and PV agents plus one agent per battery (`bat_j`), which sees its
        bus voltage and load, its SOC, the price and the time features. Call outside jit."""
        specs = super().agent_specs(params)
        n_bus, n_pv = params.load_p.shape[-1], params.pv_avail.shape[-1]
        n_dso_act = super().action_space(params).shape[0]
        n_dso_obs = super().observation_space(params).shape[0]
        time_idx = list(range(2 * n_bus + n_pv, 2 * n_bus + n_pv + 3))
        n_bat = params.battery_incidence.shape[0]
        for j, b in enumerate(np.argmax(np.asarray(params.battery_incidence), axis=1)):
            specs[f"bat_{j}"] = (np.array([n_dso_act + j]),
                                 np.array([b, n_bus + b, n_dso_obs + j, n_dso_obs + n_bat, *time_idx]))
        return specs


@host_setup
def make_der_params(case: Case | str = "141", max_steps: int = 48, delta_t_hours: float = 0.5, *,
                    battery_buses=(51, 80, 86), battery_mw=0.5, battery_mwh=2.0, eta_charge: float = 0.95,
                    eta_discharge: float = 0.95, soc_min: float = 0.1, soc_max: float = 0.9, soc_init: float = 0.5,
                    taper: float = 0.05, pv_buses=(49, 79, 109, 110), pv_rating_mw=0.5, inverter_oversize: float = 1.1,
                    flex_buses=(61, 69, 107, 112), shift_max: float = 0.2, flex_deadband: float = FLEX_DEADBAND, n_days: int | None = None, seed: int = 0,
                    split: str = "all", profiles: str = "synthetic",
                    v_min: float = 0.95, v_max: float = 1.05, price_tariff=(40.0, 70.0, 130.0),
                    loss_price: float = 20.0, discomfort_price: float = 30.0, reward_scale: float = 0.01,
                    sweeps: int = 30, forecast_steps: int = 0, forecast_error: float = FORECAST_ERROR) -> DERParams:
    """Parameters of `DEREnv`. Bus numbers are the case file's. Battery sizes may be scalars or one per
    battery. Loads and PV days as in `make_dist_params` (`profiles`: synthetic or real); the
    time-of-use price (`price_tariff` = off-peak, shoulder, peak $/MWh) is seeded and synthetic for
    either; forecasts (`forecast_steps`) as in `make_dist_params`; start-of-day states are solved once here."""
    battery, soc0 = make_battery(len(battery_buses), mw=battery_mw, mwh=battery_mwh, eta_charge=eta_charge,
                                 eta_discharge=eta_discharge, soc_min=soc_min, soc_max=soc_max, soc_init=soc_init,
                                 taper=taper)
    case, fields = feeder_fields(case, max_steps, delta_t_hours, pv_buses=pv_buses, pv_rating_mw=pv_rating_mw,
                                 inverter_oversize=inverter_oversize, flex_buses=flex_buses, shift_max=shift_max,
                                 flex_deadband=flex_deadband, n_days=n_days, seed=seed, split=split, profiles=profiles, v_min=v_min, v_max=v_max, loss_price=loss_price,
                                 curtail_price=0.0, discomfort_price=discomfort_price, reward_scale=reward_scale,
                                 sweeps=sweeps, forecast_steps=forecast_steps, forecast_error=forecast_error)
    params = DERParams(**fields, battery=battery,
                       battery_incidence=as_float(np.eye(case.n_bus)[bus_rows(case, "battery_buses", battery_buses)]),
                       soc_init=soc0,
                       price=as_float(price_days(profiles, n_days, split, max_steps, delta_t_hours, seed, price_tariff)))
    return with_initial_states(DEREnv(), params)
