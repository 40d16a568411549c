"""Seconds per generation of ECWorkflow against a hand-written fused ES loop on identical work.

    python benchmarks/ec_overhead.py   # pop 256 on TSO case14 (T=48) and gymnax CartPole-v1 (T=500), then 64, 1024
    python benchmarks/ec_overhead.py --quick

The hand-written loop is what an expert would write without the library: one
jitted function doing evosax ask -> vmap over the population of a lax.scan
rollout (MLP forward + env step_env, no per-step reset work) -> tell. The
workflow runs the same strategy, network, episodes and horizon, with
observation normalisation off so both do the same arithmetic.
"""
from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import optax
from evosax.algorithms import Open_ES
from jax.flatten_util import ravel_pytree

from evogrid.networks import MLP
from evogrid.workflows import ECConfig, ECWorkflow


def best_time(fn, state, repeats):
    state = fn(state)
    jax.block_until_ready(state)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        state = fn(state)
        jax.block_until_ready(state)
        times.append(time.perf_counter() - t0)
    return min(times)


def hand_written(task_env, params, pop: int, hidden, sigma, lr):
    obs_dim = task_env.observation_space(params).shape[0]
    act_dim = task_env.action_space(params).shape[0]
    model = MLP(tuple(hidden), act_dim)
    flat0, unravel = ravel_pytree(model.init(jax.random.key(0), jnp.zeros(obs_dim)))
    es = Open_ES(population_size=pop, solution=flat0, optimizer=optax.adam(lr), std_schedule=optax.constant_schedule(sigma))
    es_params = es.default_params
    horizon = params.max_steps

    def episode(flat, key):
        p = unravel(flat)
        k_reset, k_run = jax.random.split(key)
        obs, state = task_env.reset(k_reset, params)

        def body(carry, k):
            obs, state, ret, alive = carry
            obs, state, reward, _, done, _ = task_env.step_env(k, state, model.apply(p, obs), params)
            return (obs, state, ret + reward * alive, alive * (1.0 - done)), None

        (_, _, ret, _), _ = jax.lax.scan(body, (obs, state, 0.0, 1.0), jax.random.split(k_run, horizon))
        return ret

    @jax.jit
    def generation(carry):
        es_state, key = carry
        key, k_ask, k_eval, k_tell = jax.random.split(key, 4)
        population, es_state = es.ask(k_ask, es_state, es_params)
        fitness = jax.vmap(episode, in_axes=(0, None))(population, k_eval)
        es_state, _ = es.tell(k_tell, population, -fitness, es_state, es_params)
        return es_state, key

    es_state = es.init(jax.random.key(1), flat0, es_params)
    es_state = jax.tree_util.tree_map(lambda x: jnp.asarray(x, dtype=jnp.asarray(x).dtype), es_state)
    return generation, (es_state, jax.random.key(2))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    repeats = 3 if args.quick else 10
    print(f"# ec_overhead: 1 episode per individual, MLP 32x32, Open_ES, observation normalisation off; jax "
          f"{jax.__version__} on {jax.devices()[0].device_kind}; best of {repeats} generations after the compile")
    print("| task | T | population | ECWorkflow s/gen | hand-written s/gen | ratio | workflow compile s | env-steps/s (workflow) |")
    print("|---|---|---|---|---|---|---|---|")
    rows = [("tso-case14", 256), ("gymnax:CartPole-v1", 256), ("tso-case14", 64), ("tso-case14", 1024)]
    for task, pop in rows[:2] if args.quick else rows:
        cfg = ECConfig(task=task, pop_size=pop, episodes_per_individual=1, obs_norm=False, hidden=(32, 32))
        wf = ECWorkflow(cfg)
        t0 = time.perf_counter()
        state = wf.init()
        jax.block_until_ready(wf.step(state))
        compile_s = time.perf_counter() - t0
        wf_s = best_time(lambda s: wf.step(s)[0], state, repeats)
        fused, carry = hand_written(wf.env, wf.env_params, pop, cfg.hidden, cfg.sigma, cfg.learning_rate)
        hw_s = best_time(fused, carry, repeats)
        horizon = wf.env_params.max_steps
        print(f"| {task} | {horizon} | {pop} | {wf_s:.4f} | {hw_s:.4f} | {wf_s / hw_s:.2f}x | {compile_s:.1f} | "
              f"{pop * horizon / wf_s:,.0f} |", flush=True)


if __name__ == "__main__":
    main()
