"""GenCos market: clearing against scipy's linprog (HiGHS), profits by hand, the MARL view."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import marl_scan
from scipy.optimize import linprog

from evogrid.envs import GenCoMarketEnv, MarketMARLEnv, make, make_market_params
from evogrid.physics.market import merit_order, vertex
from evogrid.workflows.base import FEASIBLE_TOL

ENV = GenCoMarketEnv()


def _linprog_dcopf(params, prices, caps, load):
    """The same DC-OPF written for HiGHS: returns (dispatch, LMPs, total cost)."""
    ptdf, rate, f0 = (np.asarray(x, float) for x in (params.ptdf, params.rate, params.f0))
    seg_bus = np.asarray(params.seg_bus)
    lim = np.isfinite(rate)
    a = np.zeros((ptdf.shape[1], len(seg_bus)))
    a[seg_bus, np.arange(len(seg_bus))] = 1.0
    h = ptdf[lim] @ a
    base = (f0 - ptdf @ load)[lim]
    kw = {}
    if lim.any():
        kw = dict(A_ub=np.vstack([h, -h]), b_ub=np.concatenate([rate[lim] - base, rate[lim] + base]))
    res = linprog(prices, A_eq=np.ones((1, len(seg_bus))), b_eq=[load.sum()], bounds=list(zip(np.zeros(len(caps)), caps)),
                  method="highs", **kw)
    assert res.status == 0
    lmp = np.full(ptdf.shape[1], res.eqlin.marginals[0])
    if lim.any():
        n = int(lim.sum())
        lmp = lmp + ptdf[lim].T @ (res.ineqlin.marginals[:n] - res.ineqlin.marginals[n:])  # HiGHS: marginals <= 0
    return res.x, lmp, res.fun


def _per_unit(params, g):
    """MW per unit, then the shed MW per bus."""
    g = np.asarray(g, float)
    n_seg = params.seg_cost.shape[0]
    return np.concatenate([np.bincount(np.asarray(params.seg_unit), g[:n_seg]), g[n_seg:]])


def _offers(params, markup):
    return np.asarray(params.seg_cost) * (1.0 + markup[np.asarray(params.seg_unit)])


@pytest.mark.parametrize("case, load_scale", [("5", 1.0), ("5", 1.15), ("14", 1.0)])
def test_dcopf_clearing_matches_linprog(case, load_scale):
    """Seeded random mark-ups and load hours: dispatch within 1e-4 MW, LMPs within 1e-4 $/MWh, cost 1e-8
    relative (float64); case5 is congested (prices differ across buses), case14 has no line ratings."""
    rng = np.random.default_rng(7)
    spreads = []
    with jax.enable_x64(True):
        params = make_market_params(case, n_days=2, load_scale=load_scale)
        clear = jax.jit(lambda offers, load: ENV.clear(offers, params, load))
        for trial in range(4):
            markup = rng.uniform(0.0, 1.0, params.company.shape[1])
            load = np.asarray(params.load[trial % 2, rng.integers(48)])
            offers = _offers(params, markup)
            prices = np.concatenate([offers, np.full(len(load), 1000.0)])
            ref_g, ref_lmp, ref_cost = _linprog_dcopf(params, prices, np.concatenate([np.asarray(params.seg_cap), load]), load)
            g, lmp = clear(jnp.asarray(offers), jnp.asarray(load))
            # segments of one unit can tie in price (linear costs): compare each unit's total and the shedding
            np.testing.assert_allclose(_per_unit(params, g), _per_unit(params, ref_g), atol=1e-4)
            np.testing.assert_allclose(np.asarray(lmp), ref_lmp, atol=1e-4)
            np.testing.assert_allclose(prices @ np.asarray(g), ref_cost, rtol=1e-8)
            spreads.append(np.ptp(ref_lmp))
    if case == "5":
        assert max(spreads) > 1.0   # congestion: nodal prices differ
    else:
        assert max(spreads) < 1e-6


def test_dcopf_in_float32_is_close():
    """float32 (the default), 64 clearings of congested case5 test hours at random mark-ups and 1.15 x
    load: the cost within 1e-3 of HiGHS's everywhere, LMPs within 1e-3 $/MWh and each unit's output
    within 0.05 MW at the 95th percentile (the interior point's vertex is exact; a near-degenerate hour
    may keep the interior point)."""
    params = make_market_params("5", split="test", load_scale=1.15)
    rng = np.random.default_rng(3)
    days, hours = rng.integers(params.load.shape[0], size=64), rng.integers(48, size=64)
    markups = rng.uniform(0.0, 1.0, (64, 5))
    loads = np.asarray(params.load, float)[days, hours]
    offers = np.stack([_offers(params, m) for m in markups])
    g, lmp = jax.jit(jax.vmap(lambda o, l: ENV.clear(o, params, l)))(jnp.asarray(offers, jnp.float32), jnp.asarray(loads, jnp.float32))
    lmp_err, cost_err, mw_err = [], [], []
    for i in range(64):
        prices = np.concatenate([offers[i], np.full(5, 1000.0)])
        ref_g, ref_lmp, ref_cost = _linprog_dcopf(params, prices, np.concatenate([np.asarray(params.seg_cap, float), loads[i]]), loads[i])
        lmp_err.append(np.abs(np.asarray(lmp[i]) - ref_lmp).max())
        cost_err.append(abs(prices @ np.asarray(g[i], float) / ref_cost - 1))
        mw_err.append(np.abs(_per_unit(params, g[i]) - _per_unit(params, ref_g)).max())
    assert max(cost_err) < 1e-3 and np.percentile(lmp_err, 95) < 1e-3, (max(cost_err), np.percentile(lmp_err, 95))
    assert np.percentile(mw_err, 95) < 0.05, np.percentile(mw_err, 95)


@pytest.mark.parametrize("slack", [1e-7, 2.0 - 1e-7])
def test_the_vertex_pivots_from_a_basis_the_point_misreads(slack):
    """A box LP whose optimum keeps a line slack t 0.001 off its lower bound, given an interior point that stopped
    with the cheap unit 1e-6 below its capacity and t 1e-7 from one of its bounds (as a float32 point does with
    its 1e-4 residual): the basis read off the point (the m variables farthest from their bounds) takes the
    unit and drops t. With t at 0 that basis is not dual feasible (the primal simplex's pivot), with t at its
    upper bound not primal feasible (the dual simplex's); the point was kept before, one pivot reaches the
    optimum."""
    c, a = jnp.array([1.0, 2.0, 0.0]), jnp.array([[1.0, 1.0, 0.0], [1.0, 0.0, -1.0]])   # g1, g2, t
    b, u = jnp.array([1.5, 0.999]), jnp.array([1.0, 2.0, 2.0])
    z = jnp.array([1.0 - 1e-6, 0.5, slack])
    point = (z, u - z, jnp.array([7.0, 7.0]), jnp.ones(3), jnp.ones(3))
    _, y, found = vertex((c, a, b, u), point, 1e-6, pivots=0)
    assert not found and np.allclose(y, 7.0)
    x, y, found = vertex((c, a, b, u), point, 1e-6)
    assert found
    np.testing.assert_allclose(x, [1.0, 0.5, 0.001], atol=1e-6)
    np.testing.assert_allclose(y, [2.0, 0.0], atol=1e-6)   # the expensive unit sets the price; the line is free


def test_a_near_degenerate_hour_clears_at_the_optimal_prices_in_float32():
    """gencos-case5, day 51, interval 21, at mark-ups the chip's rollout drew: a line 0.1 MW inside its rating
    at the optimum. The float32 interior point ended with the line at its rating and cleared prices 1.5-7
    $/MWh above HiGHS's (uniform, 18.10) on this CPU and on a TPU; the vertex's pivots reach HiGHS's prices."""
    env, params = make("gencos-case5")
    action = np.array([0.7913670539855957, -0.7120668888092041, 0.1824655532836914, 0.5393052101135254, 0.619504451751709])
    offers = _offers(params, 0.5 * (action + 1.0) * float(params.markup_max))
    load = np.asarray(params.load, float)[51, 21]
    _, lmp = jax.jit(env.clear, static_argnums=())(jnp.asarray(offers, jnp.float32), params, jnp.asarray(load, jnp.float32))
    prices = np.concatenate([offers, np.full(5, float(params.voll))])
    _, ref, _ = _linprog_dcopf(params, prices, np.concatenate([np.asarray(params.seg_cap, float), load]), load)
    np.testing.assert_allclose(np.asarray(lmp), ref, atol=1e-3)


def test_merit_order_matches_linprog_on_a_copper_plate():
    rng = np.random.default_rng(3)
    with jax.enable_x64(True):
        for _ in range(5):
            prices, caps = rng.uniform(5, 80, 12), rng.uniform(10, 100, 12)
            demand = rng.uniform(0.2, 0.9) * caps.sum()
            g, price, unserved = merit_order(jnp.asarray(prices), jnp.asarray(caps), demand)
            res = linprog(prices, A_eq=np.ones((1, 12)), b_eq=[demand], bounds=list(zip(np.zeros(12), caps)), method="highs")
            np.testing.assert_allclose(np.asarray(g), res.x, atol=1e-9)
            np.testing.assert_allclose(float(price), res.eqlin.marginals[0], rtol=1e-12)
            assert float(unserved) == 0.0
        g, price, unserved = merit_order(jnp.array([10.0, 20.0]), jnp.array([5.0, 5.0]), 12.0)
        assert float(unserved) == 2.0 and float(price) == 20.0


def test_profits_and_thermal_cost_by_hand_in_merit_mode():
    """Copper-plate clearing of case5 at zero mark-up: every dispatched MW earns the uniform price minus its cost."""
    with jax.enable_x64(True):
        params = make_market_params("5", n_days=1, clearing="merit")
        _, state = ENV.reset(jax.random.key(0), params)
        state = state.replace(time_step=jnp.int32(38))
        _, new, reward, costs, _, info = ENV.step_env(jax.random.key(0), state, -jnp.ones(5), params)
        load = np.asarray(params.load[0, 38])
        g, price, _ = merit_order(params.seg_cost, params.seg_cap, load.sum())
        seg_profit = np.asarray(g) * (float(price) - np.asarray(params.seg_cost)) * 0.5
        expected = np.bincount(np.asarray(params.seg_unit), seg_profit, minlength=5)
        np.testing.assert_allclose(np.asarray(info["profits"]), expected, rtol=1e-12, atol=1e-9)
        np.testing.assert_allclose(float(reward), 1e-3 * expected.sum(), rtol=1e-12)
        # flows of the copper-plate dispatch on case5's rated lines (400 and 240 MW): the overload is a cost
        inj = -load.copy()
        np.add.at(inj, np.asarray(params.seg_bus[:15]), np.asarray(g))
        flows = np.asarray(params.ptdf) @ inj
        rate = np.asarray(params.rate)
        np.testing.assert_allclose(float(costs[1]), np.maximum(np.abs(flows) - rate, 0).sum(), rtol=1e-9)


@pytest.mark.slow
def test_the_thermal_channel_counts_overloads_not_round_off():
    """Random days of case5 cleared in float32 and in float64 (the same mark-ups): the lines the clearing loads
    to their ratings read a unit in the last place above them in float32 on almost every day (63 of 64 days
    of another draw counted as over a limit, none in float64, and a TPU's and its host's counted different
    ones); within `market.rounding` of a rating the thermal channel counts nothing, and no day is over a
    limit in either; the copper-plate clearing's real overloads are still counted (test above)."""
    actions = np.asarray(jax.random.uniform(jax.random.key(4), (16, 48, 5), jnp.float32, -1.0, 1.0))

    def thermal(dtype):
        params = make_market_params("5", n_days=2)
        params = jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, params)

        def day(acts):
            def body(state, action):
                _, state, _, costs, _, info = ENV.step_env(jax.random.key(0), state, action, params)
                return state, (costs[1], info["lmp"])
            return jax.lax.scan(body, ENV.reset_to_day(0, params)[1], acts.astype(dtype))[1]

        return jax.jit(jax.vmap(day))(actions)

    single, prices = thermal(jnp.float32)
    with jax.enable_x64(True):
        double, prices64 = thermal(jnp.float64)
    for thermal_days in (single, double):   # no day over a limit (the float64 LP's vertex: 6e-15 MW at most)
        assert np.asarray(thermal_days, np.float64).sum(1).max() <= FEASIBLE_TOL
    np.testing.assert_allclose(np.asarray(prices), np.asarray(prices64), rtol=1e-4, atol=1e-3)   # the same clearings
    assert np.mean(np.abs(np.asarray(prices64) - np.asarray(prices64)[:, :, :1]) > 1.0) > 0.1   # congested: prices differ by bus


def test_market_marl_view_gives_each_company_its_profit():
    params = make_market_params("5", n_days=1, max_steps=4, companies=[(0, 1), (2,), (3, 4)])
    marl = MarketMARLEnv(ENV, params)
    assert marl.agents == ["genco_0", "genco_1", "genco_2"]
    assert marl.action_spaces(params)["genco_0"].shape == (2,)
    obs, state = marl.reset(jax.random.key(0), params)
    actions = {"genco_0": jnp.array([0.2, -0.4]), "genco_1": jnp.array([0.6]), "genco_2": jnp.array([-1.0, 1.0])}
    obs, state2, rewards, done, info = jax.jit(marl.step)(jax.random.key(1), state, actions, params)
    flat = ENV.step(jax.random.key(1), state, jnp.array([0.2, -0.4, 0.6, -1.0, 1.0]), params)
    profits = np.asarray(flat[5]["profits"])
    # jit against eager float32: equal to rounding (1e-6 of the largest profit; company 1 earns ~0)
    np.testing.assert_allclose([float(rewards[f"genco_{c}"]) for c in range(3)], 1e-3 * profits, rtol=1e-6,
                               atol=1e-9 * np.abs(profits).max())
    np.testing.assert_allclose(float(flat[2]), 1e-3 * profits.sum(), rtol=1e-5)


def test_bad_market_config():
    with pytest.raises(ValueError, match="own each of the 5 units"):
        make_market_params("5", companies=[(0, 1), (2,)])
    with pytest.raises(ValueError, match="clearing must be"):
        make_market_params("5", clearing="pab")


def test_market_marl_view_under_vmap_and_scan():
    params = make_market_params("5", n_days=2, max_steps=3, clearing="merit")
    obs, rewards, dones = marl_scan(MarketMARLEnv(ENV, params), params, n_envs=4, steps=7, agent="genco_4")
    assert rewards.shape == (7, 4) and dones.sum() == 2 * 4  # two 3-step episodes ended per env
    assert obs["genco_0"].shape == (4, 13) and np.all(np.isfinite(rewards))


def test_the_clearing_calls_no_lapack_under_vmap():
    """The clearing's small systems are unrolled eliminations (`small_solve`), not batched LAPACK calls: on 2
    CPU cores jaxlib's batched LU and Cholesky deadlocked once two were in flight (gencos-case14 hung at 192
    envs and more, jax 0.10.2), and on an accelerator they run one tiny factorisation at a time."""
    env, params = make("gencos-case14")
    n = params.seg_cost.shape[0]
    offers = jnp.broadcast_to(params.seg_cost, (256, n))
    loads = params.load[0, :1].repeat(256, axis=0)
    text = jax.jit(jax.vmap(lambda o, l: env.clear(o, params, l))).lower(offers, loads).compile().as_text()
    calls = sorted(set(re.findall(r'custom_call_target="([^"]+)"', text)))
    assert calls == ["TopK"], calls   # the vertex's basis: top_k (the CPU's sort), no lapack_* factorisation
