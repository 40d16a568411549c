"""Optimisation baselines: what an operator would run instead of a learned policy, on the same days.

    report = baseline("tso-case14")          # the test days; cached after the first call
    report["oracle"]["cost"], report["myopic"]["return"], report["summary"]

Per task family (`evogrid baseline --task NAME` prints the same):
* TSO, DC (`tso.py`): the perfect-foresight multi-period DC-OPF of each day (security-constrained on the
  -n1 tasks), and the myopic policy that solves the one-step problem of the load it observes within ramp
  limits of its last dispatch. Replayed through the env: the replay equals the objective.
* DCMG (`dcmg.py`): a perfect-foresight LP lower bound on each day's cost (a relaxation of the env's
  rules, so a bound and not a schedule; no myopic policy).
* GenCos (`market.py`): the competitive reference, every company offering at cost: its prices and
  profits per day (a reference for bidding strategies, not an optimum of the flat reward).
* DSO and DERs (`feeder.py`): the day's perfect-foresight LinDistFlow QP (DERs: import at the tariff,
  batteries coupling the steps), its voltages corrected against the sweep power flow, the day replayed
  through the env (a good feasible schedule, not a proven optimum); the realisable baseline is the
  feeder with no control (zero action; on dso-case33bw the env's voltage correction still acts on it).
* The operator's baselines (`operators.py`, `baseline(task, operators=True)`), each with and without the
  task's safety layer: zero policy, persistence, myopic and rolling-horizon (MPC) DC-OPF on the
  observation's forecast on the DC transmission tasks; no control on dso.
* TSO, AC (`ac.py`): each step's AC-OPF by PYPOWER's `runopf` (optional dependency) as a reference (no
  ramp limits; a local optimum), and its dispatch replayed through the env.

Costs are in the task's reward units (minus the return): a policy's gap to the oracle on a day is
(its cost - the oracle's) / the oracle's. Days on which no schedule meets every limit are reported
as infeasible, never as a number, and left out of gaps. Everything is solved in float64.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import numpy as np

BASELINE_VERSION = "12"  # bump when an oracle's formulation or a replayed env changes (invalidates cached reports)


def supported(task: str) -> bool:
    """Every built-in task family (on AC transmission tasks a per-step AC-OPF reference, not an oracle)."""
    from evogrid.envs.registry import parse_task

    try:
        return parse_task(task).family in ("tso", "dso", "ders", "dcmg", "gencos")
    except ValueError:
        return False


def _cache_path(task: str, split: str, params, observed: bool = False) -> Path:
    """Keyed by the params' leaves, less those that only shape observations (forecasts and the cached
    first observations): a task with a forecast (-fc<H>) shares its oracle with the task without. With
    `observed` (what policies that read the observation did: the operator's baselines), every leaf counts."""
    import jax

    from evogrid.envs.registry import parse_task

    if observed:
        task = f"{task.lower()}-operators"
    else:
        params = params.replace(**{k: None for k in ("forecast", "init_obs") if hasattr(params, k)})
        task = parse_task(task).without_forecast()
    digest = hashlib.sha256(BASELINE_VERSION.encode())
    for leaf in jax.tree_util.tree_leaves(params):
        digest.update(np.asarray(leaf).tobytes())
    root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "evogrid" / "baselines"
    return root / f"{task}-{split}-{digest.hexdigest()[:16]}.json"


def baseline(task: str, split: str = "test", refresh: bool = False, operators: bool = False) -> dict:
    """Oracle and myopic figures of `task` on its `split` days (a dict, JSON-ready); cached on disk. With
    `operators`, also the operator's baselines with and without the safety layer (`operators.py`: report
    key "operators", name -> per-day figures; summary key "operators", name -> `policy_figures`), on the
    tasks that have them (DC transmission and dso)."""
    report = _oracle_report(task, split, refresh)
    if operators and _has_operators(task):
        import jax

        from evogrid.baselines.operators import operator_policies
        from evogrid.envs import make

        with jax.enable_x64(True):
            env, params = make(task, split=split)
            path = _cache_path(task, split, params, observed=True)
            if path.is_file() and not refresh:
                ops = json.loads(path.read_text())
            else:
                ops = operator_policies(env, params, progress=_progress)
                path.write_text(json.dumps(ops, indent=1))
        report["operators"] = ops
        report["summary"]["operators"] = {name: policy_figures(report, v["return"], v["violation"], v["moved_mwh"])
                                          | {"decision_s": v["decision_s"]} for name, v in ops.items()}
    return report


def _has_operators(task: str) -> bool:
    from evogrid.envs.registry import parse_task

    name = parse_task(task)
    return (name.family == "tso" and "ac" not in name.suffixes) or name.family == "dso"


def _oracle_report(task: str, split: str, refresh: bool) -> dict:
    import jax

    if not supported(task):
        raise ValueError(f"no optimisation baseline for task {task!r}; baselines exist for the transmission "
                         "tasks (tso-case5, tso-case14, tso-case118-ac, tso-case14-n1, ...), dso-case33bw, "
                         "ders-case141, dcmg and the gencos tasks (competitive reference)")
    from evogrid.baselines import ac, dcmg, feeder, market, tso
    from evogrid.case import load_case
    from evogrid.envs import make
    from evogrid.envs.registry import parse_task

    with jax.enable_x64(True):
        env, params = make(task, split=split)
        path = _cache_path(task, split, params)
        if path.is_file() and not refresh:
            return json.loads(path.read_text())
        name = parse_task(task)
        if name.family == "gencos":
            profit, price, payment = market.competitive_days(env, params)
            report = {"task": task, "split": split, "days": int(len(profit)), "oracle_kind": "competitive",
                      "return_unit": env.units(params)["return"], "oracle": None, "myopic": None,
                      "competitive": {"return": profit.tolist(), "price": price.tolist(), "consumer_payment": payment.tolist()},
                      "summary": {"competitive_return": float(profit.mean()), "competitive_price": float(price.mean()),
                                  "consumer_payment": float(payment.mean())}}
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(report, indent=1))
            return report
        if name.family == "dcmg":
            oracle, kind = dcmg.lp_bound(params), "lp_bound"
            m_ret = m_cost = None
        elif name.family == "tso" and "ac" in name.suffixes:
            oracle, kind = ac.ac_opf_reference(env, params, load_case(name.case), progress=_progress("AC-OPF reference (PYPOWER)")), "ac_opf"
            m_ret, m_cost = ac.replay_reference(env, params, oracle)
        elif name.family in ("dso", "ders"):
            oracle, kind = feeder.feeder_oracle(env, params), "feeder_schedule"
            zero = np.zeros((params.max_steps, env.action_space(params).shape[0]))
            play = feeder.replay_fn(env, params)
            uncontrolled = [play(d, zero)[:2] for d in range(len(oracle))]
            m_ret, m_cost = None, None
        else:
            oracle, kind = tso.dc_opf_oracle(params, progress=_progress("multi-period DC-OPF")), "schedule"
            m_ret, m_cost = tso.myopic_policy(env, params, progress=_progress("myopic policy"))
        feasible = [r.day for r in oracle if r.status == "optimal"]
    report = {
        "task": task, "split": split, "days": int(len(oracle)), "oracle_kind": kind,
        "return_unit": env.units(params)["return"],
        "oracle": {"status": [r.status for r in oracle], "cost": [r.cost for r in oracle],
                   "binding": {name: [r.binding.get(name, False) for r in oracle]
                               for name in dict.fromkeys(k for r in oracle for k in r.binding)}},
        "myopic": None if m_ret is None else {"return": m_ret.tolist(), "violation": m_cost.sum(1).tolist()},
    }
    report["summary"] = summarise(report, m_ret, None if m_cost is None else m_cost.sum(1))
    report["summary"]["feasible_days"] = len(feasible)
    if kind == "feeder_schedule":
        report["no_control"] = {"return": [r for r, _ in uncontrolled], "violation": [float(c.sum()) for _, c in uncontrolled]}
        report["summary"].update(no_control_return=float(np.mean(report["no_control"]["return"])),
                                 no_control_feasible_share=float(np.mean(np.asarray(report["no_control"]["violation"]) <= 1e-6)))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1))
    return report


def _progress(what: str):
    """`progress(done, total)` for a loop over days, on stderr: one line rewritten in place on a terminal,
    a plain line per day in a log."""
    tty = sys.stderr.isatty()
    start = "\r" if tty else ""

    def show(done, total):
        print(f"{start}  {what}: day {done}/{total}", end="\n" if done == total or not tty else "", file=sys.stderr, flush=True)
    return show


def solved_days(report: dict) -> list[int]:
    """Indices of the test days on which the oracle found a schedule that meets every limit."""
    return [i for i, s in enumerate(report["oracle"]["status"]) if s == "optimal"] if report.get("oracle") else []


def gap(report: dict, returns) -> tuple[float, int]:
    """A policy's gap to the oracle in % of the oracle's cost, over the days the oracle solves: (gap, days)."""
    ok = solved_days(report)
    if not ok:
        return float("nan"), 0
    oracle = np.array([report["oracle"]["cost"][i] for i in ok])
    cost = -np.asarray(returns, np.float64)[ok]
    return float(100.0 * (cost.sum() - oracle.sum()) / np.abs(oracle).sum()), len(ok)


def day_gaps(report: dict, returns) -> np.ndarray:
    """Each solved day's gap to the oracle, % of the oracle's cost that day ([days the oracle solves])."""
    ok = solved_days(report)
    oracle = np.array([report["oracle"]["cost"][i] for i in ok])
    return 100.0 * (-np.asarray(returns, np.float64)[ok] - oracle) / np.abs(oracle)


def policy_figures(report: dict, returns, violations, moved=None) -> dict:
    """A policy's figures on the test days: gap (% of cost over the solved days), its 95th percentile and
    worst day, feasible share of the solved days, mean return, and the MWh per day a safety layer moved."""
    ok = solved_days(report)
    days = day_gaps(report, returns) if ok else np.array([np.nan])
    met = np.asarray(violations, np.float64)[ok] <= 1e-6 if ok else np.array([np.nan])
    return {"gap_pct": gap(report, returns)[0], "gap_p95_pct": float(np.percentile(days, 95)),
            "gap_worst_pct": float(np.max(days)), "feasible_solved_share": float(np.mean(met)),
            "return": float(np.mean(returns)), "moved_mwh": float(np.mean(moved)) if moved is not None else 0.0}


def summarise(report: dict, returns, violations) -> dict:
    """The figures `evogrid baseline` prints: binding shares, oracle mean return, myopic figures and gap."""
    ok = solved_days(report)
    share = lambda flags: float(np.mean([flags[i] for i in ok])) if ok else float("nan")  # noqa: E731
    myopic_gap = gap(report, returns)[0] if returns is not None else float("nan")
    none = returns is None
    return {
        "oracle_return": float(-np.mean([report["oracle"]["cost"][i] for i in ok])) if ok else float("nan"),
        "infeasible_days": len(report["oracle"]["status"]) - len(ok),
        "binding_share": {name: share(flags) for name, flags in report["oracle"]["binding"].items()},
        "myopic_return": float("nan") if none else float(np.nanmean(returns)),
        "myopic_feasible_share": float("nan") if none else float(np.mean(np.asarray(violations) <= 1e-6)),
        "myopic_gap_pct": myopic_gap,
    }
