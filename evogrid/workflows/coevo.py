"""Multi-population co-evolution of market agents: one evosax population per company, all companies
evaluated against each other inside one compiled program.

Each company c has its own strategy state (stacked on a leading company axis and updated with `vmap`)
and its own MLP policy obs -> mark-up actions for its units (padded to the largest company; padding
is ignored). In a generation, each company's population is shuffled, and individual i of every
company plays in the same market episodes as individual i of the others; the fitness of an
individual is its company's mean profit over those episodes. So every company optimises its own
profit against the others' current strategies, the setting where bidding strategies co-evolve.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct

from evogrid.algorithms import EVOSAX_ALGORITHMS, EvosaxStrategy
from evogrid.algorithms.es import OPTIMISED
from evogrid.envs.market import GenCoMarketEnv
from evogrid.networks import flat_init, make_vmap_mlp
from evogrid.rollout import collect
from evogrid.utils.config import Config, param, refuse_unused
from evogrid.workflows.base import EVAL_SEED, Workflow


@dataclasses.dataclass(frozen=True)
class CoevoConfig(Config):
    task: str = param("gencos-case5", "market task (see `evogrid tasks`: gencos-*)")
    algorithm: str = param("coevo", "co-evolution (one evosax population per company)", choices=("coevo",))
    strategy: str = param("Open_ES", "each company's evolution strategy", choices=EVOSAX_ALGORITHMS)
    pop_size: int = param(32, "population size per company (even)", lo=2, cli="--pop")
    episodes: int = param(2, "market episodes per lineup per generation", lo=1, cli="--episodes")
    hidden: tuple[int, ...] = param((16,), "MLP hidden layer widths", lo=1)
    sigma: float = param(0.1, "initial search std", lo=0.0, lo_open=True)
    learning_rate: float = param(0.05, "ES optimiser step size", lo=0.0, lo_open=True, cli="--lr")
    eval_episodes: int = param(2, "episodes of the evaluation", lo=1)
    seed: int = param(0, "random seed", lo=0)

    def _check(self):
        if self.pop_size % 2:
            raise ValueError(f"pop_size must be even (antithetic sampling), got {self.pop_size}")
        refuse_unused(self, "strategy", {"learning_rate": OPTIMISED})


@struct.dataclass
class CoevoState:
    key: jnp.ndarray        # uint32 key data
    es_state: object        # stacked over companies
    generation: jnp.ndarray


class CoevolutionWorkflow(Workflow):
    """Co-evolve one policy per company of a market env (with `agent_specs` and `info["profits"]`)."""

    config_type = CoevoConfig

    def __init__(self, config: CoevoConfig = CoevoConfig(), env=None, env_params=None):
        super().__init__(config, env, env_params)
        if not isinstance(self.env, GenCoMarketEnv):
            raise ValueError(f"co-evolution needs a market task (gencos-case5, gencos-case14), got {config.task!r}")
        specs = self.env.agent_specs(self.env_params)
        self.agents = list(specs)
        width = max(len(a) for a, _ in specs.values())
        # flat action index of each (company, slot); padded slots point at an extra, dropped entry
        self.slot = jnp.asarray([list(a) + [self.act_dim] * (width - len(a)) for a, _ in specs.values()], jnp.int32)
        self.model, _, _ = make_vmap_mlp(self.obs_dim, width, config.hidden, "tanh")
        flat, self.unravel = flat_init(self.model, jax.random.key(0), self.obs_dim)
        self.strategy = EvosaxStrategy(config.strategy, config.pop_size, flat, config.sigma, config.learning_rate)

    def metric_names(self) -> dict:
        return {"profit_mean": tuple(self.agents), "markup_mean": None}

    def _init(self, key) -> CoevoState:
        keys = jax.random.split(key, 2 * len(self.agents) + 1)
        means = jnp.stack([flat_init(self.model, k, self.obs_dim)[0] for k in keys[1:1 + len(self.agents)]])
        es = jax.vmap(self.strategy.init)(keys[1 + len(self.agents):], means)
        return CoevoState(key=jax.random.key_data(keys[0]), es_state=es, generation=jnp.zeros((), jnp.int32))

    def _joint_action(self, flat_params, obs):
        """flat_params [n_comp, D] -> flat env action."""
        out = jax.vmap(lambda p: self.model.apply(self.unravel(p), obs))(flat_params)  # [n_comp, width]
        return jnp.zeros(self.act_dim + 1, out.dtype).at[self.slot].set(out)[:self.act_dim]

    def _episode(self, act, key):
        """One market day under `act(obs) -> action`: (summed profit per company, mean price, mean mark-ups)."""
        k_reset, k_steps = jax.random.split(key)
        obs, state = self.env.reset(k_reset, self.env_params)
        _, _, traj, _ = collect(self.env, self.env_params, lambda k, o: (act(o), None), k_steps, state, obs,
                                self.env_params.max_steps, reset=False)
        return traj.info["profits"].sum(0), traj.info["lmp"].mean(), traj.info["markup"].mean(0)

    def _step(self, state: CoevoState):
        key = jax.random.wrap_key_data(state.key)
        key, k_ask, k_perm, k_eval, k_tell = jax.random.split(key, 5)
        n_comp, pop = len(self.agents), self.config.pop_size
        population, es = jax.vmap(self.strategy.ask)(jax.random.split(k_ask, n_comp), state.es_state)  # [C, P, D]
        perm = jax.vmap(lambda k: jax.random.permutation(k, pop))(jax.random.split(k_perm, n_comp))  # opponents vary
        lineup = jnp.take_along_axis(population, perm[..., None], axis=1).swapaxes(0, 1)  # [P, C, D]
        episode_keys = jax.random.split(k_eval, self.config.episodes)

        def play(p):
            return jax.vmap(lambda k: self._episode(lambda o: self._joint_action(p, o), k))(episode_keys)

        profits, price, markup = jax.vmap(play)(lineup)
        fit_lineup = profits.mean(1).T * self.env_params.reward_scale                  # [C, P] in lineup order
        fitness = jnp.zeros_like(fit_lineup).at[jnp.arange(n_comp)[:, None], perm].set(fit_lineup)
        es = jax.vmap(self.strategy.tell)(jax.random.split(k_tell, n_comp), population, fitness, es)
        state = CoevoState(key=jax.random.key_data(key), es_state=es, generation=state.generation + 1)
        metrics = {"profit_mean": fit_lineup.mean(1), "price_mean": price.mean(), "markup_mean": markup.mean((0, 1))}
        return state, metrics

    def _market(self, act):
        keys = jax.random.split(jax.random.key(EVAL_SEED), self.config.eval_episodes)
        profits, price, markup = jax.vmap(lambda k: self._episode(act, k))(keys)
        return {"profits": profits.mean(0), "price": price.mean(), "markup": markup.mean(0)}

    def _evaluate(self, state: CoevoState):
        """Every company plays its distribution mean: mean price ($/MWh), mark-ups and profits ($ per day)
        over the evaluation episodes, next to the competitive price (every company offers at cost)."""
        centers = jax.vmap(self.strategy.center)(state.es_state)
        out = self._market(lambda o: self._joint_action(centers, o))
        competitive = self._market(lambda o: -jnp.ones(self.act_dim))["price"]
        return dict(out, competitive_price=competitive, markup_pct=100.0 * (out["price"] / competitive - 1.0))
