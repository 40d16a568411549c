"""What the off-policy learners (TD3, SAC) share: replay fields, the buffer in the state, warm-up, the update loop.

A subclass writes `init`, `act`, `_explore(state, key, obs)` and `update(state, key, lagrangian)`
(one gradient step); `learn` adds a `collect` rollout to the buffer and takes `updates_per_iter`
steps once the buffer holds `warmup_steps` transitions. Rewards are penalised with the current
constraint weights when a batch is sampled (`lagrangian.penalise`), so stored transitions stay raw.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax

from evogrid.algorithms.base import GradientHyperparams
from evogrid.utils.config import param
from evogrid.utils.jax_utils import tree_where


@dataclasses.dataclass(frozen=True)
class ReplayHyperparams(GradientHyperparams):
    buffer_size: int = param(100_000, "replay buffer capacity (transitions)", lo=1)
    batch_size: int = param(256, "replay batch per gradient step", lo=1)
    warmup_steps: int = param(2_000, "random actions and no updates until the buffer holds this many", lo=0)
    updates_per_iter: int = param(48, "gradient steps per iteration", lo=1)
    tau: float = param(0.005, "target-network averaging rate", lo=0.0, hi=1.0)


def transition_example(obs_dim: int, act_dim: int, n_costs: int) -> dict:
    """One stored transition (the buffer's row layout)."""
    obs0 = jnp.zeros((obs_dim,))
    return {"obs": obs0, "action": jnp.zeros(act_dim), "reward": jnp.zeros(()), "costs": jnp.zeros(n_costs),
            "next_obs": obs0, "terminated": jnp.zeros(())}


def as_rows(traj) -> dict:
    """`collect`'s [T, N, ...] transitions as buffer rows [T * N, ...] (step-major order)."""
    rows = {"obs": traj.obs, "action": traj.action, "reward": traj.reward, "costs": traj.costs,
            "next_obs": traj.next_obs, "terminated": traj.terminated.astype(traj.reward.dtype)}
    return jax.tree_util.tree_map(lambda x: x.reshape((-1,) + x.shape[2:]), rows)


def soft_update(target, source, tau: float):
    return jax.tree_util.tree_map(lambda t, s: (1 - tau) * t + tau * s, target, source)


class ReplayAgent:
    """Base of the off-policy learners; their states have `buffer` and `updates` fields."""

    on_policy = False

    def explore(self, state, key, obs):
        """Uniform random actions while the buffer is below `warmup_steps` (checked at the iteration's
        start), then the learner's own exploration."""
        k_own, k_rand = jax.random.split(key)
        action = self._explore(state, k_own, obs)
        random = jax.random.uniform(k_rand, action.shape, action.dtype, -1.0, 1.0)
        return jnp.where(state.buffer.size < self.config.warmup_steps, random, action), None

    def critic_step(self, state, batch, target):
        """One gradient step of the twin critics towards `target` [B]. -> (critic, critic_opt, loss)"""
        def loss(c):
            return jnp.mean((self.q(c, batch["obs"], batch["action"]) - target[None]) ** 2)

        value, grad = jax.value_and_grad(loss)(state.critic)
        upd, opt = self.optimizer.update(grad, state.critic_opt, state.critic)
        return optax.apply_updates(state.critic, upd), opt, value

    def add(self, state, traj):
        return state.replace(buffer=state.buffer.add(as_rows(traj)))

    def ready(self, state):
        """Whether the buffer holds the warm-up transitions (updates start)."""
        return state.buffer.size >= jnp.minimum(self.config.warmup_steps, self.config.buffer_size)

    def train(self, state, key, n_updates: int, lagrangian):
        """`n_updates` gradient steps (all skipped while the buffer is below warm-up). -> (state, metrics)"""
        ready = self.ready(state)

        def step(st, k):
            new, losses = self.update(st, k, lagrangian)
            return tree_where(ready, new, st), losses

        state, losses = jax.lax.scan(step, state, jax.random.split(key, n_updates))
        return state, jax.tree_util.tree_map(jnp.mean, losses)

    def learn(self, state, key, traj, lagrangian):
        return self.train(self.add(state, traj), key, self.config.updates_per_iter, lagrangian)

    def check_batch(self, n_transitions: int) -> None:
        if self.config.buffer_size < n_transitions:
            raise ValueError(f"buffer_size ({self.config.buffer_size}) must hold at least one iteration of transitions "
                             f"(num_envs * rollout_len = {n_transitions})")
