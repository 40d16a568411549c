"""Transmission, AC mode: a sequential AC optimal power flow by PYPOWER (`runopf`) as the reference.

It runs in closed loop with the env, as an operator re-solves from the measured state: each step's
OPF starts from the units' actual outputs, its set-points go to the env as actions (corrected, by
playing the step, for what the env's load following will move them: `advance`), and the env's next
state starts the next step. What the reference includes, per
step of a day, in order: the step's bus loads (P and Q, as the env sees them), the units' cost curves,
their active limits narrowed to the ramp window around the units' actual last outputs and to PLAN_BAND
of a ramp around the day's plan, Qmin/Qmax, every bus's voltage band, and the env's line ratings as MVA limits on both
ends of every branch (PYPOWER's default flow limit). It chooses each unit's active output and each
bus's voltage, the generator voltage set-points among them (where no dispatch near the plan meets
every limit, within the ramp window alone). The plan is the perfect-foresight
multi-period DC-OPF of the day (`tso.dc_opf_oracle` with the MVA ratings as MW limits), its loads scaled
by the day's start-of-day share of losses so that its dispatch covers them, within the same aimed
limits as the AC steps: without it a
step-by-step optimum runs the slow cheap units into load drops they cannot ramp down from (case118's
midday dip). So the reference is a DC plan tracked by an AC-OPF, not a bound: a multi-period AC
optimum can be cheaper; the report carries a bound beside it (`ac_bound.socp_bound`). Each step's cost
is a local optimum of a nonconvex problem (PYPOWER's interior-point solver, PIPS), in float64.

It aims a little inside the limits (ratings x RATING_AIM, voltage bands narrowed by V_AIM, ramps x
RAMP_AIM with the unused share of the ramp kept off each unit's output limits as well, and SLACK_RESERVE
of the slack unit's ramp kept off its limits and its ramp, for the change of the losses it balances), as an operator keeps a margin: replayed through the env (the active set-points and the
voltage set-points as actions, `dispatch_action` / `voltage_action`), the env's load following and its
reactive limits move the state a little from the OPF's, and the margin keeps the replay within every
limit. That replay is what the reference reports as the controller's figures. PYPOWER is an optional
dependency (`pip install -e ".[oracles]"`; the test extra has it).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from evogrid.baselines.report import Reference, register_reference, schedule_report
from evogrid.baselines.tso import DaySchedule, dc_opf_oracle, each_day, replay_program, setpoint_action
from evogrid.case.matpower import PD, PMAX, PMIN, QD, RATE_A, VMAX, VMIN

RATING_AIM = 0.995   # MVA limits the OPF meets: this share of the env's ratings
V_AIM = 0.002        # p.u. inside each bus's voltage band
RAMP_AIM = 0.95      # share of each unit's ramp the OPF may use between steps
SLACK_RESERVE = 0.3  # share of the slack unit's ramp kept free for the losses' change, which it balances
PLAN_BAND = 0.2      # share of a unit's ramp the AC-OPF may move it off the day's DC plan (for the losses)
SETTLE_ITERS = 3     # corrections of the set-points asked for, so that the env's load following lands on the OPF's

def ac_opf_reference(env, params, case, days=None, progress=None) -> list[DaySchedule]:
    """The sequential AC-OPF of each day (default: every day): `cost` = the summed OPF objectives in reward
    units (None if some step has no solution: status "infeasible"); `pg` = [T, n_units] MW and
    `vm` = [T, n_vbus] p.u., the voltages of the voltage-controlled buses.
    `progress(done, total)` is called after each day."""
    try:
        from pypower.api import ppoption, runopf
    except ImportError:
        raise ImportError("the AC-OPF reference needs PYPOWER: pip install -e \".[oracles]\"") from None
    if not params.ac:
        raise ValueError("the AC-OPF reference is for the AC tasks (tso-caseN-ac); the DC tasks have the DC-OPF oracle")
    opts = ppoption(VERBOSE=0, OUT_ALL=0)
    g = lambda x: np.asarray(x, np.float64)  # noqa: E731
    load_p, load_q = g(params.load_p), g(params.load_q)
    from evogrid.envs.trans import setpoints_in_band

    case = setpoints_in_band(case)   # as the env holds them without voltage control
    ppc = dict(version="2", baseMVA=case.base_mva, bus=case.bus.copy(), gen=case.gen.copy(),
               branch=case.branch.copy(), gencost=case.gencost.copy())
    ppc["branch"][:, RATE_A] = g(params.rate) * RATING_AIM
    ppc["bus"][:, VMIN], ppc["bus"][:, VMAX] = g(params.vmin) + V_AIM, g(params.vmax) - V_AIM
    slack = g(params.slack)
    reserve = SLACK_RESERVE * g(params.ramp) * slack
    # every unit keeps the ramp's unused share off its output limits too: the env's load following shares what
    # its loss estimate misses by each unit's room, and a set-point cannot be asked past a limit to offset it
    margin = np.maximum(reserve, (1.0 - RAMP_AIM) * g(params.ramp))
    mid = 0.5 * (g(params.pmin) + g(params.pmax))
    pmin, pmax = np.minimum(g(params.pmin) + margin, mid), np.maximum(g(params.pmax) - margin, mid)
    ramp = g(params.ramp) * RAMP_AIM - reserve
    vbus = np.argmax(g(params.vbus_incidence), axis=1)
    dt, scale = float(params.delta_t_hours), float(params.reward_scale)
    start, band = g(params.init.pg), PLAN_BAND * g(params.ramp)
    out = []
    # the plan's loads carry the losses: each day's load scaled by its start-of-day losses' share
    gs = float(params.dc.gs_total)
    loss_share = (start.sum(1) - load_p[:, 0].sum(1) - gs) / load_p[:, 0].sum(1)
    dtype = params.load_p.dtype
    planned = params.replace(ac=False, load_p=(load_p * (1.0 + loss_share)[:, None, None]).astype(dtype),
                             pmin=pmin.astype(dtype), pmax=pmax.astype(dtype), ramp=ramp.astype(dtype))   # the aimed limits
    @jax.jit
    def advance(state, want, v):
        """One env step that lands every unit but the slack on `want` (and the voltages on `v`): the set-points
        asked for are corrected SETTLE_ITERS times by what the env's load following moved them (it shares its
        estimate's miss of the losses among the units). Returns (next state, set-points asked for)."""
        def played(ask):
            action = setpoint_action(params, ask, state.pg, v if params.voltage_control else None)
            return env.step_no_reset(jax.random.key(0), state, action, params)[1]

        ask = jax.lax.fori_loop(0, SETTLE_ITERS, lambda _, a: a + (want - played(a).pg) * (1.0 - params.slack), want)
        return played(ask), ask

    for d in each_day(range(load_p.shape[0]) if days is None else days, progress):
        plan = dc_opf_oracle(planned, days=[d])[0]
        if plan.status != "optimal":
            out.append(DaySchedule(int(d), "infeasible", None))
            continue
        pg, vm, ask, cost = [], [], [], 0.0
        state = env.reset_to_day(jnp.int32(d), params)[1]
        for t in range(params.max_steps):
            prev = np.asarray(state.pg, np.float64)
            ppc["bus"][:, PD], ppc["bus"][:, QD] = load_p[d, t], load_q[d, t]
            lo, hi = np.maximum(pmin, prev - ramp), np.minimum(pmax, prev + ramp)
            ppc["gen"][:, PMIN] = np.minimum(np.maximum(lo, plan.pg[t] - band), hi)
            ppc["gen"][:, PMAX] = np.maximum(np.minimum(hi, plan.pg[t] + band), ppc["gen"][:, PMIN])
            result = runopf(ppc, opts)
            if not result["success"]:   # off the plan: the ramp window alone
                ppc["gen"][:, PMIN], ppc["gen"][:, PMAX] = lo, hi
                result = runopf(ppc, opts)
            if not result["success"]:
                break
            pg.append(result["gen"][:, 1].copy())
            vm.append(result["bus"][vbus, 7])
            state, sent = advance(state, jnp.asarray(pg[-1], dtype), jnp.asarray(vm[-1], dtype))
            ask.append(np.asarray(sent, np.float64))
            cost += float(result["f"]) * dt * scale
        if len(pg) < params.max_steps:
            out.append(DaySchedule(int(d), "infeasible", None))
        else:
            out.append(DaySchedule(int(d), "optimal", cost, np.array(pg), vm=np.array(vm), ask=np.array(ask)))
    return out


def replay_reference(env, params, reference: list[DaySchedule]):
    """The reference's set-points played through the env, each step asking for the OPF's active outputs
    from the units' actual last output and (with voltage control) its generator voltages: (returns [n],
    summed costs [n, C]); NaN where unsolved."""
    run = replay_program(env, params)
    dtype = params.load_p.dtype
    returns, costs = [], []
    for day in reference:
        if day.pg is None:
            returns.append(np.nan)
            costs.append(np.full(env.num_constraints(params), np.nan))
            continue
        vm = jnp.asarray(day.vm, dtype) if params.voltage_control else None
        ret, c = run(jnp.int32(day.day), jnp.asarray(day.pg if day.ask is None else day.ask, dtype), vm)
        returns.append(float(ret))
        costs.append(np.asarray(c, np.float64))
    return np.array(returns), np.array(costs)


def _reference_report(env, params, task, progress) -> dict:
    from evogrid.baselines.ac_bound import socp_bound
    from evogrid.case import load_case

    reference = ac_opf_reference(env, params, load_case(task.case), progress=progress("AC-OPF reference (PYPOWER)"))
    report = schedule_report(reference, "ac_opf", *replay_reference(env, params, reference))
    bound = socp_bound(params, progress=progress("SOCP bound (Clarabel)"))
    report["bound"] = {"status": [b.status for b in bound], "cost": [b.cost for b in bound]}
    both = [d for d, (r, b) in enumerate(zip(reference, bound)) if r.status == b.status == "optimal"]
    ref_cost, bound_cost = (sum(x[d].cost for d in both) for x in (reference, bound))
    solved = [b.cost for b in bound if b.status == "optimal"]
    report["summary"].update(
        bound_return=float(-np.mean(solved)) if solved else float("nan"), bound_infeasible_days=len(bound) - len(solved),
        reference_over_bound_pct=float(100.0 * (ref_cost - bound_cost) / abs(bound_cost)) if both else float("nan"))
    return report


def _reference_rows(s) -> list[tuple[str, str]]:
    return [("reference mean return", f"{s['oracle_return']:.4f}"),
            ("days with a step the AC-OPF did not solve", f"{s['infeasible_days']}"),
            ("replayed mean return", f"{s['myopic_return']:.4f}"),
            ("replayed feasible days", f"{round(s['myopic_feasible_share'] * (s['feasible_days'] + s['infeasible_days']))}"
             f" of the {s['feasible_days']} it solves"),
            ("replayed gap to the reference", f"{s['myopic_gap_pct']:.3f}% of cost"),
            ("SOCP bound mean return", f"{s['bound_return']:.4f}"),
            ("days no schedule can meet (bound infeasible)", f"{s['bound_infeasible_days']}"),
            ("reference above the bound", f"{s['reference_over_bound_pct']:.3f}% of the bound (days both solve)")]


register_reference("tso", Reference(
    _reference_report, lambda task: "reference: the sequential AC-OPF by PYPOWER tracking the day's DC plan (losses "
    "included) within ramp limits of the last step, its active and voltage set-points replayed through the env; "
    "bound: the day's multi-period SOC relaxation of the AC-OPF (Clarabel), below the cost of any day within every limit",
    _reference_rows, operators=True), suffix="ac")
