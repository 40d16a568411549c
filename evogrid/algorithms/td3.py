"""TD3 (Fujimoto et al. 2018): twin critics, target policy smoothing, delayed actor and target updates.

The replay buffer is part of the agent's state (a pytree of JAX arrays), so a whole iteration,
collection and updates, is one compiled call; buffer handling and the update loop come from
`off_policy.ReplayAgent`. Same interface as PPO (`init`, `explore`, `act`, `learn`).
ERL and CEM-RL reuse `add`, `train`, `q` and the actor network.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct

from evogrid.algorithms.base import make_optimizer
from evogrid.algorithms.off_policy import (
    ReplayAgent,
    ReplayHyperparams,
    soft_update,
    transition_example,
)
from evogrid.networks import MLP, MLPEnsemble
from evogrid.utils.config import param
from evogrid.utils.jax_utils import tree_where
from evogrid.utils.replay import ReplayBuffer


@dataclasses.dataclass(frozen=True)
class TD3Hyperparams(ReplayHyperparams):
    expl_noise: float = param(0.1, "std of the Gaussian exploration noise on actions", lo=0.0)
    policy_noise: float = param(0.2, "std of the target policy smoothing noise", lo=0.0)
    noise_clip: float = param(0.5, "clip of the smoothing noise", lo=0.0)
    policy_delay: int = param(2, "critic steps per actor and target update", lo=1)


@struct.dataclass
class TD3State:
    actor: Any
    critic: Any             # twin critics, leaves [2, ...]
    target_actor: Any
    target_critic: Any
    actor_opt: Any
    critic_opt: Any
    buffer: ReplayBuffer
    updates: jnp.ndarray    # int32 gradient steps taken


class TD3(ReplayAgent):
    name = "td3"
    Hyperparams = TD3Hyperparams

    def __init__(self, config: TD3Hyperparams, obs_dim: int, act_dim: int, n_costs: int, hidden):
        self.config, self.obs_dim, self.act_dim, self.n_costs = config, obs_dim, act_dim, n_costs
        self.actor = MLP(tuple(hidden), act_dim, "tanh", squash=True)
        self.critic = MLPEnsemble(hidden, 2)
        self.optimizer = make_optimizer(config)

    def init(self, key) -> TD3State:
        k_actor, k_critic = jax.random.split(key)
        actor = self.actor.init(k_actor, jnp.zeros((self.obs_dim,)))
        critic = self.critic.init(k_critic, jnp.zeros((self.obs_dim + self.act_dim,)))
        buffer = ReplayBuffer.create(self.config.buffer_size, transition_example(self.obs_dim, self.act_dim, self.n_costs))
        return TD3State(actor, critic, actor, critic, self.optimizer.init(actor), self.optimizer.init(critic), buffer,
                        jnp.zeros((), jnp.int32))

    def q(self, critic, obs, action):
        """Both critics' values [2, ...]."""
        return self.critic.apply(critic, jnp.concatenate([obs, action], -1))

    def act(self, state: TD3State, obs):
        return self.actor.apply(state.actor, obs)

    def _explore(self, state: TD3State, key, obs):
        greedy = self.act(state, obs)
        noise = self.config.expl_noise * jax.random.normal(key, greedy.shape, greedy.dtype)
        return jnp.clip(greedy + noise, -1.0, 1.0)

    def update(self, state: TD3State, key, lagrangian):
        """One gradient step on a replay batch: critics always; actor and targets every `policy_delay`."""
        cfg = self.config
        k_batch, k_noise = jax.random.split(key)
        b = state.buffer.sample(k_batch, cfg.batch_size)
        reward = lagrangian.penalise(b["reward"], b["costs"])
        noise = jnp.clip(cfg.policy_noise * jax.random.normal(k_noise, b["action"].shape), -cfg.noise_clip, cfg.noise_clip)
        next_a = jnp.clip(self.actor.apply(state.target_actor, b["next_obs"]) + noise, -1.0, 1.0)
        target = reward + cfg.gamma * (1.0 - b["terminated"]) * jnp.min(self.q(state.target_critic, b["next_obs"], next_a), 0)
        target = jax.lax.stop_gradient(target)

        critic, c_opt, c_loss = self.critic_step(state, b, target)

        def actor_loss(actor):
            return -jnp.mean(self.q(critic, b["obs"], self.actor.apply(actor, b["obs"]))[0])

        a_loss, a_grad = jax.value_and_grad(actor_loss)(state.actor)
        upd, a_opt_new = self.optimizer.update(a_grad, state.actor_opt, state.actor)
        actor_new = optax.apply_updates(state.actor, upd)
        delayed = state.updates % cfg.policy_delay == 0
        actor = tree_where(delayed, actor_new, state.actor)
        state = state.replace(
            critic=critic, critic_opt=c_opt, actor=actor, actor_opt=tree_where(delayed, a_opt_new, state.actor_opt),
            target_actor=tree_where(delayed, soft_update(state.target_actor, actor, cfg.tau), state.target_actor),
            target_critic=tree_where(delayed, soft_update(state.target_critic, critic, cfg.tau), state.target_critic),
            updates=state.updates + 1)
        return state, {"critic_loss": c_loss, "actor_loss": a_loss}
