"""Wrappers that keep the environment contract (EvoRL / PowerZooJax style)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from evogrid.constraints import ConstraintConfig, Lagrangian
from evogrid.envs.environment import Environment, EnvParams


class _ForwardSpaces:
    """Spaces and constraint names are those of the wrapped `self.env` (given its params)."""

    def _inner_params(self, params):
        return params

    @property
    def ends_early(self):
        return getattr(self.env, "ends_early", False)

    def observation_space(self, params):
        return self.env.observation_space(self._inner_params(params))

    def action_space(self, params):
        return self.env.action_space(self._inner_params(params))

    def constraint_names(self, params):
        return self.env.constraint_names(self._inner_params(params))

    def num_constraints(self, params):
        return len(self.constraint_names(params))

    def units(self, params):
        return self.env.units(self._inner_params(params))


class TrainingWrapper(_ForwardSpaces, Environment):
    """A batch of `num_envs` copies of `env`: `reset`/`step` take one key and batched states/actions.

    `vmap_step=True` vectorises the per-env calls with `jax.vmap` (one fused program);
    `vmap_step=False` runs them with `jax.lax.map` (one env at a time, lower peak memory).
    Both give the same results. Spaces are the single env's. The step key is split into
    one key per env, and so is the reset key.
    """

    def __init__(self, env, num_envs: int, vmap_step: bool = True):
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        self.env, self.num_envs, self.vmap_step = env, int(num_envs), bool(vmap_step)

    def _batched(self, fn, key, *batched, params):
        keys = jax.random.split(key, self.num_envs)
        if self.num_envs == 1:  # one env: call it unbatched and add the axis (a vmap of size 1 cost XLA 40-120%)
            out = fn(keys[0], *jax.tree_util.tree_map(lambda x: x[0], batched), params)
            return jax.tree_util.tree_map(lambda x: jnp.asarray(x)[None], out)
        if self.vmap_step:
            return jax.vmap(fn, in_axes=(0,) * (1 + len(batched)) + (None,))(keys, *batched, params)
        return jax.lax.map(lambda xs: fn(*xs, params), (keys, *batched))

    def reset(self, key, params):
        """-> (obs [N, ...], state [N, ...])"""
        return self._batched(self.env.reset, key, params=params)

    def step_no_reset(self, key, state, action, params):
        """Batched `env.step_no_reset`. action: [N, *action_shape]."""
        return self._batched(self.env.step_no_reset, key, state, action, params=params)

    def auto_reset(self, key, obs, state, done, params):
        return self._batched(lambda k, o, s, d, p: self.env.auto_reset(k, o, s, d, p), key, obs, state, done,
                             params=params)


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


@struct.dataclass
class WrappedParams(EnvParams):
    """Params of a wrapper: the inner env's params plus the wrapper's own leaves."""

    inner: object = None
    lagrangian: Lagrangian = None    # SafeRLWrapper: the cost weights (see evogrid.constraints)
    scale: jnp.ndarray = None        # RewardWrapper: reward scale


@struct.dataclass
class SafeState:
    env_state: object
    episode_cost: jnp.ndarray        # [C] summed costs of the running episode
    time_step: jnp.ndarray


class SafeRLWrapper(_ForwardSpaces, Environment):
    """Penalised reward for constrained RL/ES: reward - w . costs, with w from a `Lagrangian`.

    The `Lagrangian` (evogrid.constraints, the mechanism every workflow uses) is a params
    leaf, so a training loop updates it between calls (`lagrangian.update(...)`) without
    recompiling. `costs` pass through unchanged; `info` adds the raw reward, the running
    episode cost, and on the final step `episode_cost`.
    """

    def __init__(self, env: Environment):
        self.env = env

    def make_params(self, inner_params, config: ConstraintConfig = ConstraintConfig(), lagrangian=None) -> WrappedParams:
        lagrangian = lagrangian or Lagrangian.create(self.env.num_constraints(inner_params), config)
        return WrappedParams(max_steps=inner_params.max_steps, delta_t_hours=inner_params.delta_t_hours,
                             inner=inner_params, lagrangian=lagrangian)

    def reset_env(self, key, params: WrappedParams):
        obs, state = self.env.reset_env(key, params.inner)
        return obs, SafeState(state, jnp.zeros_like(params.lagrangian.multiplier), state.time_step)

    def step_env(self, key, state: SafeState, action, params: WrappedParams):
        obs, inner, reward, costs, done, info = self.env.step_env(key, state.env_state, action, params.inner)
        episode_cost = state.episode_cost + costs
        info = dict(info, reward_raw=reward, running_episode_cost=episode_cost,
                    episode_cost=jnp.where(done, episode_cost, 0.0))
        return obs, SafeState(inner, episode_cost, inner.time_step), params.lagrangian.penalise(reward, costs), costs, done, info

    def _inner_params(self, params):
        return params.inner


@struct.dataclass
class RewardState:
    env_state: object
    obs: jnp.ndarray      # last observation (for shaping)
    ret: jnp.ndarray      # discounted running return (for normalisation)
    mean: jnp.ndarray
    var: jnp.ndarray
    count: jnp.ndarray
    time_step: jnp.ndarray


class RewardWrapper(_ForwardSpaces, Environment):
    """Reward scaling, optional shaping `shaping(obs, next_obs) -> bonus`, optional running normalisation.

    reward' = (reward * scale + bonus) / sqrt(var of the discounted return + eps) when `normalize`,
    the usual PPO-style return normalisation; its statistics live in the state and survive
    auto-resets (`carry_over`), while the discounted return restarts with each episode.
    `scale` is a params leaf (`make_params`); `shaping`, `normalize`, `gamma` are structure.
    """

    def __init__(self, env: Environment, shaping=None, normalize: bool = False, gamma: float = 0.99):
        self.env, self.shaping, self.normalize, self.gamma = env, shaping, normalize, gamma

    def make_params(self, inner_params, scale=1.0) -> WrappedParams:
        return WrappedParams(max_steps=inner_params.max_steps, delta_t_hours=inner_params.delta_t_hours,
                             inner=inner_params, scale=jnp.asarray(scale, jnp.zeros(()).dtype))

    def reset_env(self, key, params: WrappedParams):
        obs, state = self.env.reset_env(key, params.inner)
        zero = jnp.zeros(())
        return obs, RewardState(state, obs, zero, zero, zero, zero, state.time_step)

    def carry_over(self, reset_state: RewardState, stepped_state: RewardState):
        return reset_state.replace(mean=stepped_state.mean, var=stepped_state.var, count=stepped_state.count)

    def step_env(self, key, state: RewardState, action, params: WrappedParams):
        obs, inner, reward, costs, done, info = self.env.step_env(key, state.env_state, action, params.inner)
        r = reward * params.scale + (self.shaping(state.obs, obs) if self.shaping is not None else 0.0)
        ret, mean, var, count = state.ret, state.mean, state.var, state.count
        if self.normalize:
            ret = ret * self.gamma + r
            count = count + 1.0
            delta = ret - mean
            mean = mean + delta / count
            var = var + (delta * (ret - mean) - var) / count
            r = jnp.where(count >= 2, r / jnp.sqrt(var + 1e-8), r)  # one sample has no spread yet
        info = dict(info, reward_raw=reward)
        return obs, RewardState(inner, obs, ret, mean, var, count, inner.time_step), r, costs, done, info

    def _inner_params(self, params):
        return params.inner
