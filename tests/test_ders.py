"""DERs task: battery SOC arithmetic by hand, the solved feeder against pandapower, energy balance,
the end-of-day SOC cost and the multi-agent view."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from evogrid.envs import DEREnv, GridMARLEnv, make_der_params
from evogrid.physics import Battery, battery_limits, battery_step

BAT_BUSES, PV_BUSES, FLEX_BUSES = (51, 80, 86), (49, 79, 109, 110), (61, 69, 107, 112)
N_ACT = 4 + 2 * 4 + 3


def _battery(taper=0.05):
    one = lambda v: jnp.array([v], jnp.float64)  # noqa: E731
    return Battery(capacity_mwh=one(2.0), p_max_mw=one(0.5), eta_charge=one(0.95), eta_discharge=one(0.9),
                   soc_min=one(0.1), soc_max=one(0.9), taper=one(taper))


@pytest.mark.parametrize("soc, request_mw, taper, soc_next, applied, clipped", [
    # charge 0.5 MW for 0.5 h from 50%: 0.25 MWh drawn, 0.95 * 0.25 = 0.2375 MWh stored = 0.11875 of 2 MWh
    (0.5, -0.5, 0.05, 0.61875, -0.5, 0.0),
    # discharge 0.5 MW for 0.5 h: 0.25 MWh delivered takes 0.25 / 0.9 = 0.27778 MWh = 0.138889 of capacity
    (0.5, 0.5, 0.05, 0.5 - 0.25 / 0.9 / 2.0, 0.5, 0.0),
    # 2% below full: taper allows 0.5 * 0.02 / 0.05 = 0.2 MW, the energy room 0.02 * 2 / (0.95 * 0.5)
    # = 0.0842105 MW binds; the battery ends exactly full and 0.5 - 0.0842105 MW is clipped
    (0.88, -0.5, 0.05, 0.9, -0.04 / 0.475, 0.5 - 0.04 / 0.475),
    # 2% above empty: energy room 0.02 * 2 * 0.9 / 0.5 = 0.072 MW (< taper's 0.2 MW); ends at soc_min
    (0.12, 0.5, 0.05, 0.1, 0.072, 0.428),
    # a wide taper binds first: at 80% with taper 0.2 the charge rating is 0.5 * 0.1 / 0.2 = 0.25 MW
    # (energy room 0.421 MW); stored 0.95 * 0.25 * 0.5 = 0.11875 MWh -> +0.059375
    (0.8, -0.5, 0.2, 0.859375, -0.25, 0.25),
])
def test_battery_soc_arithmetic_by_hand(soc, request_mw, taper, soc_next, applied, clipped):
    with jax.enable_x64(True):
        new, p, cut = battery_step(_battery(taper), jnp.array([soc]), jnp.array([request_mw]), 0.5)
        np.testing.assert_allclose([float(new[0]), float(p[0]), float(cut[0])], [soc_next, applied, clipped], atol=1e-12)


def test_battery_limits_vanish_at_the_bounds():
    with jax.enable_x64(True):
        p_ch, p_dis = battery_limits(_battery(), jnp.array([0.9]), 0.5)
        assert float(p_ch[0]) == 0.0 and float(p_dis[0]) == 0.5
        p_ch, p_dis = battery_limits(_battery(), jnp.array([0.1]), 0.5)
        assert float(p_dis[0]) == 0.0 and float(p_ch[0]) == 0.5


@pytest.fixture(scope="module")
def params64():
    with jax.enable_x64(True):
        yield make_der_params(n_days=2, sweeps=40)


def _state(params, day=0, t=0, soc=None):
    state = jax.tree_util.tree_map(lambda x: x[day], params.init).replace(time_step=jnp.int32(t))
    return state if soc is None else state.replace(soc=jnp.asarray(soc, state.soc.dtype))


@pytest.mark.slow
def test_solved_feeder_matches_pandapower_with_all_resources(params64):
    """Evening (t=36) with batteries, PV (curtailment, vars) and load shifting: |V| equals pandapower's to 1e-6 p.u.;
    the substation import balances load + losses - PV - batteries."""
    import pandapower as pp
    from conftest import ppc_of
    from pandapower.converter.pypower import from_ppc

    from evogrid.case import load_case

    with jax.enable_x64(True):
        params = params64
        rng = np.random.default_rng(3)
        action = rng.uniform(-1, 1, N_ACT)
        action[-3:] = [0.8, -0.6, 1.0]   # two discharging, one charging
        state = _state(params, day=1, t=36, soc=[0.5, 0.5, 0.5])
        obs, new, reward, costs, done, info = DEREnv().step_env(jax.random.key(0), state, jnp.asarray(action), params)
        load_p, load_q = np.asarray(params.load_p[1, 36]), np.asarray(params.load_q[1, 36])
        scale = np.ones(141)
        u = np.sign(action[:4]) * np.maximum(np.abs(action[:4]) - 0.4, 0.0) / 0.6   # beyond the 0.4 dead band
        scale[np.array(FLEX_BUSES) - 1] += 0.2 * u
        pv_p = np.asarray(params.pv_avail[1, 36]) * 0.5 * (1 - np.maximum(action[4:8], 0))
        pv_q = action[8:12] * np.sqrt(0.55**2 - pv_p**2)
        bat_p = action[-3:] * 0.5   # 50% SOC: far from the bounds, nothing clipped
        net = from_ppc(ppc_of(load_case("141")), f_hz=50, validate_conversion=False)
        net.load.drop(net.load.index, inplace=True)
        bus = net.bus.index.values   # pandapower's bus index of case bus k + 1, in file order
        for b in range(141):
            pp.create_load(net, bus[b], p_mw=load_p[b] * scale[b], q_mvar=load_q[b] * scale[b])
        for k, b in enumerate(PV_BUSES):
            pp.create_sgen(net, bus[b - 1], p_mw=pv_p[k], q_mvar=pv_q[k])
        for j, b in enumerate(BAT_BUSES):
            pp.create_sgen(net, bus[b - 1], p_mw=bat_p[j], q_mvar=0.0)
        pp.runpp(net, tolerance_mva=1e-8, numba=False)
        np.testing.assert_allclose(np.asarray(new.vm), net.res_bus.loc[bus, "vm_pu"].values, atol=1e-6)
        np.testing.assert_allclose(float(info["losses_mw"]), net.res_line.pl_mw.sum(), atol=1e-6)
        np.testing.assert_allclose(float(info["substation_mw"]), net.res_ext_grid.p_mw.sum(), atol=1e-6)
        np.testing.assert_allclose(float(info["battery_mw"]), bat_p.sum(), rtol=1e-12)
        assert float(info["battery_clipped_mw"]) == 0.0
        # reward by hand: import at the step's price + losses at 20 $/MWh + shifted MW at 30 $/MWh, over 0.5 h, x 0.01
        shifted = np.sum(np.abs(0.2 * u * load_p[np.array(FLEX_BUSES) - 1]))
        dollars = (net.res_ext_grid.p_mw.sum() * float(params.price[1, 36]) + net.res_line.pl_mw.sum() * 20.0
                   + shifted * 30.0) * 0.5
        np.testing.assert_allclose(float(reward), -0.01 * dollars, rtol=1e-6)


def test_energy_balance_every_step_in_float32():
    """Over a random day: import = load + shift + losses - PV - battery output at every step (float32, 1e-4 MW);
    the random actions leave the voltage band (the voltage channel counts it)."""
    env = DEREnv()
    voltage = []
    for params in (make_der_params(n_days=2),):

        def body(state, key, params=params):
            k_act, k_step = jax.random.split(key)
            action = jax.random.uniform(k_act, (N_ACT,), minval=-1, maxval=1)
            t, day = state.time_step, state.day
            obs, new, reward, costs, done, info = env.step(k_step, state, action, params)
            load = jnp.sum(params.load_p[day, t])
            gap = info["substation_mw"] - (load + info["shifted_mw"] + info["losses_mw"] - info["pv_mw"] - info["battery_mw"])
            return new, (gap, info["substation_mw"], costs)

        _, state = env.reset(jax.random.key(0), params)
        _, (gap, imports, costs) = jax.jit(lambda s, body=body: jax.lax.scan(body, s, jax.random.split(jax.random.key(1), 48)))(state)
        assert np.all(np.abs(np.asarray(gap)) < 1e-4) and np.all(np.asarray(imports) > 1.0)
        assert np.all(np.isfinite(np.asarray(costs))) and np.all(np.asarray(costs) >= 0)
        voltage.append(float(np.asarray(costs)[:, 0].sum()))
    assert voltage[0] > 0.01


def test_soc_cost_counts_clipping_and_the_end_of_day_shortfall(params64):
    env = DEREnv()
    with jax.enable_x64(True):
        params = params64
        discharge = jnp.zeros(N_ACT).at[-3:].set(1.0)
        # a nearly empty battery: 0.5 MW asked, 0.072... MW possible -> the clipped energy is the soc cost
        state = _state(params, t=10, soc=[0.5, 0.5, 0.11])
        _, new, _, costs, done, info = env.step_env(jax.random.key(0), state, discharge, params)
        room = 0.01 * 2.0 * 0.95 / 0.5   # (0.11 - 0.1) * 2 MWh * eta_d / dt (taper 0.05 allows 0.1 MW)
        np.testing.assert_allclose(float(info["battery_clipped_mw"]), 0.5 - room, rtol=1e-9)
        np.testing.assert_allclose(float(costs[2]), (0.5 - room) * 0.5, rtol=1e-9)
        np.testing.assert_allclose(np.asarray(new.soc), [0.5 - 0.25 / 0.95 / 2, 0.5 - 0.25 / 0.95 / 2, 0.1], atol=1e-12)
        # the day's last step: batteries at 0.3 end below their 0.5 start: 3 x 0.2 x 2 MWh = 1.2 MWh shortfall
        last = _state(params, t=47, soc=[0.3, 0.3, 0.3])
        _, _, _, costs, done, _ = env.step_env(jax.random.key(0), last, jnp.zeros(N_ACT), params)
        assert bool(done)
        np.testing.assert_allclose(float(costs[2]), 1.2, rtol=1e-9)


def test_cheap_night_charging_and_peak_discharging_pays():
    """Price arbitrage sanity: charging at night and discharging at the evening peak beats idling."""
    env, params = DEREnv(), make_der_params(n_days=1)
    hours = (np.arange(48) + 0.5) * 0.5

    def day_return(schedule):
        def body(state, a):
            obs, state, reward, costs, done, info = env.step(jax.random.key(0), state, a, params)
            return state, (reward, costs)

        _, state = env.reset(jax.random.key(0), params)
        _, (rewards, costs) = jax.lax.scan(body, state, schedule)
        return float(rewards.sum()), np.asarray(costs[:, 2]).sum()

    idle = jnp.zeros((48, N_ACT))
    arb = np.zeros((48, N_ACT))
    arb[(hours >= 2) & (hours < 4), -3:] = -0.8   # 4 steps: +0.095 SOC each, 0.5 -> 0.88
    arb[(hours >= 18) & (hours < 19.5), -3:] = 0.8  # 3 steps: -0.105 each, ends at 0.564 (no shortfall)
    r_idle, _ = day_return(idle)
    r_arb, soc_cost = day_return(jnp.asarray(arb, jnp.float32))
    assert r_arb > r_idle and soc_cost < 0.05


def test_marl_view_has_one_agent_per_resource():
    params = make_der_params(n_days=1, max_steps=4)
    marl = GridMARLEnv(DEREnv(), params)
    assert marl.agents == [f"flex_{i}" for i in range(4)] + [f"pv_{k}" for k in range(4)] + [f"bat_{j}" for j in range(3)]
    obs, state = marl.reset(jax.random.key(0), params)
    flat, _ = DEREnv().reset(jax.random.key(0), params)
    # bat_1 on bus 80: |V|, load at that bus, its SOC, the price, 3 time features
    n_dso = 2 * 141 + 4 + 3
    np.testing.assert_allclose(obs["bat_1"], np.asarray(flat)[[79, 141 + 79, n_dso + 1, n_dso + 3, 286, 287, 288]])
    actions = {name: jnp.full(space.shape, 0.3) for name, space in marl.action_spaces(params).items()}
    obs2, state2, reward, done, info = jax.jit(marl.step)(jax.random.key(1), state, actions, params)
    ref = jax.jit(DEREnv().step)(jax.random.key(1), state, jnp.full(N_ACT, 0.3), params)
    assert float(reward["bat_2"]) == float(ref[2]) and np.allclose(state2.soc, ref[1].soc)


def test_bad_der_config():
    with pytest.raises(ValueError, match="battery_buses: bus 1 is not a non-substation bus"):
        make_der_params(battery_buses=(1,))
    with pytest.raises(ValueError, match="soc_min <= soc_init <= soc_max"):
        make_der_params(soc_init=0.95)
    with pytest.raises(ValueError, match="efficiencies"):
        make_der_params(eta_charge=1.2)
