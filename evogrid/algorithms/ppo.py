"""PPO (Schulman et al. 2017): clipped surrogate, GAE, minibatch epochs in `lax.scan`.

Gaussian policy: an MLP mean and a state-independent log-std (learned, or held constant).
GAE bootstraps from the true next observation at a time-limit truncation and not at a
termination. The agent interface shared by the gradient learners (PPO, TD3, SAC):

    agent = PPO(config, obs_dim, act_dim, n_costs, hidden)
    state = agent.init(key)
    action, aux = agent.explore(state, key, obs)     # a `collect` policy
    action = agent.act(state, obs)                   # deterministic (evaluation)
    state, metrics = agent.learn(state, key, transitions, lagrangian)

`transitions` are `collect`'s [T, N, ...] stack; PPO learns from the penalised reward
`lagrangian.penalise(reward, costs)` (evogrid.constraints).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct

from evogrid.algorithms.base import GradientHyperparams, make_optimizer
from evogrid.networks import MLP, MLPEnsemble
from evogrid.utils.config import param


@dataclasses.dataclass(frozen=True)
class PPOHyperparams(GradientHyperparams):
    gae_lambda: float = param(0.95, "GAE lambda", lo=0.0, hi=1.0)
    clip_eps: float = param(0.2, "PPO ratio clip", lo=0.0, lo_open=True)
    epochs: int = param(4, "passes over each rollout", lo=1)
    minibatches: int = param(4, "minibatches per pass", lo=1)
    ent_coef: float = param(0.0, "entropy bonus", lo=0.0)
    vf_coef: float = param(0.5, "value-loss weight", lo=0.0)
    value_clip: bool = param(False, "clip the value update like the policy ratio")
    learn_log_std: bool = param(True, "learn the policy's log-std (else keep init_log_std)")
    init_log_std: float = param(-0.5, "initial log-std of the Gaussian policy", lo=-10.0, hi=2.0)


@struct.dataclass
class PPOState:
    actor: Any
    log_std: jnp.ndarray   # [act_dim]
    critic: Any
    actor_opt: Any
    critic_opt: Any
    updates: jnp.ndarray   # int32 gradient steps taken


def gae(rewards, values, next_values, terminated, done, gamma, lam):
    """Generalised advantage estimation over a [T, ...] rollout.

    delta_t = r_t + gamma * V(s'_t) * (1 - terminated_t) - V(s_t), where s'_t is the true next
    observation (so a time-limit truncation bootstraps and a termination does not);
    A_t = delta_t + gamma * lam * (1 - done_t) * A_{t+1} (no credit across episode ends).
    Returns (advantages, returns = advantages + values).
    """
    deltas = rewards + gamma * next_values * (1.0 - terminated) - values

    def back(carry, x):
        delta, d = x
        adv = delta + gamma * lam * (1.0 - d) * carry
        return adv, adv

    _, adv = jax.lax.scan(back, jnp.zeros_like(deltas[0]), (deltas, done.astype(deltas.dtype)), reverse=True)
    return adv, adv + values


def gaussian_log_prob(mean, log_std, action):
    return jnp.sum(-0.5 * ((action - mean) / jnp.exp(log_std)) ** 2 - log_std - 0.5 * jnp.log(2 * jnp.pi), -1)


class PPO:
    name = "ppo"
    Hyperparams = PPOHyperparams
    on_policy = True

    def __init__(self, config: PPOHyperparams, obs_dim: int, act_dim: int, n_costs: int, hidden):
        self.config, self.obs_dim, self.act_dim = config, obs_dim, act_dim
        self.actor = MLP(tuple(hidden), act_dim, "tanh", squash=False)
        self.critic = MLPEnsemble(hidden, 1)
        self.optimizer = make_optimizer(config)

    def init(self, key) -> PPOState:
        k_actor, k_critic = jax.random.split(key)
        obs0 = jnp.zeros((self.obs_dim,))
        actor, critic = self.actor.init(k_actor, obs0), self.critic.init(k_critic, obs0)
        log_std = jnp.full((self.act_dim,), self.config.init_log_std)
        return PPOState(actor, log_std, critic, self.optimizer.init((actor, log_std)), self.optimizer.init(critic),
                        jnp.zeros((), jnp.int32))

    def act(self, state: PPOState, obs):
        return self.actor.apply(state.actor, obs)

    def explore(self, state: PPOState, key, obs):
        mean = self.act(state, obs)
        action = mean + jnp.exp(state.log_std) * jax.random.normal(key, mean.shape, mean.dtype)
        return action, gaussian_log_prob(mean, state.log_std, action)

    def learn(self, state: PPOState, key, traj, lagrangian):
        """One PPO update from a [T, N] rollout (`traj.aux` = the behaviour log-probs)."""
        cfg = self.config
        reward = lagrangian.penalise(traj.reward, traj.costs)
        values = self.critic.apply(state.critic, traj.obs)[0]
        next_values = self.critic.apply(state.critic, traj.next_obs)[0]
        adv, ret = gae(reward, values, next_values, traj.terminated.astype(reward.dtype), traj.done, cfg.gamma,
                       cfg.gae_lambda)
        flat = lambda x: x.reshape((-1,) + x.shape[2:])  # noqa: E731
        batch = {"obs": flat(traj.obs), "action": flat(traj.action), "logp": flat(traj.aux), "adv": flat(adv),
                 "ret": flat(ret), "value": flat(values)}
        n = batch["adv"].shape[0]

        def loss_fn(params, mb):
            (actor, log_std), critic = params
            log_std = log_std if cfg.learn_log_std else jax.lax.stop_gradient(log_std)
            logp = gaussian_log_prob(self.actor.apply(actor, mb["obs"]), log_std, mb["action"])
            ratio = jnp.exp(logp - mb["logp"])
            a = (mb["adv"] - mb["adv"].mean()) / (mb["adv"].std() + 1e-8)
            pg = -jnp.mean(jnp.minimum(ratio * a, jnp.clip(ratio, 1 - cfg.clip_eps, 1 + cfg.clip_eps) * a))
            v = self.critic.apply(critic, mb["obs"])[0]
            v_loss = (v - mb["ret"]) ** 2
            if cfg.value_clip:
                v_clip = mb["value"] + jnp.clip(v - mb["value"], -cfg.clip_eps, cfg.clip_eps)
                v_loss = jnp.maximum(v_loss, (v_clip - mb["ret"]) ** 2)
            entropy = jnp.sum(log_std + 0.5 * jnp.log(2 * jnp.pi * jnp.e))
            return pg + cfg.vf_coef * 0.5 * jnp.mean(v_loss) - cfg.ent_coef * entropy, (pg, jnp.mean(v_loss))

        def minibatch(carry, idx):
            actor_p, critic_p, a_opt, c_opt = carry
            mb = jax.tree_util.tree_map(lambda x: x[idx], batch)
            grads, (pg, vl) = jax.grad(loss_fn, has_aux=True)((actor_p, critic_p), mb)
            upd, a_opt = self.optimizer.update(grads[0], a_opt, actor_p)
            actor_p = optax.apply_updates(actor_p, upd)
            upd, c_opt = self.optimizer.update(grads[1], c_opt, critic_p)
            return (actor_p, optax.apply_updates(critic_p, upd), a_opt, c_opt), (pg, vl)

        def epoch(carry, k):
            perm = jax.random.permutation(k, n).reshape(cfg.minibatches, -1)
            return jax.lax.scan(minibatch, carry, perm)

        carry = ((state.actor, state.log_std), state.critic, state.actor_opt, state.critic_opt)
        ((actor, log_std), critic, a_opt, c_opt), (pg, vl) = jax.lax.scan(epoch, carry, jax.random.split(key, cfg.epochs))
        state = PPOState(actor, log_std, critic, a_opt, c_opt, state.updates + cfg.epochs * cfg.minibatches)
        return state, {"policy_loss": pg.mean(), "value_loss": vl.mean()}

    def check_batch(self, n_transitions: int) -> None:
        """Refuse a rollout size that does not split into the minibatches (called by the workflow)."""
        if n_transitions % self.config.minibatches:
            raise ValueError(f"num_envs * rollout_len ({n_transitions}) must divide into {self.config.minibatches} minibatches")
