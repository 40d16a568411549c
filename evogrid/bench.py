"""`evogrid bench`: a grid of algorithms x tasks x seeds, judged on the test days against the task's oracle.

    evogrid bench --algorithms Open_ES,ppo --tasks tso-case5,tso-case14 --seeds 3 --out bench

Each run trains with the algorithm's defaults for the budget below (or `--generations`), then plays
the chosen policy on every test day. One JSON line per (algorithm, task, seed) goes to
`<out>/results.jsonl` as soon as it finishes, so a killed bench resumes where it stopped (finished
runs are skipped; a run stopped by Ctrl-C or SIGTERM is not recorded and runs again); a run that fails
(e.g. NaN) is recorded with its error and the grid goes on.
Seeds of one cell run one after another in the same compiled program (one workflow object, a key
per seed: the learn loop is Python, so seeds are not vmapped). `<out>/results.md` and
`<out>/results.png` summarise each cell: the gap to the oracle in % of cost (mean over seeds with a
95% bootstrap interval), the share of feasible test days (and of the test days the oracle solves: a
day with no feasible schedule at all cannot count against a policy), wall time and env steps.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

# generations / iterations per run, by algorithm (defaults of each config otherwise): about a minute or
# less per run on 2 CPU cores for the TSO tasks
BUDGET = {"ppo": 200, "td3": 60, "sac": 60, "erl": 40, "cemrl": 40}
EC_BUDGET = 200
# per-task budgets of the evolution strategies, chosen so the whole default table regenerates within the hour
# on 2 CPU cores (3 seeds each, measured): on the 54-unit case Sep_CMA_ES's gap was 6.5% at 200 generations,
# 2.1% at 600 (an earlier round), 1.55% at 400 and 1.72% at 300 (~135 s a run); on dso-case33bw 1.04% at 200
# and 1.21% at 100 (31 s a run instead of 59)
EC_BUDGET_BY_TASK = {"tso-case118": 300, "dso-case33bw": 100}
DEFAULT_ALGORITHMS = ("Open_ES", "Sep_CMA_ES", "GA", "ppo", "td3", "erl", "cemrl")
DEFAULT_TASKS = ("tso-case5", "tso-case14", "tso-case118", "dso-case33bw", "dcmg")


def check_grid(algorithms, tasks, seeds: int = 1, generations: int | None = None) -> tuple[list[str], list[str]]:
    """Canonical names, or a ValueError naming every unknown one and the valid ones (or what else is wrong
    with the grid: no algorithm or task, fewer than one seed or generation), before anything runs."""
    from evogrid.envs import list_tasks
    from evogrid.envs.registry import parse_task
    from evogrid.workflows.registry import algorithms as known_algorithms
    from evogrid.workflows.registry import resolve

    if not algorithms or not tasks:
        raise ValueError(f"the grid needs at least one algorithm and one task (got {len(algorithms)} and {len(tasks)})")
    if seeds < 1 or (generations is not None and generations < 1):
        raise ValueError(f"seeds and generations must be at least 1 (got seeds={seeds}, generations={generations})")
    names, bad = [], []
    for a in algorithms:
        try:
            names.append(resolve(a)[0])
        except ValueError:
            bad.append(a)
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
        out.add((row["algorithm"], row["task"], row["seed"]))
    return out


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
    if baselines.supported(workflow.config.task):
        report = baselines.baseline(workflow.config.task)
        row["gap_pct"], row["gap_days"] = baselines.gap(report, day_return)
        solved = baselines.solved_days(report)   # a day without any feasible schedule cannot count against a policy
        met = np.asarray(ev["day_feasible"])[solved]
        row["feasible_solved_share"] = float(met.mean()) if solved else float("nan")
    return row


def bench(algorithms, tasks, seeds: int, out: Path, generations: int | None = None, log=print) -> list[dict]:
    import jax

    from evogrid.workflows.registry import build

    algorithms, tasks = check_grid(algorithms, tasks, seeds, generations)
    out.mkdir(parents=True, exist_ok=True)
    results = out / "results.jsonl"
    done = _done(results)
    todo = [(a, t, s) for a in algorithms for t in tasks for s in range(seeds) if (a, t, s) not in done]
    log(f"evogrid bench: {len(algorithms)} algorithms x {len(tasks)} tasks x {seeds} seeds; {len(done)} runs done, "
        f"{len(todo)} to go -> {out}")
    t_start, finished = time.perf_counter(), 0
    workflows = {}
    for i, (algorithm, task, seed) in enumerate(todo):
        gens = generations or BUDGET.get(algorithm.lower(), EC_BUDGET_BY_TASK.get(task, EC_BUDGET))
        record = {"algorithm": algorithm, "task": task, "seed": seed, "generations": gens}
        try:
            if (algorithm, task) not in workflows:   # keep one cell, and free the last cell's compiled programs:
                # the whole grid in one process crashed near its end ("LLVM compilation error: Cannot allocate
                # memory", then a segfault, after 99 of 105 runs: every cell's executables stayed mapped)
                workflows.clear()
                jax.clear_caches()
                workflows[(algorithm, task)] = build({"algorithm": algorithm, "task": task})[1]
            record.update(status="ok", **run_one(workflows[(algorithm, task)], seed, gens))
        except Exception as err:  # the grid goes on; the failure is recorded with its reason
            record.update(status="failed", error=f"{type(err).__name__}: {err}"[:500])
        with open(results, "a") as f:
            f.write(json.dumps(record) + "\n")
        finished += 1
        per_run = (time.perf_counter() - t_start) / finished
        gap = record.get("gap_pct")
        shown = f"gap {gap:.2f}%" if gap is not None else record.get("error", "no oracle")[:60]
        log(f"[{i + 1}/{len(todo)}] {algorithm} on {task} seed {seed}: {record['status']} "
            f"{shown if record['status'] == 'ok' else record['error'][:80]}  ETA {per_run * (len(todo) - i - 1):.0f} s")
    if todo:
        log(f"evogrid bench: {finished} runs in {(time.perf_counter() - t_start) / 60:.1f} min (oracles included)")
    rows = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
    write_summary(rows, out)
    return rows


def bootstrap_ci(values, n: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """(mean, low, high): a 95% percentile bootstrap interval of the mean over seeds."""
    values = np.asarray(values, float)
    if values.size == 0:
        return float("nan"), float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    means = rng.choice(values, size=(n, values.size), replace=True).mean(1)
    return float(values.mean()), float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def summarise(rows: list[dict]) -> list[dict]:
    cells = {}
    for r in rows:
        cells.setdefault((r["algorithm"], r["task"]), []).append(r)
    out = []
    for (algorithm, task), runs in cells.items():
        ok = [r for r in runs if r["status"] == "ok"]
        gaps = [r["gap_pct"] for r in ok if "gap_pct" in r]
        mean, lo, hi = bootstrap_ci(gaps)
        out.append({"algorithm": algorithm, "task": task, "seeds": len(runs), "failed": len(runs) - len(ok),
                    "gap_pct": mean, "gap_lo": lo, "gap_hi": hi,
                    "return": float(np.mean([r["return"] for r in ok])) if ok else float("nan"),
                    "feasible_share": float(np.mean([r["feasible_share"] for r in ok])) if ok else float("nan"),
                    "feasible_solved": float(np.mean([r.get("feasible_solved_share", np.nan) for r in ok])) if ok else float("nan"),
                    "wall_s": float(np.mean([r["wall_s"] for r in ok])) if ok else float("nan"),
                    "env_steps": float(np.mean([r["env_steps"] for r in ok])) if ok else float("nan")})
    return out


def markdown(cells: list[dict]) -> str:
    lines = ["| task | algorithm | gap to oracle, % of cost (95% CI) | feasible test days | feasible days of those the "
             "oracle solves | test return | wall s / run | env steps / run | seeds (failed) |", "|---|---|---|---|---|---|---|---|---|"]
    for c in sorted(cells, key=lambda c: (c["task"], c["algorithm"])):
        gap = "no oracle" if np.isnan(c["gap_pct"]) else f"{c['gap_pct']:.2f} [{c['gap_lo']:.2f}, {c['gap_hi']:.2f}]"
        solved = "-" if np.isnan(c["feasible_solved"]) else f"{100 * c['feasible_solved']:.0f}%"
        lines.append(f"| {c['task']} | {c['algorithm']} | {gap} | {100 * c['feasible_share']:.0f}% | {solved} | {c['return']:.2f} | "
                     f"{c['wall_s']:.0f} | {c['env_steps']:,.0f} | {c['seeds']} ({c['failed']}) |")
    return "\n".join(lines) + "\n"


def write_summary(rows: list[dict], out: Path) -> None:
    cells = summarise(rows)
    (out / "results.md").write_text(markdown(cells))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("evogrid: matplotlib not installed; no results.png", file=sys.stderr)
        return
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
