"""Security redispatch: the transmission safety layer's optimiser (DC flows, Gauss-Newton least-norm steps).

`secure_redispatch` moves a balanced dispatch by about the least to one within the line ratings, the
units' ramp windows and the balance, as a system operator redispatches a schedule that would overload a
line; with a look-ahead it also keeps the forecast demand of the next intervals within the ramps' reach
and, with the peak plan, the forecast peak's lines within their ratings. It is a controller: it lives
in `evogrid.safety` and is fed by `RedispatchLayer` from the observation only. Design notes and the
measurements behind the constants: docs/design/redispatch.md.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from evogrid.envs.trans import follow_load
from evogrid.utils.jax_utils import held_least_norm_step, held_projection_step, largest, take_rows

SECURE_ITERS = 8       # Gauss-Newton steps per interval
SECURE_LINES = 3       # rows handled together in a step (the worst three, and the balance)
SECURE_MARGIN = 3e-3   # aim this share below each rating (float rounding, least-squares compromises)
SECURE_BAND = 1e-3     # lines within this share of their rating stay at it (not pushed back over)
WINDOW_MARGIN = 1e-4   # and this share of the slack unit's window inside its ends (its output is rounded)
SECURE_DAMPING = 1e-6  # Levenberg-Marquardt damping, relative to the system's mean diagonal
LOOKAHEAD_STEPS = 8    # forecast intervals whose demand the redispatch keeps within the ramps' reach
PLAN_ITERS = 8         # Gauss-Newton steps of the peak plan (before the SECURE_ITERS of the interval alone)
SECURE_ROWS_PEAK = 6   # rows handled together with the peak plan (its lines and ramps too)
PLAN_SWEEPS = 12       # with the plan, each step's rows are inequalities: Hildreth passes per solve
PLAN_MARGIN = 1e-4     # and this interval's lines are aimed this share inside
PEAK_PLAN_UNITS = 10   # the layer's default: the peak plan on for grids of at most this many units


def secure_redispatch(pg, lo, hi, demand, flow, sens, rate, iters: int, ahead=None, slack=1.0, peak=None):
    """Move the balanced dispatch `pg` [n_units] MW by about the least to bring the DC flows within `rate`
    [n_branch] MW, every unit within its window [lo, hi] and the total at `demand` MW.

    `flow` [n_branch] is the dispatch's flow and `sens` [n_branch, n_units] the flows' sensitivity to each
    unit's output (the flows are affine in the dispatch). At most `iters` Gauss-Newton steps (static); they
    stop once no row is over, with the same result, and a dispatch with no row over is returned as it is.
    Where no dispatch within the windows meets the ratings, what is left shows in the env's `thermal`
    channel.

    `ahead` = (future demand [K] MW, NaN past the day's end; pmin, pmax, ramp per step; margin): the dispatch
    is also kept where the ramps can reach each of the next K demands, widened by `margin` times the demand
    for the forecast's error (sum max(pmin, pg - k ramp) <= (1 - margin) demand[k], (1 + margin) demand[k] <=
    sum min(pmax, pg + k ramp)); the furthest-out of these 2K conditions is one more row.
    `peak` (from `peak_plan`): a plan x of the look-ahead's peak interval is moved together with pg (x's
    lines within the ratings, |x - pg| within k ramps, x balanced at the peak's demand), the rows solved as
    inequalities (`held_projection_step`); then this interval's own rows alone have the last word.
    `slack` (1 for the slack unit, 0 for the others) keeps the slack a hair inside its window.

    Each step takes the SECURE_LINES rows furthest over (or at) their limit and the balance, and moves
    the units by the least-norm change d = -J^T (J J^T + damping)^-1 r over the units free to move
    (`held_least_norm_step`), then clips to the windows and rebalances (`follow_load`). Differentiable:
    the derivative is that of the fixed count of steps (a custom JVP), whose result is the same."""
    return _redispatch_until_secure(iters, pg, lo, hi, demand, flow, sens, rate, ahead, slack, peak)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _redispatch_until_secure(iters, *args):
    """`_redispatch` stopping once no row is over: the same dispatch, and differentiable (the JVP below)."""
    return _redispatch(iters, True, *args)


@_redispatch_until_secure.defjvp
def _redispatch_until_secure_jvp(iters, primals, tangents):
    # reverse mode cannot go through a while_loop: the derivative is that of the fixed count of steps, whose
    # result is the same dispatch (a dispatch with no row over is a fixed point of the steps)
    return jax.jvp(lambda *a: _redispatch(iters, False, *a), primals, tangents)


def _redispatch(iters: int, early: bool, pg, lo, hi, demand, flow, sens, rate, ahead, slack, peak):
    """`secure_redispatch`'s steps; `early`: a while_loop that stops once no row is over (see until_secure)."""
    # a hair inside the slack's window (`slack`: 1 for it, 0 for the others; default every unit's): its output
    # is recomputed from the balance, and float rounding at the very edge would read as a ramp or balance
    # violation; the others may go to their ends (a secure dispatch can need a slow unit at its ramp limit)
    inner = WINDOW_MARGIN * (hi - lo) * slack
    lo, hi = lo + inner, hi - inner
    if ahead is not None:   # the reach with the ramps these windows leave (the slack's, less its margin)
        future, pmin, pmax, ramp, reach_margin = ahead
        ahead = (future, pmin, pmax, ramp * (1.0 - 2.0 * WINDOW_MARGIN * slack), reach_margin)
    n, n_line = pg.shape[0], rate.shape[0]
    k = min(SECURE_LINES, n_line + (ahead is not None))
    f0, pg0 = flow, pg
    target = rate * (1.0 - SECURE_MARGIN)
    if peak is not None:   # the plan's constants: its variables' windows, its ramp rows, its row count
        fx0, x0, peak_demand, reach, valid = peak
        lo_z, hi_z = jnp.concatenate([lo, pmin]), jnp.concatenate([hi, pmax])
        eye = jnp.eye(n, dtype=pg.dtype)
        ramp_rows = jnp.concatenate([jnp.concatenate([-eye, eye], 1), jnp.concatenate([eye, -eye], 1)])
        k_plan = min(SECURE_ROWS_PEAK, 2 * n_line + 2 * n + 1)

    def flows(z, plan: bool):   # the lines' flows at z's pg (and at its plan x): affine in the dispatch
        return (f0 + sens @ (z[:n] - pg0),) + ((fx0 + sens @ (z[n:] - x0),) if plan else ())

    def measure(z, fz, plan: bool, target):
        """The candidate rows at z (flows fz): excess over the aim, the aim, the gradients (a function of the
        rows taken), whether any is over."""
        pg, f = z[:n], fz[0]
        resid, aim = jnp.abs(f) - target, target
        # within the ratings (to 1e-9, round-off of a schedule at its limits; float32 sees the rating itself)
        short = jnp.any(jnp.abs(f) > rate * (1.0 + 1e-9))
        reach_grad = None
        if ahead is not None:   # the reach: one more candidate, after the lines
            reach_grad, gap, scale = reach_row(pg, *ahead)
            resid = jnp.concatenate([resid, (gap + SECURE_MARGIN * scale)[None]])
            aim = jnp.concatenate([aim, scale[None]])
            short = short | (gap > 0)

        def rows_at(idx):
            """The gradients [len(idx), n_units] of the candidates `idx` (lines, then the reach): only the rows
            taken are built (under vmap all n_line rows would be a [batch, n_line, n_units] array a step)."""
            line = jnp.minimum(idx, n_line - 1)
            picked = take_rows(jnp.sign(f)[:, None], line) * take_rows(sens, line)   # d|f|/d output
            return picked if reach_grad is None else jnp.where((idx < n_line)[:, None], picked, reach_grad[None])

        rows = rows_at
        if plan:   # the peak's lines at x, and x within the ramps' reach of pg: |x - pg| <= reach
            x, fx = z[n:], fz[1]
            cap, step_ = reach * (1.0 - SECURE_MARGIN), x - pg
            later = jnp.concatenate([jnp.abs(fx) - target, step_ - cap, -step_ - cap])
            resid = jnp.concatenate([resid, jnp.where(valid, later, -jnp.inf)])
            aim = jnp.concatenate([aim, target, cap, cap])
            now = jnp.sign(f)[:, None] * sens   # a small grid: every row built
            now = now if reach_grad is None else jnp.concatenate([now, reach_grad[None]])
            full = jnp.concatenate([jnp.concatenate([now, jnp.zeros_like(now)], 1),
                                    jnp.concatenate([jnp.zeros_like(sens), jnp.sign(fx)[:, None] * sens], 1), ramp_rows])
            rows = lambda idx: take_rows(full, idx, per_env=True)  # noqa: E731
            short = short | (valid & (jnp.any(jnp.abs(fx) > rate * (1.0 + 1e-9))
                                      | jnp.any(jnp.abs(step_) > reach * (1.0 + 1e-9))))
        return resid, aim, rows, short

    def step(z, plan: bool, measured):
        resid, aim, rows, _ = measured
        pg, x = z[:n], z[n:]
        worst, idx = largest(resid, k_plan if plan else k)
        if peak is None:
            active = worst > -SECURE_BAND * take_rows(aim, idx)   # over, or at the limit (kept there, not pushed back over)
        else:   # inequalities: every row taken, those inside may stay inside
            active = jnp.isfinite(worst)
        balance = jnp.ones((1, n), pg.dtype)       # the balance row(s): the total of pg (and of x) kept
        if plan:
            balance = jnp.kron(jnp.eye(2, dtype=pg.dtype), balance)
        r = jnp.concatenate([-jnp.where(active, worst, 0.0), jnp.zeros(balance.shape[0], pg.dtype)])
        jac = jnp.concatenate([jnp.where(active[:, None], rows(idx), 0.0), balance])
        # units d pushes out of their window stay
        if peak is None:
            d = held_least_norm_step(jac, r, z, lo, hi, jnp.ones(z.shape, bool), 1.0, SECURE_DAMPING)
        else:
            d = held_projection_step(jac, r, balance.shape[0], z, *((lo_z, hi_z) if plan else (lo, hi)),
                                     SECURE_DAMPING, PLAN_SWEEPS)
        moved = follow_load(jnp.clip(pg + d[:n], lo, hi), lo, hi, demand)
        if plan:
            moved = jnp.concatenate([moved, follow_load(jnp.clip(x + d[n:], pmin, pmax), pmin, pmax, peak_demand)])
        return moved

    def until_secure(z, plan: bool, steps: int, target=target):
        # a dispatch with no row over is a fixed point of the steps: with `early` the loop stops there (the same
        # result), a batch (vmap) once every env's is. The flows are carried: a batched loop evaluates `more`
        # twice a step, and the rows are not needed there.
        def more(c):
            return (c[0] < steps) & measure(*c[1:], plan, target)[3]

        def body(c):
            measured = measure(*c[1:], plan, target)
            z = jnp.where(measured[3], step(c[1], plan, measured), c[1])
            return c[0] + 1, z, flows(z, plan)

        c = (0, z, flows(z, plan))
        c = jax.lax.while_loop(more, body, c) if early else jax.lax.fori_loop(0, steps, lambda _, c: body(c), c)
        return c[1]

    if peak is None:
        return until_secure(pg, False, iters)
    # the plan first; then this interval's own rows have the last word
    pg = until_secure(jnp.concatenate([pg, x0]), True, PLAN_ITERS)[:n]
    return until_secure(pg, False, iters, rate * (1.0 - PLAN_MARGIN))


def peak_plan(pg, future, future_load, pmin, pmax, ramp, flows_at):
    """The look-ahead's peak interval for `secure_redispatch`: of the next K intervals (their forecast demand
    `future` [K] MW, NaN past the day's end, and bus loads `future_load` [K, n_bus] MW), the one of highest
    demand, k intervals on, and a start for its plan x: `pg` carried there within k ramps and balanced at its
    demand (`follow_load`). `flows_at(x, load)` gives the DC flows of a dispatch at bus loads `load`.
    Returns (x's flows, x, its demand, the reach k ramp [n_units], whether there is such an interval)."""
    i = jnp.argmax(jnp.where(jnp.isnan(future), -jnp.inf, future))
    reach = (i + 1).astype(pg.dtype) * ramp
    known = ~jnp.isnan(future)
    demand, valid = (take_rows(x, i[None])[0] for x in (jnp.where(known, future, 0.0), known))
    load = take_rows(future_load, i[None], per_env=True)[0]
    x0 = follow_load(pg, jnp.maximum(pmin, pg - reach), jnp.minimum(pmax, pg + reach), demand)
    return flows_at(x0, load), x0, demand, reach, valid


def reach_row(pg, future, pmin, pmax, ramp, margin=0.0):
    """The look-ahead row of `secure_redispatch`: of the 2K reach conditions (k = 1..K, the lowest and the
    highest total output k intervals on, against future[k - 1], each widened by `margin` times that demand),
    the one furthest out: (its gradient in the dispatch [n_units], its excess MW (> 0: out of reach; -inf: no
    future within the day), its demand MW)."""
    n_ahead = future.shape[0]
    k = jnp.arange(1, n_ahead + 1, dtype=pg.dtype)[:, None]
    wide = margin * jnp.abs(future)
    gaps = jnp.concatenate([jnp.sum(jnp.maximum(pmin, pg - k * ramp), 1) - future + wide,
                            future - jnp.sum(jnp.minimum(pmax, pg + k * ramp), 1) + wide])
    gaps = jnp.where(jnp.isnan(gaps), -jnp.inf, gaps)              # intervals past the day's end never bind
    i = jnp.argmax(gaps)
    # the gradient of that one condition, from its k (not all 2K rows built and one picked: a gather under vmap)
    k_i, rising = (i % n_ahead + 1).astype(pg.dtype), i >= n_ahead
    grad = jnp.where(rising, -(pg + k_i * ramp < pmax).astype(pg.dtype), (pg - k_i * ramp > pmin).astype(pg.dtype))
    demand = take_rows(jnp.nan_to_num(future), (i % n_ahead)[None])[0]
    return grad, jnp.max(gaps), jnp.abs(demand)
