"""DCMG task: a data-centre microgrid over one day of 5-minute steps (PowerZooJax `DCMicrogridEnv`).

Per step (dt hours), powers in MW:
* IT work arrives (seeded diurnal trace with bursts); a share `deferrable` of it may wait in a
  queue of `deadline_steps` buckets (bucket k = work due in k steps, MW-steps). Work not served by
  its deadline runs anyway at the deadline and is counted as an SLA violation. Deadlines stop at the
  day's last step (work deferred at t is due at min(t + D, T - 1); nothing can be deferred at T - 1), so
  a day ends with its work done: an episode cannot drop work by leaving it in the queue.
* Cooling removes heat with coefficient of performance `cop`; the room follows
      temp' = temp + dt * ((it_heat - q_cool) / c_th + (t_out - temp) / tau)
  and the cooling plant aims at the set-point: q_cool = clip(it_heat + c_th (temp - set) / dt
  + c_th (t_out - temp) / tau, 0, q_cool_max) (MW thermal; electric power q_cool / cop).
* PV, a battery (`physics.battery_step`), a diesel generator (off below its minimum load; fuel
  l/h = fuel_idle * p_max + fuel_slope * P while on) and the grid, capped at `grid_cap`.
  Balance: it + cooling = pv_used + diesel + battery + grid + deficit; surplus is curtailed from PV
  and, beyond that, spilled (no export revenue).
* Backup (`backup`, default on): what the grid cannot carry (load beyond PV, the set-points and the cap)
  is covered as a microgrid controller covers it: the battery discharges more, up to what it can give,
  then the diesel starts or rises (at least to its minimum load); only what neither can give is a
  deficit. Without it policies keep the diesel running as insurance against the deficit channel
  (docs/design/choices.md).

Actions in [-1, 1]: [battery (x p_max, + discharge), diesel set-point ((a + 1) / 2 x p_max),
cooling set-point (mapped to [set_min, set_max] degC), deferral (a > 0: defer that share of this
step's deferrable arrivals; a < 0: serve that share of the queue, earliest deadline first)].
The set-points' default range [18, 26.9] ends a hair below the 27 degC limit, as a plant's controls
are set, so that no set-point breaks the limit (only a plant at its capacity can); why and what it
costs: docs/design/choices.md.
Reward = -(grid energy x price + fuel x fuel_price + CO2 x carbon_price) x reward_scale.
Cost channels: `sla` (late work, MW-steps), `temperature` (degC above t_limit), `deficit` (MW unserved).
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from flax import struct

from evogrid.envs.environment import Environment, EnvParams, EnvState, money_unit, sanitize_action
from evogrid.envs.profiles import (
    FORECAST_ERROR,
    check_days,
    daily_load_shape,
    daily_pv_profiles,
    forecast_features,
    price_days,
    source_days,
    time_features,
)
from evogrid.envs.spaces import Box
from evogrid.physics import Battery, as_float, host_setup, battery_limits, battery_step, make_battery
from evogrid.utils.jax_utils import day_rows


@struct.dataclass
class DCMGState(EnvState):
    day: jnp.ndarray     # int32
    soc: jnp.ndarray     # [1]
    temp: jnp.ndarray    # room temperature degC
    queue: jnp.ndarray   # [deadline_steps] deferred work by steps left, MW-steps


@struct.dataclass
class DCMGParams(EnvParams):
    it_arrival: jnp.ndarray = None   # [n_days, T] MW of IT work arriving
    pv_avail: jnp.ndarray = None     # [n_days, T] MW
    price: jnp.ndarray = None        # [n_days, T] $/MWh
    t_out: jnp.ndarray = None        # [n_days, T] degC
    deferrable: jnp.ndarray = None
    battery: Battery = None
    soc_init: jnp.ndarray = None
    diesel_max: jnp.ndarray = None
    diesel_min_frac: jnp.ndarray = None
    fuel_idle: jnp.ndarray = None    # l/h per MW of rating while on
    fuel_slope: jnp.ndarray = None   # l/h per MW of output
    fuel_price: jnp.ndarray = None   # $/l
    diesel_co2: jnp.ndarray = None   # t/l
    grid_co2: jnp.ndarray = None     # t/MWh
    carbon_price: jnp.ndarray = None  # $/t
    grid_cap: jnp.ndarray = None
    cop: jnp.ndarray = None
    q_cool_max: jnp.ndarray = None   # MW thermal
    c_th: jnp.ndarray = None         # MWh/degC
    tau: jnp.ndarray = None          # h
    temp_init: jnp.ndarray = None
    t_limit: jnp.ndarray = None
    set_min: jnp.ndarray = None
    set_max: jnp.ndarray = None
    reward_scale: jnp.ndarray = None
    max_steps: int = struct.field(pytree_node=False, default=288)
    delta_t_hours: float = struct.field(pytree_node=False, default=1.0 / 12.0)
    deadline_steps: int = struct.field(pytree_node=False, default=24)
    backup: bool = struct.field(pytree_node=False, default=False)  # cover what the grid cannot (battery, then diesel)


class DCMicrogridEnv(Environment):
    """Data-centre microgrid. Use with `make_dcmg_params()`."""

    def num_days(self, params: DCMGParams) -> int:
        return params.it_arrival.shape[0]

    def reset_to_day(self, day, params: DCMGParams):
        day = jnp.asarray(day, jnp.int32)
        state = DCMGState(time_step=jnp.int32(0), day=day, soc=params.soc_init, temp=params.temp_init,
                          queue=jnp.zeros(params.deadline_steps, params.it_arrival.dtype))
        return self._obs(state, params), state

    def step_env(self, key, state: DCMGState, action, params: DCMGParams):
        action, n_bad = sanitize_action(action)
        a_bat, a_diesel, a_set, a_defer = action[0], action[1], action[2], action[3]
        t, dt = state.time_step, params.delta_t_hours
        arrival, t_out, pv, price = day_rows((params.it_arrival, params.t_out, params.pv_avail, params.price), state.day, t)
        # workload: defer part of the deferrable arrivals, or serve part of the queue (earliest deadline first)
        slot = jnp.minimum(params.deadline_steps, params.max_steps - 1 - t) - 1   # due at min(t + D, T - 1)
        deferred = jnp.where(slot >= 0, jnp.maximum(a_defer, 0.0) * params.deferrable * arrival, 0.0)
        serve = jnp.maximum(-a_defer, 0.0) * jnp.sum(state.queue)
        taken = jnp.clip(serve - (jnp.cumsum(state.queue) - state.queue), 0.0, state.queue)  # EDF
        queue = state.queue - taken
        late = queue[0]                                      # due now and not served: runs now, late
        queue = jnp.concatenate([queue[1:], jnp.zeros_like(queue[:1])]).at[jnp.maximum(slot, 0)].add(deferred)
        it = arrival - deferred + jnp.sum(taken) + late
        # cooling towards the set-point, then the room temperature
        setpoint = params.set_min + 0.5 * (a_set + 1.0) * (params.set_max - params.set_min)
        leak = params.c_th * (t_out - state.temp) / params.tau
        q_cool = jnp.clip(it + params.c_th * (state.temp - setpoint) / dt + leak, 0.0, params.q_cool_max)
        temp = state.temp + dt * ((it - q_cool) + leak) / params.c_th
        p_cool = q_cool / params.cop
        # supply: diesel, battery, PV, grid
        d_set = 0.5 * (a_diesel + 1.0) * params.diesel_max
        d_min = params.diesel_min_frac * params.diesel_max
        on = d_set >= d_min
        diesel = jnp.where(on, d_set, 0.0)
        load = it + p_cool
        request = a_bat[None] * params.battery.p_max_mw
        if params.backup:   # what the grid cannot carry: the battery discharges more, then the diesel starts or rises
            p_ch, p_dis = battery_limits(params.battery, state.soc, dt)
            applied = jnp.clip(request, -p_ch, p_dis)
            short = jnp.maximum(load - diesel - applied[0] - pv - params.grid_cap, 0.0)
            extra = jnp.minimum(short, p_dis[0] - applied[0])   # what the battery takes of it
            request = jnp.where(short > 0, applied + extra, request)   # as asked where nothing is short (its clipping reported)
            # what it cannot take: exactly 0 where it takes it all (the balance recomputed would leave a rounding
            # residual above 0 there, and start the diesel at its minimum: float32 and float64 disagreed so)
            short = short - extra
            diesel = jnp.where(short > 0, jnp.clip(jnp.maximum(diesel + short, d_min), 0.0, params.diesel_max), diesel)
            on = on | (short > 0)
        soc, p_bat, clipped = battery_step(params.battery, state.soc, request, dt)
        need = load - diesel - p_bat[0]                       # what PV and the grid must cover
        pv_used = jnp.clip(need, 0.0, pv)
        grid_want = need - pv_used                            # < 0: surplus beyond PV curtailment
        grid = jnp.clip(grid_want, 0.0, params.grid_cap)
        deficit = jnp.maximum(grid_want - params.grid_cap, 0.0)
        spilled = jnp.maximum(-grid_want, 0.0)
        fuel = jnp.where(on, params.fuel_idle * params.diesel_max + params.fuel_slope * diesel, 0.0) * dt  # litres
        co2 = fuel * params.diesel_co2 + grid * dt * params.grid_co2
        dollars = grid * dt * price + fuel * params.fuel_price + co2 * params.carbon_price
        costs = jnp.stack([late, jnp.maximum(temp - params.t_limit, 0.0), deficit])
        new = DCMGState(time_step=t + 1, day=state.day, soc=soc, temp=temp, queue=queue)
        info = {"it_mw": it, "cooling_mw": p_cool, "pv_mw": pv_used, "diesel_mw": diesel, "battery_mw": p_bat[0],
                "grid_mw": grid, "deficit_mw": deficit, "spilled_mw": spilled, "battery_clipped_mw": clipped[0],
                "fuel_l": fuel, "co2_t": co2, "cost_dollars": dollars, "nonfinite_actions": n_bad}
        return self._obs(new, params), new, -dollars * params.reward_scale, costs, t + 1 >= params.max_steps, info

    def _obs(self, state: DCMGState, params: DCMGParams):
        """[IT arrival, PV available (MW), price / 100, SOC, (temp - t_limit) / 10, queue (MW-steps),
        sin, cos time of day, progress]."""
        t = jnp.minimum(state.time_step, params.max_steps - 1)
        arrival, pv, price = day_rows((params.it_arrival, params.pv_avail, params.price), state.day, t)
        head = jnp.stack([arrival, pv, price / 100.0, state.soc[0], (state.temp - params.t_limit) / 10.0])
        return jnp.concatenate([head, state.queue, self.time_obs(state, params)])

    def observation_space(self, params: DCMGParams) -> Box:
        return Box(-jnp.inf, jnp.inf, (5 + params.deadline_steps + self.time_obs_size(params),))

    def action_space(self, params: DCMGParams) -> Box:
        return Box(-1.0, 1.0, (4,))

    def grid_view(self, state: DCMGState, params: DCMGParams) -> dict:
        return {"soc": state.soc, "temperature_c": state.temp}

    def units(self, params: DCMGParams) -> dict[str, str]:
        return {"return": f"{money_unit(params.reward_scale)} per day (minus energy, fuel, carbon)",
                "sla": "MW of work late x steps", "temperature": "degC above the limit x steps",
                "deficit": "MW unserved x steps"}

    def constraint_names(self, params: DCMGParams) -> tuple[str, ...]:
        return ("sla", "temperature", "deficit")


def it_workload_profiles(n_days: int, n_steps: int, delta_t_hours: float, peak_mw: float, seed: int = 0,
                         burst_rate_per_day: float = 6.0, burst_mw: float = 0.3) -> np.ndarray:
    """IT work arriving, MW, [n_days, n_steps]: a diurnal shape (trough ~0.6 of peak, business-hours
    and evening peaks) with 3% noise and seeded bursts (Poisson count per day, 15-45 min, +burst_mw)."""
    rng = np.random.default_rng(seed + 31337)
    base = peak_mw * daily_load_shape(n_steps, delta_t_hours)
    out = base[None] * (1.0 + 0.03 * rng.standard_normal((n_days, n_steps)))
    for d in range(n_days):
        for _ in range(rng.poisson(burst_rate_per_day * n_steps * delta_t_hours / 24.0)):
            start = rng.integers(n_steps)
            length = max(1, int(rng.uniform(0.25, 0.75) / delta_t_hours))
            out[d, start:start + length] += burst_mw
    return np.clip(out, 0.0, None)


@host_setup
def make_dcmg_params(max_steps: int = 288, delta_t_hours: float = 1.0 / 12.0, *, n_days: int | None = None, seed: int = 0,
                     split: str = "all", profiles: str = "synthetic",
                     it_peak_mw: float = 1.2, deferrable: float = 0.3, deadline_steps: int = 24,
                     pv_mw: float = 0.6, battery_mw: float = 0.5, battery_mwh: float = 1.0, eta_charge: float = 0.95,
                     eta_discharge: float = 0.95, soc_min: float = 0.1, soc_max: float = 0.9, soc_init: float = 0.5,
                     taper: float = 0.05, diesel_mw: float = 1.0, diesel_min_frac: float = 0.3, fuel_idle: float = 80.0,
                     fuel_slope: float = 230.0, fuel_price: float = 1.2, diesel_co2: float = 2.68e-3,
                     grid_co2: float = 0.4, carbon_price: float = 50.0, grid_cap_mw: float = 1.5,
                     price_tariff=(40.0, 70.0, 130.0), cop: float = 3.5, q_cool_max_mw: float = 2.0,
                     c_th_mwh_per_degc: float = 0.5, tau_hours: float = 10.0, temp_init: float = 22.0,
                     t_limit: float = 27.0, set_range=(18.0, 26.9), reward_scale: float = 0.01, forecast_steps: int = 0,
                     forecast_error: float = FORECAST_ERROR, backup: bool = True) -> DCMGParams:
    """Parameters of `DCMicrogridEnv` (defaults: a ~1 MW IT load, 5-minute steps over one day).

    Fuel use defaults follow a common diesel approximation (0.08 l/h per kW rating idle, 0.23 l/kWh);
    diesel emits 2.68 kg CO2 per litre. Days (`profiles`, `n_days`, `split`: see `profiles.source_days`):
    "synthetic": clear-sky PV with cloudiness, outdoor temperature a daily sine between 15 and 30 degC;
    "real": the 366 days of 2016 with PV output and dry-bulb temperature of a typical meteorological
    year (Greensboro, NC; `evogrid.data` kind "tmy"). IT work and the tariff are synthetic for both.
    Forecasts: `forecast_steps` > 0 appends to the observation a noisy forecast of the next
    `forecast_steps` intervals' IT work arriving and PV available (MW) (`profiles.forecast_features`: error `forecast_error` x sqrt(lead)).
    `backup=False` turns the controller's cover of what the grid cannot carry off (module docstring)."""
    check_days(max_steps, delta_t_hours, n_days)
    n_source, days = source_days(profiles, n_days, split, seed)
    if not 0.0 <= deferrable <= 1.0 or deadline_steps < 1:
        raise ValueError(f"need 0 <= deferrable <= 1 and deadline_steps >= 1, got {deferrable}, {deadline_steps}")
    if set_range[0] >= set_range[1] or cop <= 0 or c_th_mwh_per_degc <= 0 or tau_hours <= 0:
        raise ValueError("need set_range[0] < set_range[1] and positive cop, c_th_mwh_per_degc, tau_hours")
    battery, soc0 = make_battery(1, mw=battery_mw, mwh=battery_mwh, eta_charge=eta_charge, eta_discharge=eta_discharge,
                                 soc_min=soc_min, soc_max=soc_max, soc_init=soc_init, taper=taper)
    it_arrival = it_workload_profiles(n_source, max_steps, delta_t_hours, it_peak_mw, seed)[days]
    if profiles == "real":
        from evogrid import data

        weather = data.load_profiles("tmy", days, delta_t_hours, max_steps, ["pv", "temp_air"]).values
        pv, t_out = weather[..., 0], weather[..., 1]
    else:
        hours = (np.arange(max_steps) + 0.5) * delta_t_hours % 24.0
        t_out = 22.5 + 7.5 * np.sin(2 * np.pi * (hours - 9.0) / 24.0)  # coolest ~3 h, warmest ~15 h
        pv = daily_pv_profiles(1, n_source, max_steps, delta_t_hours, seed)[days, :, 0]
    return DCMGParams(
        max_steps=max_steps, delta_t_hours=delta_t_hours, deadline_steps=deadline_steps, backup=bool(backup),
        it_arrival=as_float(it_arrival), pv_avail=as_float(pv_mw * pv),
        price=as_float(price_days(profiles, n_days, split, max_steps, delta_t_hours, seed, price_tariff)),
        t_out=as_float(np.broadcast_to(t_out, (len(days), max_steps))), deferrable=as_float(deferrable),
        battery=battery, soc_init=soc0, diesel_max=as_float(diesel_mw), diesel_min_frac=as_float(diesel_min_frac),
        fuel_idle=as_float(fuel_idle), fuel_slope=as_float(fuel_slope), fuel_price=as_float(fuel_price),
        diesel_co2=as_float(diesel_co2), grid_co2=as_float(grid_co2), carbon_price=as_float(carbon_price),
        grid_cap=as_float(grid_cap_mw), cop=as_float(cop), q_cool_max=as_float(q_cool_max_mw),
        c_th=as_float(c_th_mwh_per_degc), tau=as_float(tau_hours), temp_init=as_float(temp_init),
        t_limit=as_float(t_limit), set_min=as_float(set_range[0]), set_max=as_float(set_range[1]),
        reward_scale=as_float(reward_scale), time_features=as_float(time_features(max_steps, delta_t_hours)),
        forecast=as_float(forecast_features(np.stack([it_arrival, pv_mw * pv], axis=-1), profiles, n_days, split,
                                            forecast_steps, forecast_error, seed)),
    )
