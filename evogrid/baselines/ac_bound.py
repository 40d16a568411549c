"""Transmission, AC mode: a lower bound on a day's cost, the second-order cone (SOC) relaxation of the
multi-period AC optimal power flow, solved by Clarabel.

The AC power flow written in the products of bus voltages, w_i = |V_i|^2 and W_ft = V_f conj(V_t) = a + j b
for each connected pair of buses, is linear: a branch's flows are S_f = conj(y_ff) w_f + conj(y_ft) W_ft and
S_t = conj(y_tt) w_t + conj(y_tf) conj(W_ft) (MATPOWER's branch model, the env's `acn`), a bus shunt
draws conj(y_sh) w_i. The one nonconvex condition, |W_ft|^2 = w_f w_t, is relaxed to |W_ft|^2 <= w_f w_t
(a rotated cone; Jabr's relaxation). Per step of the day, at the step's bus loads (P and Q):

    every bus's P and Q balance          units' outputs - loads = shunts + flows leaving it (equalities)
    |V| within each bus's band           vmin^2 <= w_i <= vmax^2
    MVA ratings at both ends             |S_f|, |S_t| <= rating (cones)
    active limits                        pmin <= pg <= pmax for every unit, the slack's too
    reactive limits                      the voltage-controlled buses' units within their summed Qmin, Qmax
                                         (where the task enforces them; the reference bus unlimited, as
                                         in the env), units elsewhere at their case output
    ramps                                |pg_t - pg_{t-1}| <= ramp, from the day's start-of-day dispatch

and the objective is the day's generation cost in reward units (the units' quadratic cost curves).
Every state the env reaches on a day that meets every limit satisfies all of it (W built from its
voltages), so the optimum is a lower bound on the cost of any day that meets every limit, up to the
solver's tolerance (relative 1e-8) and the ulps the env allows the slack at a limit. It is a bound, not
a schedule: its W need not come from voltages.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from evogrid.baselines.tso import DaySchedule, each_day

GAP_TOL = 1e-8      # Clarabel's relative duality gap: the bound holds up to this share of the cost


def socp_bound(params, days=None, progress=None) -> list[DaySchedule]:
    """The relaxation's optimum of each day (default: every day of `params`): `cost` in reward units (a
    lower bound on the cost of any day within every limit; None where the relaxation is infeasible: no day
    can meet every limit then), `pg` [T, n_units] MW the relaxation's dispatch. `progress(done, total)` is
    called after each day."""
    rows = socp_rows(params)
    g = lambda x: np.asarray(x, np.float64)  # noqa: E731
    load_p, load_q, start = g(params.load_p), g(params.load_q), g(params.init.pg)
    return [_solve_day(rows, params, load_p[d], load_q[d], start[d], int(d))
            for d in each_day(range(load_p.shape[0]) if days is None else days, progress)]


def socp_rows(params) -> dict:
    """One step's rows of the relaxation (the same every step), over the step's variables x = [w (n_bus) |
    a, b (n_pair: the real and imaginary parts of W for each connected pair of buses, the lower-numbered bus
    first) | pg (n_units, p.u.) | q (n_held: the reactive output at each voltage-controlled bus, p.u.)]:
    "balance" [2 n_bus, m] with the right-hand side balance @ x = [load_p; load_q] / baseMVA - "fixed_q";
    "pair" (f, t) buses of each pair; "flows" [2 n_rated, 2, m] the P and Q rows of both ends of each rated
    branch and "rating" [2 n_rated] p.u.; and the slices of x."""
    g = lambda x: np.asarray(x, np.float64)  # noqa: E731
    if not params.ac:
        raise ValueError("the SOCP bound is for the AC tasks (tso-caseN-ac); the DC tasks' oracle is already optimal")
    cost = params.cost
    poly = g(cost.poly)
    if bool(cost.any_pwl) or poly.shape[1] > 3 or np.any(poly[:, 2:] < 0):
        raise ValueError("the SOCP bound needs every unit's cost to be a convex quadratic polynomial (gencost model 2, "
                         "at most 3 coefficients, the squared term's >= 0)")
    net, base = params.acn, float(params.base_mva)
    f, t = np.asarray(net.f_bus), np.asarray(net.t_bus)
    yff, yft, ytf, ytt = (np.asarray(y, np.complex128) for y in (net.yff, net.yft, net.ytf, net.ytt))
    n_bus, n_br, n_units = int(net.ybus.shape[0]), f.shape[0], int(params.pmax.shape[0])
    ysh = np.diag(np.asarray(net.ybus, np.complex128)).copy()
    np.subtract.at(ysh, f, yff)
    np.subtract.at(ysh, t, ytt)
    lo_hi = np.sort(np.stack([f, t], 1), axis=1)
    pairs, pair_of = np.unique(lo_hi, axis=0, return_inverse=True)
    pair_of, sign = pair_of.ravel(), np.where(f < t, 1.0, -1.0)      # W_ft = a + j sign b of the branch's pair
    n_pair = pairs.shape[0]
    held = np.flatnonzero(g(params.vbus_incidence).sum(0) > 0) if params.voltage_control else \
        np.flatnonzero(g(params.gen_incidence).sum(0) > 0)
    n_held = held.shape[0]
    sl = dict(w=slice(0, n_bus), a=slice(n_bus, n_bus + n_pair), b=slice(n_bus + n_pair, n_bus + 2 * n_pair),
              pg=slice(n_bus + 2 * n_pair, n_bus + 2 * n_pair + n_units))
    sl["q"] = slice(sl["pg"].stop, sl["pg"].stop + n_held)
    m = sl["q"].stop

    def end_rows(k, y_self, y_mut, bus, conj_w):
        """[2, m] the P and Q rows of the flow leaving `bus` on branch k (conj_w: the far end's W is conj(W_ft))."""
        r = np.zeros((2, m))
        s = sign[k] * (-1.0 if conj_w else 1.0)           # the imaginary part of the W this end sees
        r[0, sl["w"].start + bus] += y_self.real
        r[1, sl["w"].start + bus] -= y_self.imag
        # conj(y) (a + j s b) = (g a + bb s b) + j (g s b - bb a), with y = g + j bb
        r[0, sl["a"].start + pair_of[k]] += y_mut.real
        r[0, sl["b"].start + pair_of[k]] += y_mut.imag * s
        r[1, sl["a"].start + pair_of[k]] -= y_mut.imag
        r[1, sl["b"].start + pair_of[k]] += y_mut.real * s
        return r

    ends = np.stack([np.stack([end_rows(k, yff[k], yft[k], f[k], False), end_rows(k, ytt[k], ytf[k], t[k], True)])
                     for k in range(n_br)])                   # [n_br, 2 ends, 2 (P, Q), m]
    leaving = np.zeros((2, n_bus, m))                         # flows and shunt leaving each bus
    for k in range(n_br):
        leaving[:, f[k]] += ends[k, 0]
        leaving[:, t[k]] += ends[k, 1]
    leaving[0, np.arange(n_bus), sl["w"].start + np.arange(n_bus)] += ysh.real
    leaving[1, np.arange(n_bus), sl["w"].start + np.arange(n_bus)] -= ysh.imag
    balance = -leaving
    balance[0][:, sl["pg"]] += g(params.gen_incidence).T      # [n_bus, n_units]
    balance[1][held, sl["q"].start + np.arange(n_held)] += 1.0
    others = np.ones(n_bus, bool)
    others[held] = False
    fixed_q = np.where(others, g(params.qg) @ g(params.gen_incidence), 0.0) / base
    rate = g(params.rate)
    rated = np.flatnonzero(np.isfinite(rate))
    ref = np.flatnonzero(g(params.slack) @ g(params.gen_incidence))
    q_lo, q_hi = np.full(n_held, -np.inf), np.full(n_held, np.inf)
    if params.q_min is not None:
        q_lo, q_hi = g(params.q_min)[held] / base, g(params.q_max)[held] / base
        q_lo[np.isin(held, ref)], q_hi[np.isin(held, ref)] = -np.inf, np.inf
    return {"balance": balance.reshape(2 * n_bus, m), "fixed_q": np.concatenate([np.zeros(n_bus), fixed_q]),
            "pair": pairs, "flows": ends[rated].reshape(2 * rated.shape[0], 2, m),
            "rating": np.repeat(rate[rated] / base, 2), "slices": sl, "m": m, "held": held, "q_lim": (q_lo, q_hi)}


def voltage_products(rows, v) -> np.ndarray:
    """The variables x of one step for the complex bus voltages `v` [n_bus] (the rest zero): w = |V|^2 and,
    for each pair (f, t), a + j b = V_f conj(V_t)."""
    sl = rows["slices"]
    x = np.zeros(rows["m"])
    x[sl["w"]] = np.abs(v) ** 2
    prod = v[rows["pair"][:, 0]] * np.conj(v[rows["pair"][:, 1]])
    x[sl["a"]], x[sl["b"]] = prod.real, prod.imag
    return x


def _solve_day(rows, params, load_p, load_q, start, day) -> DaySchedule:
    import clarabel

    g = lambda x: np.asarray(x, np.float64)  # noqa: E731
    T, m, sl = load_p.shape[0], rows["m"], rows["slices"]
    base, dt, scale = float(params.base_mva), float(params.delta_t_hours), float(params.reward_scale)
    n_units = sl["pg"].stop - sl["pg"].start
    eye_t = sp.identity(T, format="csr")
    # equalities: each step's balance
    A_eq = sp.kron(eye_t, sp.csr_matrix(rows["balance"]))
    b_eq = (np.concatenate([load_p, load_q], axis=1) / base - rows["fixed_q"][None]).ravel()
    # bounds on one step's variables: x <= hi, -x <= -lo (finite ones only)
    lo, hi = np.full(m, -np.inf), np.full(m, np.inf)
    lo[sl["w"]], hi[sl["w"]] = g(params.vmin) ** 2, g(params.vmax) ** 2
    lo[sl["pg"]], hi[sl["pg"]] = g(params.pmin) / base, g(params.pmax) / base
    lo[sl["q"]], hi[sl["q"]] = rows["q_lim"]
    eye_m = sp.identity(m, format="csr")
    up, down = np.isfinite(hi), np.isfinite(lo)
    bound = sp.vstack([eye_m[up], -eye_m[down]])
    A_bd = sp.kron(eye_t, bound)
    b_bd = np.tile(np.concatenate([hi[up], -lo[down]]), T)
    # ramps: +-(pg_t - pg_{t-1}) <= ramp, pg_{-1} the start-of-day dispatch
    pick = sp.csr_matrix((np.ones(n_units), (np.arange(n_units), np.arange(sl["pg"].start, sl["pg"].stop))), shape=(n_units, m))
    diff = sp.kron(sp.diags([1.0, -1.0], [0, -1], shape=(T, T)), pick)
    ramp = np.tile(g(params.ramp) / base, T)
    first = np.zeros(T * n_units)
    first[:n_units] = start / base
    A_rp, b_rp = sp.vstack([diff, -diff]), np.concatenate([ramp + first, ramp - first])
    # cones, per step: |W|^2 <= w_f w_t as ||(2a, 2b, w_f - w_t)|| <= w_f + w_t; ||(P, Q)|| <= rating at each end
    n_pair = rows["pair"].shape[0]
    idx = np.arange(n_pair)
    wf, wt = sl["w"].start + rows["pair"][:, 0], sl["w"].start + rows["pair"][:, 1]
    soc = sp.lil_matrix((4 * n_pair, m))
    soc[4 * idx, wf], soc[4 * idx, wt] = -1.0, -1.0
    soc[4 * idx + 1, sl["a"].start + idx] = -2.0
    soc[4 * idx + 2, sl["b"].start + idx] = -2.0
    soc[4 * idx + 3, wf], soc[4 * idx + 3, wt] = -1.0, 1.0
    n_rated = rows["rating"].shape[0]
    flows = np.zeros((3 * n_rated, m))
    flows[1::3], flows[2::3] = -rows["flows"][:, 0], -rows["flows"][:, 1]
    cone_step = sp.vstack([soc.tocsr(), sp.csr_matrix(flows)])
    A_cone = sp.kron(eye_t, cone_step)
    b_cone = np.tile(np.concatenate([np.zeros(4 * n_pair), np.stack([rows["rating"], np.zeros(n_rated), np.zeros(n_rated)], 1).ravel()]), T)
    A = sp.vstack([A_eq, A_bd, A_rp, A_cone], format="csc")
    b = np.concatenate([b_eq, b_bd, b_rp, b_cone])
    cones = ([clarabel.ZeroConeT(A_eq.shape[0]), clarabel.NonnegativeConeT(A_bd.shape[0] + A_rp.shape[0])]
             + ([clarabel.SecondOrderConeT(4)] * n_pair + [clarabel.SecondOrderConeT(3)] * n_rated) * T)
    # objective: dt * scale * sum (c2 pg^2 + c1 pg + c0), pg = base x
    poly = np.zeros((n_units, 3))
    poly[:, :g(params.cost.poly).shape[1]] = g(params.cost.poly)
    w = dt * scale
    quad, lin = np.zeros(m), np.zeros(m)
    quad[sl["pg"]], lin[sl["pg"]] = 2.0 * w * poly[:, 2] * base**2, w * poly[:, 1] * base
    settings = clarabel.DefaultSettings()
    settings.verbose = False
    solver = clarabel.DefaultSolver(sp.diags(np.tile(quad, T), format="csc"), np.tile(lin, T), A, b, cones, settings)
    result = solver.solve()
    if str(result.status) not in ("Solved", "AlmostSolved"):
        return DaySchedule(day, "infeasible" if "Infeasible" in str(result.status) else f"Clarabel: {result.status}", None)
    x = np.array(result.x).reshape(T, m)
    return DaySchedule(day, "optimal", float(result.obj_val) + w * T * poly[:, 0].sum(), x[:, sl["pg"]] * base)
