"""JAX helpers: the EvoRL-style jit boundary and the PowerZooJax batch/scan helpers.

`batch_reset`, `batch_step`, `scan_rollout` and `split_key_for_envs` keep the
signatures and return tuples of the PowerZooJax parallelization contract
(shared/reference/powerzoojax-jax-parallelization.txt).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


def jit_method(*, static_argnums=(0,), static_argnames=None, donate_argnums=()):
    """Decorate a method with `jax.jit`, treating `self` (argument 0) as static.

    `self` is hashed by identity, so configuration stored on the instance is a
    compile-time constant: build the object once and reuse it, or each new
    instance compiles again. Apply at class definition, never by patching.
    """
    if 0 not in tuple(static_argnums):
        static_argnums = (0, *static_argnums)

    def decorator(fn):
        return functools.wraps(fn)(
            jax.jit(fn, static_argnums=static_argnums, static_argnames=static_argnames, donate_argnums=donate_argnums)
        )

    return decorator


def rng_split(key: jax.Array, num: int = 2) -> jax.Array:
    """Split a PRNG key (new-style `jax.random.key` or legacy `PRNGKey`) into `num` keys."""
    return jax.random.split(key, num)


def tree_stop_gradient(tree):
    return jax.tree_util.tree_map(jax.lax.stop_gradient, tree)


def split_key_for_envs(key: jax.Array, n_envs: int) -> jax.Array:
    """One independent key per environment: [n_envs] keys."""
    return jax.random.split(key, n_envs)


def batch_reset(env, keys, params):
    """`jax.vmap(env.reset, in_axes=(0, None))`: keys batched, params broadcast. Returns (obs, states)."""
    return jax.vmap(env.reset, in_axes=(0, None))(keys, params)


def batch_step(env, keys, states, actions, params):
    """Step a batch with auto-reset (`env.step_auto_reset`); params broadcast.

    Returns (obs, states, rewards, costs, dones, infos), each with a leading [n_envs] axis.
    """
    return jax.vmap(env.step_auto_reset, in_axes=(0, 0, 0, None))(keys, states, actions, params)


def scan_rollout(env, key, init_state, params, actions):
    """Fixed-length rollout of one env under `lax.scan` with pre-generated actions.

    actions: [T, *action_shape]. The key is split into T step keys before the scan.
    Returns (final_state, obs_traj, reward_traj, cost_traj, done_traj, info_traj), stacked on T.
    """
    keys = jax.random.split(key, actions.shape[0])

    def body(state, xs):
        k, a = xs
        obs, state, reward, costs, done, info = env.step_auto_reset(k, state, a, params)
        return state, (obs, reward, costs, done, info)

    final_state, (obs, rewards, costs, dones, infos) = jax.lax.scan(body, init_state, (keys, actions))
    return final_state, obs, rewards, costs, dones, infos


def tree_where(cond, on_true, on_false):
    """Leaf-wise `jnp.where(cond, a, b)` over two pytrees of the same structure (cond is a scalar)."""
    return jax.tree_util.tree_map(lambda a, b: jnp.where(cond, a, b), on_true, on_false)
