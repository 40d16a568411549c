"""One command for an accelerator: env-steps/s of tso-case14 (DC) at large batches and ECWorkflow seconds per
generation at large populations, with the device's name and memory.

    python benchmarks/gpu.py            # N = 4096 .. 65536 envs, populations 4096 and 16384
    python benchmarks/gpu.py --smoke    # small sizes: runs anywhere (CPU included) as its own smoke test

Envs: the PowerZooJax pattern (batch_reset, uniform actions [N, T, A], vmap(scan_rollout)), T = 48, best of
`--repeats` calls after the compile. ECWorkflow: Open_ES, one 48-step episode per individual, MLP 32x32,
observation normalisation off, best of `--repeats` generations after the first (compile) one.
"""
from __future__ import annotations

import argparse
import time

import jax
from _timing import time_steps


def device_line() -> str:
    dev = jax.devices()[0]
    stats = dev.memory_stats() if hasattr(dev, "memory_stats") else None
    memory = f", {stats['bytes_limit'] / 2**30:.1f} GiB" if stats and "bytes_limit" in stats else ""
    return f"{dev.platform.upper()} {dev.device_kind} x{jax.device_count()}{memory}; jax {jax.__version__}"


def env_rate(n_envs: int, repeats: int) -> float:
    from evogrid.envs import make
    from evogrid.rollout import make_random_rollout

    env, params = make("tso-case14")
    run = make_random_rollout(env, params, n_envs, params.max_steps)
    jax.block_until_ready(run(jax.random.key(0)))
    best = float("inf")
    for i in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(run(jax.random.key(i + 1)))
        best = min(best, time.perf_counter() - t0)
    return n_envs * params.max_steps / best


def ec_seconds(pop: int, repeats: int) -> tuple[float, float]:
    from evogrid.workflows import ECConfig, ECWorkflow

    wf = ECWorkflow(ECConfig(task="tso-case14", pop_size=pop, episodes_per_individual=1, obs_norm=False))
    return time_steps(wf, repeats)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="small sizes (any machine)")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    sizes = (256,) if args.smoke else (4096, 16384, 65536)
    pops = (16,) if args.smoke else (4096, 16384)
    print(f"# {device_line()}")
    print("| tso-case14 DC envs N | env-steps/s |")
    print("|---|---|")
    for n in sizes:
        print(f"| {n:,} | {env_rate(n, args.repeats):,.0f} |", flush=True)
    print("\n| ECWorkflow Open_ES population | s / generation | env-steps/s | first generation (compile) s |")
    print("|---|---|---|---|")
    for pop in pops:
        s, c = ec_seconds(pop, args.repeats)
        print(f"| {pop:,} | {s:.4f} | {pop * 48 / s:,.0f} | {c:.1f} |", flush=True)


if __name__ == "__main__":
    main()
