"""`evogrid bench`: an ablation grid of algorithms x tasks x seeds x safety layer on/off, judged on the test
days against the task's oracle, beside the operator's baselines with and without the layer.

    evogrid bench --algorithms Open_ES,ppo --tasks tso-case5,tso-case14 --seeds 3 --layers on,off --out bench
    evogrid bench --algorithms Sep_CMA_ES,Sep_CMA_ES:init=operator --tasks tso-case14   # config overrides per entry

Each run trains with the algorithm's defaults for the budget below (or `--generations`), with the task's
safety layer between the policy and the env or without it (`safety` config field; a task without a
layer runs without), then plays the chosen policy on every test day. One JSON line per (algorithm, task,
layer, seed) goes to `<out>/results.jsonl` as soon as it finishes, so a killed bench resumes where it
stopped (finished runs are skipped; a run stopped by Ctrl-C or SIGTERM is not recorded and runs again);
a run that fails (e.g. NaN) is recorded with its error and the grid goes on.
Seeds of one cell run one after another in the same compiled program (one workflow object, a key
per seed: the learn loop is Python, so seeds are not vmapped). `<out>/results.md` and
`<out>/results.png` summarise each cell and each operator baseline (`baselines.operators`): the gap to
the oracle in % of cost over the test days the oracle solves (mean over seeds with a 95% bootstrap
interval, the 95th percentile and the worst day), the feasible share of those days, with the layer the
raw policy's feasible share before it and the MWh per day it moved, the decision time per step (policy
forward and layer, or one MPC solve), wall time and env steps.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import sys
import time
from pathlib import Path

import numpy as np

# generations / iterations per run, by algorithm (defaults of each config otherwise): about a minute or
# less per run on 2 CPU cores for the TSO tasks
BUDGET = {"ppo": 200, "td3": 60, "sac": 60, "erl": 40, "cemrl": 40, "pbt": 200, "pbt_td3": 60, "apg": 500}
EC_BUDGET = 200
# per-task budgets of the evolution strategies, chosen so the whole default table regenerates within the hour
# on 2 CPU cores (docs/design/choices.md)
EC_BUDGET_BY_TASK = {"tso-case118": 300, "dso-case33bw": 100}
DEFAULT_ALGORITHMS = ("Open_ES", "Sep_CMA_ES", "ppo")   # the ablation doubles the grid: the best of each family
DEFAULT_TASKS = ("tso-case5", "tso-case14", "tso-case118", "dso-case33bw", "dcmg")


LAYERS = ("on", "off")


def parse_algorithm(spec: str) -> tuple[str, dict]:
    """(algorithm name, config overrides) of a grid entry: a name, then `:key=value` pairs for its config, e.g.
    "Sep_CMA_ES:init=operator" (values read as JSON where they parse, as strings otherwise). The whole entry
    labels the runs and the table rows."""
    name, *pairs = str(spec).split(":")
    overrides = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"{spec!r}: config overrides follow the algorithm as :key=value, e.g. Sep_CMA_ES:init=operator")
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key] = value
    return name, overrides


def check_grid(algorithms, tasks, seeds: int = 1, generations: int | None = None, layers=LAYERS) -> tuple[list[str], list[str]]:
    """Canonical names, or a ValueError naming every unknown one and the valid ones (or what else is wrong
    with the grid: no algorithm or task, fewer than one seed or generation, a layer setting other than on
    and off), before anything runs."""
    from evogrid.envs import list_tasks
    from evogrid.envs.registry import parse_task
    from evogrid.workflows.registry import algorithms as known_algorithms
    from evogrid.workflows.registry import resolve

    if not algorithms or not tasks:
        raise ValueError(f"the grid needs at least one algorithm and one task (got {len(algorithms)} and {len(tasks)})")
    if seeds < 1 or (generations is not None and generations < 1):
        raise ValueError(f"seeds and generations must be at least 1 (got seeds={seeds}, generations={generations})")
    if not layers or any(x not in LAYERS for x in layers):
        raise ValueError(f"layers must be on, off or both (comma-separated), got {','.join(layers) or 'nothing'}")
    names, bad = [], []
    for a in algorithms:
        name, overrides = parse_algorithm(a)
        try:
            canonical, config_cls, _ = resolve(name)
        except ValueError:
            bad.append(name)
            continue
        try:
            config_cls.from_dict({"algorithm": canonical, **overrides})
        except ValueError as err:
            raise ValueError(f"{a}: {err}") from None
        names.append(":".join([canonical, *a.split(":")[1:]]))
    if bad:
        raise ValueError(f"unknown algorithm(s) {', '.join(bad)}; choose from {', '.join(known_algorithms())}")
    wrong = []
    for t in tasks:  # the registry's own parser: every valid name (suffixes like -fc4 included) and nothing else
        try:
            if not t.startswith("gymnax:"):
                parse_task(t)
        except ValueError:
            wrong.append(t)
    if wrong:
        raise ValueError(f"unknown task(s) {', '.join(wrong)}; choose from {', '.join(sorted(list_tasks()))} "
                         "(with '-fc<H>' appended for an H-step forecast)")
    return names, list(tasks)


def _done(path: Path) -> set:
    if not path.exists():
        return set()
    out = set()
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a torn last line of a killed bench
        out.add((row["algorithm"], row["task"], row.get("layer", "on"), row["seed"]))
    return out


@functools.lru_cache(maxsize=None)
def has_layer(task: str) -> bool:
    """Whether the task has a safety layer (`evogrid.safety.make_layer`: transmission (DC and AC) and dso tasks)."""
    from evogrid.envs import make
    from evogrid.safety import make_layer

    return not task.startswith("gymnax:") and make_layer(*make(task, split="test"), "auto") is not None


def _takes_layer(algorithm: str) -> bool:
    """Whether the algorithm's workflow composes a safety layer (its config has the `safety` field)."""
    from evogrid.workflows.registry import config_class

    return "safety" in {f.name for f in dataclasses.fields(config_class(parse_algorithm(algorithm)[0]))}


def decision_seconds(env, policy, obs, repeats: int = 200) -> float:
    """Median seconds of one decision for one observation: `policy(obs)`, and the layer's correction when
    `env` is `Shielded` (compiled; what a control room would wait for each interval)."""
    import jax

    from evogrid.safety import Shielded

    decide = jax.jit((lambda o: env.layer(o, policy(o))[0]) if isinstance(env, Shielded) else policy)
    jax.block_until_ready(decide(obs))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(decide(obs))
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def run_one(workflow, seed: int, generations: int) -> dict:
    import jax

    from evogrid import baselines

    t0 = time.perf_counter()
    state, history = workflow.learn(workflow.init(jax.random.key(seed)), generations, progress=False)
    if workflow.interrupted:   # Ctrl-C / SIGTERM: a run cut short is not a result; rerunning the bench redoes it
        raise KeyboardInterrupt(f"stopped during {workflow.config.algorithm} on {workflow.config.task} seed {seed}; "
                                "finished runs are kept, run the same command again to resume")
    ev = workflow.evaluate(state)
    wall = time.perf_counter() - t0
    day_return = np.asarray(ev["day_return"], np.float64)
    row = {"return": float(ev["return"]), "feasible_share": float(ev["feasible_share"]),
           "cost_channels": dict(zip(workflow.cost_names, np.asarray(ev["cost_channels"]).tolist())),
           "wall_s": wall, "env_steps": float(history[-1].get("env_steps", float("nan"))) if history else 0.0}
    if not np.all(np.isfinite(day_return)):
        raise FloatingPointError("the evaluated return is not finite")
    report = baselines.baseline(workflow.config.task) if baselines.supported(workflow.config.task) else None
    solved = baselines.solved_days(report) if report else []  # a day without any feasible schedule cannot count against a policy
    if report:
        row["gap_pct"], row["gap_days"] = baselines.gap(report, day_return)
        if report.get("bound"):
            row["gap_bound_pct"] = baselines.gap(report, day_return, "bound")[0]
        met = np.asarray(ev["day_feasible"])[solved]
        row["feasible_solved_share"] = float(met.mean()) if solved else float("nan")
        if solved:
            days = baselines.day_gaps(report, day_return)
            row["gap_p95_pct"], row["gap_worst_pct"] = float(np.percentile(days, 95)), float(days.max())
    try:
        policy = workflow.chosen_policy(state)
    except NotImplementedError:
        return row
    from evogrid.baselines.operators import day_figures

    test = workflow.split_params("test")
    row["decision_s"] = decision_seconds(workflow.env, policy, workflow.env.reset_to_day(0, test)[0])
    if workflow.layer_on:   # what the layer did: the raw policy's feasible days before it, the MWh it moved
        _, raw_costs, _ = day_figures(workflow.env.env, test, policy)
        _, _, moved = day_figures(workflow.env, test, policy)
        row["moved_mwh"] = float(moved.mean())
        if solved:
            row["raw_feasible_solved_share"] = float(np.mean(np.all(raw_costs[solved] <= 1e-6, axis=-1)))
    return row


def bench(algorithms, tasks, seeds: int, out: Path, generations: int | None = None, log=print,
          layers=LAYERS) -> list[dict]:
    import jax

    from evogrid import baselines
    from evogrid.workflows.registry import build

    algorithms, tasks = check_grid(algorithms, tasks, seeds, generations, layers)
    out.mkdir(parents=True, exist_ok=True)
    results = out / "results.jsonl"
    done = _done(results)
    cells = [(a, t, layer) for a in algorithms for t in tasks for layer in layers
             if layer == "off" or (has_layer(t) and _takes_layer(a))]
    todo = [(a, t, layer, s) for a, t, layer in cells for s in range(seeds) if (a, t, layer, s) not in done]
    log(f"evogrid bench: {len(algorithms)} algorithms x {len(tasks)} tasks x layer {'/'.join(layers)} x {seeds} seeds; "
        f"{len(done)} runs done, {len(todo)} to go -> {out}")
    t_start, finished = time.perf_counter(), 0
    for task in tasks:   # the oracles and the operator's baselines first (cached): every run's gap needs them
        if baselines.supported(task):
            log(f"evogrid bench: the oracle and the operator's baselines of {task}")
            baselines.baseline(task, operators=True)
    workflows = {}
    for i, (algorithm, task, layer, seed) in enumerate(todo):
        name, overrides = parse_algorithm(algorithm)
        gens = generations or BUDGET.get(name.lower(), EC_BUDGET_BY_TASK.get(task, EC_BUDGET))
        record = {"algorithm": algorithm, "task": task, "layer": layer, "seed": seed, "generations": gens}
        try:
            if (algorithm, task, layer) not in workflows:   # keep one cell, and free the last cell's compiled programs:
                # the whole grid in one process crashed near its end ("LLVM compilation error: Cannot allocate
                # memory", then a segfault, after 99 of 105 runs: every cell's executables stayed mapped)
                workflows.clear()
                jax.clear_caches()
                values = {"algorithm": name, "task": task, **overrides} | ({"safety": layer} if _takes_layer(name) else {})
                workflows[(algorithm, task, layer)] = build(values)[1]
            record.update(status="ok", **run_one(workflows[(algorithm, task, layer)], seed, gens))
        except Exception as err:  # the grid goes on; the failure is recorded with its reason
            record.update(status="failed", error=f"{type(err).__name__}: {err}"[:500])
        with open(results, "a") as f:
            f.write(json.dumps(record) + "\n")
        finished += 1
        per_run = (time.perf_counter() - t_start) / finished
        gap = record.get("gap_pct")
        shown = f"gap {gap:.2f}%" if gap is not None else record.get("error", "no oracle")[:60]
        log(f"[{i + 1}/{len(todo)}] {algorithm} on {task} (layer {layer}) seed {seed}: {record['status']} "
            f"{shown if record['status'] == 'ok' else record['error'][:80]}  ETA {per_run * (len(todo) - i - 1):.0f} s")
    if todo:
        log(f"evogrid bench: {finished} runs in {(time.perf_counter() - t_start) / 60:.1f} min (oracles included)")
    rows = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
    every = dict.fromkeys(r["task"] for r in rows)   # the table covers every run recorded, earlier calls' too
    write_summary(rows, out, {t: baselines.baseline(t, operators=True) for t in every if baselines.supported(t)})
    return rows


def bootstrap_ci(values, n: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """(mean, low, high): a 95% percentile bootstrap interval of the mean over seeds."""
    values = np.asarray(values, float)
    if values.size == 0:
        return float("nan"), float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    means = rng.choice(values, size=(n, values.size), replace=True).mean(1)
    return float(values.mean()), float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def _mean(runs, key) -> float:
    values = [r[key] for r in runs if r.get(key) is not None]
    return float(np.mean(values)) if values else float("nan")


def summarise(rows: list[dict], reports: dict | None = None) -> list[dict]:
    """One summary per (algorithm, task, layer) cell over its seeds, and one per operator baseline of each
    task in `reports` (task -> `baselines.baseline(task, operators=True)`; algorithm "baseline:<name>")."""
    cells = {}
    for r in rows:
        cells.setdefault((r["algorithm"], r["task"], r.get("layer", "on")), []).append(r)
    out = []
    for (algorithm, task, layer), runs in cells.items():
        ok = [r for r in runs if r["status"] == "ok"]
        mean, lo, hi = bootstrap_ci([r["gap_pct"] for r in ok if "gap_pct" in r])
        out.append({"algorithm": algorithm, "task": task, "layer": layer, "seeds": len(runs), "failed": len(runs) - len(ok),
                    "gap_pct": mean, "gap_lo": lo, "gap_hi": hi, "gap_p95_pct": _mean(ok, "gap_p95_pct"),
                    "gap_worst_pct": max((r["gap_worst_pct"] for r in ok if "gap_worst_pct" in r), default=float("nan")),
                    **{k: _mean(ok, k) for k in ("gap_bound_pct", "return", "feasible_share", "feasible_solved_share",
                                                 "raw_feasible_solved_share", "moved_mwh", "decision_s", "wall_s", "env_steps")}})
    for task, report in (reports or {}).items():
        for name, f in report.get("summary", {}).get("operators", {}).items():
            out.append({"algorithm": f"baseline:{name.removesuffix('+layer')}", "task": task,
                        "layer": "on" if name.endswith("+layer") else "off", "seeds": 1, "failed": 0,
                        "gap_pct": f["gap_pct"], "gap_lo": f["gap_pct"], "gap_hi": f["gap_pct"],
                        "gap_bound_pct": f.get("gap_bound_pct", float("nan")),
                        "gap_p95_pct": f["gap_p95_pct"], "gap_worst_pct": f["gap_worst_pct"], "return": f["return"],
                        "feasible_share": float("nan"), "feasible_solved_share": f["feasible_solved_share"],
                        "raw_feasible_solved_share": float("nan"), "moved_mwh": f["moved_mwh"],
                        "decision_s": float("nan") if f.get("decision_s") is None else f["decision_s"],
                        "wall_s": float("nan"), "env_steps": float("nan")})
    return out


def _pct(x) -> str:
    return "-" if np.isnan(x) else f"{100 * x:.0f}%"


def _num(x, fmt: str) -> str:
    return "-" if np.isnan(x) else format(x, fmt)


def markdown(cells: list[dict]) -> str:
    """One table per task: every cell and baseline, with the layer on and off."""
    head = ("| policy | safety layer | gap to oracle, % of cost (95% CI over seeds) | p95 day | worst day | feasible "
            "(of the days the oracle solves) | raw policy feasible, before the layer | layer moved, MWh/day | "
            "decision ms/step | wall s / run | env steps / run | seeds (failed) |")
    out = []
    for task in sorted({c["task"] for c in cells}):
        out += [f"\n**{task}**\n", head, "|---" * 12 + "|"]
        for c in sorted((c for c in cells if c["task"] == task), key=lambda c: (c["algorithm"].startswith("baseline:"), c["algorithm"], c["layer"])):
            gap = "no oracle" if np.isnan(c["gap_pct"]) else (
                f"{c['gap_pct']:.2f}" + ("" if c["algorithm"].startswith("baseline:") else f" [{c['gap_lo']:.2f}, {c['gap_hi']:.2f}]")
                + ("" if np.isnan(c.get("gap_bound_pct", np.nan)) else f"; to the bound {c['gap_bound_pct']:.2f}"))
            out.append(f"| {c['algorithm']} | {c['layer']} | {gap} | {_num(c['gap_p95_pct'], '.2f')} | {_num(c['gap_worst_pct'], '.2f')} | "
                       f"{_pct(c['feasible_solved_share'])} | {_pct(c['raw_feasible_solved_share'])} | {_num(c['moved_mwh'], '.1f')} | "
                       f"{_num(1e3 * c['decision_s'], '.2f')} | {_num(c['wall_s'], '.0f')} | {_num(c['env_steps'], ',.0f')} | "
                       f"{c['seeds']} ({c['failed']}) |")
    return "\n".join(out).lstrip("\n") + "\n"


def write_summary(rows: list[dict], out: Path, reports: dict | None = None) -> None:
    cells = summarise(rows, reports)
    (out / "results.md").write_text(markdown(cells))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("evogrid: matplotlib not installed; no results.png", file=sys.stderr)
        return
    cells = [c for c in cells if c["layer"] == "on" or not has_layer(c["task"])]   # the plot: as deployed
    tasks = sorted({c["task"] for c in cells})
    algs = sorted({c["algorithm"] for c in cells})
    fig, axes = plt.subplots(1, len(tasks), figsize=(3.2 * len(tasks), 3.6), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for i, alg in enumerate(algs):
            c = next((c for c in cells if c["task"] == task and c["algorithm"] == alg), None)
            if c is None or np.isnan(c["gap_pct"]):
                continue
            ax.bar(i, c["gap_pct"], yerr=[[c["gap_pct"] - c["gap_lo"]], [c["gap_hi"] - c["gap_pct"]]], capsize=3)
        ax.set_xticks(range(len(algs)), algs, rotation=60, fontsize=7)
        ax.set_title(task, fontsize=9)
        ax.set_ylabel("gap to oracle (% of cost)", fontsize=8)
    fig.suptitle("evogrid bench: test days, mean over seeds with 95% bootstrap interval", fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "results.png", dpi=100)
    plt.close(fig)
