"""The `evogrid` command.

    evogrid                      # = evogrid rollout: batched random-policy TSO rollout on case14, summary table
    evogrid rollout --task tso-case118-ac --envs 64 --steps 48
    evogrid cases                # shipped grid cases
    evogrid tasks                # registered task names
"""
from __future__ import annotations

import argparse
import sys
import time


def _rollout(args) -> int:
    import jax
    import numpy as np

    from evogrid.envs import make
    from evogrid.rollout import make_random_rollout

    try:
        env, params = make(args.task, max_steps=args.steps)
    except ValueError as err:
        print(f"evogrid: {err}", file=sys.stderr)
        return 2
    print(f"evogrid: {args.envs} x {args.steps}-step random-policy rollouts of {args.task} "
          f"on {jax.devices()[0].platform.upper()} (one compiled program)", flush=True)
    collect = make_random_rollout(env, params, args.envs, args.steps)
    key_compile, key_run = jax.random.split(jax.random.key(args.seed))
    t0 = time.perf_counter()
    jax.block_until_ready(collect(key_compile))
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    reward, costs, done, info = jax.block_until_ready(collect(key_run))
    run_s = time.perf_counter() - t0
    steps = args.envs * args.steps
    episode_return = np.asarray(reward).sum(axis=1)
    rows = [
        ("env steps", f"{steps:,}"),
        ("first call (compile + run)", f"{compile_s:.2f} s"),
        ("second call", f"{run_s * 1e3:.1f} ms"),
        ("throughput", f"{steps / run_s:,.0f} env-steps/s"),
        ("episode return (mean ± std)", f"{episode_return.mean():.2f} ± {episode_return.std():.2f}"),
        ("generation cost per step", f"{float(np.asarray(info['gen_cost']).mean()):,.0f} $"),
    ]
    for name, total in zip(env.constraint_names(params), np.asarray(costs).sum(axis=1).mean(axis=0)):
        rows.append((f"cost '{name}' per episode", f"{total:.3f} p.u."))
    width = max(len(r[0]) for r in rows)
    print("\n".join(f"  {name:<{width}}  {value}" for name, value in rows))
    return 0


def _cases(args) -> int:
    from evogrid.case import list_cases, load_case

    for name in list_cases():
        c = load_case(name)
        print(f"  {name:>5}  buses {c.n_bus:>4}  units {c.n_units:>3}  branches {c.n_branch:>4}")
    return 0


def _tasks(args) -> int:
    from evogrid.envs import list_tasks

    print("\n".join(f"  {t}" for t in list_tasks()))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="evogrid", description="Evolutionary RL on JAX power-system environments.")
    sub = parser.add_subparsers(dest="command")
    ro = sub.add_parser("rollout", help="batched random-policy rollout with a summary table (the default)")
    ro.add_argument("--task", default="tso-case14", help="task name, see `evogrid tasks` (default tso-case14)")
    ro.add_argument("--envs", type=int, default=256, help="parallel environments (default 256)")
    ro.add_argument("--steps", type=int, default=48, help="steps per episode (default 48 half-hours)")
    ro.add_argument("--seed", type=int, default=0)
    sub.add_parser("cases", help="list shipped grid cases")
    sub.add_parser("tasks", help="list task names for `make`")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.command is None:
        args = parser.parse_args(["rollout"])
    if args.command == "rollout" and (args.envs < 1 or args.steps < 1):
        parser.error("--envs and --steps must be positive")
    return {"rollout": _rollout, "cases": _cases, "tasks": _tasks}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
