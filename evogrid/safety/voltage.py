"""Voltage correction: the feeder safety layer's optimiser (LinDistFlow least-cost steps on the controls),
and the step it shares with the transmission voltage schedule (`band_steps`).

A DSO's controller overrides flexible-load, curtailment and inverter set-points that would leave a bus
voltage outside its band, by about the cheapest move, reactive power first. It is a controller: it
lives in `evogrid.safety` and is fed by `VoltageLayer` from the observation only. Design notes and the
measurements behind the constants: docs/design/voltage_correction.md.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from evogrid.envs.dist import DistParams, headroom
from evogrid.utils.jax_utils import held_least_norm_step

VOLT_ROUNDS = 2        # correction rounds per interval, each followed by a sweep power flow
VOLT_STEPS = 8         # linear least-norm steps per round
VOLT_BUSES = 2         # buses furthest outside (or at the edge of) the band, taken per step
VOLT_MARGIN = 1e-4     # p.u. of |V| aimed inside the band, as the oracle's schedule (baselines.feeder.V_MARGIN)
VOLT_BAND = 1e-4       # p.u. of |V|^2: a bus this close to its limit is held there, not pushed back over
VOLT_DAMPING = 1e-2    # Levenberg-Marquardt damping, relative to the mean diagonal of the step's system
Q_WEIGHT = 1e-3        # weight of reactive power against the cheaper of shifting and curtailing (it has no price)
# the transmission voltage schedule (AC tasks: `layers.ScheduleLayer`)
SCHEDULE_ROUNDS = 3    # Newton power flows (each with its sensitivities) and corrections per interval
SCHEDULE_MARGIN = 1e-3   # p.u. of |V| aimed inside the band (the layer's flow misses the env's loss estimate)
SCHEDULE_TRIGGER = 2e-4  # p.u.: an interval whose every bus is this far inside the band is left as it is
SCHEDULE_BUSES = 4     # buses furthest outside the band taken per step
SCHEDULE_Q_RESERVE = 0.05  # share of each bus's reactive range kept above Qmin in the layer's flow (see ScheduleLayer)
SCHEDULE_REACH = 0.02  # p.u.: the most a round moves a set-point (the linear model's reach: limits switch buses)
SCHEDULE_SLACK_MARGIN = 0.1   # share of the slack's ramp its output is kept inside its ramp window (the losses)
SCHEDULE_DERIVATIVE_ITERS = 10   # chord iterations carrying the layer's flow's derivative (the env's: 30): 1.3-2.9x
                                 # the layer's speed on 2 CPU cores, the band kept as well (docs/accelerator.md)


def voltage_correction(controls, vm, load_p, load_q, avail, params: DistParams):
    """Voltage correction: move the controls (shift [n_flex] MW, curtail [n_pv] MW, q [n_pv] MVAr) by about
    the cheapest amount that brings every bus voltage within [v_min, v_max] (VOLT_MARGIN inside), each
    within its range, as a DSO's controller overrides set-points that would leave the band. `vm` [n_bus]
    are the voltages the sweep found at `controls`, at the interval's bus loads `load_p` MW, `load_q` MVAr
    [n_bus] and PV power available `avail` [n_pv] MW.

    LinDistFlow gives |V|^2 affinely in the net loads: d|V_j|^2 / dP_m = -2 sum of r over the branches the
    paths to j and m share / base (`volt_sens_p`, and x for Q), so the step is a linear problem around
    the sweep's voltages. VOLT_STEPS Gauss-Newton steps on it, each over the VOLT_BUSES buses furthest
    outside the band: d = W^-1 J^T (J W^-1 J^T + damping)^-1 r, the least change weighted by cost W (the
    discomfort price for shifts, the curtailment price for curtailment, Q_WEIGHT of the cheaper of the
    two for reactive power, which costs only losses; reactive power alone for the first half of the steps,
    every control after), a control that d would push past its range held
    there and d solved again (`utils.jax_utils.held_least_norm_step`, the step of the security redispatch
    too). The caller re-solves the sweep after each call (`VoltageLayer`, VOLT_ROUNDS times), so
    the linear model's error (losses) is corrected against the real power flow. Where no controls within
    their ranges reach the band (a day too heavy for the feeder's resources), what is left shows in the
    `voltage` channel."""
    shift, curtail, q = controls
    n_flex = shift.shape[0]
    flex_p, flex_q = params.flex_incidence @ load_p, params.flex_incidence @ load_q
    ratio = jnp.where(flex_p > 0, flex_q / jnp.where(flex_p > 0, flex_p, 1.0), 0.0)   # a shift moves Q with P
    sp, sq = params.volt_sens_p, params.volt_sens_q
    # d|V|^2 per unit of each control: shifting adds load; curtailing removes PV (adds net load); q injects
    jac = jnp.concatenate([sp[:, :n_flex] + sq[:, :n_flex] * ratio, sp[:, n_flex:], -sq[:, n_flex:]], axis=1)
    room = headroom(params, avail - curtail)
    x0 = jnp.concatenate([shift, curtail, q])
    lo = jnp.concatenate([-params.shift_max * flex_p, jnp.zeros_like(avail), -room])
    hi = jnp.concatenate([params.shift_max * flex_p, avail, room])
    cheap = jnp.minimum(params.discomfort_price, jnp.where(params.curtail_price > 0, params.curtail_price, params.discomfort_price))
    weight = jnp.concatenate([jnp.broadcast_to(params.discomfort_price, shift.shape),
                              jnp.broadcast_to(params.curtail_price, curtail.shape),
                              jnp.broadcast_to(Q_WEIGHT * cheap, q.shape)])
    weight = jnp.maximum(weight, Q_WEIGHT * cheap)   # a free control (no price) still has a finite weight
    first = weight <= Q_WEIGHT * cheap   # reactive power alone for the first half of the steps
    x = band_steps(vm**2, jac, x0, lo, hi, (params.v_min + VOLT_MARGIN) ** 2, (params.v_max - VOLT_MARGIN) ** 2,
                   weight, first)
    n_pv = curtail.shape[0]
    shift, curtail, q = x[:n_flex], x[n_flex:n_flex + n_pv], x[n_flex + n_pv:]
    room = headroom(params, avail - curtail)   # curtailing frees inverter capacity; q stays within what is left
    return shift, curtail, jnp.clip(q, -room, room)


def band_steps(u0, jac, x0, lo, hi, u_lo, u_hi, weight, first, steps: int = VOLT_STEPS, buses: int = VOLT_BUSES,
               band: float = VOLT_BAND):
    """`x0` [n] moved by `steps` damped least-norm steps on the linear model u = u0 + jac (x - x0) (u0 [m],
    jac [m, n]) towards every u within [u_lo, u_hi], each step over the `buses` entries furthest outside
    (or within `band` of an end: held there, not pushed back over by another's move), weighted by `weight`,
    the columns `first` alone free for the first half of the steps, each within [lo, hi]
    (`utils.jax_utils.held_least_norm_step`). The step of both voltage corrections (the feeder's in
    |V|^2, the transmission voltage schedule's in |V|)."""
    k = min(buses, u0.shape[0])

    def step(i, x):
        u = u0 + jac @ (x - x0)
        low, high = u_lo - u, u - u_hi
        need = jnp.maximum(low, high)
        worst, idx = jax.lax.top_k(need, k)
        active = worst > -band
        rows = jnp.where(low[idx] >= high[idx], 1.0, -1.0)[:, None] * jac[idx]   # [k, n] d(need met)/d control
        r = jnp.where(active, jnp.maximum(worst, 0.0), 0.0)
        free = first | (i >= steps // 2)
        d = held_least_norm_step(jnp.where(active[:, None], rows, 0.0), r, x, lo, hi, free, weight, VOLT_DAMPING)
        return jnp.clip(x + d, lo, hi)

    return jax.lax.fori_loop(0, steps, step, x0)
