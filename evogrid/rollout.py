"""Batched rollouts as one compiled program.

`make_random_rollout` is the PowerZooJax "complete pattern": reset N envs,
draw [N, T, A] uniform actions, `vmap(scan_rollout)`, all under one `jit`.
"""
from __future__ import annotations

import jax

from evogrid.utils.jax_utils import batch_reset, scan_rollout, split_key_for_envs


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
