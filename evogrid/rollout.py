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


def rollout(env, policy, rng, max_steps: int, params, *, keep_trajectory: bool = False, obs_moments: bool = True,
            auto_reset: bool | None = None):
    """Run `policy(obs) -> action` for `max_steps` steps from a fresh reset.

    Returns (metrics, trajectories):
      metrics: episode_return [*B] (sum of rewards up to and including the first `done`; when
        `max_steps` crosses episode boundaries, the sum over all of them), episode_cost [*B, C]
        (summed cost channels, same span), episode_length [*B] (steps counted), and (with `obs_moments`) obs_mean / obs_var [obs_dim] over every
        observation the policy saw.
      trajectories: None, or with `keep_trajectory` a dict of obs, action, reward, costs, done
        stacked on a leading [max_steps] axis.
    *B is the batch shape of the env (empty for a single env, [num_envs] for a TrainingWrapper).
    `auto_reset` forces the step kind (default: auto-reset only when `max_steps` exceeds the horizon).
    """
    k_reset, k_steps = jax.random.split(rng)
    obs, state = env.reset(k_reset, params)
    crosses = max_steps > params.max_steps if auto_reset is None else auto_reset
    step = env.step_auto_reset if crosses else env.step_no_reset
    obs_dim = obs.shape[-1]

    def body(carry, key):
        obs, state, alive, s1, s2, count = carry
        action = policy(obs)
        if obs_moments:  # observations of live episodes only
            flat = obs.reshape(-1, obs_dim) * alive.reshape(-1, 1)
            s1, s2, count = s1 + flat.sum(0), s2 + (flat * flat).sum(0), count + alive.sum()
        next_obs, state, reward, costs, done, _ = step(key, state, action, params)
        out = (reward, costs, done, alive) + ((obs, action) if keep_trajectory else ())
        # without resets, an episode that ends early must stop counting (a terminated gymnax
        # env would otherwise keep stepping)
        alive = alive if crosses else alive & ~done
        return (next_obs, state, alive, s1, s2, count), out

    zeros = jnp.zeros((obs_dim,), obs.dtype)
    alive0 = jnp.ones(obs.shape[:-1], bool)
    carry0 = (obs, state, alive0, zeros, zeros, jnp.zeros((), obs.dtype))
    (_, _, _, s1, s2, n), outs = jax.lax.scan(body, carry0, jax.random.split(k_steps, max_steps))
    reward, costs, done, alive = outs[:4]
    n = jnp.maximum(n, 1.0)
    mean = s1 / n
    metrics = {
        "episode_return": jnp.where(alive, reward, 0.0).sum(0),
        "episode_cost": jnp.where(alive[..., None], costs, 0.0).sum(0),
        "episode_length": alive.sum(0).astype(jnp.int32),
    }
    if obs_moments:
        metrics.update(obs_mean=mean, obs_var=jnp.maximum(s2 / n - mean * mean, 0.0), obs_count=n)
    trajectories = None
    if keep_trajectory:
        trajectories = {"obs": outs[4], "action": outs[5], "reward": reward, "costs": costs, "done": done}
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
