"""The operator's baselines, each played with and without the task's safety layer (`evogrid.safety`).

On the DC transmission tasks: the zero policy (every unit at the middle of its ramp window), persistence
(every unit holds its last output; the automatic generation control follows the load), the myopic
one-step DC-OPF and the rolling-horizon DC-OPF (MPC) on the forecast the observation carries, re-solved
every interval (`tso.rolling_policy`). On dso: the zero policy (no control). Each is judged as a learned
policy is: every test day from its start, return, summed cost channels, and the MWh the layer moved.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from evogrid.baselines import tso


def play_days(env, params, policy, days=None):
    """(returns [n], summed costs [n, C], MWh the layer moved [n]) of `policy(obs) -> action` on each day of
    `params` (default all) from its start, deterministically (one compiled program, vmapped over days)."""
    days = jnp.arange(env.num_days(params), dtype=jnp.int32) if days is None else jnp.asarray(days, jnp.int32)

    def one(day):
        start = env.reset_to_day(day, params)

        def step(carry, key):
            obs, state = carry
            obs, state, reward, costs, _, info = env.step_no_reset(key, state, policy(obs), params)
            return (obs, state), (reward, costs, info.get("layer_moved", jnp.zeros_like(reward)))

        _, (reward, costs, moved) = jax.lax.scan(step, start, jax.random.split(jax.random.key(0), params.max_steps))
        return reward.sum(), costs.sum(0), moved.sum()

    return tuple(np.asarray(x, np.float64) for x in jax.jit(jax.vmap(one))(days))


def operator_policies(env, params, progress=None) -> dict:
    """name -> {"return", "violation" (summed over channels), "moved_mwh" (per day lists), "layer" (bool),
    "decision_s" (mean seconds per decision where an optimiser decides)} for every baseline of the task's
    family, with ("<name>+layer") and without the safety layer. `progress(what)` returns a per-day callback."""
    from evogrid.envs.dist import DistGridEnv
    from evogrid.envs.trans import TransGridEnv, dispatch_action, observation_layout, read_observation
    from evogrid.safety import shield

    zero = lambda obs: jnp.zeros(env.action_space(params).shape, obs.dtype)  # noqa: E731
    out = {}
    for layered in (False, True):
        played = shield(env, params) if layered else env
        tag = "+layer" if layered else ""

        def record(name, returns, costs, moved, decision_s=None):
            out[name + tag] = {"return": returns.tolist(), "violation": np.asarray(costs).sum(-1).tolist(),
                               "moved_mwh": moved.tolist(), "layer": layered, "decision_s": decision_s}

        record("zero", *play_days(played, params, zero))
        if type(env) is TransGridEnv and not params.ac:
            layout = observation_layout(params)

            def hold(obs):
                last = read_observation(obs, params, layout)["last_pg"]
                return dispatch_action(params, last, last)

            record("persistence", *play_days(played, params, hold))
            for name, horizon in (("myopic", 1), ("mpc", 1 + layout[0])):
                returns, costs, moved, seconds = tso.rolling_policy(
                    played, params, horizon, progress=progress and progress(f"{name}{tag} policy"))
                record(name, returns, costs, moved, seconds)
        elif type(env) is not DistGridEnv:
            raise ValueError(f"no operator baselines for {type(env).__name__}")
    return out
