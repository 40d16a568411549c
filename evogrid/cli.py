"""The `evogrid` command.

    evogrid                      # = evogrid train: Open_ES on TSO case14 with the defaults below
    evogrid train --algorithm CMA_ES --task tso-case5 --pop 32 --generations 100 --out runs/cma5
    evogrid train --out runs/cma5 --algorithm CMA_ES --task tso-case5 --pop 32 --generations 200 --resume
    evogrid train --distributed --coordinator host0:12355 --num-processes 2 --process-id 0   # one per host
    evogrid eval runs/cma5       # replay the best policy, print its return and cost channels
    evogrid rollout --task tso-case118-ac --envs 64 --steps 48   # random-policy throughput table
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
    ]
    for name, values in sorted(info.items()):
        rows.append((f"info '{name}' (mean per step)", f"{float(np.asarray(values).mean()):,.4g}"))
    for name, total in zip(env.constraint_names(params), np.asarray(costs).sum(axis=1).mean(axis=0)):
        rows.append((f"cost '{name}' per episode", f"{total:.3f} p.u."))
    width = max(len(r[0]) for r in rows)
    print("\n".join(f"  {name:<{width}}  {value}" for name, value in rows))
    return 0


def _train(args) -> int:
    import json
    from pathlib import Path

    import jax

    if args.distributed and not args.out:
        print("evogrid: --distributed needs --out (a directory every process can reach)", file=sys.stderr)
        return 2
    if args.distributed:  # before any JAX computation
        from evogrid.utils.sharding import initialize_distributed

        try:
            initialize_distributed(args.coordinator, args.num_processes, args.process_id)
        except (ValueError, RuntimeError) as err:
            print(f"evogrid: cannot start the distributed runtime: {err}\n(pass --coordinator HOST:PORT "
                  "--num-processes N --process-id I, or run under SLURM / Open MPI)", file=sys.stderr)
            return 2
    primary = jax.process_index() == 0

    values = {}
    if args.config:
        try:
            values = json.loads(Path(args.config).read_text())
        except (OSError, json.JSONDecodeError) as err:
            print(f"evogrid: cannot read --config {args.config}: {err}", file=sys.stderr)
            return 2
    for opt, key in (("algorithm", "algorithm"), ("task", "task"), ("pop", "pop_size"), ("episodes", "episodes_per_individual"),
                     ("seed", "seed"), ("sigma", "sigma"), ("lr", "learning_rate"), ("cost_penalty", "cost_penalty"),
                     ("hidden", "hidden"), ("envs", "num_envs"), ("cost_budget", "cost_budget")):
        if getattr(args, opt) is not None:
            values[key] = getattr(args, opt)
    try:
        config, workflow = _workflow(values)
    except ValueError as err:
        print(f"evogrid: {err}", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else Path("runs") / f"{config.task}-{config.algorithm}-{time.strftime('%Y%m%d-%H%M%S')}"
    if primary:
        n_dev, n_proc = jax.device_count(), jax.process_count()
        size = (f"population {config.pop_size} x {config.episodes_per_individual} episodes"
                if hasattr(config, "episodes_per_individual") else f"population {config.pop_size} + a TD3 learner"
                if hasattr(config, "inject_every") else f"{config.num_envs} envs x {config.rollout_len} steps per iteration")
        print(f"evogrid train: {config.algorithm} on {config.task}, {size}, {args.generations} iterations on {n_dev} "
              f"{jax.devices()[0].platform.upper()} device(s)" + (f" in {n_proc} processes" if n_proc > 1 else "")
              + f" -> {out}", flush=True)
    state = workflow.init()
    try:
        state, history = workflow.learn(state, args.generations, run_dir=out, checkpoint_every=args.checkpoint_every,
                                        resume=args.resume)
    except (FileExistsError, RuntimeError) as err:
        print(f"evogrid: {err}", file=sys.stderr)
        return 2
    if not primary:
        workflow.evaluate(state)  # a collective computation: every process takes part
        return 0
    _plot(out, history)
    if history:
        first, last = history[0], history[-1]
        if "best_fitness" in last:
            print(f"fitness (best of population): generation {first['generation']}: {first['fitness_max']:.2f} -> "
                  f"generation {last['generation']}: {last['fitness_max']:.2f}; best so far {last['best_fitness']:.2f}")
        else:
            key, label = ("return", "training episode return") if "return" in last else ("fitness_max", "best fitness")
            print(f"{label}: iteration {first['generation']}: {first[key]:.2f} -> iteration {last['generation']}: "
                  f"{last[key]:.2f}")
    _report(workflow, state)
    print(f"metrics: {out / 'metrics.jsonl'}, {out / 'metrics.csv'}; curve: {out / 'learning_curve.png'}; "
          f"checkpoints: {out / 'checkpoints'}")
    return 0


def _workflow(values: dict):
    """(config, workflow) for an EC algorithm (ECWorkflow), an RL one (RLWorkflow: ppo, td3) or an
    ERL hybrid (ERLWorkflow: erl, cemrl)."""
    from evogrid.workflows import ECConfig, ECWorkflow, RL_ALGORITHMS, RLConfig, RLWorkflow
    from evogrid.workflows.erl import ERL_ALGORITHMS, ERLConfig, ERLWorkflow

    families = ((ERL_ALGORITHMS, ERLConfig, ERLWorkflow, {"episodes_per_individual", "sigma", "cost_penalty", "num_envs"}),
                (RL_ALGORITHMS, RLConfig, RLWorkflow, {"pop_size", "episodes_per_individual", "sigma", "cost_penalty"}))
    for names, config_cls, workflow_cls, not_here in families:
        if values.get("algorithm") in names:
            wrong = sorted(set(values) & not_here)
            if wrong:
                raise ValueError(f"{', '.join(wrong)} do not apply to {values['algorithm']}")
            config = config_cls.from_dict({"task": "tso-case14", **values})
            return config, workflow_cls(config)
    if {"num_envs", "cost_budget"} & set(values):
        raise ValueError("--envs and --cost-budget apply to the RL algorithms (ppo, td3)")
    defaults = {"task": "tso-case14", "pop_size": 64, "episodes_per_individual": 4, "cost_penalty": 1.0}
    config = ECConfig.from_dict({**defaults, **values})
    return config, ECWorkflow(config)


def _report(workflow, state) -> None:
    import numpy as np

    ev = workflow.evaluate(state)
    names = workflow.env.constraint_names(workflow.env_params)
    print(f"best policy over {workflow.config.eval_episodes} fresh episodes: return {float(ev['return']):.2f} "
          f"± {float(ev['return_std']):.2f}")
    for name, value in zip(names, np.asarray(ev["cost_channels"])):
        print(f"  cost '{name}' per episode  {value:.4f}")


def _plot(out, history) -> None:
    if not history:
        return
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("evogrid: matplotlib not installed; no learning-curve PNG", file=sys.stderr)
        return
    gens = [r["generation"] for r in history]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.5))
    for key in ("fitness_max", "fitness_mean", "best_fitness", "return"):
        if key in history[-1]:
            ax1.plot(gens, [r[key] for r in history], label=key)
    ax1.set_xlabel("generation"), ax1.set_ylabel("fitness / return"), ax1.legend()
    cost_key = "cost_mean" if "cost_mean" in history[-1] else "episode_cost"
    ax2.plot(gens, [r[cost_key] for r in history], color="tab:red")
    ax2.set_xlabel("generation"), ax2.set_ylabel("mean summed costs (p.u.)")
    fig.tight_layout()
    fig.savefig(out / "learning_curve.png", dpi=100)
    plt.close(fig)


def _eval(args) -> int:
    import json
    from pathlib import Path

    from evogrid.utils.checkpoint import Checkpointer

    run = Path(args.run_dir)
    if not (run / "config.json").exists():
        print(f"evogrid: {run} is not a run directory (no config.json); pass the --out of `evogrid train`", file=sys.stderr)
        return 2
    config, workflow = _workflow(json.loads((run / "config.json").read_text()))
    restored = Checkpointer(run / "checkpoints", config.to_dict()).restore_latest(workflow.init())
    if restored is None:
        print(f"evogrid: no checkpoint in {run / 'checkpoints'}", file=sys.stderr)
        return 2
    step, state = restored
    print(f"evogrid eval: {config.algorithm} on {config.task}, checkpoint of generation {step}")
    _report(workflow, state)
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
    from evogrid.workflows.ec import ALGORITHMS
    from evogrid.workflows.erl import ERL_ALGORITHMS
    from evogrid.workflows.rl import RL_ALGORITHMS

    tr = sub.add_parser("train", help="evolve a policy (the default command)")
    tr.add_argument("--algorithm", choices=ALGORITHMS + RL_ALGORITHMS + ERL_ALGORITHMS,
                    help="default Open_ES; ppo and td3 train by gradient; erl and cemrl are hybrids")
    tr.add_argument("--task", help="task name, see `evogrid tasks` (default tso-case14)")
    tr.add_argument("--pop", type=int, help="population size (default 64)")
    tr.add_argument("--generations", type=int, default=300, help="total generations (default 300)")
    tr.add_argument("--episodes", type=int, help="episodes per individual (default 4)")
    tr.add_argument("--seed", type=int)
    tr.add_argument("--sigma", type=float, help="initial search std / mutation scale (default 0.05)")
    tr.add_argument("--lr", type=float, help="ES learning rate (default 0.03)")
    tr.add_argument("--cost-penalty", type=float, help="lambda in fitness = return - lambda * costs (default 1.0)")
    tr.add_argument("--hidden", type=int, nargs="+", help="MLP widths (default 32 32; RL 64 64)")
    tr.add_argument("--envs", type=int, help="RL: parallel environments (default 16)")
    tr.add_argument("--cost-budget", type=float, help="RL: episode cost budget for the Lagrange multiplier (default off)")
    tr.add_argument("--config", help="JSON file of ECConfig (or, for ppo/td3, RLConfig) keys; command-line options override it")
    tr.add_argument("--out", help="run directory (default runs/<task>-<algorithm>-<time>)")
    tr.add_argument("--checkpoint-every", type=int, default=25, help="generations between checkpoints (default 25)")
    tr.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --out")
    tr.add_argument("--distributed", action="store_true",
                    help="multi-host run: start jax.distributed (options below, EVOGRID_* variables, or SLURM/MPI detection)")
    tr.add_argument("--coordinator", help="with --distributed: HOST:PORT of process 0")
    tr.add_argument("--num-processes", type=int, help="with --distributed: number of processes")
    tr.add_argument("--process-id", type=int, help="with --distributed: this process's index")
    ev = sub.add_parser("eval", help="replay the best policy of a run")
    ev.add_argument("run_dir")
    ro = sub.add_parser("rollout", help="batched random-policy rollout with a summary table (the default)")
    ro.add_argument("--task", default="tso-case14", help="task name, see `evogrid tasks` (default tso-case14)")
    ro.add_argument("--envs", type=int, default=256, help="parallel environments (default 256)")
    ro.add_argument("--steps", type=int, default=48, help="steps per episode (default 48 half-hours)")
    ro.add_argument("--seed", type=int, default=0)
    sub.add_parser("cases", help="list shipped grid cases")
    sub.add_parser("tasks", help="list task names for `make`")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.command is None:
        args = parser.parse_args(["train"])
    if args.command == "rollout" and (args.envs < 1 or args.steps < 1):
        parser.error("--envs and --steps must be positive")
    if args.command == "train" and (args.generations < 1 or args.checkpoint_every < 1):
        parser.error("--generations and --checkpoint-every must be positive")
    return {"train": _train, "eval": _eval, "rollout": _rollout, "cases": _cases, "tasks": _tasks}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
