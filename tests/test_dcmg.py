"""DCMG task: energy balance every step, and the room temperature, workload queue, diesel and
battery dynamics against hand-derived numbers."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from evogrid.envs import DCMicrogridEnv, make_dcmg_params

ENV = DCMicrogridEnv()
DT = 1.0 / 12.0


@pytest.fixture(scope="module")
def params():
    with jax.enable_x64(True):
        yield make_dcmg_params(n_days=2, deadline_steps=2, set_range=(18.0, 30.0))


def _state(params, t=0, temp=22.0, queue=(0.0, 0.0), soc=0.5):
    _, state = ENV.reset(jax.random.key(0), params)
    return state.replace(day=jnp.int32(0), time_step=jnp.int32(t), temp=jnp.asarray(temp, state.temp.dtype),
                         queue=jnp.asarray(queue, state.queue.dtype), soc=jnp.asarray([soc], state.soc.dtype))


def _step(params, state, bat=0.0, diesel=-1.0, setpoint=24.0, defer=0.0):
    a_set = 2 * (setpoint - 18.0) / 12.0 - 1.0
    return ENV.step_env(jax.random.key(0), state, jnp.array([bat, diesel, a_set, defer]), params)


def test_energy_balance_every_step():
    """it + cooling = PV + diesel + battery + grid + deficit - spilled, at every step of a random day."""
    params = make_dcmg_params(n_days=2)

    def body(state, key):
        k_a, k_s = jax.random.split(key)
        action = jax.random.uniform(k_a, (4,), minval=-1, maxval=1)
        _, state, _, costs, _, i = ENV.step(k_s, state, action, params)
        gap = i["it_mw"] + i["cooling_mw"] - (i["pv_mw"] + i["diesel_mw"] + i["battery_mw"] + i["grid_mw"]
                                              + i["deficit_mw"] - i["spilled_mw"])
        return state, (gap, costs, i["grid_mw"])

    _, state = ENV.reset(jax.random.key(0), params)
    _, (gap, costs, grid) = jax.jit(lambda s: jax.lax.scan(body, s, jax.random.split(jax.random.key(1), 288)))(state)
    assert np.abs(np.asarray(gap)).max() < 1e-5
    assert np.all(np.asarray(grid) <= 1.5 + 1e-6) and np.all(np.asarray(costs) >= 0)


def test_cooling_reaches_the_set_point_or_runs_at_capacity(params):
    with jax.enable_x64(True):
        it, t_out = float(params.it_arrival[0, 10]), float(params.t_out[0, 10])
        # from 25 degC to a 22 degC set-point: heat to remove = it + 0.5 MWh/degC * 3 degC / (1/12 h) + leak,
        # within the 2 MW plant? No: 18 MW thermal is needed, so the plant runs flat out at 2 MW
        _, new, _, costs, _, info = _step(params, _state(params, t=10, temp=25.0), setpoint=22.0)
        leak = 0.5 * (t_out - 25.0) / 10.0
        expected = 25.0 + DT * ((it - 2.0) + leak) / 0.5
        np.testing.assert_allclose(float(new.temp), expected, rtol=1e-12)
        np.testing.assert_allclose(float(info["cooling_mw"]), 2.0 / 3.5, rtol=1e-12)
        # a step that can be met: from 24.1 to 24 degC needs it + 0.6 + leak < 2 MW; the room lands on 24
        _, new, _, costs, _, info = _step(params, _state(params, t=10, temp=24.1), setpoint=24.0)
        np.testing.assert_allclose(float(new.temp), 24.0, rtol=1e-12)
        np.testing.assert_allclose(float(info["cooling_mw"]) * 3.5, it + 0.5 * 0.1 / DT + 0.5 * (t_out - 24.1) / 10.0, rtol=1e-12)
        # above the 27 degC limit the temperature channel carries the excess
        _, new, _, costs, _, _ = _step(params, _state(params, t=10, temp=29.0), setpoint=30.0)
        np.testing.assert_allclose(float(costs[1]), float(new.temp) - 27.0, rtol=1e-12)


def test_deferred_work_runs_late_and_counts_as_sla_violation(params):
    """deadline_steps = 2: work deferred at step 0 is due at step 2; unserved, it runs then and is late."""
    with jax.enable_x64(True):
        a0, a1, a2 = (float(params.it_arrival[0, t]) for t in range(3))
        state = _state(params)
        _, s1, _, c0, _, i0 = _step(params, state, defer=1.0)     # defer all of the deferrable 30%
        x = 0.3 * a0
        np.testing.assert_allclose(np.asarray(s1.queue), [0.0, x], rtol=1e-12)
        np.testing.assert_allclose(float(i0["it_mw"]), a0 - x, rtol=1e-12)
        _, s2, _, c1, _, i1 = _step(params, s1)                    # not served: moves to "due next step"
        np.testing.assert_allclose(np.asarray(s2.queue), [x, 0.0], rtol=1e-12)
        assert float(c1[0]) == 0.0
        _, s3, _, c2, _, i2 = _step(params, s2)                    # due now, unserved: runs late
        np.testing.assert_allclose([float(c2[0]), float(i2["it_mw"])], [x, a2 + x], rtol=1e-12)
        # serving half of a two-bucket queue takes the earliest deadline first
        _, s, _, c, _, i = _step(params, _state(params, queue=(0.2, 0.4)), defer=-0.5)
        np.testing.assert_allclose(np.asarray(s.queue), [0.3, 0.0], rtol=1e-12)  # 0.2 + 0.1 served, 0.3 left
        np.testing.assert_allclose(float(i["it_mw"]), a0 + 0.3, rtol=1e-12)
        # deadlines stop at the day's last step T - 1: deferred at T - 2 it is due next step; at T - 1 nothing waits
        T = params.max_steps
        b, c = float(params.it_arrival[0, T - 2]), float(params.it_arrival[0, T - 1])
        _, s, _, _, _, _ = _step(params, _state(params, t=T - 2), defer=1.0)
        np.testing.assert_allclose(np.asarray(s.queue), [0.3 * b, 0.0], rtol=1e-12)
        _, s, _, cost, _, i = _step(params, s, defer=1.0)
        np.testing.assert_allclose(np.asarray(s.queue), [0.0, 0.0], atol=1e-12)
        np.testing.assert_allclose([float(cost[0]), float(i["it_mw"])], [0.3 * b, c + 0.3 * b], rtol=1e-12)


def test_diesel_minimum_load_fuel_and_battery(params):
    with jax.enable_x64(True):
        # 0.2 MW asked of a 1 MW unit with a 30% minimum load: it stays off, no fuel
        _, _, _, _, _, info = _step(params, _state(params), diesel=-0.6)
        assert float(info["diesel_mw"]) == 0.0 and float(info["fuel_l"]) == 0.0
        # 0.5 MW: fuel = (80 l/h x 1 MW + 230 l/MWh x 0.5 MW) x 1/12 h = 16.25 l, CO2 2.68 kg/l
        _, new, reward, _, _, info = _step(params, _state(params), diesel=0.0, bat=-1.0)
        np.testing.assert_allclose([float(info["diesel_mw"]), float(info["fuel_l"])], [0.5, 16.25], rtol=1e-12)
        # battery charging 0.5 MW for 5 minutes: SOC + 0.95 x 0.5 / 12 / 1 MWh
        np.testing.assert_allclose(float(new.soc[0]), 0.5 + 0.95 * 0.5 / 12.0, rtol=1e-12)
        price = float(params.price[0, 0])
        co2 = 16.25 * 2.68e-3 + float(info["grid_mw"]) * DT * 0.4
        dollars = float(info["grid_mw"]) * DT * price + 16.25 * 1.2 + co2 * 50.0
        np.testing.assert_allclose(float(reward), -0.01 * dollars, rtol=1e-12)


def test_backup_covers_what_the_grid_cannot(params):
    """A step whose load exceeds a 1 MW grid cap (a hot room cooled hard at night, no PV): without the backup
    the excess is a deficit; with it the battery discharges the excess on top of the policy's request (0.1 MW),
    and where the battery cannot (empty) the diesel starts, covering the excess (and at least its 0.3 MW minimum
    load: what it gives beyond the excess comes off the grid's import)."""
    with jax.enable_x64(True):
        params = params.replace(grid_cap=jnp.asarray(1.0, params.grid_cap.dtype))
        state = _state(params, t=0, temp=26.0)
        off = params.replace(backup=False)
        _, _, _, costs, _, i = _step(off, state, bat=0.2, setpoint=18.0)
        load = float(i["it_mw"] + i["cooling_mw"])
        excess = load - 0.1 - 1.0   # the battery's 0.1 MW asked for, no PV at midnight
        assert excess > 0.05 and float(params.pv_avail[0, 0]) == 0.0
        np.testing.assert_allclose(float(costs[2]), excess, rtol=1e-12)
        _, _, _, costs, _, i = _step(params, state, bat=0.2, setpoint=18.0)
        assert float(costs[2]) == 0.0 and float(i["diesel_mw"]) == 0.0
        np.testing.assert_allclose([float(i["battery_mw"]), float(i["grid_mw"])], [0.1 + excess, 1.0], rtol=1e-12)
        _, _, _, costs, _, i = _step(params, _state(params, t=0, temp=26.0, soc=0.1), bat=0.2, setpoint=18.0)
        assert float(costs[2]) == 0.0 and float(i["battery_mw"]) == 0.0
        diesel = max(load - 1.0, 0.3)   # what the grid cannot carry, at least the unit's minimum load
        np.testing.assert_allclose([float(i["diesel_mw"]), float(i["grid_mw"])], [diesel, load - diesel], rtol=1e-12)
        assert float(i["fuel_l"]) > 0


def test_float32_days_match_float64():
    """Random days played in float32 and in float64 (the same actions) reach the same returns to 1e-5: the
    backup starts the diesel only for what the battery cannot take, not for the rounding residual of a
    recomputed balance (which had float32 days 0.6% off float64's, and a TPU's 0.2% off the CPU's)."""
    actions = np.asarray(jax.random.uniform(jax.random.key(7), (8, 288, 4), jnp.float32, -1.0, 1.0))

    def returns(dtype):
        params = make_dcmg_params(n_days=2)
        params = jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, params)

        def day(acts):
            def body(state, action):
                _, state, reward, _, _, _ = ENV.step_env(jax.random.key(0), state, action, params)
                return state, reward
            return jnp.sum(jax.lax.scan(body, ENV.reset_to_day(0, params)[1], acts.astype(dtype))[1])

        return np.asarray(jax.jit(jax.vmap(day))(actions), np.float64)

    single = returns(jnp.float32)
    with jax.enable_x64(True):
        double = returns(jnp.float64)
    np.testing.assert_allclose(single, double, rtol=1e-5)


def test_bad_dcmg_config():
    with pytest.raises(ValueError, match="deferrable"):
        make_dcmg_params(deferrable=1.5)
    with pytest.raises(ValueError, match="set_range"):
        make_dcmg_params(set_range=(30.0, 20.0))
