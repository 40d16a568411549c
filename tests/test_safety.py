"""Safety layers (evogrid.safety): the security redispatch and the voltage correction as controllers that
read the observation only; the env's applied controls replayed through the reference solvers."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import ppc_of, pypower_opts, solved_33bw

from evogrid.case import load_case
from evogrid.case.matpower import PD, PF, PG
from evogrid.envs import (
    DistGridEnv,
    TransGridEnv,
    make,
    make_dist_params,
    make_trans_params,
)
from evogrid.envs.trans import dispatch_action, ramp_window
from evogrid.physics import dc_line_flows
from evogrid.safety import (
    Shielded,
    ShieldedState,
    make_layer,
    redispatch,
    redispatch_layer,
    schedule_layer,
    shield,
    voltage_layer,
)
from evogrid.safety.redispatch import SECURE_MARGIN, WINDOW_MARGIN, reach_row
from evogrid.utils.jax_utils import held_projection_step

FLEX_BUSES = (7, 8, 24, 25, 30, 32)


def _layered_step(params, state, action, layer=None, env=None):
    """The env's step on what the layer makes of `action`, the layer fed the observation of `state`:
    (the step's outputs, the layer's action)."""
    env = env or TransGridEnv()
    layer = layer or redispatch_layer(params)
    safe, _ = layer(env._obs(state, params), action)
    return env.step_env(jax.random.key(0), state, safe, params), safe


def _start(params, day=0):
    return jax.tree_util.tree_map(lambda x: x[day], params.init)


@pytest.mark.slow
def test_the_layer_reads_the_observation_and_nothing_else():
    """Two tso-case14 tasks whose loads differ after the present interval (the observation's loads and
    forecast the same): their layers give the same action, bit for bit, on the same observation; the
    layer's own params hold no time series. Changing the forecast in the observation changes the action."""
    env, params = make("tso-case14", split="test")
    day, t = 13, 35
    later = params.load_p.at[day, t + 1:].multiply(1.3)
    other = params.replace(load_p=later)
    prev = jnp.asarray([194.448, 53.338, 0.891, 4.799, 7.452], jnp.float32)   # a trained policy's, two steps before the peak
    state = _start(params, day).replace(time_step=jnp.int32(t), pg=prev)
    obs = env._obs(state, params)
    np.testing.assert_array_equal(obs, env._obs(state, other))   # the same observation
    action = jax.random.uniform(jax.random.key(3), (5,), minval=-1, maxval=1)
    a1, a2 = (jax.jit(redispatch_layer(p).__call__)(obs, action)[0] for p in (params, other))
    np.testing.assert_array_equal(a1, a2)
    layer = redispatch_layer(params)
    assert layer.grid.load_p is None and layer.grid.forecast is None and layer.grid.init is None
    n = obs.shape[0]
    forecast = slice(n - layer.forecast_steps, n)
    light = obs.at[forecast].set(obs[forecast] * 0.5)   # a forecast of a much lighter evening
    assert not np.array_equal(np.asarray(layer(light, action)[0]), np.asarray(a1))


def _nearest_secure_dispatch(pg, lo, hi, sens, offset, rate):
    """scipy's trust-constr: the dispatch nearest `pg` (least squares) with the same total, within [lo, hi]
    and every rated flow sens @ x + offset within `rate` (the reference the security redispatch is checked
    against)."""
    from scipy.optimize import Bounds, LinearConstraint, minimize

    rated = np.isfinite(rate)
    cons = [LinearConstraint(np.ones((1, pg.size)), pg.sum(), pg.sum()),
            LinearConstraint(sens[rated], -rate[rated] - offset[rated], rate[rated] - offset[rated])]
    res = minimize(lambda x: 0.5 * np.sum((x - pg) ** 2), pg, jac=lambda x: x - pg, hess=lambda x: np.eye(pg.size),
                   bounds=Bounds(lo, hi), constraints=cons, method="trust-constr", options={"gtol": 1e-10, "xtol": 1e-12})
    assert res.status in (1, 2), res.message
    return res.x


@pytest.mark.parametrize("ramp_per_hour, action, atol, margin", [(100.0, [-1.0, -1.0, 1.0, -1.0, 1.0], 0.05, 0.0),
                                                                 (0.5, [-1.0, -1.0, 1.0, -1.0, 1.0], 0.6, 0.0),  # windows bind
                                                                 (100.0, [-1.0, -1.0, 1.0, -1.0, 1.0], 2.0, 0.05)])
def test_security_redispatch_is_the_nearest_dispatch_within_the_ratings(ramp_per_hour, action, atol, margin):
    """Case5 at 1.2 x its loads, the units at buses 3 and 5 asked for (nearly) full output: line 4-5 would
    carry more than its 240 MW (test_envs). Through the layer the step's dispatch keeps the total, stays
    within every unit's ramp window, every flow is within its rating (the thermal channel is 0) and it is
    the nearest such dispatch: scipy trust-constr's least-squares projection of the requested dispatch onto
    the same set less the redispatch's margins (SECURE_MARGIN below each rating, WINDOW_MARGIN of the slack
    unit's window inside its ends), to 0.05 MW. Where the windows bind (20 MW/step ramps) the clip-and-
    rebalance steps are not an exact projection and stop once every flow is within its rating: within
    0.6 MW of the reference, moving at most 1.002 times as far. Without the look-ahead (lookahead=0). With a
    line margin of 5%, within the ratings cut by 5%, where a unit's limit binds: within 2 MW (1.5 measured)."""
    with jax.enable_x64(True):
        load = np.broadcast_to(1.2 * load_case("5").bus[:, PD], (1, 4, 5))
        params = make_trans_params("5", max_steps=4, n_days=1, default_ramp_per_hour=ramp_per_hour, load_p=load)
        layer = redispatch_layer(params, lookahead=0, line_margin=margin)
        action = jnp.array(action)
        state = _start(params)
        _, asked, _, asked_costs, _, _ = TransGridEnv().step_env(jax.random.key(0), state, action, params)
        (_, new, _, costs, _, _), _ = _layered_step(params, state, action, layer)
        assert float(asked_costs[0]) > 0.01 and abs(float(asked.flow[5])) > 241.0
        assert float(costs[0]) == 0.0 and np.all(np.abs(np.asarray(new.flow)) <= np.asarray(params.rate) * (1 - margin))
        np.testing.assert_allclose(np.sum(new.pg), np.sum(asked.pg), rtol=1e-12)
        lo, hi = (np.asarray(x) for x in ramp_window(state.pg, params))
        assert np.all(np.asarray(new.pg) >= lo - 1e-9) and np.all(np.asarray(new.pg) <= hi + 1e-9)
        sens = np.asarray(layer.grid.gen_ptdf)
        inject = lambda pg: (pg * (1.0 - params.slack)) @ params.gen_incidence - params.load_p[0, 0]  # noqa: E731
        flows = lambda pg: dc_line_flows(params.dc, inject(pg))[0]  # noqa: E731  (the whole PTDF's product)
        np.testing.assert_allclose(sens, np.asarray(jax.jacfwd(flows)(params.pmin)), atol=1e-12)  # the flow map's Jacobian
        offset = np.asarray(asked.flow) - sens @ np.asarray(asked.pg)
        np.testing.assert_allclose(sens @ np.asarray(new.pg) + offset, np.asarray(new.flow), atol=1e-9)  # affine, as assumed
        inner = WINDOW_MARGIN * (hi - lo) * np.asarray(params.slack)  # the margins the redispatch keeps, given to the reference too
        ref = _nearest_secure_dispatch(np.asarray(asked.pg), lo + inner, hi - inner, sens, offset,
                                       np.asarray(params.rate) * (1 - margin) * (1 - SECURE_MARGIN))
        moved, least = np.linalg.norm(np.asarray(new.pg - asked.pg)), np.linalg.norm(ref - np.asarray(asked.pg))
        np.testing.assert_allclose(np.asarray(new.pg), ref, atol=atol)
        assert moved <= 1.002 * least, (moved, least)


@pytest.mark.slow
@pytest.mark.parametrize("day, t, prev, asked", [
    (12, 38, [210.275, 46.085, 0.513, 7.412, 7.29], [215.24, 44.85, 0.6, 8.97, 8.91]),
    (12, 38, [208.731, 42.518, 4.658, 8.268, 7.4], [213.62, 42.61, 4.79, 8.94, 8.6]),
    (2, 37, [168.919, 59.76, 24.593, 8.14, 7.474], [168.95, 54.79, 24.7, 15.28, 14.47])])
def test_redispatch_secures_the_evening_peaks_where_a_secure_dispatch_is_in_reach(day, t, prev, asked):
    """States met on trained policies' tso-case14 test days (the last dispatch `prev`, the schedule asked
    for): at the evening peak three or four lines reach their ratings together, the slow slack unit can
    move 5 MW at most and the slow unit at bus 3 1.5 MW. HiGHS finds a dispatch within 0.99 x every rating
    reachable from `prev`, so the grid can be kept secure; the layer does so (every channel 0)."""
    from evogrid.baselines.solvers import solve_qp
    from evogrid.baselines.tso import _Problem

    env, params = make("tso-case14", split="test")
    prob = _Problem(params)
    prob.rate = np.asarray(params.rate, np.float64) * 0.99
    assert solve_qp(*prob.build(np.asarray(params.load_p[day, t:t + 1], np.float64), np.asarray(prev, np.float64))).ok
    prev = jnp.asarray(prev, jnp.float32)
    state = _start(params, day).replace(time_step=jnp.int32(t), pg=prev)
    (_, new, _, costs, _, _), _ = _layered_step(params, state, dispatch_action(params, jnp.asarray(asked, jnp.float32), prev))
    np.testing.assert_array_equal(np.asarray(costs), 0.0)
    assert np.all(np.abs(np.asarray(new.flow)) <= np.asarray(params.rate))


@pytest.mark.parametrize("prev, asked", [
    ([194.448, 53.338, 0.891, 4.799, 7.452], [199.413, 51.325, 1.018, 7.033, 7.437]),   # Open_ES, seed 0
    ([197.441, 53.083, 0.348, 2.604, 7.452], [202.426, 55.9, 0.099, 0.349, 7.452])])   # Sep_CMA_ES, seed 0
def test_peak_plan_keeps_the_evening_peak_within_reach(prev, asked):
    """tso-case14's test day 13, step 35 (266 MW), two intervals before its 291 MW evening peak: the
    schedules trained policies asked for there leave no secure way through the peak (HiGHS finds no
    dispatch of the rest of the day within the ratings and ramps from them). The layer's peak plan, on the
    observation's forecast (bus loads at the peak: today's pattern scaled to the forecast total; a perfect
    forecast here), redispatches to one from which HiGHS finds the rest of the day feasible, every limit
    kept this step; without the plan the step keeps this interval's limits and the day is lost."""
    from evogrid.baselines.solvers import solve_qp
    from evogrid.baselines.tso import _Problem

    day, t = 13, 35
    env, params = make("tso-case14", split="test", forecast_error=0.0)
    assert redispatch_layer(params).plan_peak and not redispatch_layer(params, lookahead=0).plan_peak
    n1_env, n1_params = make("tso-case14-n1", split="test")
    assert not redispatch_layer(n1_params).plan_peak   # outages change the grid it plans on
    prob = _Problem(params)
    rest = np.asarray(params.load_p[day, t + 1:], np.float64)
    assert not solve_qp(*prob.build(rest, np.asarray(asked, np.float64))).ok
    prev = jnp.asarray(prev, jnp.float32)
    action = dispatch_action(params, jnp.asarray(asked, jnp.float32), prev)
    state = _start(params, day).replace(time_step=jnp.int32(t), pg=prev)
    for plan, secure in ((False, False), (True, True)):
        (_, new, _, costs, _, _), _ = _layered_step(params, state, action, redispatch_layer(params, plan_peak=plan))
        np.testing.assert_array_equal(np.asarray(costs), 0.0)
        assert solve_qp(*prob.build(rest, np.asarray(new.pg, np.float64))).ok == secure


def test_peak_step_meets_every_line_as_an_inequality():
    """tso-case14's test day 13 at its 291 MW evening peak (step 37), the state a trained Open_ES policy
    reached: from its last dispatch a dispatch within every rating exists (HiGHS) but none with 0.1% to
    spare, and four lines bind with the slack's window. Without the peak plan (whose steps solve the rows
    as inequalities) the equality least-squares step leaves a line over its rating; with it (the default
    on case14) every line ends within its rating and every channel at 0."""
    from evogrid.baselines.solvers import solve_qp
    from evogrid.baselines.tso import _Problem

    day, t = 13, 37
    prev, asked = [204.542, 49.649, 3.641, 6.982, 7.452], [209.527, 72.058, 4.779, 1.691, 3.199]
    env, params = make("tso-case14", split="test")
    prob = _Problem(params)
    for share, ok in ((1.0, True), (0.999, False)):
        prob.rate = np.asarray(params.rate, np.float64) * share
        assert solve_qp(*prob.build(np.asarray(params.load_p[day, t:t + 1], np.float64), np.asarray(prev, np.float64))).ok == ok
    prev = jnp.asarray(prev, jnp.float32)
    action = dispatch_action(params, jnp.asarray(asked, jnp.float32), prev)
    state = _start(params, day).replace(time_step=jnp.int32(t), pg=prev)
    for plan in (False, True):
        (_, new, _, costs, _, _), _ = _layered_step(params, state, action, redispatch_layer(params, plan_peak=plan))
        assert (float(costs[0]) == 0.0) == plan, (plan, costs)
    np.testing.assert_array_equal(np.asarray(costs), 0.0)
    assert np.all(np.abs(np.asarray(new.flow)) <= np.asarray(params.rate))


@pytest.mark.slow
def test_redispatch_stops_early_as_the_fixed_count_would(monkeypatch):
    """The redispatch's loops stop once no row is over (a batch once every env's is): the dispatch is the
    fixed count's, and so is its derivative through the layer (the custom JVP differentiates the fixed
    count; reverse mode cannot go through a while_loop), with the peak plan and without. To float32
    rounding: the two are different programs, and the compiler may round them differently."""
    day, t = 13, 37
    prev, asked = [204.542, 49.649, 3.641, 6.982, 7.452], [209.527, 72.058, 4.779, 1.691, 3.199]
    env, params = make("tso-case14", split="test")
    prev = jnp.asarray(prev, jnp.float32)
    state = _start(params, day).replace(time_step=jnp.int32(t), pg=prev)
    action = dispatch_action(params, jnp.asarray(asked, jnp.float32), prev)
    actions = jnp.clip(action + 0.2 * jax.random.normal(jax.random.key(1), (7, action.shape[0])), -1.0, 1.0)
    actions = jnp.concatenate([action[None], actions, dispatch_action(params, prev, prev)[None]])
    weight = jax.random.normal(jax.random.key(2), prev.shape)

    def run(plan):
        layer = redispatch_layer(params, plan_peak=plan)
        pg = lambda a: _layered_step(params, state, a, layer)[0][1].pg  # noqa: E731
        return (jax.jit(jax.vmap(pg))(actions),
                jax.jit(jax.vmap(jax.grad(lambda a: jnp.sum(pg(a) * weight))))(actions))

    early = [run(plan) for plan in (True, False)]
    monkeypatch.setattr(redispatch, "_redispatch_until_secure", lambda iters, *a: redispatch._redispatch(iters, False, *a))
    fixed = [run(plan) for plan in (True, False)]
    raw = env.step_env(jax.random.key(0), state, action, params)[1].pg
    for (pg, grad), (pg_fixed, grad_fixed) in zip(early, fixed):
        assert np.max(np.abs(np.asarray(pg[0] - raw))) > 0.1   # the redispatch moved the overloading one
        assert np.any(np.asarray(grad) != 0.0)
        np.testing.assert_allclose(pg, pg_fixed, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(grad, grad_fixed, rtol=1e-4, atol=1e-5)


def test_projection_step_by_hand():
    """Three units, the first must come down 1 MW (d0 <= -1), the second may rise 2 (d1 <= 2), the total kept
    (d0 + d1 + d2 = 0): the least change is (-1, 0.5, 0.5), the second row left inside (an equality solve
    would push it to +2: (-1, 2, -1)). With the second unit at its upper end the change is held there:
    (-1, 0, 1). Rows no point meets (d0 <= -1 and d0 >= 1) end finite, the later row met (the balance
    rows come last in the redispatch's solves)."""
    with jax.enable_x64(True):
        a = jnp.asarray([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
        r = jnp.asarray([-1.0, 2.0, 0.0])
        x, lo, hi = jnp.zeros(3), jnp.full(3, -5.0), jnp.full(3, 5.0)
        d = held_projection_step(a, r, 1, x, lo, hi, 1e-12, 40)
        np.testing.assert_allclose(np.asarray(d), [-1.0, 0.5, 0.5], atol=1e-6)
        d = held_projection_step(a, r, 1, x, lo, hi.at[1].set(0.0), 1e-12, 40)
        np.testing.assert_allclose(np.asarray(d), [-1.0, 0.0, 1.0], atol=1e-6)
        clash = jnp.asarray([[1.0, 0.0, 0.0], [-1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
        d = held_projection_step(clash, jnp.asarray([-1.0, -1.0, 0.0]), 1, x, lo, hi, 1e-6, 40)
        np.testing.assert_allclose(np.asarray(d), [1.0, -0.5, -0.5], atol=1e-3)


def test_reach_row_by_hand():
    """Two units (ramps 10 and 50 MW a step, [0, 100] MW) at 80 and 20 MW, the next loads 60 and 30 MW: one
    step on they can total no less than 70 (10 too many), two steps on 60 (30 too many: the worst row); its
    gradient is the unit still ramp-bound then (the first). Past the day's end (NaN) nothing binds."""
    with jax.enable_x64(True):
        pg, pmin, pmax, ramp = (jnp.asarray(x, jnp.float64) for x in ([80.0, 20.0], [0.0, 0.0], [100.0, 100.0], [10.0, 50.0]))
        row, gap, scale = reach_row(pg, jnp.asarray([60.0, 30.0]), pmin, pmax, ramp)
        np.testing.assert_allclose([float(gap), float(scale)], [30.0, 30.0], rtol=1e-12)
        np.testing.assert_array_equal(np.asarray(row), [1.0, 0.0])
        row, gap, _ = reach_row(pg, jnp.asarray([250.0, jnp.nan]), pmin, pmax, ramp)   # up: 90 + 70 = 160 at most
        np.testing.assert_allclose(float(gap), 90.0, rtol=1e-12)
        np.testing.assert_array_equal(np.asarray(row), [-1.0, -1.0])
        assert float(reach_row(pg, jnp.asarray([jnp.nan, jnp.nan]), pmin, pmax, ramp)[1]) == -np.inf
        # a 10% margin for the forecast's error: the rows ask to reach 54 and 27 MW (the second now 33 too many)
        # and, up, 275 MW; a day end stays out of it
        row, gap, _ = reach_row(pg, jnp.asarray([60.0, 30.0]), pmin, pmax, ramp, 0.1)
        np.testing.assert_allclose(float(gap), 33.0, rtol=1e-12)
        np.testing.assert_array_equal(np.asarray(row), [1.0, 0.0])
        np.testing.assert_allclose(float(reach_row(pg, jnp.asarray([250.0, jnp.nan]), pmin, pmax, ramp, 0.1)[1]), 115.0, rtol=1e-12)
        assert float(reach_row(pg, jnp.asarray([jnp.nan, jnp.nan]), pmin, pmax, ramp, 0.1)[1]) == -np.inf


@pytest.mark.slow
def test_lookahead_keeps_the_evening_drop_within_the_ramps_reach():
    """Case5's load falling from 0.8 to 0.6 of its Pd over two half-hours after six flat ones, the cheap slow
    unit (Brighton, 600 MW, 9 MW a half-hour) asked for its most and the others for their least each step:
    without the look-ahead the drop outruns its ramp and the slack unit is pushed below its minimum (the
    balance channel); with it (on the observation's forecast, perfect here) the layer lowers Brighton ahead
    of the drop and the balance and ramp channels stay at 0, each step's dispatch keeping the next loads
    within reach. (The day starts within the line ratings: the start-of-day dispatch is the first interval's
    cheapest within them: Brighton at 495 MW, where the economic dispatch put it at its 600 MW maximum.)"""
    with jax.enable_x64(True):
        level = np.array([0.8] * 6 + [0.7] + [0.6] * 5)
        load = level[None, :, None] * load_case("5").bus[None, None, :, PD]
        params = make_trans_params("5", max_steps=12, n_days=1, load_p=load, forecast_error=0.0)
        env, action = TransGridEnv(), jnp.array([-1.0, -1.0, -1.0, -1.0, 1.0])

        def day(layer):
            obs, state = env.reset_to_day(0, params)
            out = []
            for _ in range(12):
                safe, _ = layer(obs, action)
                obs, state, _, costs, _, _ = env.step_env(jax.random.key(0), state, safe, params)
                out.append((np.asarray(state.pg), np.asarray(costs)))
            return out

        assert redispatch_layer(params).lookahead == 8
        raw = day(redispatch_layer(params, lookahead=0))
        assert sum(float(c[1]) for _, c in raw) > 0.05   # measured 0.074, at the drop's second step
        ahead = day(redispatch_layer(params))
        assert max(float(c[1:].max()) for _, c in ahead) <= 1e-12
        totals = load.sum(-1)[0]
        pmin, ramp = np.asarray(params.pmin), np.asarray(params.ramp)
        for t, (pg, _) in enumerate(ahead[:-1]):
            for k in range(1, min(9, 12 - t)):
                assert np.maximum(pmin, pg - k * ramp).sum() <= totals[t + k] + 1e-6
        np.testing.assert_allclose([pg.sum() for pg, _ in ahead], totals, rtol=1e-12)


@pytest.mark.slow
def test_security_redispatch_uses_the_outaged_grid():
    """Case14 with a line out of service from the first step (an outage schedule): once the observation
    shows it out (from the second step), the layer works on the post-outage flows (their sensitivities by
    the same low-rank update), so the flows the env reports, the post-outage ones, end within the ratings
    where the requested dispatch overloads them."""
    with jax.enable_x64(True):
        base = make_trans_params("14", max_steps=4, n_days=1, default_ramp_per_hour=100.0)
        sched = np.full((1, 4, 1), 2, np.int32)   # branch 2 (2-3) out
        params = make_trans_params("14", max_steps=4, n_days=1, default_ramp_per_hour=100.0, outage_schedule=sched)
        env = TransGridEnv()
        hold = lambda p, s: dispatch_action(p, s.pg, s.pg)  # noqa: E731
        state = env.step_env(jax.random.key(0), _start(params), hold(params, _start(params)), params)[1]
        intact_state = env.step_env(jax.random.key(0), _start(base), hold(base, _start(base)), base)[1]
        assert float(env._obs(state, params)[-params.rate.shape[0] + 2]) == 0.0   # the observation shows it out
        action = jnp.array([1.0, 1.0, -1.0, -1.0, -1.0])  # the units at buses 1 and 2 up, the rest down
        _, asked, _, asked_costs, _, _ = env.step_env(jax.random.key(0), state, action, params)
        (_, new, _, costs, _, _), _ = _layered_step(params, state, action)
        (_, intact, _, _, _, _), _ = _layered_step(base, intact_state, action)
        assert float(asked_costs[0]) > 0.1 and float(new.flow[2]) == 0.0
        assert float(costs[0]) == 0.0
        assert np.all(np.abs(np.asarray(new.flow)) <= np.asarray(params.rate))
        assert not np.allclose(np.asarray(new.pg), np.asarray(intact.pg), atol=0.1)  # not the intact grid's redispatch


def _day_trace(env, params, day, action=None):
    """Every step of `day` from its start under a constant `action` (default zero) through `env` (the raw env
    or one with its layer): (|V| [T, n_bus], costs [T, C], info)."""
    if action is None:
        action = jnp.zeros(env.action_space(params).shape, params.load_p.dtype)

    def one(carry, key):
        obs, state = carry
        obs, state, _, costs, _, info = env.step_env(key, state, action, params)
        inner = state.inner if isinstance(state, ShieldedState) else state
        return (obs, state), (inner.vm, costs, info)

    start = env.reset_to_day(jnp.int32(day), params)
    return jax.jit(lambda s: jax.lax.scan(one, s, jax.random.split(jax.random.key(0), params.max_steps))[1])(start)


def test_voltage_layer_brings_the_feeder_within_its_band():
    """The uncontrolled feeder sags below 0.95 p.u. at the evening peak of a day the oracle solves; the layer
    brings every step within the band (to 1e-6 p.u. summed), reactive power first: where the inverters' vars
    suffice (mild sags) loads all but stay, and the deep sags of the peak move them. A step already within
    the band is left as it is (the layer's sweep warm-starts from the observed |V|, the env's from its
    complex voltages: the same power flow to its tolerance), and on a day no control can hold in the band
    the layer leaves less violation than there was."""
    from evogrid import baselines

    with jax.enable_x64(True):
        env, params = make("dso-case33bw", split="test")
        safe = shield(env, params)
        solved = baselines.solved_days(baselines.baseline("dso-case33bw"))
        hard = next(d for d in range(params.load_p.shape[0]) if d not in solved)
        for d in (solved[0], hard):
            vm0, costs0, info0 = _day_trace(env, params, d)
            vm, costs, info = _day_trace(safe, params, d)
            v0, v = float(np.sum(costs0[:, 0])), float(np.sum(costs[:, 0]))
            assert v0 > 0.05
            if d == hard:
                assert v < 0.5 * v0
                continue
            assert v <= 1e-6
            outside = np.any((np.asarray(vm0) < 0.95) | (np.asarray(vm0) > 1.05), axis=1)
            np.testing.assert_allclose(np.asarray(info["losses_mw"])[~outside], np.asarray(info0["losses_mw"])[~outside], rtol=1e-9)
            assert np.all(np.asarray(info["layer_moved"])[~outside] == 0.0)
            # reactive power first: mild sags are met by the inverters' vars (loads move by < 0.1% of the most they
            # move at the peak), deep ones take load shifting as well; lowering voltage never calls for curtailment
            shift, sag = np.abs(np.asarray(info["shifted_mw"])), np.asarray(vm0).min(1)
            mild = outside & (sag > 0.945)
            assert mild.any() and shift[mild].max() < 1e-3 * shift.max() and shift[np.argmin(sag)] > 0.01
            assert np.all(np.asarray(info["curtailed_mw"]) == 0)
            # the layer's MWh moved: every flexible bus's shift, at least the net shift
            assert np.all(np.asarray(info["layer_moved"]) >= shift * params.delta_t_hours - 1e-12)


def _days_under(env, params, action):
    """Every test day under a constant `action` (`_day_trace`): (summed costs [days, C], the voltage
    set-points applied [days, T, n_vbus])."""
    _, costs, info = jax.vmap(lambda d: _day_trace(env, params, d, action))(jnp.arange(params.load_p.shape[0]))
    return costs.sum(1), info["voltage_setpoints"]


@pytest.mark.slow
def test_voltage_schedule_brings_the_ac_grid_within_its_band():
    """tso-case14-ac's 16 test days under constant actions. Every set-point at the top of its band (+1): the
    units at buses 3 and 6 reach their reactive limits and the load buses rise past 1.06 p.u. on every day;
    with the voltage schedule every day meets every limit. Set-points a quarter below the top (0.5): the raw
    grid leaves the band on some days, the layer's on none. Mid-band set-points (0) keep every bus within
    the band: the layer leaves them as they are (the same set-points applied, bit for bit). The active
    dispatch is the policy's, the slack's asked SCHEDULE_SLACK_MARGIN of its ramp inside its window."""
    env, params = make("tso-case14-ac", split="test")
    safe = shield(env, params)
    assert type(safe.layer).__name__ == "ScheduleLayer"
    n = env.action_space(params).shape[0]
    voltage = list(env.constraint_names(params)).index("voltage")
    obs = env.reset_to_day(jnp.int32(0), params)[0]
    for a in (1.0, 0.5, 0.0):
        action = jnp.full((n,), a, jnp.float32)
        raw, raw_vset = (np.asarray(x) for x in _days_under(env, params, action))
        costs, vset = (np.asarray(x) for x in _days_under(safe, params, action))
        assert np.all(costs.max(1) <= 1e-6), (a, costs.max(0))
        dispatch = np.asarray(safe.layer(obs, action)[0])[:5]
        np.testing.assert_array_equal(dispatch[1:], a)
        assert dispatch[0] == a if a == 0.0 else 0.5 * a < dispatch[0] < a   # the slack (unit 0), kept inside
        if a == 1.0:
            assert np.all(raw[:, voltage] > 1e-3) and np.all(vset <= raw_vset)
        elif a == 0.5:
            assert np.any(raw[:, voltage] > 1e-6)
        else:
            assert np.all(raw.max(1) <= 1e-6)
            np.testing.assert_array_equal(vset, raw_vset)


def test_voltage_schedule_asks_the_slack_inside_its_ramp_window():
    """The slack takes what the load following's estimate of the losses misses: asked for the edge of its ramp
    window it leaves that remainder past the ramp. The layer asks it SCHEDULE_SLACK_MARGIN of its ramp inside
    (the MWh of that move reported), every other unit's set-point left as asked, bit for bit."""
    from evogrid.envs.trans import asked_dispatch, read_observation
    from evogrid.safety.voltage import SCHEDULE_SLACK_MARGIN

    env, params = make("tso-case14-ac", split="test", n_days=4)
    layer = schedule_layer(params)
    obs = env.reset_to_day(jnp.int32(0), params)[0]
    last = read_observation(obs, layer.grid, (layer.forecast_steps, False))["last_pg"]
    slack = int(np.argmax(np.asarray(params.slack)))
    edge = SCHEDULE_SLACK_MARGIN * float(params.ramp[slack])
    n = params.pmax.shape[0]
    for a, room in ((1.0, -edge), (-1.0, edge), (0.3, 0.0)):
        action = jax.random.uniform(jax.random.key(3), env.action_space(params).shape, minval=-1.0, maxval=1.0)
        action = action.at[slack].set(a)
        safe, mwh = jax.jit(layer.__call__)(obs, action)
        asked, lo, hi = (np.asarray(x) for x in asked_dispatch(safe[:n], last, params))
        edge_of = {1.0: hi, -1.0: lo, 0.3: np.asarray(asked_dispatch(action[:n], last, params)[0])}[a][slack]
        np.testing.assert_allclose(asked[slack], edge_of + room, atol=1e-4)
        np.testing.assert_array_equal(np.delete(np.asarray(safe[:n]), slack), np.delete(np.asarray(action[:n]), slack))
        np.testing.assert_allclose(float(mwh), abs(room) * float(params.delta_t_hours), atol=1e-4)


@pytest.mark.slow
def test_voltage_schedule_reads_the_observation_and_nothing_else():
    """Two tso-case14-ac tasks whose loads differ after the present interval (the same power factor, the
    same observation): their voltage schedules give the same action on it; the layer holds no time series."""
    env, params = make("tso-case14-ac", split="test", n_days=4)
    day, t = 1, 20
    other = params.replace(load_p=params.load_p.at[day, t + 1:].multiply(1.3), load_q=params.load_q.at[day, t + 1:].multiply(1.3))
    state = _start(params, day).replace(time_step=jnp.int32(t))
    obs = env._obs(state, params)
    np.testing.assert_array_equal(obs, env._obs(state, other))
    action = jnp.ones(env.action_space(params).shape)
    a1, a2 = (jax.jit(schedule_layer(p).__call__)(obs, action)[0] for p in (params, other))
    np.testing.assert_array_equal(a1, a2)
    assert not np.array_equal(np.asarray(a1), np.asarray(action))   # it moved the set-points
    assert schedule_layer(params).grid.load_p is None and schedule_layer(params).grid.load_q is None


@pytest.mark.slow
def test_voltage_layer_against_the_cheapest_correction():
    """At the evening peak of a solvable test day (zero action: q = 0, no shift) the layer's load shift
    against the cheapest one that holds every bus at 0.95 p.u. + margin by the sweep power flow, found by
    scipy's SLSQP over the shifts (down only) and the inverters' vars: within 1.6x (the least-norm step
    spreads the shift over every flexible bus, where the cheapest moves the buses at the feeder's far end
    most)."""
    from scipy.optimize import minimize

    from evogrid import baselines
    from evogrid.envs.dist import feeder_flow, headroom, interval

    with jax.enable_x64(True):
        env, params = make("dso-case33bw", split="test")
        d, t = baselines.solved_days(baselines.baseline("dso-case33bw"))[0], 38
        state = _start(params, d).replace(time_step=jnp.int32(t))
        (_, _, _, costs, _, info), _ = _layered_step(params, state, jnp.zeros(14), voltage_layer(params), env)
        assert float(costs[0]) == 0.0
        load_p, load_q, avail = interval(state, params)
        flex_p = np.asarray(params.flex_incidence @ load_p)
        room = np.asarray(headroom(params, avail))
        v0 = jax.lax.complex(state.v_re, state.v_im)
        vm = jax.jit(lambda x: feeder_flow(load_p, load_q, avail, v0, (x[:6], jnp.zeros(4), x[6:]), params)[0]["vm"])
        best = minimize(lambda x: -np.sum(x[:6]), np.zeros(10), method="SLSQP",
                        bounds=[(-0.2 * f, 0.0) for f in flex_p] + [(-r, r) for r in room],
                        constraints=[{"type": "ineq", "fun": lambda x: np.asarray(vm(jnp.asarray(x))) - 0.9501}],
                        options={"maxiter": 200, "ftol": 1e-12})
        assert best.success and np.all(np.asarray(vm(jnp.asarray(best.x))) >= 0.9501 - 1e-8)
        cheapest, moved = -np.sum(best.x[:6]), -float(info["shifted_mw"])
        assert 0.01 < cheapest <= moved <= 1.6 * cheapest


@pytest.mark.slow
@pytest.mark.parametrize("task", ["tso-case14", "tso-case14-n1"])
def test_applied_dispatch_replays_through_pypower(task):
    """Random actions through the layer on a DC task: the dispatch the env reports it applied
    (`info["dispatch_mw"]`), given to PYPOWER's DC power flow (rundcpf) with the interval's loads (and the
    lines out of service removed), gives the env's flows and slack output to 1e-6 MW (float64)."""
    from pypower.api import rundcpf

    with jax.enable_x64(True):
        env, params = make(task, n_days=2, split="all", max_steps=8, seed=3)
        safe = shield(env, params)
        case = load_case("14")
        obs, state = safe.reset_to_day(1, params)
        step = jax.jit(safe.step_env)
        for t in range(8):
            action = jax.random.uniform(jax.random.key(t), (5,), minval=-1, maxval=1)
            obs, state, _, _, _, info = step(jax.random.key(t), state, action, params)
            ppc = ppc_of(case)
            ppc["bus"][:, PD] = np.asarray(params.load_p[1, t])
            ppc["gen"][:, PG] = np.asarray(info["dispatch_mw"])
            out = [int(b) for b in np.asarray(params.outage_schedule[1, t]) if b >= 0]
            ppc["branch"][out, 10] = 0   # BR_STATUS
            ref, ok = rundcpf(ppc, pypower_opts())
            assert ok
            flow = ref["branch"][:, PF]
            flow[out] = 0.0
            np.testing.assert_allclose(np.asarray(state.inner.flow), flow, atol=1e-6)
            np.testing.assert_allclose(np.asarray(state.inner.pg), ref["gen"][:, PG], atol=1e-6)


@pytest.mark.slow
def test_applied_feeder_controls_replay_through_pandapower():
    """dso-case33bw through the voltage layer at its evening peak: the controls the env reports it applied
    (`info["controls"]`: MW shifted, MW curtailed, MVAr injected), given to pandapower's runpp as load
    scaling and static generators, give the env's bus voltages to 1e-6 p.u. (float64)."""
    with jax.enable_x64(True):
        params = make_dist_params(n_days=2, sweeps=40)
        env = DistGridEnv()
        safe = Shielded(env, voltage_layer(params))
        day, t = 1, 38
        _, state = safe.reset_to_day(day, params)
        state = state.replace(inner=state.inner.replace(time_step=jnp.int32(t)))
        state = state.replace(obs=env._obs(state.inner, params))
        action = jnp.asarray([0.3, -0.2, 0.1, 0.0, 0.5, -0.5] + [0.2] * 4 + [-0.3] * 4)
        _, new, _, _, _, info = safe.step_env(jax.random.key(0), state, action, params)
        assert float(info["layer_moved"]) > 0.0 or np.any(np.asarray(info["controls"]) != 0.0)
        controls = np.asarray(info["controls"])
        shift, curtail, q = controls[:6], controls[6:10], controls[10:]
        load_p, load_q = np.asarray(params.load_p[day, t]), np.asarray(params.load_q[day, t])
        scale = np.ones(33)
        flex = np.array(FLEX_BUSES) - 1
        scale[flex] += shift / load_p[flex]
        pv_p = np.asarray(params.pv_avail[day, t]) * 0.4 - curtail
        net = solved_33bw(load_p, load_q, scale, pv_p, q)
        np.testing.assert_allclose(np.asarray(new.inner.vm), net.res_bus.vm_pu.values, atol=1e-6)


@pytest.mark.slow
def test_applied_der_controls_replay_through_pandapower():
    """ders-case141 with batteries near their charge limits, so the env clips what the action asks for: the
    controls and battery powers the env reports it applied (`info["controls"]`, `info["battery_each_mw"]`),
    given to pandapower's runpp (loads scaled, PV and batteries as static generators), give the env's bus
    voltages to 1e-6 p.u. (float64)."""
    import pandapower as pp
    from pandapower.converter.pypower import from_ppc

    from evogrid.envs import DEREnv, make_der_params

    with jax.enable_x64(True):
        params = make_der_params(n_days=2)
        env = DEREnv()
        day, t = 1, 36
        state = _start(params, day).replace(time_step=jnp.int32(t), soc=jnp.asarray([0.11, 0.89, 0.5]))
        action = jax.random.uniform(jax.random.key(5), (15,), minval=-1, maxval=1).at[-3:].set(jnp.asarray([1.0, -1.0, 0.4]))
        _, new, _, _, _, info = env.step_env(jax.random.key(0), state, action, params)
        assert float(info["battery_clipped_mw"]) > 0.0    # applied != asked
        controls, bat_p = np.asarray(info["controls"]), np.asarray(info["battery_each_mw"])
        shift, curtail, q = controls[:4], controls[4:8], controls[8:]
        load_p, load_q = np.asarray(params.load_p[day, t]), np.asarray(params.load_q[day, t])
        flex = np.argmax(np.asarray(params.flex_incidence), 1)
        scale = np.ones(141)
        scale[flex] += shift / load_p[flex]
        pv_p = np.asarray(params.pv_avail[day, t] * params.pv_rating) - curtail
        net = from_ppc(ppc_of(load_case("141")), f_hz=50, validate_conversion=False)
        net.load.drop(net.load.index, inplace=True)
        bus = net.bus.index.values
        for b in range(141):
            pp.create_load(net, bus[b], p_mw=load_p[b] * scale[b], q_mvar=load_q[b] * scale[b])
        for k, b in enumerate(np.argmax(np.asarray(params.pv_incidence), 1)):
            pp.create_sgen(net, bus[b], p_mw=pv_p[k], q_mvar=q[k])
        for j, b in enumerate(np.argmax(np.asarray(params.battery_incidence), 1)):
            pp.create_sgen(net, bus[b], p_mw=bat_p[j], q_mvar=0.0)
        pp.runpp(net, tolerance_mva=1e-8, numba=False)
        np.testing.assert_allclose(np.asarray(new.vm), net.res_bus.loc[bus, "vm_pu"].values, atol=1e-6)


@pytest.mark.slow
def test_layer_bad_input():
    """A layer asked for on a task without one, a look-ahead longer than the forecast the observation
    carries, a bad safety choice: one clear line each."""
    env, params = make("tso-case14", n_days=2)
    with pytest.raises(ValueError, match="the voltage schedule moves the units' voltage set-points: it needs an AC task"):
        schedule_layer(params)
    env, params = make("tso-case14-ac", n_days=2)
    with pytest.raises(ValueError, match="the security redispatch works on the DC flows"):
        redispatch_layer(params)
    with pytest.raises(ValueError, match="this task's load_q does not keep one"):
        schedule_layer(params.replace(load_q=params.load_q.at[0, 3].multiply(2.0)))
    env, params = make("dcmg")
    with pytest.raises(ValueError, match="no safety layer for DCMicrogridEnv"):
        make_layer(env, params, "on")
    env, params = make("tso-case5", n_days=2)
    with pytest.raises(ValueError, match=r"lookahead must be an integer in \[0, 8\]"):
        redispatch_layer(params, lookahead=9)
    with pytest.raises(ValueError, match="safety must be one of auto, on, off"):
        make_layer(env, params, "maybe")
    with pytest.raises(ValueError, match=r"reach_margin must be a share in \[0, 1\)"):
        redispatch_layer(params, reach_margin=-0.01)
    with pytest.raises(ValueError, match=r"line_margin must be a share in \[0, 1\) of each line's rating"):
        redispatch_layer(params, line_margin=1.0)
    env, params = make("dso-case33bw", n_days=2)
    with pytest.raises(ValueError, match="reach_margin is the security redispatch's"):
        make_layer(env, params, "auto", reach_margin=0.01)
    with pytest.raises(ValueError, match="line_margin is the security redispatch's"):
        make_layer(env, params, "auto", line_margin=0.01)
    with pytest.raises(ValueError, match="forecast_error must be >= 0"):
        make("tso-case5", n_days=2, forecast_error=-0.01)


@pytest.mark.parametrize("argv, message", [
    (["--task", "dcmg", "--safety", "on"], "no safety layer for DCMicrogridEnv"),
    (["--task", "ders-case141", "--safety", "on"], "no safety layer for"),
    (["--task", "tso-case5-fc60"], "forecast_steps 60 is longer than the day (48 steps)"),
])
def test_bad_safety_requests_are_one_line_and_write_nothing(tmp_path, capsys, argv, message):
    from evogrid import cli

    code = cli.main(["train", *argv, "--pop", "4", "--generations", "1", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.strip().count("\n") <= 1, err
    assert not (tmp_path / "run").exists()


def test_the_margins_go_from_the_config_to_the_layer():
    """`--reach-margin` and `--line-margin` (every workflow config's `reach_margin`, `line_margin`) are the
    redispatch's; 0 leaves it as it was."""
    from evogrid.workflows import ECConfig, ECWorkflow

    wf = ECWorkflow(ECConfig(task="tso-case5", pop_size=4, reach_margin=0.02, line_margin=0.03))
    assert wf.layer_on and wf.env.layer.reach_margin == 0.02 and wf.env.layer.line_margin == 0.03
    layer = ECWorkflow(ECConfig(task="tso-case5", pop_size=4)).env.layer
    assert layer.reach_margin == 0.0 and layer.line_margin == 0.0
