"""Multi-agent views (PowerZooJax `GridMARLEnv`): per-agent observations and actions as dicts.

    marl = GridMARLEnv(env, params)            # env provides agent_specs(params)
    obs_dict, state = marl.reset(key, params)
    obs_dict, state, reward_dict, done, info = marl.step(key, state, action_dict, params)

The objective is shared: every agent gets the env's reward; the constraint
costs are in `info["costs"]`. The wrapper only re-indexes arrays, so it keeps
jit/vmap/scan compatibility and the env's auto-reset.
"""
from __future__ import annotations

import jax.numpy as jnp

from evogrid.envs.spaces import Box
from evogrid.utils.jax_utils import stop_obs_state_gradient


class GridMARLEnv:
    def __init__(self, env, params):
        self.env = env
        self.specs = env.agent_specs(params)  # static index arrays, fixed at construction
        self.n_act = env.action_space(params).shape[0]
        covered = sorted(int(i) for a, _ in self.specs.values() for i in a)
        if covered != list(range(self.n_act)):
            raise ValueError(f"agent_specs must cover each of the {self.n_act} action entries exactly once")

    @property
    def agents(self) -> list[str]:
        return list(self.specs)

    def _split(self, obs):
        return {name: obs[..., o] for name, (_, o) in self.specs.items()}

    def _join(self, action_dict):
        missing = set(self.specs) - set(action_dict)
        if missing:
            raise ValueError(f"action_dict lacks agents {sorted(missing)}; expected {self.agents}")
        first = jnp.asarray(next(iter(action_dict.values())))
        action = jnp.zeros(first.shape[:-1] + (self.n_act,), first.dtype)
        for name, (a, _) in self.specs.items():
            act = jnp.asarray(action_dict[name])
            if act.shape[-1:] != (len(a),):
                raise ValueError(f"agent {name!r}: action has shape {act.shape}, expected ({len(a)},)")
            action = action.at[..., a].set(act)
        return action

    def reset(self, key, params):
        obs, state = self.env.reset(key, params)
        return self._split(obs), state

    def step(self, key, state, action_dict, params):
        obs, state, reward, costs, done, info = self.env.step(key, state, self._join(action_dict), params)
        return self._split(obs), state, {name: reward for name in self.specs}, done, dict(info, costs=costs)

    def step_auto_reset(self, key, state, action_dict, params):
        obs, state, reward, done, info = self.step(key, state, action_dict, params)
        obs, state = stop_obs_state_gradient((obs, state))
        return obs, state, reward, done, info

    def action_spaces(self, params) -> dict:
        return {name: Box(-1.0, 1.0, (len(a),)) for name, (a, _) in self.specs.items()}

    def observation_spaces(self, params) -> dict:
        return {name: Box(-jnp.inf, jnp.inf, (len(o),)) for name, (_, o) in self.specs.items()}
