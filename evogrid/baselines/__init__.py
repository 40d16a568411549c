"""Optimisation baselines: what an operator would run instead of a learned policy, on the same days.

    report = baseline("tso-case14")          # the test days; cached after the first call
    report["oracle"]["cost"], report["myopic"]["return"], report["summary"]

Per task family (`evogrid baseline --task NAME` prints the same):
* TSO, DC (`tso.py`): the perfect-foresight multi-period DC-OPF of each day (HiGHS), and the myopic
  policy that solves the one-step DC-OPF of the load it observes within ramp limits of its last dispatch.
* Other families have no oracle yet; `baseline` says so by name.

Costs are in the task's reward units (minus the return): a policy's gap to the oracle on a day is
(its cost - the oracle's) / the oracle's. Days on which no schedule meets every limit are reported
as infeasible, never as a number, and left out of gaps. Everything is solved in float64 and replayed
through the environment (the replay equals the oracle's objective with zero cost channels).
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

BASELINE_VERSION = "2"  # bump when an oracle's formulation changes (invalidates cached reports)


def supported(task: str) -> bool:
    """The DC transmission tasks, -n1 ones included (the oracle has no AC physics)."""
    return task.lower().startswith("tso-") and not task.lower().endswith("-ac")


def _cache_path(task: str, split: str, params) -> Path:
    import jax

    digest = hashlib.sha256(BASELINE_VERSION.encode())
    for leaf in jax.tree_util.tree_leaves(params):
        digest.update(np.asarray(leaf).tobytes())
    root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "evogrid" / "baselines"
    return root / f"{task}-{split}-{digest.hexdigest()[:16]}.json"


def baseline(task: str, split: str = "test", refresh: bool = False) -> dict:
    """Oracle and myopic figures of `task` on its `split` days (a dict, JSON-ready); cached on disk."""
    import jax

    if not supported(task):
        raise ValueError(f"no optimisation baseline for task {task!r} yet; baselines exist for the DC "
                         "transmission tasks (tso-case5, tso-case14, tso-case118, ...)")
    from evogrid.baselines import tso
    from evogrid.envs import make

    with jax.enable_x64(True):
        env, params = make(task, split=split)
        path = _cache_path(task, split, params)
        if path.is_file() and not refresh:
            return json.loads(path.read_text())
        oracle = tso.dc_opf_oracle(params)
        feasible = [r.day for r in oracle if r.status == "optimal"]
        m_ret, m_cost = tso.myopic_policy(env, params)
    report = {
        "task": task, "split": split, "days": int(len(oracle)), "return_unit": "reward units (k$ per day for TSO)",
        "oracle": {"status": [r.status for r in oracle], "cost": [r.cost for r in oracle],
                   "line_binding": [r.line_binding for r in oracle], "ramp_binding": [r.ramp_binding for r in oracle]},
        "myopic": {"return": m_ret.tolist(), "violation": m_cost.sum(1).tolist()},
    }
    report["summary"] = summarise(report, m_ret, m_cost.sum(1))
    report["summary"]["feasible_days"] = len(feasible)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1))
    return report


def gap(report: dict, returns) -> tuple[float, int]:
    """A policy's gap to the oracle in % of the oracle's cost, over the days the oracle solves: (gap, days)."""
    ok = [i for i, s in enumerate(report["oracle"]["status"]) if s == "optimal"]
    if not ok:
        return float("nan"), 0
    oracle = np.array([report["oracle"]["cost"][i] for i in ok])
    cost = -np.asarray(returns, np.float64)[ok]
    return float(100.0 * (cost.sum() - oracle.sum()) / np.abs(oracle).sum()), len(ok)


def summarise(report: dict, returns, violations) -> dict:
    """The figures `evogrid baseline` prints: binding shares, oracle mean return, myopic figures and gap."""
    ok = [i for i, s in enumerate(report["oracle"]["status"]) if s == "optimal"]
    share = lambda key: float(np.mean([report["oracle"][key][i] for i in ok])) if ok else float("nan")  # noqa: E731
    myopic_gap, _ = gap(report, returns)
    return {
        "oracle_return": float(-np.mean([report["oracle"]["cost"][i] for i in ok])) if ok else float("nan"),
        "infeasible_days": len(report["oracle"]["status"]) - len(ok),
        "line_binding_share": share("line_binding"), "ramp_binding_share": share("ramp_binding"),
        "myopic_return": float(np.mean(returns)), "myopic_feasible_share": float(np.mean(np.asarray(violations) <= 1e-6)),
        "myopic_gap_pct": myopic_gap,
    }
