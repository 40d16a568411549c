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
import numpy as np
from flax import struct
from jax.flatten_util import ravel_pytree

from evogrid.envs import make
from evogrid.networks import make_vmap_mlp
from evogrid.workflows.base import ConfigMixin, Workflow
from evogrid.workflows.ec import EvosaxStrategy


@dataclasses.dataclass(frozen=True)
class CoevoConfig(ConfigMixin):
    task: str = "gencos-case5"
    algorithm: str = "Open_ES"
    pop_size: int = 32
    episodes: int = 2
    hidden: tuple[int, ...] = (16,)
    sigma: float = 0.1
    learning_rate: float = 0.05
    seed: int = 0

    def __post_init__(self):
        object.__setattr__(self, "hidden", tuple(int(h) for h in self.hidden))
        if self.pop_size < 2 or self.pop_size % 2 or self.episodes < 1:
            raise ValueError(f"need an even pop_size >= 2 and episodes >= 1, got {self.pop_size}, {self.episodes}")



@struct.dataclass
class CoevoState:
    key: jnp.ndarray        # uint32 key data
    es_state: object        # stacked over companies
    generation: jnp.ndarray


class CoevolutionWorkflow(Workflow):
    """Co-evolve one policy per company of a market env (with `agent_specs` and `info["profits"]`)."""

    def __init__(self, config: CoevoConfig = CoevoConfig(), env=None, env_params=None):
        self.config = config
        if env is None:
            env, env_params = make(config.task)
        self.env, self.params = env, env_params
        specs = env.agent_specs(env_params)
        self.agents = list(specs)
        width = max(len(a) for a, _ in specs.values())
        n_act = env.action_space(env_params).shape[0]
        # flat action index of each (company, slot); padded slots point at an extra, dropped entry
        self.slot = jnp.asarray([list(a) + [n_act] * (width - len(a)) for a, _ in specs.values()], jnp.int32)
        self.n_act = n_act
        obs_dim = env.observation_space(env_params).shape[0]
        self.model, _, _ = make_vmap_mlp(obs_dim, width, config.hidden, "tanh")
        flat, self.unravel = ravel_pytree(self.model.init(jax.random.key(0), jnp.zeros((obs_dim,))))
        self.strategy = EvosaxStrategy(config.algorithm, config.pop_size, flat, config.sigma, config.learning_rate)
        self.obs_dim = obs_dim

    def config_dict(self) -> dict:
        return self.config.to_dict()

    def init(self, key=None) -> CoevoState:
        key = jax.random.key(self.config.seed) if key is None else key
        keys = jax.random.split(key, 2 * len(self.agents) + 1)
        means = jnp.stack([ravel_pytree(self.model.init(k, jnp.zeros((self.obs_dim,))))[0] for k in keys[1:1 + len(self.agents)]])
        es = jax.vmap(self.strategy.init)(keys[1 + len(self.agents):], means)
        return CoevoState(key=jax.random.key_data(keys[0]), es_state=es, generation=jnp.zeros((), jnp.int32))

    def _joint_action(self, flat_params, obs):
        """flat_params [n_comp, D] -> flat env action."""
        out = jax.vmap(lambda p: self.model.apply(self.unravel(p), obs))(flat_params)  # [n_comp, width]
        return jnp.zeros(self.n_act + 1, out.dtype).at[self.slot].set(out)[:self.n_act]

    def _episode_profits(self, flat_params, key):
        """Summed profit per company over one episode, and the mean price and mark-ups."""
        k_reset, k_steps = jax.random.split(key)
        obs, state = self.env.reset(k_reset, self.params)

        def body(carry, k):
            obs, state = carry
            obs, state, _, _, _, info = self.env.step_no_reset(k, state, self._joint_action(flat_params, obs), self.params)
            return (obs, state), (info["profits"], jnp.mean(info["lmp"]), info["markup"])

        _, (profits, price, markup) = jax.lax.scan(body, (obs, state), jax.random.split(k_steps, self.params.max_steps))
        return profits.sum(0), price.mean(), markup.mean(0)

    def _step(self, state: CoevoState):
        key = jax.random.wrap_key_data(state.key)
        key, k_ask, k_perm, k_eval, k_tell = jax.random.split(key, 5)
        n_comp, pop = len(self.agents), self.config.pop_size
        population, es = jax.vmap(self.strategy.ask)(jax.random.split(k_ask, n_comp), state.es_state)  # [C, P, D]
        perm = jax.vmap(lambda k: jax.random.permutation(k, pop))(jax.random.split(k_perm, n_comp))  # opponents vary
        lineup = jnp.take_along_axis(population, perm[..., None], axis=1).swapaxes(0, 1)  # [P, C, D]
        episode_keys = jax.random.split(k_eval, self.config.episodes)
        profits, price, markup = jax.vmap(lambda p: jax.vmap(lambda k: self._episode_profits(p, k))(episode_keys))(lineup)
        fit_lineup = profits.mean(1).T * self.params.reward_scale                  # [C, P] in lineup order
        fitness = jnp.zeros_like(fit_lineup).at[jnp.arange(n_comp)[:, None], perm].set(fit_lineup)
        es = jax.vmap(self.strategy.tell)(jax.random.split(k_tell, n_comp), population, fitness, es)
        state = CoevoState(key=jax.random.key_data(key), es_state=es, generation=state.generation + 1)
        metrics = {"profit_mean": fit_lineup.mean(1), "price_mean": price.mean(), "markup_mean": markup.mean((0, 1))}
        return state, metrics

    def _evaluate(self, state: CoevoState):
        """Every company plays its distribution mean: mean price, mark-ups and profits over `episodes`."""
        centers = jax.vmap(self.strategy.center)(state.es_state)
        keys = jax.random.split(jax.random.fold_in(jax.random.wrap_key_data(state.key), 7), self.config.episodes)
        profits, price, markup = jax.vmap(lambda k: self._episode_profits(centers, k))(keys)
        return {"profits": profits.mean(0), "price": price.mean(), "markup": markup.mean(0)}

    def competitive_price(self):
        """Mean price when every company offers at cost (zero mark-up): the competitive benchmark."""
        zero = -jnp.ones(self.n_act)

        def episode(k):
            k_reset, k_steps = jax.random.split(k)
            obs, state = self.env.reset(k_reset, self.params)

            def body(state, kk):
                _, state, _, _, _, info = self.env.step_no_reset(kk, state, zero, self.params)
                return state, jnp.mean(info["lmp"])

            return jax.lax.scan(body, state, jax.random.split(k_steps, self.params.max_steps))[1].mean()

        keys = jax.random.split(jax.random.key(np.uint32(self.config.seed) + 7), self.config.episodes)
        return jax.jit(jax.vmap(episode))(keys).mean()
