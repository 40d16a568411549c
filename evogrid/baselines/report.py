"""The reference each task family is measured against, registered with the family.

A family (and optionally one of its suffixes, e.g. "tso" with "ac") registers a `Reference`: how its
report is computed, how `evogrid baseline` words it, whether a policy's gap to it is meaningful, and
whether the operator's baselines exist. Adding a task family means one `register_reference` call beside
its oracle, no branch in `baselines` or the CLI.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

_REFERENCES: dict[tuple[str, str | None], Reference] = {}


@dataclasses.dataclass(frozen=True)
class Reference:
    """`build(env, params, task, progress) -> dict`: the report's "oracle_kind", "days", "oracle", "myopic",
    "summary" and any entries of its own (`task` is the parsed `TaskName`; `progress(what)` returns a per-day
    callback). `words(task)`: what the reference is, for the heading `evogrid baseline` prints;
    `rows(summary)`: the (label, value) rows it prints. `gap`: policies are scored by their gap to the
    reference's cost (not for a reference that is no optimum, e.g. a market's competitive prices).
    `operators`: the operator's baselines (`operators.py`) exist for the family."""

    build: Callable
    words: Callable
    rows: Callable
    gap: bool = True
    operators: bool = False


def register_reference(family: str, reference: Reference, suffix: str | None = None) -> None:
    """Make `reference` the one of `family`'s tasks (of those with `suffix`, when given: it wins over the
    family's own)."""
    _REFERENCES[family, suffix] = reference


def reference_of(task) -> Reference | None:
    """The reference of a parsed task (`TaskName`): the first of its suffixes that has one, else its family's."""
    for key in [(task.family, x) for x in task.suffixes] + [(task.family, None)]:
        if key in _REFERENCES:
            return _REFERENCES[key]
    return None


def percent(share: float) -> str:
    return f"{100 * share:.1f}%"


def binding_rows(summary) -> list[tuple[str, str]]:
    """One row per limit: the share of solved days on which the oracle's schedule meets it with equality."""
    return [(f"days with a binding {name} limit", percent(share)) for name, share in summary["binding_share"].items()]


def solved_days(report: dict, against: str = "oracle") -> list[int]:
    """Indices of the test days on which the oracle (or the report's `against` entry, e.g. "bound") found a
    schedule that meets every limit."""
    return [i for i, s in enumerate(report[against]["status"]) if s == "optimal"] if report.get(against) else []


def gap(report: dict, returns, against: str = "oracle") -> tuple[float, int]:
    """A policy's gap to the oracle (or the report's `against` entry: "bound" on the AC tasks) in % of its
    cost, over the days it solves: (gap, days)."""
    ok = solved_days(report, against)
    if not ok:
        return float("nan"), 0
    oracle = np.array([report[against]["cost"][i] for i in ok])
    cost = -np.asarray(returns, np.float64)[ok]
    return float(100.0 * (cost.sum() - oracle.sum()) / np.abs(oracle).sum()), len(ok)


def day_gaps(report: dict, returns) -> np.ndarray:
    """Each solved day's gap to the oracle, % of the oracle's cost that day ([days the oracle solves])."""
    ok = solved_days(report)
    oracle = np.array([report["oracle"]["cost"][i] for i in ok])
    return 100.0 * (-np.asarray(returns, np.float64)[ok] - oracle) / np.abs(oracle)


def policy_figures(report: dict, returns, violations, moved=None) -> dict:
    """A policy's figures on the test days: gap (% of cost over the solved days), its 95th percentile and
    worst day, feasible share of the solved days, mean return, the MWh per day a safety layer moved, and
    the gap to the report's bound where it has one (NaN otherwise)."""
    ok = solved_days(report)
    days = day_gaps(report, returns) if ok else np.array([np.nan])
    met = np.asarray(violations, np.float64)[ok] <= 1e-6 if ok else np.array([np.nan])
    return {"gap_pct": gap(report, returns)[0], "gap_p95_pct": float(np.percentile(days, 95)),
            "gap_worst_pct": float(np.max(days)), "feasible_solved_share": float(np.mean(met)),
            "return": float(np.mean(returns)), "moved_mwh": float(np.mean(moved)) if moved is not None else 0.0,
            "gap_bound_pct": gap(report, returns, "bound")[0]}


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


def schedule_report(oracle, kind: str, returns=None, costs=None, decision_s=None) -> dict:
    """The report of an oracle given as `DaySchedule`s per day, with a policy replayed beside it (the
    myopic policy or the reference's own replay: `returns` [n], `costs` [n, C], and the mean seconds per
    decision where an optimiser decides) when there is one."""
    report = {
        "days": int(len(oracle)), "oracle_kind": kind,
        "oracle": {"status": [r.status for r in oracle], "cost": [r.cost for r in oracle],
                   "seconds": [r.seconds for r in oracle],
                   "binding": {name: [r.binding.get(name, False) for r in oracle]
                               for name in dict.fromkeys(k for r in oracle for k in r.binding)}},
        "myopic": None if returns is None else {"return": returns.tolist(), "violation": costs.sum(1).tolist(),
                                                **({} if decision_s is None else {"decision_s": decision_s})},
    }
    report["summary"] = summarise(report, returns, None if costs is None else costs.sum(1))
    report["summary"]["feasible_days"] = sum(r.status == "optimal" for r in oracle)
    if oracle and all(r.seconds is not None for r in oracle):
        report["summary"]["oracle_seconds_per_day"] = float(np.mean([r.seconds for r in oracle]))
    return report
