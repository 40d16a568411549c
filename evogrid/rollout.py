"""The one rollout path: every episode loop in evogrid is `collect`.

`collect(env, params, policy, key, state, obs, steps)` runs a policy for `steps` steps under
`lax.scan` and returns the stacked `Transition`s. Each transition carries the observation the
action was chosen on, the true next observation (before any reset), and whether the episode
ended by termination (no bootstrap) or by the time limit `params.max_steps` (truncation:
bootstrap from `next_obs`). With `reset=True` finished episodes restart inside the loop
(`env.auto_reset`, the same reset as `env.step` performs, with the step key's `reset_key`); with
`reset=False` the loop never resets, which is what fixed-horizon fitness and evaluation rollouts
want (under vmap an auto-reset evaluates a reset on every step). A `fold(acc, transition) -> acc`
reduces transitions on the fly (episode returns, observation moments) without stacking them. Unused
outputs are dropped by XLA.

Built on it: `rollout` (episode metrics of a policy from a fresh reset: EC fitness and
evaluation), `EpisodeStats`/`track_episodes` (running returns of a continuing batch: PPO, TD3,
SAC), `scan_rollout` and `batch_reset`/`batch_step`/`split_key_for_envs` (the PowerZooJax
helpers, also importable from `evogrid.utils.jax_utils`), and `make_random_rollout`.

Keys: `collect` splits its key into one key k_t per step and treats k_t exactly as `env.step`
does (the transition's key, and `reset_key(k_t)` the reset's); the policy's key is
`fold_in(k_t, 1)`. All of them are derived before the loop (vectorised), not inside it.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from evogrid.utils.jaxprs import equations


POLICY_STREAM = 1  # fold_in constant that separates the policy's key from the environment's
RESET_STREAM = 0x9E3779B9   # xor'ed into every word of a step's key to give its auto-reset's key (`reset_key`)


def reset_key(key: jax.Array) -> jax.Array:
    """The key of a step's auto-reset, from the step's own `key` without hashing: every word of the key's data
    xor `RESET_STREAM`. For the hash-based generators (threefry, rbg) another key is another, independent
    stream; the reset's `uniform_index` reads the new key's bits, which nothing else reads (a step uses its key
    only through the hash). `jax.random.split` would cost a hash per env and step: on 2 CPU cores a rolled
    loop that took a sixth of tso-case14's step (256 envs)."""
    typed = jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
    bits = jax.random.key_data(key) if typed else key
    bits = bits ^ jnp.asarray(RESET_STREAM, bits.dtype)
    return jax.random.wrap_key_data(bits, impl=jax.random.key_impl(key)) if typed else bits


class Transition(NamedTuple):
    """One step; stacked by `collect` on a leading [T] axis ([T, *B, ...] for a batch *B)."""

    obs: jnp.ndarray         # [*B, obs_dim] the observation the action was chosen on
    action: jnp.ndarray      # [*B, act_dim]
    reward: jnp.ndarray      # [*B]
    costs: jnp.ndarray       # [*B, C] constraint cost channels
    next_obs: jnp.ndarray    # [*B, obs_dim] true next observation (the final one when the episode ended)
    terminated: jnp.ndarray  # [*B] bool: the env ended the episode (do not bootstrap)
    truncated: jnp.ndarray   # [*B] bool: the time limit ended it (bootstrap from next_obs)
    info: Any                # the env's info pytree
    aux: Any                 # what the policy returned beside the action (log-probs, ...)

    @property
    def done(self):
        return self.terminated | self.truncated


LOOP_BLOCK = 8   # steps an iteration of a rollout's loop on an accelerator (`scan_steps`)
BLOCK_MAX_OPS = 500   # a step of more operations (traced, loops' bodies included) runs one an iteration


def scan_steps(body, carry, xs, steps: int, block: int | None = None):
    """`jax.lax.scan(body, carry, xs)` over `steps` steps, `block` of them an iteration of the loop, their
    outputs stacked and written together: the same steps, to float rounding (XLA fuses the block's steps
    together), and `block` copies of the body to compile. A loop that stacks each step's outputs writes a
    step's slice of the trajectory into the accelerator's tiles of eight rows one row at a time; a block of 8
    fills them (TPU v5e: rollouts that keep their outputs up to 1.4x faster; docs/accelerator.md).
    Default: LOOP_BLOCK on an accelerator where it divides `steps` and the step is small (at most
    BLOCK_MAX_OPS operations: the bare envs' 175-354), else 1: the CPU, where blocks only add compile time,
    and the steps behind a safety layer (900-8,600 operations), whose loops hold their time (blocks gained
    1.00-1.10x there and multiplied the compile: tso-case14-ac behind the voltage schedule 30 s -> 180 s)."""
    if block is None:
        block = LOOP_BLOCK if jax.default_backend() != "cpu" and steps % LOOP_BLOCK == 0 else 1
        if block > 1:
            ops = sum(1 for _ in equations(jax.make_jaxpr(body)(carry, jax.tree.map(lambda x: x[0], xs))))
            block = block if ops <= BLOCK_MAX_OPS else 1
    if not isinstance(block, int) or block < 1 or steps % block:
        raise ValueError(f"block must be a positive divisor of the {steps} steps, got {block!r}")
    if block == 1:
        return jax.lax.scan(body, carry, xs)

    def blocked(carry, xs):
        outs = []
        for i in range(block):
            carry, out = body(carry, jax.tree.map(lambda x: x[i], xs))
            outs.append(out)
        return carry, jax.tree.map(lambda *o: jnp.stack(o), *outs)

    carry, ys = jax.lax.scan(blocked, carry, jax.tree.map(lambda x: x.reshape(steps // block, block, *x.shape[1:]), xs))
    return carry, jax.tree.map(lambda y: y.reshape(steps, *y.shape[2:]), ys)


def collect(env, params, policy, key, state, obs, steps: int, *, reset: bool = True, inputs=None, fold=None, acc=None,
            until=None, block: int = 1):
    """Run `policy` in `env` (a single env or a `TrainingWrapper` batch) for `steps` steps.

    policy(key, obs) -> (action, aux), or policy(key, obs, x) with `inputs` (per-step values
    [steps, ...], e.g. pre-generated actions). Returns (state, obs, transitions, acc): the
    carry after the last step (ready to continue), the stacked `Transition`s, and the folded
    accumulator. With `reset=True` the carried obs and state pass `stop_gradient` (as
    `env.step_auto_reset` does). With `until(acc) -> bool` the loop is a `while_loop` that also
    stops once `until` holds (e.g. every episode of the batch has ended): transitions are then
    not kept (None), and the steps it skips are the ones that would not change `acc`. `block`: steps an
    iteration of the scan (`scan_steps`; one by default: a training step's time is in its updates, where
    blocks gain nothing and multiply the compile time; docs/accelerator.md).
    """
    k_step = jax.random.split(key, steps)
    k_reset = reset_key(k_step)
    k_act = jax.vmap(lambda k: jax.random.fold_in(k, POLICY_STREAM))(k_step)

    def body(carry, xs):
        state, obs, acc = carry
        ks, kr, ka, x = xs
        action, aux = policy(ka, obs) if inputs is None else policy(ka, obs, x)
        next_obs, next_state, reward, costs, done, info = env.step_no_reset(ks, state, action, params)
        truncated = done & (next_state.time_step >= params.max_steps)
        tr = Transition(obs, action, reward, costs, next_obs, done & ~truncated, truncated, info, aux)
        if fold is not None:
            acc = fold(acc, tr)
        if reset:
            next_obs, next_state = jax.lax.stop_gradient(env.auto_reset(kr, next_obs, next_state, done, params))
        return (next_state, next_obs, acc), tr

    if until is not None:
        def keep_going(carry):
            t, _, _, acc = carry
            return (t < steps) & ~until(acc)

        def one(carry):
            t, state, obs, acc = carry
            x = None if inputs is None else jax.tree_util.tree_map(lambda v: v[t], inputs)
            (state, obs, acc), _ = body((state, obs, acc), (k_step[t], k_reset[t], k_act[t], x))
            return t + 1, state, obs, acc

        _, state, obs, acc = jax.lax.while_loop(keep_going, one, (jnp.int32(0), state, obs, acc))
        return state, obs, None, acc
    (state, obs, acc), traj = scan_steps(body, (state, obs, acc), (k_step, k_reset, k_act, inputs), steps, block)
    return state, obs, traj, acc


def deterministic(policy):
    """Lift `policy(obs) -> action` to the `collect` signature (no key, no aux)."""
    return lambda key, obs: (policy(obs), None)


def rollout(env, policy, rng, max_steps: int, params, *, keep_trajectory: bool = False, obs_moments: bool = True,
            auto_reset: bool | None = None, start=None, info_sums=()):
    """Episode metrics of `policy(obs) -> action` over `max_steps` steps from a fresh reset.

    `start`: (obs, state) to begin from instead of `env.reset(k, params)` (e.g. chosen days).
    Returns (metrics, trajectories):
      metrics: episode_return [*B] (sum of rewards up to and including the first `done`; when
        `max_steps` crosses episode boundaries, the sum over all of them), episode_cost [*B, C]
        (same span), episode_length [*B], and (with `obs_moments`) obs_mean / obs_var [obs_dim]
        and obs_count over every observation the policy saw in a live episode; for each name in
        `info_sums`, that per-step `info` entry summed over the same span (e.g. "layer_moved"; a vector
        entry such as "dispatch_mw" [*B, n_units] is summed entry by entry).
      trajectories: None, or with `keep_trajectory` a dict of obs, action, reward, costs, done [max_steps, *B, ...].
    *B is the batch shape of the env (empty for a single env, [num_envs] for a TrainingWrapper).
    `auto_reset` forces the step kind (default: resets only when `max_steps` exceeds the horizon).
    """
    k_reset, k_steps = jax.random.split(rng)
    obs, state = env.reset(k_reset, params) if start is None else start
    crosses = max_steps > params.max_steps if auto_reset is None else auto_reset
    obs_dim = obs.shape[-1]
    batch = obs.shape[:-1]

    def fold(acc, tr: Transition):
        alive, ret, cost, length, s1, s2, count, sums = acc
        sums = {k: v + jnp.where(alive.reshape(alive.shape + (1,) * (v.ndim - alive.ndim)), tr.info[k], 0.0)
                for k, v in sums.items()}
        if obs_moments:
            flat = tr.obs.reshape(-1, obs_dim) * alive.reshape(-1, 1)
            s1, s2, count = s1 + flat.sum(0), s2 + (flat * flat).sum(0), count + alive.sum()
        ret = ret + jnp.where(alive, tr.reward, 0.0)
        cost = cost + jnp.where(alive[..., None], tr.costs, 0.0)
        length = length + alive.astype(jnp.int32)
        # without resets an episode that ends early must stop counting (a terminated gymnax env keeps stepping)
        alive = alive if crosses else alive & ~tr.done
        return alive, ret, cost, length, s1, s2, count, sums

    n_costs = env.num_constraints(params)
    zeros = jnp.zeros((obs_dim,), obs.dtype)
    info = {}
    if info_sums:   # the shapes of the summed entries (vectors too, e.g. a dispatch [*B, n_units]), from a trace
        step = jax.eval_shape(lambda: env.step_no_reset(k_steps, state, policy(obs), params))
        info = {k: step[-1][k].shape for k in info_sums}
    acc0 = (jnp.ones(batch, bool), jnp.zeros(batch, obs.dtype), jnp.zeros(batch + (n_costs,), obs.dtype),
            jnp.zeros(batch, jnp.int32), zeros, zeros, jnp.zeros((), obs.dtype), {k: jnp.zeros(info[k], obs.dtype) for k in info_sums})
    # episodes that can end before the horizon (gymnax): stop once every one has (nothing changes after)
    until = (lambda acc: ~jnp.any(acc[0])) if getattr(env, "ends_early", False) and not crosses and not keep_trajectory else None
    _, _, traj, acc = collect(env, params, deterministic(policy), k_steps, state, obs, max_steps, reset=crosses,
                              fold=fold, acc=acc0, until=until)
    _, ret, cost, length, s1, s2, n, sums = acc
    metrics = {"episode_return": ret, "episode_cost": cost, "episode_length": length, **sums}
    if obs_moments:
        n = jnp.maximum(n, 1.0)
        mean = s1 / n
        metrics.update(obs_mean=mean, obs_var=jnp.maximum(s2 / n - mean * mean, 0.0), obs_count=n)
    trajectories = None
    if keep_trajectory:
        trajectories = {"obs": traj.obs, "action": traj.action, "reward": traj.reward, "costs": traj.costs, "done": traj.done}
    return metrics, trajectories


def play_days(env, params, policy, days=None, key=None, info_sums=(), obs_moments=False):
    """Each of `days` (default every day of `params`) played once from its start of day by
    `policy(obs) -> action`, vmapped over the days (traceable and differentiable; jit it or call it inside
    jit): the metrics of `rollout` (observation moments only with `obs_moments`), with a leading [n_days]
    axis. `key` (default key 0) seeds the same step keys on every day."""
    days = jnp.arange(env.num_days(params), dtype=jnp.int32) if days is None else jnp.asarray(days, jnp.int32)
    key = jax.random.key(0) if key is None else key

    def one(day):
        return rollout(env, policy, key, params.max_steps, params, obs_moments=obs_moments,
                       start=env.reset_to_day(day, params), info_sums=info_sums)[0]

    return jax.vmap(one)(days)


@struct.dataclass
class EpisodeStats:
    """Running episode sums of a continuing batch of N envs, and the latest finished episodes' means."""

    running_return: jnp.ndarray   # [N]
    running_cost: jnp.ndarray     # [N, C]
    last_return: jnp.ndarray      # [] mean return of the latest finished episodes
    last_cost: jnp.ndarray        # [C] their mean summed costs per channel

    @classmethod
    def create(cls, n_envs: int, n_costs: int) -> EpisodeStats:
        zero = jnp.zeros(())
        return cls(jnp.zeros((n_envs,)), jnp.zeros((n_envs, n_costs)), zero, jnp.zeros((n_costs,)))


def track_episodes(stats: EpisodeStats, tr: Transition) -> EpisodeStats:
    """A `collect` fold: add a step to the running sums; where episodes end, record their means."""
    ret = stats.running_return + tr.reward
    cost = stats.running_cost + tr.costs
    done = tr.done
    n = done.sum()
    any_done = n > 0
    last_ret = jnp.where(any_done, jnp.sum(ret * done) / jnp.maximum(n, 1), stats.last_return)
    last_cost = jnp.where(any_done, jnp.sum(cost * done[:, None], 0) / jnp.maximum(n, 1), stats.last_cost)
    return EpisodeStats(jnp.where(done, 0.0, ret), jnp.where(done[:, None], 0.0, cost), last_ret, last_cost)


# --- the PowerZooJax helpers (signatures and return tuples of the reference contract) ------------------

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


def scan_rollout(env, key, init_state, params, actions, block: int | None = None):
    """Fixed-length auto-reset rollout of one env with pre-generated actions [T, *action_shape].

    Step t uses the t-th key of `jax.random.split(key, T)` exactly as `env.step_auto_reset` would (the
    keys `collect` gives its steps). Returns (final_state, obs_traj, reward_traj, cost_traj, done_traj,
    info_traj), stacked on T; obs_traj[t] is the observation after step t (already the next episode's after
    a `done`). Each step's outputs are stacked as the step makes them: stacking the observation carried into
    the next step (as `collect`'s transitions do) and shifting it after the loop copied the whole trajectory
    once more (TPU v5e, tso-case118, 16,384 envs: 9% of the rollout). `block`: steps an iteration of the
    loop (`scan_steps`).
    """
    k_step = jax.random.split(key, actions.shape[0])

    def body(state, xs):
        ks, kr, action = xs
        obs, state, reward, costs, done, info = env.step_no_reset(ks, state, action, params)
        obs, state = jax.lax.stop_gradient(env.auto_reset(kr, obs, state, done, params))
        return state, (obs, reward, costs, done, info)

    final_state, (obs, reward, costs, done, info) = scan_steps(body, init_state, (k_step, reset_key(k_step), actions),
                                                              actions.shape[0], block)
    return final_state, obs, reward, costs, done, info


def make_random_rollout(env, params, n_envs: int, horizon: int, block: int | None = None):
    """Return `collect(key) -> (reward [N, T], costs [N, T, C], done [N, T], info)` with uniform random
    actions, jitted (the PowerZooJax "complete pattern"). Build it once and call it many times: params
    are an argument of the compiled program (not baked in), so new values of the same shapes reuse it.
    `block`: steps an iteration of the loop (`scan_steps`)."""
    n_act = env.action_space(params).shape

    @jax.jit
    def run(key, params):
        k_reset, k_act, k_roll = jax.random.split(key, 3)
        _, states = batch_reset(env, split_key_for_envs(k_reset, n_envs), params)
        actions = jax.random.uniform(k_act, (n_envs, horizon, *n_act), minval=-1.0, maxval=1.0)
        one = lambda s, k, a: scan_rollout(env, k, s, params, a, block)  # noqa: E731
        _, _, reward, costs, done, info = jax.vmap(one)(states, split_key_for_envs(k_roll, n_envs), actions)
        return reward, costs, done, info

    return lambda key, p=params: run(key, p)
