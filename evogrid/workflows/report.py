"""A workflow's evaluation as a labelled report: every figure by name with its unit, the gap to the task's
oracle and the operator's baselines under the run's own safety setting. `Workflow.report(state)` returns it;
`print(report)` is the table `evogrid eval` prints, `dict(report)` the JSON it writes to eval.json."""
from __future__ import annotations

import sys

from evogrid.safety.layers import MARGINS


class Report(dict):
    """figure name -> value (per-day figures as lists; "units": name -> unit); `str()` is the printed table."""

    def __str__(self) -> str:
        return format_report(self)


def units_of(workflow, result: dict) -> dict:
    """The unit of each figure of an evaluation, by key (the task's units; shares and gaps by name)."""
    units = workflow.env.units(workflow.env_params)
    out = {}
    for key in result:
        base = key.split(":", 1)
        if base[0] == "cost_channels" and len(base) == 2:
            out[key] = units.get(base[1], "")
        elif key in ("return", "return_std", "day_return", "oracle_return", "myopic_return", "mpc_return"):
            out[key] = units["return"]
        elif key == "gap_days":
            out[key] = "test days the oracle solved"
        elif key in ("front_size", "archive_filled"):
            out[key] = "policies"
        elif key in ("front_feasible", "archive_feasible"):
            out[key] = "policies within every limit on every test day"
        elif key in MARGINS:
            out[key] = MARGINS[key]
        elif key.endswith("_share"):
            out[key] = "share of test days"
        elif key.endswith("_pct"):
            out[key] = ("% of the bound's cost" if "bound" in key else "% of the oracle's cost") if "gap" in key else "%"
    return out


def report(workflow, ev, operators: bool = True) -> dict:
    """The evaluation as plain numbers (per-day vectors kept as lists), with the gap to the task's oracle
    and (`operators`) the operator's baselines' figures where the task has them."""
    import numpy as np

    from evogrid import baselines
    from evogrid.utils.rundir import flatten_row

    names = dict(workflow.metric_names(), cost_channels=workflow.cost_names, profits=getattr(workflow, "agents", None))
    days = {k: np.asarray(v).tolist() for k, v in ev.items() if k.startswith(("day_", "cells_", "front_"))
            and np.ndim(v)}   # kept as lists
    out = flatten_row({k: np.asarray(v).tolist() for k, v in ev.items() if k not in days}, names)
    task = workflow.config.task
    ref = baselines.reference(task)
    layer_on = getattr(workflow, "layer_on", False)
    if ref is not None and ref.gap and not workflow.own_params and "day_return" in days:
        operators = operators and ref.operators
        try:   # with the operator's baselines (played with and without the layer) where the task has them
            report = baselines.baseline(task, operators=operators)
        except ImportError as err:   # the AC reference's optional PYPOWER
            print(f"evogrid eval: no gap to the reference: {err}", file=sys.stderr)
            return Report({**out, **days, "safety_layer": "on" if layer_on else "off",
                           "units": units_of(workflow, {**out, **days})})
        out["gap_to_oracle_pct"], out["gap_days"] = baselines.gap(report, days["day_return"])
        if report.get("bound"):
            out["gap_to_bound_pct"] = baselines.gap(report, days["day_return"], "bound")[0]
        s = report["summary"]
        out.update(oracle_return=s["oracle_return"])
        if operators:   # the operator's baselines played as the policy was: with its layer or without
            ops = s["operators"]
            for name in ("myopic", "mpc"):
                f = ops.get(name + ("+layer" if layer_on else ""))
                if f is not None:
                    out.update({f"{name}_return": f["return"], f"{name}_gap_pct": f["gap_pct"],
                                f"{name}_feasible_share": f["feasible_solved_share"]})
            out["baselines_layer"] = "on" if layer_on else "off"
        elif report.get("myopic") is not None:
            out.update(myopic_return=s["myopic_return"], myopic_gap_pct=s["myopic_gap_pct"],
                       myopic_feasible_share=s["myopic_feasible_share"], baselines_layer="off")
    result = {**out, **days, "safety_layer": "on" if layer_on else "off"}
    layer = getattr(workflow.env, "layer", None) if layer_on else None
    for name in MARGINS:   # the policy's layer kept margins; the baselines' did not
        if getattr(layer, name, 0.0):
            result[name] = getattr(layer, name)
    return Report({**result, "units": units_of(workflow, result)})


def _as_the_policy(ev: dict, layer: str) -> str:
    """How the baselines' layer compares with the policy's, for `format_report`'s last line."""
    if layer != ev.get("safety_layer"):
        return ""
    kept = [name.replace("_", " ") for name in MARGINS if ev.get(name)]
    return ", as the policy was" if not kept else f", without the policy's {' and '.join(kept)}"


def format_report(ev: dict) -> str:
    shown = {k: v for k, v in ev.items() if isinstance(v, (int, float))}
    units = ev.get("units", {})
    width = max(len(k) for k in shown)
    layer = ev.get("baselines_layer")
    said = (f"\n  (the operator's myopic{' and MPC' if 'mpc_gap_pct' in ev else ''} baselines played "
            f"{'with' if layer == 'on' else 'without'} the safety layer{_as_the_policy(ev, layer)})"
            if layer else "")
    return "evaluation of the chosen policy on the test days:\n" + "\n".join(
        f"  {k:<{width}}  {v:<11.6g} {units.get(k, '')}".rstrip() for k, v in shown.items()) + said
