"""Wrappers that keep the environment contract (EvoRL / PowerZooJax style)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from evogrid.envs.environment import Environment
from evogrid.utils.jax_utils import stop_obs_state_gradient


class _ForwardSpaces:
    """Spaces and constraint names are those of the wrapped `self.env`."""

    def observation_space(self, params):
        return self.env.observation_space(params)

    def action_space(self, params):
        return self.env.action_space(params)

    def constraint_names(self, params):
        return self.env.constraint_names(params)

    def num_constraints(self, params):
        return len(self.env.constraint_names(params))


class TrainingWrapper(_ForwardSpaces):
    """A batch of `num_envs` copies of `env`: `reset`/`step` take one key and batched states/actions.

    `vmap_step=True` vectorises the per-env step with `jax.vmap` (one fused
    program); `vmap_step=False` runs it with `jax.lax.map` (one env at a time,
    lower peak memory). Both give the same results. Spaces are the single env's.
    """

    def __init__(self, env, num_envs: int, vmap_step: bool = True):
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        self.env, self.num_envs, self.vmap_step = env, int(num_envs), bool(vmap_step)

    def _batched(self, fn, key, *batched, params):
        keys = jax.random.split(key, self.num_envs)
        if self.vmap_step:
            return jax.vmap(fn, in_axes=(0,) * (1 + len(batched)) + (None,))(keys, *batched, params)
        return jax.lax.map(lambda xs: fn(*xs, params), (keys, *batched))

    def reset(self, key, params):
        """-> (obs [N, ...], state [N, ...])"""
        return self._batched(self.env.reset, key, params=params)

    def step(self, key, state, action, params):
        """Batched `env.step` (auto-reset per env). action: [N, *action_shape]."""
        return self._batched(self.env.step, key, state, action, params=params)

    def step_auto_reset(self, key, state, action, params):
        return stop_obs_state_gradient(self.step(key, state, action, params))

    def step_no_reset(self, key, state, action, params):
        return self._batched(self.env.step_no_reset, key, state, action, params=params)


@struct.dataclass
class LogState:
    env_state: object
    episode_return: jnp.ndarray
    episode_length: jnp.ndarray
    time_step: jnp.ndarray


class LogWrapper(_ForwardSpaces, Environment):
    """Adds the running and the finished episode's return and length to `info`.

    `info["returned_episode_return"]` / `["returned_episode_length"]` hold the
    finished episode's totals on the step where `done` is True, else 0.
    """

    def __init__(self, env: Environment):
        self.env = env

    def reset_env(self, key, params):
        obs, state = self.env.reset_env(key, params)
        zero = jnp.zeros(())  # default float dtype, as rewards
        return obs, LogState(state, zero, jnp.zeros((), jnp.int32), state.time_step)

    def step_env(self, key, state: LogState, action, params):
        obs, env_state, reward, costs, done, info = self.env.step_env(key, state.env_state, action, params)
        ret = state.episode_return + reward
        length = state.episode_length + 1
        info = dict(info, episode_return=ret, episode_length=length,
                    returned_episode_return=jnp.where(done, ret, 0.0), returned_episode_length=jnp.where(done, length, 0))
        return obs, LogState(env_state, ret, length, env_state.time_step), reward, costs, done, info
