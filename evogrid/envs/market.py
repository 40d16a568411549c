"""GenCos task: generation companies bid mark-ups on offer segments; the operator clears the market
every step (PowerZooJax `GenCoMarketEnv`). `MarketMARLEnv` is its multi-agent view.

Each unit's capacity (0..Pmax) is offered in `segments` equal blocks priced at the block's true
average cost (from the case's gencost) times (1 + markup), markup = (a + 1) / 2 * markup_max for
the unit's action a in [-1, 1]. Demand is inelastic (seeded daily profiles of the case's loads);
load shedding is offered at every bus at `voll` so the market always clears. Clearing:
* "dcopf" (default): DC optimal power flow with line limits (`physics.dc_opf`), nodal prices (LMPs);
* "merit": uniform-price merit order on a copper plate; line overloads then show as a cost.
Each segment is paid the price at its bus. Profit of a company = sum over its units of
(revenue - true cost). The flat env's reward is the companies' summed profit (a single policy
sets every mark-up: the collusive benchmark); `info["profits"]` holds each company's, and
`MarketMARLEnv` gives each company its own. Cost channels: `unserved` (MW shed), `thermal`
(MW above line ratings, beyond the round-off of the flow: `rounding`).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from evogrid.case import Case, load_case
from evogrid.case.matpower import PD, PMAX
from evogrid.envs.environment import Environment, EnvParams, EnvState, money_unit, sanitize_action
from evogrid.envs.profiles import (
    FORECAST_ERROR,
    bus_load_days,
    check_days,
    forecast_features,
    time_features,
)
from evogrid.envs.spaces import Box
from evogrid.physics import as_float, generation_cost, host_setup, make_dc_network, make_gen_cost
from evogrid.physics.market import DCOPF, dc_opf, make_dcopf, merit_order
from evogrid.utils.jax_utils import day_row, stop_obs_state_gradient


def rounding(params, inj):
    """The bound on the round-off of each line's flow `ptdf @ inj + f0` [n_line] MW (n eps times the sum of
    its terms' sizes): a line the clearing loads to its rating reads up to this much above it, which the
    `thermal` channel does not count (in float32 otherwise almost every day read over a rating, and devices
    disagreed on which; docs/accelerator.md)."""
    eps = jnp.finfo(inj.dtype).eps * (inj.shape[0] + 1)
    return eps * (jnp.abs(params.ptdf) @ jnp.abs(inj) + jnp.abs(params.f0))


@struct.dataclass
class MarketState(EnvState):
    day: jnp.ndarray
    lmp: jnp.ndarray   # [n_bus] last cleared prices $/MWh


@struct.dataclass
class MarketParams(EnvParams):
    load: jnp.ndarray = None          # [n_days, T, n_bus] MW
    seg_cost: jnp.ndarray = None      # [K] true average cost of each generator segment $/MWh
    seg_cap: jnp.ndarray = None       # [K] MW
    seg_unit: jnp.ndarray = None      # [K] int unit index
    seg_bus: jnp.ndarray = None       # [K + n_bus] int bus of every segment, shedding last
    company: jnp.ndarray = None       # [n_companies, n_units] 0/1 ownership
    markup_max: jnp.ndarray = None
    voll: jnp.ndarray = None
    ptdf: jnp.ndarray = None          # [n_line, n_bus]
    f0: jnp.ndarray = None
    rate: jnp.ndarray = None          # [n_line] MW (inf = unlimited)
    opf: DCOPF = None
    reward_scale: jnp.ndarray = None
    clearing: str = struct.field(pytree_node=False, default="dcopf")
    opf_iters: int = struct.field(pytree_node=False, default=50)


class GenCoMarketEnv(Environment):
    """Generation-company market. Use with `make_market_params(case)`."""

    def num_days(self, params: MarketParams) -> int:
        return params.load.shape[0]

    def reset_to_day(self, day, params: MarketParams):
        day = jnp.asarray(day, jnp.int32)
        state = MarketState(time_step=jnp.int32(0), day=day, lmp=jnp.zeros(params.load.shape[-1], params.load.dtype))
        return self._obs(state, params), state

    def clear(self, offers, params: MarketParams, load):
        """Clear one market: offers [K] $/MWh for the generator segments, load [n_bus] MW. Returns
        (dispatch [K + n_bus] MW incl. shedding, prices [n_bus] $/MWh)."""
        n_bus = load.shape[0]
        prices = jnp.concatenate([offers, jnp.full((n_bus,), params.voll, offers.dtype)])
        caps = jnp.concatenate([params.seg_cap, load])
        if params.clearing == "merit":
            g, price, _ = merit_order(prices, caps, jnp.sum(load))
            return g, jnp.full((n_bus,), price)
        g, lmp, _ = dc_opf(params.opf, prices, caps, load, iters=params.opf_iters)
        return g, lmp

    def step_env(self, key, state: MarketState, action, params: MarketParams):
        action, n_bad = sanitize_action(action)
        markup = 0.5 * (action + 1.0) * params.markup_max             # [n_units]
        offers = params.seg_cost * (1.0 + markup[params.seg_unit])
        load = day_row(params.load, state.day, state.time_step)
        g, lmp = self.clear(offers, params, load)
        n_seg = params.seg_cost.shape[0]
        gen, shed = g[:n_seg], g[n_seg:]
        seg_profit = gen * (lmp[params.seg_bus[:n_seg]] - params.seg_cost) * params.delta_t_hours
        unit_profit = jnp.zeros(params.company.shape[1], gen.dtype).at[params.seg_unit].add(seg_profit)
        profits = params.company @ unit_profit                        # [n_companies] $
        inj = jnp.zeros_like(load).at[params.seg_bus].add(g) - load
        flows = params.ptdf @ inj + params.f0
        costs = jnp.stack([jnp.sum(shed), jnp.sum(jnp.maximum(jnp.abs(flows) - params.rate - rounding(params, inj), 0.0))])
        unit_mw = jnp.zeros(params.company.shape[1], gen.dtype).at[params.seg_unit].add(gen)
        new = MarketState(time_step=state.time_step + 1, day=state.day, lmp=lmp)
        info = {"profits": profits, "lmp": lmp, "unit_mw": unit_mw, "markup": markup, "nonfinite_actions": n_bad,
                "consumer_payment": jnp.sum(lmp * (load - shed)) * params.delta_t_hours}  # shedding segment n sits at bus n
        reward = jnp.sum(profits) * params.reward_scale
        return self._obs(new, params), new, reward, costs, new.time_step >= params.max_steps, info

    def _obs(self, state: MarketState, params: MarketParams):
        """[load per bus / 100 MW, last prices / 100 $/MWh, sin, cos time of day, progress]."""
        t = jnp.minimum(state.time_step, params.max_steps - 1)
        return jnp.concatenate([day_row(params.load, state.day, t) / 100.0, state.lmp / 100.0, self.time_obs(state, params)])

    def observation_space(self, params: MarketParams) -> Box:
        return Box(-jnp.inf, jnp.inf, (2 * params.load.shape[-1] + self.time_obs_size(params),))

    def action_space(self, params: MarketParams) -> Box:
        return Box(-1.0, 1.0, (params.company.shape[1],))

    def units(self, params: MarketParams) -> dict[str, str]:
        return {"return": f"{money_unit(params.reward_scale)} per day (the companies' summed profit)",
                "unserved": "MW shed x steps", "thermal": "MW over line ratings x steps"}

    def constraint_names(self, params: MarketParams) -> tuple[str, ...]:
        return ("unserved", "thermal")

    def agent_specs(self, params: MarketParams) -> dict:
        """One agent per company: its units' mark-ups; it sees the whole (public) observation."""
        own = np.asarray(params.company) > 0
        n_obs = self.observation_space(params).shape[0]
        return {f"genco_{c}": (np.flatnonzero(own[c]), np.arange(n_obs)) for c in range(own.shape[0])}


class MarketMARLEnv:
    """Multi-agent view of `GenCoMarketEnv`: obs/action dicts keyed by company, each company's own
    profit as its reward (scaled like the flat reward); the same contract as `GridMARLEnv`."""

    def __init__(self, env: GenCoMarketEnv, params: MarketParams):
        from evogrid.envs.marl import GridMARLEnv

        self._view = GridMARLEnv(env, params)
        self.env, self.specs = env, self._view.specs

    @property
    def agents(self) -> list[str]:
        return self._view.agents

    def reset(self, key, params):
        return self._view.reset(key, params)

    def step(self, key, state, action_dict, params):
        obs, state, _, done, info = self._view.step(key, state, action_dict, params)
        rewards = {name: info["profits"][i] * params.reward_scale for i, name in enumerate(self.agents)}
        return obs, state, rewards, done, info

    def step_auto_reset(self, key, state, action_dict, params):
        obs, state, reward, done, info = self.step(key, state, action_dict, params)
        obs, state = stop_obs_state_gradient((obs, state))
        return obs, state, reward, done, info

    def action_spaces(self, params) -> dict:
        return self._view.action_spaces(params)

    def observation_spaces(self, params) -> dict:
        return self._view.observation_spaces(params)


@host_setup
def make_market_params(case: Case | str = "5", max_steps: int = 48, delta_t_hours: float = 0.5, *, companies=None,
                       segments: int = 3, markup_max: float = 1.0, clearing: str = "dcopf", voll: float = 1000.0,
                       n_days: int | None = None, seed: int = 0, split: str = "all", profiles: str = "synthetic", load_scale: float = 1.0, opf_iters: int = 50,
                       reward_scale: float = 1e-3, forecast_steps: int = 0, forecast_error: float = FORECAST_ERROR) -> MarketParams:
    """Parameters of `GenCoMarketEnv`. `companies`: tuples of unit indices (0-based, case order), one
    per company; default one company per unit. `clearing`: "dcopf" or "merit". Demand days
    (`profiles`, `n_days`, `split`) and forecasts of the total demand as in `make_trans_params`, times `load_scale`."""
    check_days(max_steps, delta_t_hours, n_days)
    case = load_case(case) if not isinstance(case, Case) else case
    if clearing not in ("dcopf", "merit"):
        raise ValueError(f"clearing must be 'dcopf' or 'merit', got {clearing!r}")
    if segments < 1 or markup_max < 0:
        raise ValueError(f"need segments >= 1 and markup_max >= 0, got {segments}, {markup_max}")
    n_units = case.n_units
    companies = [(u,) for u in range(n_units)] if companies is None else [tuple(c) for c in companies]
    owned = sorted(u for c in companies for u in c)
    if owned != list(range(n_units)):
        raise ValueError(f"companies must own each of the {n_units} units of {case.name} exactly once, got {companies}")
    own = np.zeros((len(companies), n_units))
    for c, units in enumerate(companies):
        own[c, list(units)] = 1.0
    # segment k of unit u covers [k, k + 1] * Pmax / segments; its price is the true average cost there
    pmax = case.gen[:, PMAX]
    edges = pmax[:, None] * np.arange(segments + 1)[None, :] / segments       # [n_units, S + 1]
    cost = np.asarray(jax.vmap(lambda p: generation_cost(make_gen_cost(case), p), in_axes=1, out_axes=1)(jnp.asarray(edges)))
    width = np.diff(edges, axis=1)
    seg_cost = (np.diff(cost, axis=1) / np.where(width > 0, width, 1.0)).ravel()
    seg_unit = np.repeat(np.arange(n_units), segments)
    seg_bus = np.concatenate([case.gen_bus[seg_unit], np.arange(case.n_bus)])
    dc = make_dc_network(case)
    rate = np.where(case.rate_a > 0, case.rate_a, np.inf)
    load = bus_load_days(profiles, "transmission", case.bus[:, PD] * load_scale, n_days, split, max_steps, delta_t_hours, seed)
    return MarketParams(
        max_steps=max_steps, delta_t_hours=delta_t_hours, clearing=clearing, opf_iters=opf_iters,
        load=as_float(load), seg_cost=as_float(seg_cost), seg_cap=as_float(width.ravel()),
        seg_unit=jnp.asarray(seg_unit, jnp.int32), seg_bus=jnp.asarray(seg_bus, jnp.int32), company=as_float(own),
        markup_max=as_float(markup_max), voll=as_float(voll), ptdf=dc.ptdf, f0=dc.flow0, rate=as_float(rate),
        opf=make_dcopf(np.asarray(dc.ptdf), np.asarray(dc.flow0), rate, seg_bus, base=case.base_mva),
        reward_scale=as_float(reward_scale), time_features=as_float(time_features(max_steps, delta_t_hours)),
        forecast=as_float(forecast_features(load.sum(-1, keepdims=True) / max(load_scale * case.bus[:, PD].sum(), 1e-9),
                                            profiles, n_days, split, forecast_steps, forecast_error, seed)),
    )
