"""Feeders (DSO, DERs): a perfect-foresight LinDistFlow schedule of the day, corrected against the real power
flow and replayed through the env.

The day is one QP over every step t (per unit of base MVA unless said):

    s+, s- in [0, shift_max]   the flexible loads' up/down shift (share of the bus load; P and Q scale)
    c in [0, avail] MW          PV curtailment;  q in [-Qcap, Qcap] MVAr PV reactive power, with
                                Qcap = sqrt(S^2 - avail^2) (the smallest headroom: whatever is curtailed)
    ch, dis in [0, p_max] MW    battery charge / discharge (DERs), soc[t+1] = soc[t] + dt (eta_c ch -
                                dis / eta_d) / capacity within [soc_min + taper, soc_max - taper] (where
                                the env never derates the battery), soc[T] >= soc[0] (no end-of-day shortfall)
    P_k, Q_k                    branch flows = the downstream net loads (LinDistFlow: losses left out)
    u_j = u_0 - 2 sum_{k on the path to j} (r_k P_k + x_k Q_k) + e_j  in [v_min^2, v_max^2]

    min  sum_t dt (price_t import_t + loss_price losses_t + curtail_price c_t + discomfort_price |shift_t| MW)
         import = net load + losses,  losses = base sum_k r_k (P_k^2 + Q_k^2)

solved by Clarabel (DSO: price 0 and no batteries, so the day separates into its steps; DERs: the
substation import is bought at the time-of-use price and the batteries couple the steps). LinDistFlow
leaves losses out of the voltage drop, so its voltages are optimistic; e_j corrects them: after each
solve the day is played through the env (backward / forward sweep) and e_j becomes the difference
between the real and the linear |V|^2 at that schedule (three rounds). The day's actions are then
replayed: the reported cost is the env's own, and a day counts as solved only if that replay has every
cost channel zero. It is a good feasible schedule, not a proven optimum (losses are quadratic in the
linear flows, the PV headroom and battery band are conservative), so a learned policy may beat it by a
little: gaps can be slightly negative.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import scipy.sparse as sp

from evogrid.baselines.report import Reference, binding_rows, percent, register_reference, schedule_report
from evogrid.baselines.solvers import solve_qp
from evogrid.baselines.tso import DaySchedule
from evogrid.envs.dist import flex_action

ROUNDS = 3            # voltage-correction rounds
V_MARGIN = 1e-4       # p.u. kept inside the voltage band, so round-off in float32 replays stays feasible


def feeder_oracle(env, params, days=None) -> list[DaySchedule]:
    """The corrected LinDistFlow schedule of each day (default: every day), replayed through `env`.
    `DaySchedule.pg` holds the day's actions [T, n_act]; `binding["voltage"]` says some bus voltage sits at
    its limit (within 1e-3 p.u.) at some step of the replay, `binding["battery"]` (DERs) that some battery
    reaches its power rating or its state-of-charge band. Status "infeasible": no schedule even in the
    (optimistic) linear model; "violates": the replay still breaks a limit."""
    # the schedule is replayed on the physics alone (no safety layer): a layer would move an iterate
    # outside the band and hide the linear model's error
    play = replay_fn(env, params)
    out = []
    for d in range(np.asarray(params.load_p).shape[0]) if days is None else days:
        d = int(d)
        offset = np.zeros(np.asarray(params.load_p).shape[1:])
        for _ in range(ROUNDS + 1):
            sol, actions, u_lin, battery = _day_qp(params, d, offset)
            if not sol.ok:
                break
            offset = offset + play(d, actions)[2] ** 2 - u_lin      # the linear model's error at this schedule
        if not sol.ok:
            out.append(DaySchedule(d, sol.status, None))
            continue
        ret, costs, vm = play(d, actions)
        if np.any(costs > 1e-6):
            out.append(DaySchedule(d, "violates", None, actions))
            continue
        root = np.arange(vm.shape[1]) != params.net.root
        v_lo, v_hi = np.asarray(params.v_min, np.float64), np.asarray(params.v_max, np.float64)
        binding = {"voltage": bool(np.any((vm[:, root] <= v_lo + 1e-3) | (vm[:, root] >= v_hi - 1e-3)))}
        if battery is not None:
            binding["battery"] = battery
        out.append(DaySchedule(d, "optimal", -ret, actions, binding))
    return out


def replay_fn(env, params):
    """(day, actions [T, n_act]) -> (return, summed costs [C], |V| [T, n_bus] after each step), float64 out."""
    @jax.jit
    def run(day, actions):
        _, state = env.reset_to_day(day, params)

        def step(state, a):
            _, state, reward, costs, _, _ = env.step_no_reset(jax.random.key(0), state, a, params)
            return state, (reward, costs, state.vm)

        _, (reward, costs, vm) = jax.lax.scan(step, state, actions)
        return reward.sum(), costs.sum(0), vm

    def play(d, actions):
        ret, costs, vm = run(jnp.int32(d), jnp.asarray(actions, params.load_p.dtype))
        return float(ret), np.asarray(costs, np.float64), np.asarray(vm, np.float64)

    return play


SOFT_BAND = 1e6       # $ per p.u. of |V|^2 outside the band, per interval: the rolling policy's least violating schedule


def rolling_policy(env, params, days=None, progress=None, record=None):
    """Replayed figures of the operator's rolling dispatch of a DSO feeder (model-predictive control): every
    interval's action is `mpc_decision`'s on what the controller observes. The feeder's intervals do not couple
    (no storage, no energy price), so the interval alone is the horizon: a forecast would add nothing. `env`
    may be `Shielded` (the action then passes through the safety layer). `record`, a list, receives each
    interval's (observation, action). Returns (returns [n], costs [n, C], MWh the layer moved per day [n],
    mean seconds per decision)."""
    from evogrid.baselines.tso import play_decisions
    from evogrid.envs.dist import read_observation

    decide = mpc_decision(params)
    read = jax.jit(lambda obs: read_observation(obs, params))
    days = range(np.asarray(params.load_p).shape[0]) if days is None else days
    return play_decisions(env, params, days, read, lambda d, t, seen: decide(seen, f"day {d} step {t}: "),
                          progress, record)


def mpc_decision(params):
    """The operator's decision on a DSO feeder, `decide(seen, where="") -> action`, from what one observation says
    (`seen` = `read_observation(obs)` as float64 arrays): that interval's LinDistFlow QP (`_schedule_qp`) at
    the bus loads and PV power it observes (reactive loads at each bus's power factor), its linear voltages
    corrected by its own sweep power flow of the schedule, warm-started from the observed |V| (`ROUNDS` rounds,
    as the oracle corrects by the env). Where no schedule keeps every bus within its band in the linear model,
    the least violating one (`SOFT_BAND`). `where` prefixes the error a failed solve raises."""
    from evogrid.envs.dist import decode_controls, feeder_flow

    if hasattr(params, "battery"):
        raise ValueError("the feeder's rolling dispatch plans one interval at a time: it has no plan for batteries "
                         "(DERs tasks); use the oracle (`evogrid baseline`) there")
    g = lambda x: np.asarray(x, np.float64)  # noqa: E731
    ratio, dtype = g(params.q_ratio), params.load_p.dtype

    @jax.jit
    def sweep_vm(load_p, avail, vm, action):   # |V| of the controller's own power flow of the interval
        controls = decode_controls(action, load_p, avail, params)
        return feeder_flow(load_p, load_p * params.q_ratio, avail, vm.astype(params.net.z.dtype), controls, params)[0]["vm"]

    def decide(seen, where=""):
        load_p, avail = seen["load_mw"][None], seen["avail_mw"][None]
        offset = np.zeros_like(load_p)
        for soft in (None, SOFT_BAND):
            for r in range(ROUNDS + 1):
                sol, actions, u_lin, _ = _schedule_qp(params, load_p, load_p * ratio, avail, np.zeros(1), offset, soft)
                if not sol.ok:
                    break
                action = jnp.asarray(actions[0], dtype)
                if r < ROUNDS:
                    vm = sweep_vm(jnp.asarray(load_p[0], dtype), jnp.asarray(avail[0], dtype), jnp.asarray(seen["vm"], dtype), action)
                    offset = offset + g(vm)[None] ** 2 - u_lin
            if sol.ok:
                return action
            offset = np.zeros_like(load_p)
        raise RuntimeError(f"feeder rolling dispatch, {where}the solver returned {sol.status!r}")

    return decide


LOAD_SPREAD = 0.10     # log-normal spread of one bus's load in a perturbed observation (`perturbed_demonstrations`)
FEEDER_SPREAD = 0.15   # ... of the whole feeder's load and PV power, the day-to-day spread the profiles show


def perturbed_demonstrations(params, obs, copies: int, seed: int = 0, progress=None):
    """(observations [copies * N, obs_dim], actions [copies * N, n_act]) float32: `copies` perturbed copies of
    every feeder observation in `obs` [N, obs_dim] (whole days of `params.max_steps` intervals, as
    `demonstrations` records them), each labelled by the operator's decision on it (`mpc_decision`). A copy
    scales every bus load by its own log-normal factor (spread `LOAD_SPREAD`) times one for the whole feeder
    (`FEEDER_SPREAD`), and the PV power available by the feeder's factor, within the ratings; the |V| and the
    time features stay. The intervals do not couple, so a perturbed observation is a situation the operator
    could meet and its decision a true label: inputs the training days do not hold, for a fit that
    generalises beyond them (`ECConfig.init_augment`). Seeded; `progress(done, total)` after each day."""
    from evogrid.baselines.tso import each_day
    from evogrid.envs.dist import read_observation

    obs = np.asarray(obs, np.float64)
    n_bus, n_pv, steps = params.flex_incidence.shape[-1], params.pv_incidence.shape[0], params.max_steps
    load, pv = slice(n_bus, 2 * n_bus), slice(2 * n_bus, 2 * n_bus + n_pv)
    decide, rng = mpc_decision(params), np.random.default_rng(seed)
    read = jax.jit(jax.vmap(lambda o: read_observation(o, params)))
    out_obs, out_actions = [], []
    for d in each_day(range(len(obs) // steps), progress):
        day = np.repeat(obs[d * steps:(d + 1) * steps][None], copies, 0).reshape(copies * steps, -1)
        feeder = FEEDER_SPREAD * rng.standard_normal((len(day), 1))
        day[:, load] *= np.exp(feeder + LOAD_SPREAD * rng.standard_normal((len(day), n_bus)))
        day[:, pv] = np.clip(day[:, pv] * np.exp(feeder), 0.0, 1.0)
        seen = {k: np.asarray(v, np.float64) for k, v in read(jnp.asarray(day, params.load_p.dtype)).items()}
        out_obs.append(day)
        out_actions += [np.asarray(decide({k: v[i] for k, v in seen.items()})) for i in range(len(day))]
    return np.concatenate(out_obs).astype(np.float32), np.stack(out_actions).astype(np.float32)


def _day_qp(params, d, offset):
    """The day's QP (`_schedule_qp` on day `d`'s loads, PV and price)."""
    g = lambda x: np.asarray(x, np.float64)  # noqa: E731
    price = g(params.price)[d] if hasattr(params, "price") else np.zeros(params.max_steps)
    return _schedule_qp(params, g(params.load_p)[d], g(params.load_q)[d], g(params.pv_avail)[d] * g(params.pv_rating),
                        price, offset)


def _schedule_qp(params, load_p, load_q, avail, price, offset, soft=None):
    """The QP of the intervals given by their bus loads (`load_p` MW, `load_q` MVAr [T, n_bus]), PV power
    available (`avail` [T, n_pv] MW) and energy price (`price` [T]), with the linear model's voltage error
    `offset` [T, n_bus] (|V|^2): (solution, env actions [T, n_act], LinDistFlow |V|^2 [T, n_bus], battery
    binding or None). `soft` ($ per p.u. of |V|^2 per interval) turns the voltage band into a penalty: the
    least violating schedule where none meets it."""
    g = lambda x: np.asarray(x, np.float64)  # noqa: E731
    T, base, dt = load_p.shape[0], float(params.base_mva), float(params.delta_t_hours)
    down, z = g(params.net.down), np.asarray(params.net.z, np.complex128)
    r, x = z.real, z.imag
    flex, pv_inc = g(params.flex_incidence), g(params.pv_incidence)
    bat_inc = g(params.battery_incidence) if hasattr(params, "battery_incidence") else np.zeros((0, load_p.shape[1]))
    n_bus, n_br, n_flex, n_pv, n_bat = load_p.shape[1], down.shape[0], flex.shape[0], pv_inc.shape[0], bat_inc.shape[0]
    keep = np.arange(n_bus) != params.net.root
    n_soft = int(keep.sum()) if soft is not None else 0
    s_max, inv_s = float(params.shift_max), g(params.inverter_s)
    q_cap = np.sqrt(np.maximum(inv_s**2 - avail**2, 0.0))
    # per step: s+ | s- | c | q | ch | dis | soc (after the step) | P | Q | |V|^2 below, above the band (soft)
    sizes = [n_flex, n_flex, n_pv, n_pv, n_bat, n_bat, n_bat, n_br, n_br, n_soft, n_soft]
    m = sum(sizes)
    cut = np.cumsum([0] + sizes)
    part = {k: np.arange(cut[i], cut[i + 1])
            for i, k in enumerate(["sp", "sm", "c", "q", "ch", "dis", "soc", "P", "Q", "below", "above"])}
    at = lambda k, t: t * m + part[k]  # noqa: E731
    n = T * m
    col_lo, col_up = np.full(n, -np.inf), np.full(n, np.inf)
    cost, hess = np.zeros(n), np.zeros(n)
    steps, r_lo, r_up = [], [], []   # each step's rows (its flows and voltages), then the bounds of every row
    u0 = abs(complex(np.asarray(params.net.v_root))) ** 2
    v_band = [np.broadcast_to((g(params.v_min) + V_MARGIN) ** 2 - u0, (n_bus,)),
              np.broadcast_to((g(params.v_max) - V_MARGIN) ** 2 - u0, (n_bus,))]
    A_v = np.zeros((n_bus, m))
    A_v[:, part["P"]], A_v[:, part["Q"]] = -2.0 * down.T * r[None, :], -2.0 * down.T * x[None, :]
    A_band = A_v[keep]
    if n_soft:
        A_band[:, part["below"]], A_band[:, part["above"]] = np.eye(n_soft), -np.eye(n_soft)
    if n_bat:
        bat = params.battery
        cap, p_max = g(bat.capacity_mwh), g(bat.p_max_mw)
        eta_c, eta_d, taper = g(bat.eta_charge), g(bat.eta_discharge), g(bat.taper)
        soc0 = g(params.soc_init)
        soc_lo, soc_hi = np.broadcast_to(g(bat.soc_min) + taper, (n_bat,)), np.broadcast_to(g(bat.soc_max) - taper, (n_bat,))
    loss_w = float(params.loss_price) * dt * base
    for t in range(T):
        lo_t, up_t = np.zeros(m), np.zeros(m)
        up_t[part["sp"]] = up_t[part["sm"]] = s_max
        up_t[part["c"]] = avail[t]
        lo_t[part["q"]], up_t[part["q"]] = -q_cap[t], q_cap[t]
        lo_t[part["P"]] = lo_t[part["Q"]] = -np.inf
        up_t[part["P"]] = up_t[part["Q"]] = up_t[part["below"]] = up_t[part["above"]] = np.inf
        if n_bat:
            up_t[part["ch"]] = up_t[part["dis"]] = p_max
            lo_t[part["soc"]], up_t[part["soc"]] = soc_lo, soc_hi
        col_lo[t * m:(t + 1) * m], col_up[t * m:(t + 1) * m] = lo_t, up_t
        flex_p, flex_q = flex * load_p[t][None, :], flex * load_q[t][None, :]      # [n_flex, n_bus] MW per unit shift
        # net load (MW) per bus, linear part: dp = flex_p' (s+ - s-) + pv' c + bat' (ch - dis)
        dp = np.zeros((n_bus, m))
        dp[:, part["sp"]], dp[:, part["sm"]], dp[:, part["c"]] = flex_p.T, -flex_p.T, pv_inc.T
        dp[:, part["ch"]], dp[:, part["dis"]] = bat_inc.T, -bat_inc.T
        dq = np.zeros((n_bus, m))
        dq[:, part["sp"]], dq[:, part["sm"]], dq[:, part["q"]] = flex_q.T, -flex_q.T, -pv_inc.T
        p0, q0 = load_p[t] - pv_inc.T @ avail[t], load_q[t]
        rows = []
        for flows, dnet, net0 in ((part["P"], dp, p0), (part["Q"], dq, q0)):   # flow - down dnet / base = down net0 / base
            block = -down @ dnet / base
            block[:, flows] += np.eye(n_br)
            rows.append(block)
            r_lo.append(down @ net0 / base), r_up.append(down @ net0 / base)
        steps.append(sp.csr_matrix(np.vstack(rows + [A_band])))
        r_lo.append(v_band[0][keep] - offset[t][keep]), r_up.append(v_band[1][keep] - offset[t][keep])
        # cost: import at the price (net load + losses), losses, curtailment, discomfort
        w = np.zeros(m)
        w += price[t] * dt * dp.sum(0)
        w[part["sp"]] += float(params.discomfort_price) * dt * flex_p.sum(1)
        w[part["sm"]] += float(params.discomfort_price) * dt * flex_p.sum(1)
        w[part["c"]] += float(params.curtail_price) * dt
        w[part["below"]] = w[part["above"]] = soft or 0.0
        cost[t * m:(t + 1) * m] = w
        h = np.zeros(m)
        h[part["P"]] = h[part["Q"]] = 2.0 * (loss_w + price[t] * dt * base) * r
        hess[t * m:(t + 1) * m] = h
    blocks = [sp.block_diag(steps, format="csr")]
    if n_bat:   # soc[t] - soc[t-1] - dt (eta_c ch - dis / eta_d) / cap = 0 (soc[-1] = soc0); soc[T-1] >= soc0
        link = sp.lil_matrix((T * n_bat + n_bat, n))
        for t in range(T):
            for j in range(n_bat):
                i = t * n_bat + j
                link[i, at("soc", t)[j]] = 1.0
                if t:
                    link[i, at("soc", t - 1)[j]] = -1.0
                link[i, at("ch", t)[j]] = -dt * eta_c[j] / cap[j]
                link[i, at("dis", t)[j]] = dt / (eta_d[j] * cap[j])
        for j in range(n_bat):
            link[T * n_bat + j, at("soc", T - 1)[j]] = 1.0
        blocks.append(link.tocsr())
        r_lo += [np.concatenate([soc0, np.zeros((T - 1) * n_bat)]), soc0]
        r_up += [np.concatenate([soc0, np.zeros((T - 1) * n_bat)]), np.full(n_bat, np.inf)]
    A = sp.vstack(blocks).tocsc()
    scale = float(params.reward_scale)
    const = sum(price[t] * dt * (load_p[t] - pv_inc.T @ avail[t]).sum() for t in range(T))
    sol = solve_qp(cost * scale, A, np.concatenate(r_lo), np.concatenate(r_up), col_lo, col_up, hess * scale, const * scale)
    if not sol.ok:
        return sol, None, None, None
    xs = sol.x.reshape(T, m)
    shift = (xs[:, part["sp"]] - xs[:, part["sm"]]) / s_max if s_max > 0 else np.zeros((T, n_flex))
    c = xs[:, part["c"]]
    curt = np.divide(c, avail, out=np.zeros_like(c), where=avail > 1e-12)
    headroom = np.sqrt(np.maximum(inv_s**2 - (avail - c) ** 2, 0.0))
    aq = np.divide(xs[:, part["q"]], headroom, out=np.zeros_like(c), where=headroom > 1e-12)
    acts = [flex_action(shift, float(params.flex_deadband)), curt, aq]
    battery = None
    if n_bat:
        p_bat = xs[:, part["dis"]] - xs[:, part["ch"]]
        acts.append(p_bat / p_max)
        soc = xs[:, part["soc"]]
        battery = bool(np.any(np.abs(p_bat) >= p_max - 1e-6) or np.any(soc <= soc_lo + 1e-6) or np.any(soc >= soc_hi - 1e-6))
    u_lin = u0 + xs @ A_v.T + offset
    return sol, np.clip(np.concatenate(acts, axis=1), -1.0, 1.0), u_lin, battery


def _reference_report(env, params, task, progress) -> dict:
    report = schedule_report(feeder_oracle(env, params), "feeder_schedule")
    play, zero = replay_fn(env, params), np.zeros((params.max_steps, env.action_space(params).shape[0]))
    uncontrolled = [play(d, zero)[:2] for d in range(report["days"])]
    report["no_control"] = {"return": [r for r, _ in uncontrolled], "violation": [float(c.sum()) for _, c in uncontrolled]}
    report["summary"].update(no_control_return=float(np.mean(report["no_control"]["return"])),
                             no_control_feasible_share=float(np.mean(np.asarray(report["no_control"]["violation"]) <= 1e-6)))
    return report


def _reference_rows(s) -> list[tuple[str, str]]:
    return [("oracle mean return", f"{s['oracle_return']:.4f}"), ("days without a feasible schedule", f"{s['infeasible_days']}"),
            *binding_rows(s), ("no-control mean return", f"{s['no_control_return']:.4f}"),
            ("no-control feasible days", percent(s["no_control_feasible_share"]))]


FEEDER_REFERENCE = Reference(
    _reference_report, lambda task: "oracle: the day's perfect-foresight LinDistFlow QP, Clarabel, voltages corrected "
    "by the sweep power flow, replayed through the env", _reference_rows)
register_reference("dso", dataclasses.replace(FEEDER_REFERENCE, operators=True))
register_reference("ders", FEEDER_REFERENCE)
