"""SAC (Haarnoja et al. 2018, with the learned temperature of "SAC: algorithms and applications").

A tanh-squashed Gaussian actor, twin critics with soft (entropy-regularised) targets, Polyak-averaged
target critics and a temperature alpha tuned towards the target entropy -act_dim. The replay buffer
lives in the state; replay fields, warm-up and the update loop come from `off_policy.ReplayAgent`.
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
from evogrid.utils.replay import ReplayBuffer

LOG_STD_RANGE = (-5.0, 2.0)


@dataclasses.dataclass(frozen=True)
class SACHyperparams(ReplayHyperparams):
    init_alpha: float = param(0.1, "initial entropy temperature", lo=0.0, lo_open=True)
    learn_alpha: bool = param(True, "tune alpha towards the target entropy -act_dim")


@struct.dataclass
class SACState:
    actor: Any
    critic: Any            # twin critics, leaves [2, ...]
    target_critic: Any
    log_alpha: jnp.ndarray
    actor_opt: Any
    critic_opt: Any
    alpha_opt: Any
    buffer: ReplayBuffer
    updates: jnp.ndarray


class SAC(ReplayAgent):
    name = "sac"
    Hyperparams = SACHyperparams

    def __init__(self, config: SACHyperparams, obs_dim: int, act_dim: int, n_costs: int, hidden):
        self.config, self.obs_dim, self.act_dim, self.n_costs = config, obs_dim, act_dim, n_costs
        self.actor = MLP(tuple(hidden), 2 * act_dim, "relu", squash=False)
        self.critic = MLPEnsemble(hidden, 2)
        self.optimizer = make_optimizer(config)
        self.target_entropy = -float(act_dim)

    def init(self, key) -> SACState:
        k_actor, k_critic = jax.random.split(key)
        actor = self.actor.init(k_actor, jnp.zeros((self.obs_dim,)))
        critic = self.critic.init(k_critic, jnp.zeros((self.obs_dim + self.act_dim,)))
        log_alpha = jnp.log(jnp.asarray(self.config.init_alpha, jnp.zeros(()).dtype))
        buffer = ReplayBuffer.create(self.config.buffer_size, transition_example(self.obs_dim, self.act_dim, self.n_costs))
        return SACState(actor, critic, critic, log_alpha, self.optimizer.init(actor), self.optimizer.init(critic),
                        self.optimizer.init(log_alpha), buffer, jnp.zeros((), jnp.int32))

    def _dist(self, actor, obs):
        out = self.actor.apply(actor, obs)
        mean, log_std = out[..., :self.act_dim], out[..., self.act_dim:]
        return mean, jnp.clip(log_std, *LOG_STD_RANGE)

    def sample(self, actor, key, obs):
        """A squashed sample and its log-probability (change of variables through tanh)."""
        mean, log_std = self._dist(actor, obs)
        u = mean + jnp.exp(log_std) * jax.random.normal(key, mean.shape, mean.dtype)
        logp = jnp.sum(-0.5 * ((u - mean) / jnp.exp(log_std)) ** 2 - log_std - 0.5 * jnp.log(2 * jnp.pi), -1)
        action = jnp.tanh(u)
        return action, logp - jnp.sum(jnp.log(1.0 - action**2 + 1e-6), -1)

    def q(self, critic, obs, action):
        return self.critic.apply(critic, jnp.concatenate([obs, action], -1))

    def act(self, state: SACState, obs):
        return jnp.tanh(self._dist(state.actor, obs)[0])

    def _explore(self, state: SACState, key, obs):
        return self.sample(state.actor, key, obs)[0]

    def update(self, state: SACState, key, lagrangian):
        cfg = self.config
        k_batch, k_next, k_pi = jax.random.split(key, 3)
        b = state.buffer.sample(k_batch, cfg.batch_size)
        alpha = jnp.exp(state.log_alpha)
        reward = lagrangian.penalise(b["reward"], b["costs"])
        next_a, next_logp = self.sample(state.actor, k_next, b["next_obs"])
        next_q = jnp.min(self.q(state.target_critic, b["next_obs"], next_a), 0) - alpha * next_logp
        target = jax.lax.stop_gradient(reward + cfg.gamma * (1.0 - b["terminated"]) * next_q)

        critic, c_opt, c_loss = self.critic_step(state, b, target)

        def actor_loss(actor):
            a, logp = self.sample(actor, k_pi, b["obs"])
            return jnp.mean(alpha * logp - jnp.min(self.q(critic, b["obs"], a), 0)), logp

        (a_loss, logp), a_grad = jax.value_and_grad(actor_loss, has_aux=True)(state.actor)
        upd, a_opt = self.optimizer.update(a_grad, state.actor_opt, state.actor)
        actor = optax.apply_updates(state.actor, upd)
        log_alpha, alpha_opt = state.log_alpha, state.alpha_opt
        if cfg.learn_alpha:
            entropy_gap = jax.lax.stop_gradient(logp + self.target_entropy)
            g = jax.grad(lambda la: -jnp.mean(la * entropy_gap))(log_alpha)
            upd, alpha_opt = self.optimizer.update(g, alpha_opt, log_alpha)
            log_alpha = optax.apply_updates(log_alpha, upd)
        state = state.replace(actor=actor, critic=critic, target_critic=soft_update(state.target_critic, critic, cfg.tau),
                              log_alpha=log_alpha, actor_opt=a_opt, critic_opt=c_opt, alpha_opt=alpha_opt,
                              updates=state.updates + 1)
        return state, {"critic_loss": c_loss, "actor_loss": a_loss, "alpha": jnp.exp(log_alpha)}
