"""Adapter that puts a gymnax environment behind the evogrid contract (empty cost vector).

    env, params = make("gymnax:CartPole-v1")      # needs the `gymnax` extra

Actions follow the evogrid convention, a Box in [-1, 1]: for a discrete gymnax
space of n actions the policy outputs n scores and the adapter takes the
argmax; for a continuous space the box is mapped linearly onto [low, high].
"""
from __future__ import annotations

import jax.numpy as jnp
from flax import struct

from evogrid.envs.environment import Environment, EnvParams, EnvState, sanitize_action
from evogrid.envs.spaces import Box


@struct.dataclass
class GymnaxParams(EnvParams):
    inner: object = None


@struct.dataclass
class GymnaxState(EnvState):
    inner: object = None


class GymnaxEnv(Environment):
    ends_early = True  # e.g. CartPole ends when the pole falls
    def __init__(self, name: str):
        try:
            import gymnax
        except ImportError as err:
            raise ImportError("gymnax tasks need the optional dependency: pip install 'evogrid[gymnax]'") from err
        if name not in gymnax.registered_envs:
            raise ValueError(f"unknown gymnax environment {name!r}; gymnax has {', '.join(gymnax.registered_envs)}")
        self.name = name
        self.env, self.default_inner = gymnax.make(name)
        space = self.env.action_space(self.default_inner)
        self.discrete = hasattr(space, "n")
        self.n_act = int(space.n) if self.discrete else int(jnp.prod(jnp.asarray(space.shape)))
        self.low, self.high = (None, None) if self.discrete else (space.low, space.high)

    def default_params(self, max_steps: int | None = None) -> GymnaxParams:
        """The gymnax defaults; `max_steps` overrides the episode limit (gymnax's max_steps_in_episode)."""
        inner = self.default_inner
        if max_steps is not None:
            if max_steps < 1:
                raise ValueError(f"max_steps must be >= 1, got {max_steps}")
            inner = inner.replace(max_steps_in_episode=max_steps)
        return GymnaxParams(max_steps=int(inner.max_steps_in_episode), delta_t_hours=1.0, inner=inner)

    def reset_env(self, key, params: GymnaxParams):
        obs, inner = self.env.reset_env(key, params.inner)
        return jnp.asarray(obs, jnp.zeros(()).dtype).reshape(-1), GymnaxState(time_step=jnp.zeros((), jnp.int32), inner=inner)

    def step_env(self, key, state: GymnaxState, action, params: GymnaxParams):
        action, n_bad = sanitize_action(action)
        if self.discrete:
            inner_action = jnp.argmax(action)
        else:
            inner_action = (self.low + 0.5 * (action + 1.0) * (self.high - self.low)).reshape(
                self.env.action_space(params.inner).shape)
        obs, inner, reward, done, _ = self.env.step_env(key, state.inner, inner_action, params.inner)
        t = state.time_step + 1
        done = jnp.logical_or(done, t >= params.max_steps)
        dtype = jnp.zeros(()).dtype
        info = {"nonfinite_actions": n_bad}
        return (jnp.asarray(obs, dtype).reshape(-1), GymnaxState(time_step=t, inner=inner), jnp.asarray(reward, dtype),
                jnp.zeros((0,), dtype), done, info)

    def observation_space(self, params):
        return Box(-jnp.inf, jnp.inf, (int(jnp.prod(jnp.asarray(self.env.observation_space(params.inner).shape))),))

    def action_space(self, params):
        return Box(-1.0, 1.0, (self.n_act,))

    def units(self, params):
        return {"return": "the gymnax task's reward per episode"}

    def constraint_names(self, params):
        return ()
