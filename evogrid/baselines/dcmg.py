"""Data-centre microgrid: a perfect-foresight linear-programming lower bound on a day's cost.

Over the day's T steps (dt hours), with every profile known in advance, the LP chooses (MW unless said):

    x[t, j] >= 0   IT work arriving at t served at t + j, j = 0..D (D = deadline_steps); sum_j x[t, j] =
                   arrival[t] and x[t, 0] >= (1 - deferrable) arrival[t]; x[t, j] = 0 where t + j > T - 1
                   (the env's deadlines stop at the day's last step: the day's work is done within it)
    q[t] in [0, q_cool_max]   heat removed; room temp[t+1] = temp[t] (1 - dt/tau) + dt (it[t] - q[t]) / c_th
                   + dt t_out[t] / tau, temp[t+1] <= t_limit, temp[0] = temp_init
    ch, dis in [0, p_max], soc[t+1] = soc[t] + dt (eta_c ch - dis / eta_d) / capacity in [soc_min, soc_max]
    diesel d with on-share u in [0, 1]: u d_min <= d <= u d_max, fuel (fuel_idle d_max u + fuel_slope d) dt
    pv <= pv_avail, grid in [0, grid_cap], spill >= 0
    it[t] + q[t] / cop + ch[t] + spill[t] = pv[t] + d[t] + dis[t] + grid[t]      (no deficit)

    min  sum_t (grid dt price + fuel fuel_price + (fuel diesel_co2 + grid dt grid_co2) carbon_price) x reward_scale

Every policy the env can run that serves all work on time, keeps the room below t_limit and leaves no
deficit (a feasible day) costs at least this much: the LP relaxes the env's rules (any cooling power
instead of the set-point controller, the diesel's on/off minimum load as a continuous share, the
battery's taper near its SOC bounds, any order of serving deferred work), so it is a bound, not a
schedule to replay. `evogrid baseline --task dcmg` and eval's gap use it as the oracle.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from evogrid.baselines.report import Reference, binding_rows, register_reference, schedule_report
from evogrid.baselines.solvers import solve_qp
from evogrid.baselines.tso import DaySchedule


def lp_bound(params, days=None) -> list[DaySchedule]:
    """The LP lower bound of each day (default: every day of `params`), in reward units (minus the return).
    `binding` of a solved day: "battery" (its state of charge at a bound, or its power at its rating, at
    some step) and "grid cap" (import at the cap at some step), within 1e-6."""
    g = lambda x: np.asarray(x, np.float64)  # noqa: E731
    n_days = g(params.it_arrival).shape[0]
    out = []
    for d in range(n_days) if days is None else days:
        c, A, r_lo, r_up, lo, up, part = _day_lp(params, int(d), g)
        sol = solve_qp(c, A, r_lo, r_up, lo, up)
        if not sol.ok:
            out.append(DaySchedule(int(d), sol.status, None))
            continue
        at = lambda name, bound: bool(np.any(np.abs(sol.x[part(name)] - bound[part(name)]) <= 1e-6))  # noqa: E731
        battery = at("soc", lo) or at("soc", up) or at("ch", up) or at("dis", up)
        out.append(DaySchedule(int(d), "optimal", float(sol.objective), binding={"battery": battery, "grid cap": at("grid", up)}))
    return out


def _day_lp(params, d: int, g):
    T, D, dt = params.max_steps, params.deadline_steps, params.delta_t_hours
    arrival, pv_avail, price, t_out = (g(x)[d] for x in (params.it_arrival, params.pv_avail, params.price, params.t_out))
    bat = params.battery
    cap, p_max, eta_c, eta_d = (float(g(x)[0]) for x in (bat.capacity_mwh, bat.p_max_mw, bat.eta_charge, bat.eta_discharge))
    soc_lo, soc_hi, soc0 = float(g(bat.soc_min)[0]), float(g(bat.soc_max)[0]), float(g(params.soc_init)[0])
    f = {k: float(g(getattr(params, k))) for k in (
        "deferrable", "diesel_max", "diesel_min_frac", "fuel_idle", "fuel_slope", "fuel_price", "diesel_co2",
        "grid_co2", "carbon_price", "grid_cap", "cop", "q_cool_max", "c_th", "tau", "temp_init", "t_limit", "reward_scale")}
    # variable layout: x [T, D+1] | q | temp[1..T] | ch | dis | soc[1..T] | d | u | pv | grid | spill
    names = ["x", "q", "temp", "ch", "dis", "soc", "d", "u", "pv", "grid", "spill"]
    sizes = [T * (D + 1)] + [T] * 10
    start = dict(zip(names, np.cumsum([0] + sizes[:-1])))
    n = sum(sizes)
    idx = lambda name, t: start[name] + t
    lo, up = np.zeros(n), np.full(n, np.inf)
    up[idx("q", 0):idx("q", T)] = f["q_cool_max"]
    lo[idx("temp", 0):idx("temp", T)], up[idx("temp", 0):idx("temp", T)] = -np.inf, f["t_limit"]
    up[idx("ch", 0):idx("ch", T)] = p_max
    up[idx("dis", 0):idx("dis", T)] = p_max
    lo[idx("soc", 0):idx("soc", T)], up[idx("soc", 0):idx("soc", T)] = soc_lo, soc_hi
    up[idx("u", 0):idx("u", T)] = 1.0
    up[idx("pv", 0):idx("pv", T)] = pv_avail
    up[idx("grid", 0):idx("grid", T)] = f["grid_cap"]
    t = np.arange(T)
    x_of = lambda ta, j: start["x"] + ta * (D + 1) + j
    lo[x_of(t, 0)] = (1.0 - f["deferrable"]) * arrival   # the share that cannot wait runs on arrival
    past_ta, past_j = np.nonzero(t[:, None] + np.arange(D + 1)[None, :] > T - 1)
    up[x_of(past_ta, past_j)] = 0.0   # nothing is served after the day's end

    rows, cols, vals, r_lo, r_up = [], [], [], [], []
    row = 0

    def add(entries, low, high):
        nonlocal row
        for c, v in entries:
            rows.append(row), cols.append(c), vals.append(v)
        r_lo.append(low), r_up.append(high)
        row += 1

    for ta in range(T):                                       # every arrival is served within the day
        add([(x_of(ta, j), 1.0) for j in range(D + 1)], arrival[ta], arrival[ta])
    served = [[(x_of(ta, tb - ta), 1.0) for ta in range(max(0, tb - D), tb + 1)] for tb in range(T)]
    for tb in range(T):
        it = served[tb]
        # balance: it + q / cop + ch + spill - pv - d - dis - grid = 0
        add(it + [(idx("q", tb), 1.0 / f["cop"]), (idx("ch", tb), 1.0), (idx("spill", tb), 1.0), (idx("pv", tb), -1.0),
                  (idx("d", tb), -1.0), (idx("dis", tb), -1.0), (idx("grid", tb), -1.0)], 0.0, 0.0)
        # room: temp[t+1] - temp[t] (1 - dt/tau) - dt it / c_th + dt q / c_th = dt t_out / tau (temp[0] known)
        keep = 1.0 - dt / f["tau"]
        rhs = dt * t_out[tb] / f["tau"] + (keep * f["temp_init"] if tb == 0 else 0.0)
        prev = [] if tb == 0 else [(idx("temp", tb - 1), -keep)]
        add([(idx("temp", tb), 1.0)] + prev + [(c, -dt / f["c_th"]) for c, _ in it] + [(idx("q", tb), dt / f["c_th"])], rhs, rhs)
        # battery: soc[t+1] - soc[t] - dt (eta_c ch - dis / eta_d) / cap = 0 (soc[0] known)
        rhs = soc0 if tb == 0 else 0.0
        prev = [] if tb == 0 else [(idx("soc", tb - 1), -1.0)]
        add([(idx("soc", tb), 1.0)] + prev + [(idx("ch", tb), -dt * eta_c / cap), (idx("dis", tb), dt / (eta_d * cap))], rhs, rhs)
        # diesel: u d_min <= d <= u d_max
        add([(idx("d", tb), 1.0), (idx("u", tb), -f["diesel_min_frac"] * f["diesel_max"])], 0.0, np.inf)
        add([(idx("d", tb), 1.0), (idx("u", tb), -f["diesel_max"])], -np.inf, 0.0)
    A = sp.csr_matrix((vals, (rows, cols)), shape=(row, n))
    c = np.zeros(n)
    fuel_cost = f["fuel_price"] + f["carbon_price"] * f["diesel_co2"]    # $ per litre
    c[idx("grid", 0):idx("grid", T)] = dt * (price + f["carbon_price"] * f["grid_co2"])
    c[idx("d", 0):idx("d", T)] = dt * f["fuel_slope"] * fuel_cost
    c[idx("u", 0):idx("u", T)] = dt * f["fuel_idle"] * f["diesel_max"] * fuel_cost
    part = lambda name: slice(idx(name, 0), idx(name, T))  # noqa: E731
    return c * f["reward_scale"], A, np.array(r_lo), np.array(r_up), lo, up, part


register_reference("dcmg", Reference(
    lambda env, params, task, progress: schedule_report(lp_bound(params), "lp_bound"),
    lambda task: "oracle: a perfect-foresight LP lower bound on each day's cost, HiGHS",
    lambda s: [("bound on the mean return", f"{s['oracle_return']:.4f}"),
               ("days without a feasible schedule", f"{s['infeasible_days']}"), *binding_rows(s)]))
