"""RLWorkflow: a gradient learner (PPO, TD3, SAC from `evogrid.algorithms`), one iteration per compiled call.

An iteration: `collect` `rollout_len` steps of `num_envs` auto-resetting envs with the agent's
exploring policy (transitions keep the true next observation and say whether an episode was
truncated or terminated), then `agent.learn` (PPO: epochs of minibatch updates; TD3/SAC: add to
the replay buffer in the state and take gradient steps), then the constraint multiplier's step
(evogrid.constraints) on the finished episodes' costs.

The workflow config of an agent is `RLConfig`'s fields plus the agent's hyper-parameters
(`rl_config(agent)`; `PPOConfig`, `TD3Config`, `SACConfig` are made that way), so adding a
learner is one algorithm module and one registry line.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from evogrid.constraints import ConstraintConfig, Lagrangian
from evogrid.envs.wrappers import TrainingWrapper
from evogrid.rollout import EpisodeStats, collect, track_episodes
from evogrid.utils.config import param
from evogrid.utils.jax_utils import strong_types, tree_where
from evogrid.workflows.base import Chosen, Workflow


@dataclasses.dataclass(frozen=True)
class RLConfig(ConstraintConfig):
    """Fields of every gradient-learner run (the agent's hyper-parameters are added by `rl_config`)."""

    task: str = param("tso-case14", "task name (see `evogrid tasks`)")
    algorithm: str = param("ppo", "gradient learner", choices=("ppo", "td3", "sac"))
    num_envs: int = param(16, "parallel environments", lo=1, cli="--envs")
    rollout_len: int = param(48, "steps per env per iteration", lo=1)
    hidden: tuple[int, ...] = param((64, 64), "actor and critic hidden layer widths", lo=1)
    eval_episodes: int = param(16, "evaluation episodes of tasks without days (gymnax); day tasks play every test day", lo=1)
    select_every: int = param(5, "generations (iterations) between re-evaluations of the policy on the validation days", lo=1)
    seed: int = param(0, "random seed", lo=0)


def rl_config(agent) -> type:
    """The config class of `RLWorkflow` with `agent`: RLConfig's fields plus `agent.Hyperparams`."""
    name = agent.Hyperparams.__name__.replace("Hyperparams", "Config")
    algorithm = ("algorithm", str, param(agent.name, "gradient learner", choices=(agent.name,)))
    cls = dataclasses.make_dataclass(name, [algorithm], bases=(RLConfig, agent.Hyperparams), frozen=True)
    cls.__module__ = __name__
    cls.agent = agent
    return cls


@struct.dataclass
class RLState:
    key: jnp.ndarray             # uint32 key data
    agent: Any                   # the learner's own state (networks, optimisers, buffer)
    env_state: Any
    obs: jnp.ndarray             # [num_envs, obs_dim]
    episodes: EpisodeStats
    lagrangian: Lagrangian
    iteration: jnp.ndarray
    best_actor: Any              # the actor chosen on the validation days (every agent state has `actor`)
    chosen: Chosen               # its validation record (base.Chosen)


class RLWorkflow(Workflow):
    """A gradient learner on a task; `config` comes from `rl_config(agent)` (e.g. `PPOConfig`)."""

    config_type = RLConfig

    @classmethod
    def check_config(cls, config):
        """A bare `RLConfig(algorithm=...)` becomes the named learner's config (its hyper-parameters at their
        defaults); anything else as `Workflow.check_config`."""
        if type(config) is RLConfig:
            from evogrid.workflows.registry import config_class

            config = config_class(config.algorithm)(**{f.name: getattr(config, f.name) for f in dataclasses.fields(RLConfig)})
        return super().check_config(config)

    def __init__(self, config, env=None, env_params=None):
        super().__init__(config, env, env_params)
        config = self.config
        hyper = {f.name: getattr(config, f.name) for f in dataclasses.fields(config.agent.Hyperparams)}
        self.agent = config.agent(config.agent.Hyperparams(**hyper), self.obs_dim, self.act_dim, len(self.cost_names),
                                  config.hidden)
        self.agent.check_batch(config.num_envs * config.rollout_len)
        self.envs = TrainingWrapper(self.env, config.num_envs)

    def _init(self, key) -> RLState:
        key, k_agent, k_env = jax.random.split(key, 3)
        obs, env_state = self.envs.reset(k_env, self.env_params)
        agent = self.agent.init(k_agent)
        state = RLState(key=jax.random.key_data(key), agent=agent, env_state=env_state, obs=obs,
                        episodes=EpisodeStats.create(self.config.num_envs, len(self.cost_names)),
                        lagrangian=Lagrangian.create(len(self.cost_names), self.config),
                        iteration=jnp.zeros((), jnp.int32), best_actor=agent.actor,
                        chosen=self.new_chosen())
        return strong_types(state)

    def _step(self, state: RLState):
        cfg = self.config
        state, metrics = self.train(state, self.agent, cfg)
        agent, lagrangian = state.agent, state.lagrangian

        def select():  # the learner's deterministic policy against the one kept so far, on the validation days
            ret, day_cost = self.validation_score(self._policy(agent, agent.actor))
            k, chosen = state.chosen.consider(ret[None], day_cost[None], lagrangian.weights())
            return tree_where(k >= 0, agent.actor, state.best_actor), chosen

        best_actor, chosen = jax.lax.cond(state.iteration % cfg.select_every == 0, select,
                                          lambda: (state.best_actor, state.chosen))
        return state.replace(best_actor=best_actor, chosen=chosen), {**metrics, **chosen.metrics()}

    def train(self, state: RLState, agent, cfg):
        """One iteration of learning without the choice of a policy: `collect` with `agent`'s exploring policy,
        `agent.learn`, the multiplier's step with `cfg`'s gains. `agent` and `cfg` are arguments so that
        population-based training can pass each member its own hyper-parameters (workflows/pbt.py)."""
        key = jax.random.wrap_key_data(state.key)
        key, k_roll, k_learn = jax.random.split(key, 3)
        explore = lambda k, obs: agent.explore(state.agent, k, obs)  # noqa: E731
        env_state, obs, traj, episodes = collect(self.envs, self.env_params, explore, k_roll, state.env_state, state.obs,
                                                 cfg.rollout_len, fold=track_episodes, acc=state.episodes)
        learner, metrics = agent.learn(state.agent, k_learn, traj, state.lagrangian)
        lagrangian = state.lagrangian.update(episodes.last_cost, episodes.last_return, cfg)
        state = state.replace(key=jax.random.key_data(key), agent=learner, env_state=env_state, obs=obs,
                              episodes=episodes, lagrangian=lagrangian, iteration=state.iteration + 1)
        return state, {"return": episodes.last_return, "cost_total": episodes.last_cost.sum(),
                       "cost_channels": episodes.last_cost, "multiplier": lagrangian.multiplier,
                       "env_steps": (state.iteration * cfg.num_envs * cfg.rollout_len).astype(jnp.float32), **metrics}

    def _policy(self, agent_state, actor):
        return lambda obs: self.agent.act(agent_state.replace(actor=actor), obs)

    def _evaluate(self, state: RLState):
        """The deterministic policy chosen on the validation days (the latest one before any choice), on
        every test day."""
        return self.evaluate_policy(self.chosen_policy(state))

    def chosen_policy(self, state: RLState):
        actor = tree_where(jnp.isfinite(state.chosen.ret), state.best_actor, state.agent.actor)
        return self._policy(state.agent, actor)
