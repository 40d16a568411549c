"""DSO feeder: a LinDistFlow schedule of every step, corrected against the real power flow and replayed.

The DSO task has no coupling between steps (a flexible load's shift is paid for, not paid back; PV and
loads are given), so a perfect-foresight day schedule is the best action of each step on its own. Each
step is a QP over (per unit of base MVA unless said)

    s+, s- in [0, shift_max]   the flexible loads' up/down shift (share of the bus load; P and Q scale)
    c in [0, avail] MW          PV curtailment;  q in [-Qcap, Qcap] MVAr PV reactive power, with
                                Qcap = sqrt(S^2 - avail^2) (the smallest headroom: whatever is curtailed)
    P_k, Q_k                    branch flows = the downstream net loads (LinDistFlow: losses left out)
    u_j = u_0 - 2 sum_{k on the path to j} (r_k P_k + x_k Q_k) + e_j  in [v_min^2, v_max^2]

    min  dt (loss_price base sum_k r_k (P_k^2 + Q_k^2) + curtail_price c + discomfort_price |shift| MW)

solved by Clarabel. LinDistFlow leaves losses out of the voltage drop, so its voltages are optimistic;
e_j corrects them: after each solve the actions are played through the env's power flow (backward /
forward sweep) and e_j becomes the difference between the real and the linear |V|^2 at that schedule
(three rounds). The day's actions are then replayed through the env: the reported cost is the env's
own, and a day counts as solved only if that replay has every cost channel zero. It is a good feasible
schedule, not a proven optimum (losses are quadratic in the linear flows, the PV headroom is the
conservative one), so a learned policy may beat it by a little: gaps can be slightly negative.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import scipy.sparse as sp

from evogrid.baselines.solvers import solve_qp
from evogrid.baselines.tso import DaySchedule, replay

ROUNDS = 3            # voltage-correction rounds
V_MARGIN = 1e-4       # p.u. kept inside the voltage band, so round-off in float32 replays stays feasible


def feeder_oracle(env, params, days=None) -> list[DaySchedule]:
    """The corrected LinDistFlow schedule of each day (default: every day), replayed through `env`.
    `DaySchedule.pg` holds the day's actions [T, n_act]; `line_binding` says some bus voltage sits at its
    limit (within 1e-3 p.u.) at some step of the replay. Status "infeasible": some step has no schedule
    even in the (optimistic) linear model; "violates": the replay still breaks a limit."""
    g = lambda x: np.asarray(x, np.float64)  # noqa: E731
    net = params.net
    down, z = g(net.down), np.asarray(net.z, np.complex128)
    r, x = z.real, z.imag
    voltages = _voltages_fn(env, params)
    out = []
    for d in range(g(params.load_p).shape[0]) if days is None else days:
        d = int(d)
        T = params.max_steps
        offset = np.zeros((T, down.shape[1]))
        status, actions = "optimal", None
        for _ in range(ROUNDS + 1):
            sols = [_step_qp(params, g, d, t, down, r, x, offset[t]) for t in range(T)]
            if not all(s[0].ok for s in sols):
                status = next(s[0].status for s in sols if not s[0].ok)
                break
            actions = np.stack([s[1] for s in sols])
            u_lin = np.stack([s[2] for s in sols])
            vm = voltages(d, actions)
            offset = offset + vm**2 - u_lin          # the linear model's error at this schedule
        if status != "optimal":
            out.append(DaySchedule(d, status, None))
            continue
        ret, costs = replay(env, params, d, actions)
        vm = voltages(d, actions)
        if np.any(costs > 1e-6):
            out.append(DaySchedule(d, "violates", None, actions))
            continue
        root = np.arange(vm.shape[1]) != net.root
        v_lo, v_hi = g(params.v_min), g(params.v_max)
        binding = bool(np.any((vm[:, root] <= v_lo + 1e-3) | (vm[:, root] >= v_hi - 1e-3)))
        out.append(DaySchedule(d, "optimal", -ret, actions, line_binding=binding))
    return out


def _voltages_fn(env, params):
    """(day, actions [T, n_act]) -> |V| [T, n_bus] of each step's power flow with those actions."""
    @jax.jit
    def run(day, actions):
        def one(t, a):
            state = env.start_state(day, params).replace(time_step=t)
            return env._solve_feeder(state, a, params)[0]["vm"]
        return jax.vmap(one)(jnp.arange(actions.shape[0], dtype=jnp.int32), actions)

    return lambda d, a: np.asarray(run(jnp.int32(d), jnp.asarray(a, params.load_p.dtype)), np.float64)


def _step_qp(params, g, d, t, down, r, x, offset):
    """One step's QP: (solution, env action, LinDistFlow |V|^2 [n_bus] at the solution)."""
    base, dt = float(params.base_mva), float(params.delta_t_hours)
    load_p, load_q = g(params.load_p)[d, t], g(params.load_q)[d, t]
    flex, pv_inc = g(params.flex_incidence), g(params.pv_incidence)
    n_bus, n_br, n_flex, n_pv = load_p.shape[0], down.shape[0], flex.shape[0], pv_inc.shape[0]
    avail = g(params.pv_avail)[d, t] * g(params.pv_rating)
    s_max, inv_s = float(params.shift_max), g(params.inverter_s)
    q_cap = np.sqrt(np.maximum(inv_s**2 - avail**2, 0.0))
    # variables: s+ | s- | c | q | P | Q
    n = 2 * n_flex + 2 * n_pv + 2 * n_br
    sp_, sm, c, q, P, Q = np.split(np.arange(n), np.cumsum([n_flex, n_flex, n_pv, n_pv, n_br]))
    col_lo = np.concatenate([np.zeros(2 * n_flex + n_pv), -q_cap, np.full(2 * n_br, -np.inf)])
    col_up = np.concatenate([np.full(2 * n_flex, s_max), avail, q_cap, np.full(2 * n_br, np.inf)])
    flex_p, flex_q = flex * load_p[None, :], flex * load_q[None, :]     # [n_flex, n_bus] MW moved per unit shift
    # P - down (flex_p' (s+ - s-) + pv' c) / base = down (load_p - pv' avail) / base;  Q likewise with -pv' q
    A_p = np.hstack([-down @ flex_p.T, down @ flex_p.T, -down @ pv_inc.T, np.zeros((n_br, n_pv)), np.eye(n_br), np.zeros((n_br, n_br))])
    A_q = np.hstack([-down @ flex_q.T, down @ flex_q.T, np.zeros((n_br, n_pv)), down @ pv_inc.T, np.zeros((n_br, n_br)), np.eye(n_br)])
    b_p = down @ (load_p - pv_inc.T @ avail) / base
    b_q = down @ load_q / base
    A_p[:, :2 * n_flex + 2 * n_pv] /= base
    A_q[:, :2 * n_flex + 2 * n_pv] /= base
    # u = u0 - 2 down' (r P + x Q) + offset, inside the band (non-root buses)
    u0 = abs(complex(np.asarray(params.net.v_root))) ** 2
    keep = np.arange(n_bus) != params.net.root
    A_v = np.zeros((n_bus, n)); A_v[:, P] = -2.0 * down.T * r[None, :]; A_v[:, Q] = -2.0 * down.T * x[None, :]  # noqa: E702
    v_lo = (g(params.v_min) + V_MARGIN) ** 2 - u0 - offset
    v_hi = (g(params.v_max) - V_MARGIN) ** 2 - u0 - offset
    v_lo, v_hi = np.broadcast_to(v_lo, (n_bus,))[keep], np.broadcast_to(v_hi, (n_bus,))[keep]
    A = sp.csc_matrix(np.vstack([A_p, A_q, A_v[keep]]))
    row_lo = np.concatenate([b_p, b_q, v_lo])
    row_up = np.concatenate([b_p, b_q, v_hi])
    cost = np.zeros(n)
    cost[sp_] = cost[sm] = float(params.discomfort_price) * dt * (flex @ load_p)
    cost[c] = float(params.curtail_price) * dt
    hess = np.zeros(n)
    hess[P] = hess[Q] = 2.0 * float(params.loss_price) * dt * base * r
    scale = float(params.reward_scale)
    sol = solve_qp(cost * scale, A, row_lo, row_up, col_lo, col_up, hess * scale)
    if not sol.ok:
        return sol, None, None
    xs = sol.x
    shift = (xs[sp_] - xs[sm]) / s_max if s_max > 0 else np.zeros(n_flex)
    curt = np.divide(xs[c], avail, out=np.zeros(n_pv), where=avail > 1e-12)
    headroom = np.sqrt(np.maximum(inv_s**2 - (avail - xs[c]) ** 2, 0.0))
    aq = np.divide(xs[q], headroom, out=np.zeros(n_pv), where=headroom > 1e-12)
    action = np.clip(np.concatenate([shift, curt, aq]), -1.0, 1.0)
    u_lin = u0 + A_v @ xs + offset
    return sol, action, u_lin
