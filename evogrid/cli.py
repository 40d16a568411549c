"""The `evogrid` command. Training options, their defaults and help come from the config classes
of the workflow registry (`evogrid.workflows.registry`), so a default lives in one place.

    evogrid                      # = evogrid train: Open_ES on TSO case14 with the ECConfig defaults
    evogrid train --algorithm CMA_ES --task tso-case5 --pop 32 --generations 100 --out runs/cma5
    evogrid train --out runs/cma5 --algorithm CMA_ES --task tso-case5 --pop 32 --generations 200 --resume
    evogrid train --algorithm ppo --help            # the options of one algorithm
    evogrid train --task gencos-case5 --algorithm coevo
    evogrid train --distributed --coordinator host0:12355 --num-processes 2 --process-id 0   # one per host
    evogrid eval runs/cma5       # the run's chosen policy on the test days, with the gap to the oracle
    evogrid baseline --task tso-case14              # the oracle's and the myopic policy's figures
    evogrid config --algorithm ppo                  # every config key with its default and help
    evogrid rollout --task tso-case118-ac --envs 64 --steps 48   # random-policy throughput table
    evogrid cases                # shipped grid cases
    evogrid tasks                # registered task names
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
import typing
from pathlib import Path

DEFAULT_ALGORITHM = "Open_ES"


class UsageError(Exception):
    """A mistake in the command: printed as one line, exit code 2."""


def _rollout(args) -> int:
    import jax
    import numpy as np

    from evogrid.envs import make
    from evogrid.rollout import make_random_rollout

    env, params = make(args.task, max_steps=args.steps)
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
        rows.append((f"cost '{name}' per episode", f"{total:.3f}"))
    width = max(len(r[0]) for r in rows)
    print("\n".join(f"  {name:<{width}}  {value}" for name, value in rows))
    return 0


# --- options generated from the config classes ----------------------------------------------------

def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _parse_bool(text: str) -> bool:
    low = text.lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _add_config_options(parser, config_cls, algorithm: str) -> None:
    """One option per config field that `algorithm` uses (and its short spelling), default None = not given."""
    from evogrid.utils.config import field_type, unused_options

    group = parser.add_argument_group(f"{config_cls.__name__} options (defaults from the config class)")
    unused = unused_options(config_cls, algorithm)
    for f in dataclasses.fields(config_cls):
        if f.name == "algorithm" or f.name in unused:
            continue
        tp = field_type(config_cls, f.name)
        kwargs = {"dest": f.name, "default": None, "help": f"{f.metadata.get('help', '')} (default: {_shown(f.default)})"}
        args = typing.get_args(tp)
        if typing.get_origin(tp) is tuple:
            kwargs.update(nargs="+", type=args[0], metavar="N")
        elif tp is bool:
            kwargs.update(type=_parse_bool, metavar="BOOL")
        elif f.metadata.get("choices"):
            kwargs.update(choices=f.metadata["choices"])
        else:
            base = next((a for a in args if a is not type(None)), tp)  # float | None -> float
            kwargs.update(type=base if base in (int, float, str) else str)
        flags = [_flag(f.name)] + ([f.metadata["cli"]] if f.metadata.get("cli") else [])
        group.add_argument(*flags, **kwargs)


def _shown(value) -> str:
    return " ".join(map(str, value)) if isinstance(value, tuple) else str(value)


def _all_option_flags() -> dict[str, list[str]]:
    """flag -> algorithms whose config takes it (to name the algorithms in a refusal)."""
    from evogrid.utils.config import unused_options
    from evogrid.workflows.registry import algorithms, config_class

    flags: dict[str, list[str]] = {}
    for name in algorithms():
        cls = config_class(name)
        unused = unused_options(cls, name)
        for f in dataclasses.fields(cls):
            if f.name in unused:
                continue
            for flag in [_flag(f.name)] + ([f.metadata["cli"]] if f.metadata.get("cli") else []):
                flags.setdefault(flag, []).append(name)
    return flags


BASELINES = ("all", "oracle")
BASELINES_HELP = ("the baselines the evaluation compares with: all (default: the task's reference, i.e. its oracle and "
                  "on the transmission tasks a one-step OPF, and the operator's myopic and MPC with and without the "
                  "layer; computed once per task and cached, minutes to hours the first time on the pglib grids) or "
                  "oracle (the task's reference alone)")


def _train_parser(config_cls, algorithm: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="evogrid train", description=f"Train with {algorithm}. Options depend on "
                                "--algorithm: `evogrid train --algorithm NAME --help` lists them.")
    from evogrid.workflows.registry import algorithms

    p.add_argument("--algorithm", default=None, help=f"algorithm name, one of {', '.join(algorithms())} (default "
                   f"{DEFAULT_ALGORITHM}; `evogrid config --algorithm NAME` lists its options); case and '_'/'-' do not matter")
    p.add_argument("--config", help="JSON, TOML or YAML file of config keys; command-line options override it")
    p.add_argument("--out", help="run directory (default runs/<task>-<algorithm>-<time>)")
    p.add_argument("--generations", type=int, default=300, help="total generations: steps of the workflow (an ES generation, an RL iteration, an APG update; default 300)")
    p.add_argument("--checkpoint-every", type=int, default=25, help="generations between checkpoints (default 25)")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in --out from its newest checkpoint, with the run's own config")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.add_argument("--baselines", choices=BASELINES, default="all", help=BASELINES_HELP)
    p.add_argument("--wandb", metavar="PROJECT", help="also log metrics to Weights & Biases (needs `pip install wandb`; "
                   "WANDB_MODE=offline logs locally)")
    p.add_argument("--distributed", action="store_true",
                   help="multi-host run: start jax.distributed (options below, EVOGRID_* variables, or SLURM/MPI detection)")
    p.add_argument("--coordinator", help="with --distributed: HOST:PORT of process 0")
    p.add_argument("--num-processes", type=int, help="with --distributed: number of processes")
    p.add_argument("--process-id", type=int, help="with --distributed: this process's index")
    _add_config_options(p, config_cls, algorithm)
    return p


def _read_config_file(path: str) -> dict:
    """Config keys from a JSON, TOML (.toml) or YAML (.yaml, .yml) file, by its suffix. YAML is read with
    the safe loader (plain data only)."""
    suffix = Path(path).suffix.lower()
    try:
        text = Path(path).read_text()
        if suffix == ".toml":
            import tomllib  # Python 3.11+

            values = tomllib.loads(text)
        elif suffix in (".yaml", ".yml"):
            import yaml

            values = yaml.safe_load(text)
        else:
            values = json.loads(text)
    except ImportError as err:
        raise UsageError(f"cannot read --config {path}: {err} (TOML needs Python 3.11+; use JSON or YAML)") from None
    except Exception as err:  # noqa: BLE001  each parser has its own error class; all mean a malformed file
        raise UsageError(f"cannot read --config {path}: {type(err).__name__}: {err}") from None
    if not isinstance(values, dict):
        raise UsageError(f"--config {path} must hold a mapping of config keys, got {type(values).__name__}")
    return {k: list(v) if isinstance(v, tuple) else v for k, v in values.items()}


def _train_values(argv: list[str]):
    """(parsed args, config values) from the command line: algorithm first, then its own options."""
    from evogrid.workflows.registry import resolve

    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--algorithm")
    pre.add_argument("--config")
    pre.add_argument("--out")
    pre.add_argument("--resume", action="store_true")
    known, _ = pre.parse_known_args(argv)
    file_values = _read_config_file(known.config) if known.config else {}
    run_values = {}
    if known.resume and known.out and (Path(known.out) / "config.json").is_file():
        run_values = _read_config_file(str(Path(known.out) / "config.json"))  # a run knows its own config
        file_values = {**file_values, **run_values}
    try:
        algorithm, config_cls, _ = resolve(known.algorithm or file_values.get("algorithm", DEFAULT_ALGORITHM))
    except ValueError as err:
        raise UsageError(str(err)) from None
    parser = _train_parser(config_cls, algorithm)
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        takers = _all_option_flags().get(unknown[0].split("=")[0])
        if takers:
            raise UsageError(f"{unknown[0]} does not apply to {algorithm} (it is an option of {', '.join(takers)}); "
                             f"see `evogrid train --algorithm {algorithm} --help`")
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    values = dict(file_values)
    for f in dataclasses.fields(config_cls):
        given = getattr(args, f.name, None)
        if given is not None and f.name != "algorithm":
            values[f.name] = given
    values["algorithm"] = algorithm
    changed = sorted(k for k in run_values if k in values and values[k] != run_values[k]
                     and not (isinstance(run_values[k], list) and tuple(run_values[k]) == tuple(values[k])))
    if changed:
        raise UsageError(f"--resume continues {args.out} with its own config; these options differ from it: "
                         + ", ".join(f"{k} ({run_values[k]!r} there, {values[k]!r} here)" for k in changed)
                         + " (only --generations and --checkpoint-every may change; use a new --out for another config)")
    if args.generations < 1 or args.checkpoint_every < 1:
        raise UsageError("--generations and --checkpoint-every must be positive")
    return args, values


def _train(argv: list[str]) -> int:
    import jax

    from evogrid.utils.checkpoint import CheckpointError
    from evogrid.workflows.registry import build

    args, values = _train_values(argv)
    if args.distributed and not args.out:
        raise UsageError("--distributed needs --out (a directory every process can reach)")
    if args.distributed:  # before any JAX computation
        from evogrid.utils.sharding import initialize_distributed

        try:
            initialize_distributed(args.coordinator, args.num_processes, args.process_id)
        except (ValueError, RuntimeError) as err:
            raise UsageError(f"cannot start the distributed runtime: {err} (pass --coordinator HOST:PORT "
                             "--num-processes N --process-id I, or run under SLURM / Open MPI)") from None
    primary = jax.process_index() == 0
    try:
        config, workflow = build(values)
    except ValueError as err:
        raise UsageError(str(err)) from None
    out = Path(args.out) if args.out else Path("runs") / f"{config.task}-{config.algorithm}-{time.strftime('%Y%m%d-%H%M%S')}"
    if primary:
        n_dev, n_proc = jax.device_count(), jax.process_count()
        print(f"evogrid train: {config.algorithm} on {config.task} ({_layer_words(workflow)}), {args.generations} "
              f"generations on {n_dev} "
              f"{jax.devices()[0].platform.upper()} device(s)" + (f" in {n_proc} processes" if n_proc > 1 else "")
              + f" -> {out}", flush=True)
    warning = _size_warning(config, workflow)
    if warning and primary:
        print(f"evogrid: warning: {warning}", file=sys.stderr)
    try:
        _check_memory(values, config, workflow, args.checkpoint_every)
    except ValueError as err:
        raise UsageError(str(err)) from None
    state = None if args.resume else workflow.init()   # resumed: the checkpoint's, or init() where there is none
    try:
        state, history = workflow.learn(state, args.generations, run_dir=out, checkpoint_every=args.checkpoint_every,
                                        resume=args.resume, progress=not args.quiet, wandb_project=args.wandb)
    except (FileExistsError, FileNotFoundError, PermissionError, CheckpointError, ValueError) as err:
        raise UsageError(str(err)) from None
    except FloatingPointError as err:
        print(f"evogrid: {err}", file=sys.stderr)
        return 1
    if workflow.interrupted:
        if primary:
            _curve(out, history, config, workflow)
            print(f"evogrid: interrupted at generation {history[-1]['generation'] if history else 0}; checkpoint, "
                  f"metrics and curve are in {out}. Continue with:\n  evogrid train --resume --out {out} "
                  f"--generations {args.generations}", file=sys.stderr)
        return 130
    ev = workflow.evaluate(state)  # a collective computation under jax.distributed: every process takes part
    if not primary:
        return 0
    from evogrid.workflows.report import report

    result = report(workflow, ev, operators=args.baselines == "all")
    _curve(out, history, config, workflow, result.get("return"))
    (out / "eval.json").write_text(json.dumps(result, indent=1))
    print(result)
    print(f"metrics: {out / 'metrics.jsonl'}, {out / 'metrics.csv'}; curve: {out / 'learning_curve.png'}; "
          f"checkpoints: {out / 'checkpoints'}")
    return 0


def _curve(out, history, config, workflow, test_return=None):
    from evogrid.utils.plots import learning_curve

    units = workflow.env.units(workflow.env_params)
    learning_curve(out, history, title=f"{config.task} · {config.algorithm} · seed {config.seed}",
                   return_unit=units["return"], cost_units=units, test_return=test_return)


def _layer_words(workflow) -> str:
    """Whether the task's safety layer stands between the policy and the grid (and where the search started,
    when not from random weights, and what the MLP outputs, when not the env's actions), for the run's
    header line."""
    start = "; started from the MPC's decisions" if getattr(workflow.config, "init", "random") == "operator" else ""
    if getattr(workflow.config, "policy_output", "action") == "setpoint":
        start += "; the MLP outputs set-points"
    if not getattr(workflow, "layer_on", False):
        return "safety layer off: the raw policy" + start
    layer = workflow.env.layer
    said = {"reach_margin": "its look-ahead's demands widened by {:.1%}", "line_margin": "its lines' ratings cut by {:.1%}"}
    margins = "".join(f", {said[name].format(getattr(layer, name))}" for name in said if getattr(layer, name, 0.0))
    return f"safety layer on: {type(layer).__name__}{margins}" + start


def _check_memory(values: dict, config, workflow, checkpoint_every: int) -> None:
    """On a device that says how much memory it holds (a GPU or TPU, or EVOGRID_DEVICE_MEMORY), refuse a
    population (--pop) or, for the RL algorithms, an env batch (--envs) whose program would not fit, before
    the run starts: the run's own program compiled for a state of its shapes (`state_template`; the
    compilation cache keeps the program for the run; `utils.memory.check_batch` names the largest batch that
    fits)."""
    import jax

    from evogrid.utils.memory import check_batch, device_memory, program_bytes
    from evogrid.workflows.registry import step_bytes

    limit = device_memory()
    if limit is None:
        return
    if hasattr(config, "pop_size"):   # populations of antithetic pairs, shared evenly over the devices
        field, flag, what, multiple = "pop_size", "--pop", "one generation", 2 * jax.device_count()
    elif hasattr(config, "num_envs"):   # a batch that still splits into PPO's minibatches
        field, flag, what, multiple = "num_envs", "--envs", "one iteration", getattr(config, "minibatches", 1)
    else:
        return
    try:
        need = program_bytes(workflow.lower_steps(workflow.state_template(), checkpoint_every))
    except jax.errors.JaxRuntimeError as err:
        if "RESOURCE_EXHAUSTED" not in str(err):
            raise
        need = None   # its compile ran out of the device's memory
    check_batch(need, getattr(config, field), limit,
                lambda n: step_bytes({**values, field: n}, workflow.env, workflow.env_params), flag,
                f" on {config.task} ({what})", multiple)


def _size_warning(config, workflow) -> str | None:
    """A full-covariance strategy on a large network is slow (O(D^2) memory, O(D^3) work per generation)."""
    from evogrid.algorithms.es import FULL_COVARIANCE

    n = getattr(workflow, "num_params", 0)
    if config.algorithm in FULL_COVARIANCE and n > 2000:
        seconds = 3.2 * (n / 1861) ** 2  # measured: CMA_ES at 1,861 parameters took 3.2 s per generation here
        return (f"{config.algorithm} keeps a full covariance over {n:,} parameters: expect ~{seconds:.0f} s per "
                "generation on a 2-core CPU; Sep_CMA_ES or SNES (diagonal) scale to large policies")
    return None


def _eval(args) -> int:
    from evogrid.utils.checkpoint import CheckpointError
    from evogrid.workflows.registry import load

    run = Path(args.run_dir)
    try:
        workflow, state, step = load(run)
    except FileNotFoundError as err:
        raise UsageError(str(err)) from None
    except (ValueError, CheckpointError) as err:
        raise UsageError(f"cannot evaluate {run}: config.json: {err}") from None
    config = workflow.config
    if args.plot:
        n_days = workflow.env.num_days(workflow.split_params("test"))
        if n_days is None:
            raise UsageError(f"{config.task} has no days to plot")
        if not 0 <= args.day < n_days:
            raise UsageError(f"--day must be in [0, {n_days}) ({config.task} has {n_days} test days), got {args.day}")
    print(f"evogrid eval: {config.algorithm} on {config.task} ({_layer_words(workflow)}), checkpoint of generation {step}")
    result = workflow.report(state, operators=args.baselines == "all")
    (run / "eval.json").write_text(json.dumps(result, indent=1))
    print(result)
    for what, path in workflow.plot_evaluation(result, run):
        print(f"{what}: {path}")
    if args.plot:
        print(f"grid over test day {args.day}: {_plot_day(workflow, config, state, args.day, run)}")
    return 0


def _plot_day(workflow, config, state, day: int, run: Path) -> Path:
    import jax.numpy as jnp

    from evogrid.utils.plots import grid_day

    params = workflow.split_params("test")
    try:
        trace = workflow.trace_day(state, jnp.int32(day))
    except NotImplementedError as err:
        raise UsageError(str(err)) from None
    title = f"{config.task} · {config.algorithm} · seed {config.seed} · test day {day}"
    return grid_day(run / f"grid_day{day}.png", trace, title, workflow.cost_names, float(params.delta_t_hours))


def _bench(args) -> int:
    from evogrid import bench

    split = lambda text: [x.strip() for x in text.split(",") if x.strip()]  # noqa: E731
    try:
        bench.check_grid(split(args.algorithms), split(args.tasks), args.seeds, args.generations, split(args.layers))
    except ValueError as err:
        raise UsageError(str(err)) from None
    out = Path(args.out)
    try:
        bench.bench(split(args.algorithms), split(args.tasks), args.seeds, out, args.generations,
                    log=lambda m: print(m, flush=True), layers=split(args.layers))
    except KeyboardInterrupt as stop:
        print(f"evogrid bench: {stop or 'stopped'}", file=sys.stderr)
        return 130
    print((out / "results.md").read_text())
    print(f"written: {out / 'results.jsonl'}, {out / 'results.md'}, {out / 'results.png'}")
    return 0


def _baseline(args) -> int:
    from evogrid import baselines
    from evogrid.envs.registry import parse_task

    try:
        report = baselines.baseline(args.task, split=args.split, refresh=args.refresh, operators=True)
    except (ValueError, ImportError) as err:   # an unknown task; the AC reference's optional PYPOWER
        raise UsageError(str(err)) from None
    s, ref = report["summary"], baselines.reference(args.task)
    print(f"evogrid baseline: {args.task}, {report['days']} {args.split} days ({ref.words(parse_task(args.task))}; "
          f"returns in {report['return_unit']})")
    rows = ref.rows(s)
    width = max(len(r[0]) for r in rows)
    print("\n".join(f"  {name:<{width}}  {value}" for name, value in rows))
    if s.get("operators"):
        print(operator_table(s["operators"]))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
        print(f"written: {args.json}")
    return 0


def operator_table(figures: dict) -> str:
    """The operator's baselines as a markdown table (`baselines.policy_figures` per name)."""
    lines = ["", "| baseline | safety layer | gap to oracle, % of cost | p95 day | worst day | feasible solved days "
             "| layer moved, MWh/day | decision s/step |", "|---|---|---|---|---|---|---|---|"]
    for name, f in figures.items():
        seconds = "-" if f.get("decision_s") is None else f"{f['decision_s']:.4f}"
        bound = f.get("gap_bound_pct", float("nan"))
        gap = f"{f['gap_pct']:.2f}" + ("" if math.isnan(bound) else f"; to the bound {bound:.2f}")
        lines.append(f"| {name.removesuffix('+layer')} | {'on' if name.endswith('+layer') else 'off'} | {gap} | "
                     f"{f['gap_p95_pct']:.2f} | {f['gap_worst_pct']:.2f} | {100 * f['feasible_solved_share']:.0f}% | "
                     f"{f['moved_mwh']:.2f} | {seconds} |")
    return "\n".join(lines)


def _config(args) -> int:
    from evogrid.utils.config import unused_options
    from evogrid.workflows.registry import algorithms, resolve

    try:
        name, config_cls, workflow_cls = resolve(args.algorithm)
    except ValueError as err:
        raise UsageError(str(err)) from None
    print(f"{config_cls.__name__} ({name}, {workflow_cls.__name__}); algorithms: {', '.join(algorithms())}")
    unused = unused_options(config_cls, name)
    for field, kind, default, help_text in config_cls.describe():
        if field not in unused:
            print(f"  {field:<24} {_shown(default):<14} {help_text} [{kind}]")
    if unused:
        print(f"  (not used by {name}: {', '.join(unused)})")
    return 0


def _cases(args) -> int:
    from evogrid.case import list_cases, load_case

    for name in list_cases():
        c = load_case(name)
        print(f"  {name:>10}  buses {c.n_bus:>4}  units {c.n_units:>4}  branches {c.n_branch:>5}")
    return 0


def _tasks(args) -> int:
    from evogrid.envs import list_tasks
    from evogrid.envs.registry import describe

    names = list_tasks()
    width = max(map(len, names))
    print("\n".join(f"  {t:<{width}}  {describe(t)}" for t in names))
    print("  gymnax:<id>" + " " * max(width - 9, 1) + "  a gymnax environment (e.g. gymnax:CartPole-v1)")
    return 0


def _parser() -> argparse.ArgumentParser:
    """The commands other than `train` (whose options depend on the algorithm: `_train_values`)."""
    parser = argparse.ArgumentParser(prog="evogrid", description="Evolutionary RL on JAX power-system environments.",
                                     epilog="With no command, `evogrid` runs `evogrid train` (with the options given, e.g. "
                                            "`evogrid --task tso-case5`).")
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("train", help="train a policy (the default command); `evogrid train --help` for options",
                   add_help=False)
    ev = sub.add_parser("eval", help="evaluate the best policy of a run")
    ev.add_argument("run_dir")
    ev.add_argument("--plot", action="store_true", help="also draw the grid over a test day (RUN/grid_day<N>.png)")
    ev.add_argument("--day", type=int, default=0, help="the test day --plot draws (default 0)")
    ev.add_argument("--baselines", choices=BASELINES, default="all", help=BASELINES_HELP)
    co = sub.add_parser("config", help="list every config key of an algorithm with its default and help")
    co.add_argument("--algorithm", default=DEFAULT_ALGORITHM)
    ro = sub.add_parser("rollout", help="batched random-policy rollout with a throughput table")
    ro.add_argument("--task", default="tso-case14", help="task name, see `evogrid tasks` (default tso-case14)")
    ro.add_argument("--envs", type=int, default=256, help="parallel environments (default 256)")
    ro.add_argument("--steps", type=int, default=48, help="steps per episode (default 48 half-hours)")
    ro.add_argument("--seed", type=int, default=0)
    ba = sub.add_parser("baseline", help="the task's optimisation oracle and the operator's baselines (with and "
                                         "without the safety layer) on its test days")
    ba.add_argument("--task", required=True, help="task name, see `evogrid tasks`")
    ba.add_argument("--split", default="test", choices=("train", "val", "test"))
    ba.add_argument("--refresh", action="store_true", help="recompute instead of reading the cache")
    ba.add_argument("--json", help="also write the full report (per-day figures) to this file")
    from evogrid.bench import DEFAULT_ALGORITHMS, DEFAULT_TASKS, LAYERS

    be = sub.add_parser("bench", help="algorithms x tasks x seeds x safety layer on/off against the oracle and the "
                                      "operator's baselines; resumable (see evogrid/bench.py)")
    be.add_argument("--algorithms", default=",".join(DEFAULT_ALGORITHMS), help="comma-separated names")
    be.add_argument("--tasks", default=",".join(DEFAULT_TASKS), help="comma-separated tasks")
    be.add_argument("--layers", default=",".join(LAYERS), help="safety layer settings to run: on, off or on,off (default both)")
    be.add_argument("--seeds", type=int, default=3)
    be.add_argument("--generations", type=int, help="per run (default: a budget per algorithm, and for the evolution strategies per task, see evogrid/bench.py)")
    be.add_argument("--out", default="bench", help="output directory (default bench/)")
    sub.add_parser("cases", help="list shipped grid cases")
    sub.add_parser("tasks", help="list task names for `make`")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    from evogrid.utils.jax_utils import keep_compiled_programs

    keep_compiled_programs()
    parser = _parser()
    try:
        if not argv or argv[0] == "train":
            return _train(argv[1:])
        if argv[0].startswith("-") and argv[0] not in ("-h", "--help"):   # options with no command: `train`'s
            return _train(argv)
        args = parser.parse_args(argv)
        if args.command == "rollout" and (args.envs < 1 or args.steps < 1):
            parser.error("--envs and --steps must be positive")
        commands = {"eval": _eval, "baseline": _baseline, "bench": _bench, "config": _config, "rollout": _rollout, "cases": _cases,
                    "tasks": _tasks}
        return commands[args.command](args)
    except UsageError as err:
        print(f"evogrid: {err}", file=sys.stderr)
        return 2
    except ValueError as err:  # bad task names and options reported by the library
        print(f"evogrid: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
