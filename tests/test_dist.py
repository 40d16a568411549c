"""DSO env physics: the solved feeder against pandapower, energy balance, the cost/control mappings by hand
(the voltage correction is a safety layer: tests/test_safety.py)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import solved_33bw

from evogrid.envs import DistGridEnv, make_dist_params
from evogrid.envs.dist import flex_action, flex_share

PV_BUSES, FLEX_BUSES = (18, 22, 25, 33), (7, 8, 24, 25, 30, 32)


def _step(params, action, day=0, t=0):
    env = DistGridEnv()
    state = jax.tree_util.tree_map(lambda x: x[day], params.init).replace(time_step=jnp.int32(t))
    return env.step_env(jax.random.key(0), state, jnp.asarray(action), params)


def test_solved_feeder_matches_pandapower_with_pv_and_flex_actions():
    """Midday (t=24) with curtailment, reactive power and load shifting: |V| equals pandapower's runpp to 1e-6 p.u."""
    with jax.enable_x64(True):
        params = make_dist_params(n_days=2, sweeps=40)
        action = np.array([0.5, -1.0, 0.2, 0.0, -0.3, 1.0] + [0.3, 0.0, 0.8, -0.5] + [1.0, -0.4, 0.0, 0.6])
        obs, new, reward, costs, done, info = _step(params, action, day=1, t=24)
        load_p, load_q = np.asarray(params.load_p[1, 24]), np.asarray(params.load_q[1, 24])
        # the flexible loads move beyond the dead band (0.4) only: 0.5 -> 1/6, -1 -> -1, 0.2 and -0.3 -> 0
        u = np.sign(action[:6]) * np.maximum(np.abs(action[:6]) - 0.4, 0.0) / 0.6
        scale = np.ones(33)
        scale[np.array(FLEX_BUSES) - 1] += 0.2 * u
        avail = np.asarray(params.pv_avail[1, 24]) * 0.4
        pv_p = avail * (1 - np.maximum(action[6:10], 0))
        pv_q = action[10:] * np.sqrt((0.44**2) - pv_p**2)
        net = solved_33bw(load_p, load_q, scale, pv_p, pv_q)
        np.testing.assert_allclose(np.asarray(new.vm), net.res_bus.vm_pu.values, atol=1e-6)
        np.testing.assert_allclose(float(info["losses_mw"]), net.res_line.pl_mw.sum(), atol=1e-7)
        # energy balance: substation import = load + losses - PV output (pandapower's ext_grid injection)
        np.testing.assert_allclose(float(info["substation_mw"]), net.res_ext_grid.p_mw.sum(), atol=1e-7)
        np.testing.assert_allclose(float(info["pv_mw"]), pv_p.sum(), rtol=1e-12)
        np.testing.assert_allclose(float(info["shifted_mw"]), np.sum(0.2 * u * load_p[np.array(FLEX_BUSES) - 1]), rtol=1e-12)


def test_flexible_loads_hold_within_the_dead_band():
    """Actions within the dead band move no load (the step equals the zero action's); `flex_action` inverts
    `flex_share` beyond it; a dead band outside [0, 1) is refused."""
    with jax.enable_x64(True):
        params = make_dist_params(n_days=1)
        inside = np.array([0.39, -0.39, 0.2, -0.1, 0.0, 0.4] + [0.0] * 8)
        a, b = _step(params, inside, t=38), _step(params, np.zeros(14), t=38)
        assert float(a[5]["shifted_mw"]) == 0.0 and float(a[2]) == float(b[2])
        share = np.array([-1.0, -0.25, 0.0, 1e-9, 0.5, 1.0])
        np.testing.assert_allclose(np.asarray(flex_share(jnp.asarray(flex_action(share, 0.4)), 0.4)), share, atol=1e-15)
        with pytest.raises(ValueError, match=r"flex_deadband must be in \[0, 1\), got 1.0"):
            make_dist_params(n_days=1, flex_deadband=1.0)


def test_voltage_cost_zero_inside_band_and_summed_outside():
    with jax.enable_x64(True):
        wide = make_dist_params(n_days=1, v_min=0.80, v_max=1.20)
        _, new, _, costs, _, _ = _step(wide, np.zeros(14), t=38)  # evening peak
        assert float(costs[0]) == 0.0
        tight = make_dist_params(n_days=1)
        _, new, _, costs, _, _ = _step(tight, np.zeros(14), t=38)
        vm = np.asarray(new.vm)
        assert vm.min() < 0.95  # Baran & Wu's feeder sags below 0.95 p.u. near peak load
        np.testing.assert_allclose(float(costs[0]), np.sum(np.maximum(0.95 - vm, 0) + np.maximum(vm - 1.05, 0)), rtol=1e-12)


def test_reactive_power_and_curtailment_mappings():
    with jax.enable_x64(True):
        params = make_dist_params(n_days=1)
        q_in = np.zeros(14)
        q_in[10:] = 1.0   # inject vars at every inverter
        q_out = -q_in
        v_in = np.asarray(_step(params, q_in, t=24)[1].vm)
        v_out = np.asarray(_step(params, q_out, t=24)[1].vm)
        assert np.all(v_in[np.array(PV_BUSES) - 1] > v_out[np.array(PV_BUSES) - 1] + 1e-3)
        full = np.zeros(14)
        full[6:10] = 1.0  # curtail everything: no PV output, the curtailed energy is priced
        _, _, reward, _, _, info = _step(params, full, t=24)
        _, _, reward0, _, _, info0 = _step(params, np.zeros(14), t=24)
        assert float(info["pv_mw"]) == 0.0 and float(info["curtailed_mw"]) == pytest.approx(float(info0["pv_mw"]))
        assert float(reward) < float(reward0)


def test_bad_dist_config():
    with pytest.raises(ValueError, match="pv_buses: bus 40 is not a non-substation bus"):
        make_dist_params(pv_buses=(18, 40))
    with pytest.raises(ValueError, match="not radial"):
        make_dist_params("14")
