"""What skipping per-step resets saves in fitness rollouts.

    python benchmarks/fitness_rollout.py

Population evaluation as ECWorkflow does it (vmap over 256 MLP policies of a
48-step rollout), once with `step_no_reset` (what the workflow uses: episodes
end exactly at the horizon) and once forced through the auto-reset step, whose
`where` makes vmap evaluate a reset on every step.
"""
from __future__ import annotations

import time

import jax

from evogrid.envs import make
from evogrid.envs.wrappers import TrainingWrapper
from evogrid.networks import make_vmap_mlp
from evogrid.rollout import rollout


def best(fn, *args, repeats=10):
    jax.block_until_ready(fn(*args))
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        out.append(time.perf_counter() - t0)
    return min(out)


def main(pop: int = 256):
    print(f"# fitness_rollout: population {pop} x 1 episode x 48 steps, MLP 32x32; jax {jax.__version__} on "
          f"{jax.devices()[0].device_kind}; best of 10 calls")
    print("| task | no-reset s | auto-reset s | auto-reset / no-reset |")
    print("|---|---|---|---|")
    for task in ("tso-case14", "tso-case118", "tso-case14-ac"):
        env, params = make(task)
        model, init_pop, _ = make_vmap_mlp(env.observation_space(params).shape[0], env.action_space(params).shape[0])
        pop_params = init_pop(jax.random.key(0), pop)
        batch = TrainingWrapper(env, 1)
        times = []
        for auto_reset in (False, True):
            def one(p, key, auto_reset=auto_reset):
                metrics, _ = rollout(batch, lambda o: model.apply(p, o), key, params.max_steps, params,
                                     obs_moments=False, auto_reset=auto_reset)
                return metrics["episode_return"]

            fn = jax.jit(jax.vmap(one, in_axes=(0, None)))
            times.append(best(fn, pop_params, jax.random.key(1)))
        print(f"| {task} | {times[0]:.4f} | {times[1]:.4f} | {times[1] / times[0]:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
