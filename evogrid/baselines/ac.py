"""Transmission, AC mode: each step's AC optimal power flow by PYPOWER (`runopf`) as the reference.

What the reference includes, per step of a day: the step's bus loads (P and Q, as the env sees them),
the units' cost curves, Pmin/Pmax and Qmin/Qmax, every bus's voltage band, and the env's line ratings
as MVA limits on both ends of every branch (PYPOWER's default flow limit). It leaves out the ramp
limits between steps, so it is a reference rather than a bound: on a day where ramps bind the env
cannot follow it. Its cost is a local optimum of a nonconvex problem (PYPOWER's interior-point
solver, PIPS), in float64.

Its dispatch is also replayed through the env (each step asking for the OPF's outputs, the slack
unit balancing): that replay is what a controller following the per-step AC-OPF would get, ramp limits
and all. PYPOWER is an optional dependency (`pip install -e ".[oracles]"`; the test extra has it).
"""
from __future__ import annotations

import numpy as np

from evogrid.baselines.report import Reference, percent, register_reference, schedule_report
from evogrid.baselines.tso import DaySchedule, each_day, replay
from evogrid.case.matpower import PD, PMAX, PMIN, QD, RATE_A


def ac_opf_reference(env, params, case, days=None, progress=None) -> list[DaySchedule]:
    """Per-step AC-OPF of each day (default: every day): `cost` = the summed OPF objectives in reward units
    (None if some step has no solution: status "infeasible"); `pg` = [T, n_units] MW. `progress(done, total)`
    is called after each day."""
    try:
        from pypower.api import ppoption, runopf
    except ImportError:
        raise ImportError("the AC-OPF reference needs PYPOWER: pip install -e \".[oracles]\"") from None
    opts = ppoption(VERBOSE=0, OUT_ALL=0)
    g = lambda x: np.asarray(x, np.float64)  # noqa: E731
    load_p, load_q = g(params.load_p), g(params.load_q)
    from evogrid.envs.trans import setpoints_in_band

    case = setpoints_in_band(case)   # as the env holds them (its voltage_setpoints="band"; PYPOWER's OPF moves them)
    ppc = dict(version="2", baseMVA=case.base_mva, bus=case.bus.copy(), gen=case.gen.copy(),
               branch=case.branch.copy(), gencost=case.gencost.copy())
    ppc["gen"][:, PMIN], ppc["gen"][:, PMAX] = g(params.pmin), g(params.pmax)
    ppc["branch"][:, RATE_A] = g(params.rate)
    dt, scale = float(params.delta_t_hours), float(params.reward_scale)
    out = []
    for d in each_day(range(load_p.shape[0]) if days is None else days, progress):
        pg, cost, ok = [], 0.0, True
        for t in range(params.max_steps):
            ppc["bus"][:, PD], ppc["bus"][:, QD] = load_p[d, t], load_q[d, t]
            result = runopf(ppc, opts)
            if not result["success"]:
                ok = False
                break
            pg.append(result["gen"][:, 1])
            cost += float(result["f"]) * dt * scale
        out.append(DaySchedule(int(d), "optimal", cost, np.array(pg)) if ok else DaySchedule(int(d), "infeasible", None))
    return out


def replay_reference(env, params, reference: list[DaySchedule]):
    """The reference dispatch played through the env: (returns [n], summed costs [n, C]); NaN where unsolved."""
    returns, costs = [], []
    for day in reference:
        if day.pg is None:
            returns.append(np.nan)
            costs.append(np.full(env.num_constraints(params), np.nan))
            continue
        ret, c = replay(env, params, day.day, day.pg)
        returns.append(ret)
        costs.append(c)
    return np.array(returns), np.array(costs)


def _reference_report(env, params, task, progress) -> dict:
    from evogrid.case import load_case

    reference = ac_opf_reference(env, params, load_case(task.case), progress=progress("AC-OPF reference (PYPOWER)"))
    return schedule_report(reference, "ac_opf", *replay_reference(env, params, reference))


def _reference_rows(s) -> list[tuple[str, str]]:
    return [("reference mean return", f"{s['oracle_return']:.4f}"),
            ("days with a step the AC-OPF did not solve", f"{s['infeasible_days']}"),
            ("replayed mean return", f"{s['myopic_return']:.4f}"),
            ("replayed feasible days", percent(s["myopic_feasible_share"])),
            ("replayed gap to the reference", f"{s['myopic_gap_pct']:.3f}% of cost")]


register_reference("tso", Reference(
    _reference_report, lambda task: "reference: each step's AC-OPF by PYPOWER, no ramp limits; its dispatch replayed "
    "through the env", _reference_rows), suffix="ac")
