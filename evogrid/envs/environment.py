"""The `Environment` base class: public API, auto-reset and the action checks in one place.

Subclasses write two pure functions, `reset_env(key, params) -> (obs, state)`
and `step_env(key, state, action, params) -> (obs, state, reward, costs, done, info)`,
plus the spaces and `constraint_names`.

Every env's physics is traced with float32 matrix products at full precision: the base class wraps each
subclass's `reset_env`, `reset_to_day`, `step_env` and `grid_view` in `jax.default_matmul_precision("highest")`
(`FULL_PRECISION`). On GPUs JAX's default runs float32 products in TF32 (a 10-bit mantissa): a power flow's
injections and mismatches then carry errors of 1e-3 relative, Newton cannot reach its tolerance and every
AC step reports `ac_diverged`. A policy's own layers (outside the env) keep the fast default. The one
exception inside: the AC chord method's corrections ask for `physics.ac.CORRECTION_PRECISION` themselves
(its residual, which decides where it ends, stays at full precision).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import struct

from evogrid.utils.jax_utils import day_row, reset_key, stop_obs_state_gradient, take_rows, tree_where, uniform_index


@struct.dataclass
class EnvState:
    time_step: jnp.ndarray  # int32, steps taken in the current episode


@struct.dataclass
class EnvParams:
    max_steps: int = struct.field(pytree_node=False, default=48)
    delta_t_hours: float = struct.field(pytree_node=False, default=0.5)
    # grid tasks: [max_steps + 1, 3] time of day and progress; [n_days, max_steps + 1, F] forecasts (F may be 0)
    time_features: jnp.ndarray = None
    forecast: jnp.ndarray = None


FULL_PRECISION = ("reset_env", "reset_to_day", "step_env", "grid_view")   # traced at full float32 precision


def _full_precision(method):
    @functools.wraps(method)
    def traced(*args, **kwargs):
        with jax.default_matmul_precision("highest"):
            return method(*args, **kwargs)
    return traced


class Environment:
    """Base class. Instances are hashed by identity (they are static under jit): build once, reuse.

    `ends_early`: whether an episode can end before `params.max_steps` (a terminal state); rollouts of
    such envs stop once every episode of a batch has ended. The grid tasks run to their horizon."""

    ends_early = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for name in FULL_PRECISION:   # the physics at full float32 precision on every backend (module docstring)
            if name in cls.__dict__:
                setattr(cls, name, _full_precision(cls.__dict__[name]))

    def time_obs(self, state, params: EnvParams) -> jnp.ndarray:
        """The observation's tail on every grid task: time of day and progress (3), then the noisy forecast
        of the next steps when the task has one (`profiles.forecast_features`; nothing when F = 0)."""
        parts = [take_rows(params.time_features, state.time_step)]
        if params.forecast is not None:
            parts.append(day_row(params.forecast, state.day, state.time_step))
        return jnp.concatenate(parts)

    def time_obs_size(self, params: EnvParams) -> int:
        return params.time_features.shape[-1] + (0 if params.forecast is None else params.forecast.shape[-1])

    def reset(self, key: jax.Array, params):
        return self.reset_env(key, params)

    def step(self, key: jax.Array, state, action, params):
        """One transition with auto-reset.

        When `done` is True the returned obs/state are those of a fresh episode,
        reset with `reset_key(key)` (another stream than the transition's `key`,
        derived without a hash: `utils.jax_utils.reset_key`); `done`, `reward`,
        `costs` and `info` still describe the finished transition.
        """
        return self.step_with_reset_key(key, reset_key(key), state, action, params)

    def step_with_reset_key(self, key_step: jax.Array, key_reset: jax.Array, state, action, params):
        """`step` with its reset's key given: `step(key, ...) == step_with_reset_key(key, reset_key(key), ...)`.

        It is `step_no_reset` followed by `auto_reset`; `evogrid.rollout.collect` makes the
        same two calls with all keys split before its loop.
        """
        obs, state, reward, costs, done, info = self.step_no_reset(key_step, state, action, params)
        obs, state = self.auto_reset(key_reset, obs, state, done, params)
        return obs, state, reward, costs, done, info

    def auto_reset(self, key: jax.Array, obs, state, done, params):
        """Where `done`, replace (obs, state) by a fresh episode's, reset with `key` (what survives: `carry_over`)."""
        obs_re, state_re = self.reset_env(key, params)
        return jnp.where(done, obs_re, obs), tree_where(done, self.carry_over(state_re, state), state)

    def carry_over(self, reset_state, stepped_state):
        """What survives an auto-reset: by default nothing (the fresh episode's state).
        A wrapper whose statistics must outlive episodes (RewardWrapper) copies them here."""
        return reset_state

    def step_no_reset(self, key: jax.Array, state, action, params):
        """One transition without the auto-reset: for fixed-horizon evaluation that stops at `max_steps`.

        Under vmap the auto-reset's select evaluates `reset_env` on every step; a
        rollout that never crosses an episode boundary need not pay for it.
        """
        return self.step_env(key, state, self._check_action(action, params), params)

    def step_auto_reset(self, key: jax.Array, state, action, params):
        """`step` with `stop_gradient` on the returned obs and state: no gradient crosses an episode boundary."""
        return stop_obs_state_gradient(self.step(key, state, action, params))

    def _check_action(self, action, params):
        space = self.action_space(params)
        action = jnp.asarray(action)
        if action.shape != space.shape:
            raise ValueError(
                f"{type(self).__name__}: action has shape {action.shape}, expected {space.shape} "
                f"(one value in [-1, 1] per controllable unit; batch with jax.vmap or TrainingWrapper)"
            )
        if not jnp.issubdtype(action.dtype, jnp.floating):
            action = action.astype(jnp.zeros(()).dtype)
        return action

    # --- to be written by subclasses -------------------------------------------------
    def reset_env(self, key, params):
        """A fresh episode on a day drawn uniformly from the params' days (tasks with days write
        `num_days` and `reset_to_day`; others override this)."""
        n_days = self.num_days(params)
        if n_days is None:
            raise NotImplementedError(f"{type(self).__name__} must write reset_env (it has no days)")
        return self.reset_to_day(uniform_index(key, n_days), params)

    def reset_to_day(self, day, params):
        """(obs, state) at the start of day `day` (an int32 index into the params' days)."""
        raise NotImplementedError(f"{type(self).__name__} has no days to start from")

    def num_days(self, params) -> int | None:
        """How many days the params hold (None: the env has no days, e.g. gymnax)."""
        return None

    def step_env(self, key, state, action, params):
        raise NotImplementedError

    def observation_space(self, params):
        raise NotImplementedError

    def action_space(self, params):
        raise NotImplementedError

    def constraint_names(self, params) -> tuple[str, ...]:
        raise NotImplementedError

    def num_constraints(self, params) -> int:
        return len(self.constraint_names(params))

    def grid_view(self, state, params) -> dict:
        """What a grid operator looks at after a step, as named arrays (keys and units in `GRID_VIEW`;
        jit/vmap-safe). Tasks without a grid return {}."""
        return {}

    def units(self, params) -> dict[str, str]:
        """The unit of the episode return ("return") and of each cost channel summed over an episode,
        for people reading figures (eval, progress, plots). Override in each task."""
        return {"return": "reward units per episode", **{c: "cost units per episode" for c in self.constraint_names(params)}}


GRID_VIEW = {  # the keys `grid_view` may return, with their units (evogrid eval --plot draws each that is present)
    "dispatch_mw": "MW per unit", "load_mw": "MW", "loading_pct": "% of rating per branch",
    "vm_pu": "p.u. per bus", "v_band": "p.u. (min, max)", "soc": "share of capacity per battery", "temperature_c": "degC",
}


def money_unit(reward_scale) -> str:
    """The money unit of a reward that is dollars times `reward_scale`: "k$" for 1e-3, "$" for 1, "10 $" for 0.1."""
    per = float(f"{1.0 / float(reward_scale):.6g}")  # float32 scales: 1 / 0.001f is 999.99994
    return {1e3: "k$", 1e6: "M$", 1.0: "$"}.get(per, f"{per:g} $")


def sanitize_action(action: jnp.ndarray):
    """Replace NaN/inf by 0 (mid-range) and clip to [-1, 1]. Returns (action, n_nonfinite int32)."""
    finite = jnp.isfinite(action)
    clean = jnp.clip(jnp.where(finite, action, 0.0), -1.0, 1.0)
    return clean, jnp.sum(~finite).astype(jnp.int32)
