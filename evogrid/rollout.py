"""Rollouts as one compiled program.

`rollout(env, policy, rng, max_steps, params)` runs a policy in an environment
(or a `TrainingWrapper` batch) under `lax.scan` and returns `(metrics,
trajectories)`. When `max_steps` does not exceed the episode horizon
(`params.max_steps`) no episode boundary is crossed, so the steps skip the
auto-reset entirely (`step_no_reset`): under vmap the auto-reset's select would
otherwise evaluate a reset on every step.

`make_random_rollout` is the PowerZooJax "complete pattern" with uniform random actions.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from evogrid.utils.jax_utils import batch_reset, scan_rollout, split_key_for_envs


def rollout(env, policy, rng, max_steps: int, params, *, keep_trajectory: bool = False, obs_moments: bool = True):
    """Run `policy(obs) -> action` for `max_steps` steps from a fresh reset.

    Returns (metrics, trajectories):
      metrics: episode_return [*B] (sum of rewards), episode_cost [*B, C] (summed cost channels),
        episode_length [*B], and (with `obs_moments`) obs_mean / obs_var [obs_dim] over every
        observation the policy saw.
      trajectories: None, or with `keep_trajectory` a dict of obs, action, reward, costs, done
        stacked on a leading [max_steps] axis.
    *B is the batch shape of the env (empty for a single env, [num_envs] for a TrainingWrapper).
    """
    k_reset, k_steps = jax.random.split(rng)
    obs, state = env.reset(k_reset, params)
    crosses = max_steps > params.max_steps
    step = env.step_auto_reset if crosses else env.step_no_reset
    obs_dim = obs.shape[-1]

    def body(carry, key):
        obs, state, s1, s2 = carry
        action = policy(obs)
        if obs_moments:
            flat = obs.reshape(-1, obs_dim)
            s1, s2 = s1 + flat.sum(0), s2 + (flat * flat).sum(0)
        next_obs, state, reward, costs, done, _ = step(key, state, action, params)
        out = (reward, costs, done) + ((obs, action) if keep_trajectory else ())
        return (next_obs, state, s1, s2), out

    zeros = jnp.zeros((obs_dim,), obs.dtype)
    (_, _, s1, s2), outs = jax.lax.scan(body, (obs, state, zeros, zeros), jax.random.split(k_steps, max_steps))
    reward, costs, done = outs[:3]
    n = max_steps * (obs.size // obs_dim)
    mean = s1 / n
    metrics = {
        "episode_return": reward.sum(0),
        "episode_cost": costs.sum(0),
        "episode_length": jnp.full(reward.shape[1:], max_steps, jnp.int32),
    }
    if obs_moments:
        metrics.update(obs_mean=mean, obs_var=jnp.maximum(s2 / n - mean * mean, 0.0))
    trajectories = None
    if keep_trajectory:
        trajectories = {"obs": outs[3], "action": outs[4], "reward": reward, "costs": costs, "done": done}
    return metrics, trajectories


def make_random_rollout(env, params, n_envs: int, horizon: int):
    """Return `collect(key) -> (reward [N, T], costs [N, T, C], done [N, T], info)`, jitted.

    Build it once and call it many times: params are an argument of the
    compiled program (not baked in), so new values of the same shapes reuse it.
    """
    n_act = env.action_space(params).shape

    @jax.jit
    def collect(key, params):
        k_reset, k_act, k_roll = jax.random.split(key, 3)
        _, states = batch_reset(env, split_key_for_envs(k_reset, n_envs), params)
        actions = jax.random.uniform(k_act, (n_envs, horizon, *n_act), minval=-1.0, maxval=1.0)
        run = lambda s, k, a: scan_rollout(env, k, s, params, a)  # noqa: E731
        _, _, reward, costs, done, info = jax.vmap(run)(states, split_key_for_envs(k_roll, n_envs), actions)
        return reward, costs, done, info

    return lambda key, p=params: collect(key, p)
