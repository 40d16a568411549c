"""Environment contract (PowerZooJax) and TSO physics inside the env."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import ppc_of, pypower_opts

from evogrid.case import load_case
from evogrid.case.matpower import PD, PG, PMAX, PMIN, QD, QG, VA, VG, VM
from evogrid.envs import TransGridEnv, list_tasks, make, make_trans_params
from evogrid.envs.trans import (
    asked_dispatch,
    dispatch_action,
    follow_load,
    ramp_window,
    setpoint_output,
    setpoint_output_action,
    setpoints_in_band,
    voltage_action,
)
from evogrid.utils.jax_utils import batch_reset, batch_step, reset_key, scan_rollout, split_key_for_envs
from evogrid.utils.jaxprs import equations

CONTRACT_TASKS = ["tso-case5", "tso-case14-ac", "tso-case14-n1", "dso-case33bw", "ders-case141", "dcmg", "gencos-case5",
                  "tso-case14-real", "dcmg-real"]
HORIZON = 3  # short episodes so a rollout crosses episode boundaries


@pytest.fixture(scope="module", params=CONTRACT_TASKS)
def task(request):
    days = {"split": "test"} if request.param.endswith("-real") else {"n_days": 4}   # real: the 28 test days
    env, params = make(request.param, max_steps=HORIZON, **days)
    n_act = env.action_space(params).shape[0]
    rollout = jax.jit(jax.vmap(lambda k, s, a: scan_rollout(env, k, s, params, a)))
    return request.param, env, params, n_act, rollout, jax.jit(env.step), jax.jit(env.reset)


def _actions(key, n, t, n_act):
    return jax.random.uniform(key, (n, t, n_act), minval=-1.0, maxval=1.0)


@pytest.mark.slow
def test_auto_reset_inside_step(task):
    _, env, params, n_act, _, step, reset = task
    key = jax.random.key(0)
    obs, state = env.reset(key, params)
    assert state.time_step.dtype == jnp.int32 and int(state.time_step) == 0
    for t in range(HORIZON):
        step_key = jax.random.fold_in(key, t)
        obs, state, reward, costs, done, info = step(step_key, state, jnp.zeros(n_act), params)
        assert bool(done) == (t == HORIZON - 1)
    # done is reported, and the state is already the fresh episode's, reset with the step key's reset_key
    assert int(state.time_step) == 0
    obs_reset, state_reset = reset(reset_key(step_key), params)
    for a, b in zip(jax.tree_util.tree_leaves(state), jax.tree_util.tree_leaves(state_reset)):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(obs, obs_reset)
    assert costs.shape == (len(env.constraint_names(params)),) and np.all(np.asarray(costs) >= 0)
    units = env.units(params)  # a unit for the return and every channel, for eval and plots
    assert "return" in units and set(env.constraint_names(params)) <= set(units) and " per day" in units["return"]


@pytest.mark.slow
def test_step_auto_reset_stops_gradients(task):
    _, env, params, n_act, _, step, reset = task
    obs, state = env.reset(jax.random.key(1), params)
    key = jax.random.key(2)

    def through(step_fn, action):
        obs, new_state, reward, *_ = step_fn(key, state, action, params)
        return jnp.sum(obs) + sum(jnp.sum(x) for x in jax.tree_util.tree_leaves(new_state) if jnp.issubdtype(x.dtype, jnp.floating))

    if hasattr(state, "pg"):  # TSO: ask every unit for its previous output, so no ramp limit binds
        action = dispatch_action(params, state.pg, state.pg)
        if params.voltage_control:   # AC: and every voltage-controlled bus for the case's set-point
            action = jnp.concatenate([action, voltage_action(params, params.v_set)])
    else:
        action = jnp.full((n_act,), 0.1)
    g_plain = jax.jit(jax.grad(lambda a: through(env.step, a)))(action)
    g_stopped = jax.jit(jax.grad(lambda a: through(env.step_auto_reset, a)))(action)
    assert np.any(np.asarray(g_plain) != 0)
    np.testing.assert_array_equal(g_stopped, 0.0)


@pytest.mark.slow
def test_vmap_scan_across_episode_boundaries(task):
    _, env, params, n_act, rollout, _, _ = task
    n, t = 4, 2 * HORIZON + 1
    keys = split_key_for_envs(jax.random.key(3), n)
    obs0, states0 = batch_reset(env, keys, params)
    acts = _actions(jax.random.key(4), n, t, n_act)
    final, obs, rew, costs, dones, infos = rollout(split_key_for_envs(jax.random.key(5), n), states0, acts)
    n_obs = env.observation_space(params).shape[0]
    assert obs.shape == (n, t, n_obs) and rew.shape == (n, t) and dones.shape == (n, t)
    assert costs.shape == (n, t, env.num_constraints(params))
    assert all(v.shape[:2] == (n, t) for v in jax.tree_util.tree_leaves(infos))  # fixed structure (market info holds vectors)
    expected_done = (np.arange(t) % HORIZON) == HORIZON - 1
    np.testing.assert_array_equal(np.asarray(dones), np.broadcast_to(expected_done, (n, t)))
    np.testing.assert_array_equal(np.asarray(final.time_step), t % HORIZON)
    assert np.all(np.isfinite(np.asarray(rew)))


@pytest.mark.slow
def test_no_recompilation_and_determinism(task):
    name, env, params, n_act, *_ = task
    traces = []

    @jax.jit
    def run(key, params):
        traces.append(1)
        keys = jax.random.split(key, 3)
        _, states = batch_reset(env, keys, params)
        acts = jnp.zeros((3, n_act))
        return batch_step(env, keys, states, acts, params)

    out1 = run(jax.random.key(7), params)
    out2 = run(jax.random.key(8), params)
    # a swept value (a params leaf) changes the numbers, not the program
    out3 = run(jax.random.key(7), params.replace(reward_scale=params.reward_scale * 2))
    assert len(traces) == 1
    out1b = run(jax.random.key(7), params)
    for a, b in zip(jax.tree_util.tree_leaves(out1), jax.tree_util.tree_leaves(out1b)):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(out3[2], 2 * out1[2], rtol=1e-6)
    assert len(traces) == 1 and out2[2].shape == (3,)


def test_bad_actions(task):
    _, env, params, n_act, _, step, reset = task
    obs, state = env.reset(jax.random.key(0), params)
    with pytest.raises(ValueError, match=rf"action has shape \({n_act + 1},\), expected \({n_act},\)"):
        env.step(jax.random.key(1), state, jnp.zeros(n_act + 1), params)
    with pytest.raises(ValueError, match="expected"):
        jax.jit(lambda a: env.step(jax.random.key(1), state, a, params))(jnp.zeros((2, n_act)))
    bad = jnp.zeros(n_act).at[0].set(jnp.nan).at[-1].set(jnp.inf)
    out_bad = step(jax.random.key(1), state, bad, params)
    out_zero = step(jax.random.key(1), state, jnp.zeros(n_act), params)
    assert int(out_bad[5]["nonfinite_actions"]) == 2 and int(out_zero[5]["nonfinite_actions"]) == 0
    np.testing.assert_array_equal(out_bad[2], out_zero[2])  # NaN/inf act as 0 (mid-range)
    assert np.all(np.isfinite(np.asarray(out_bad[0])))


def _matrix_products(jaxpr, names=("dot_general",)):
    """Every dot_general (or primitive of `names`) of a (closed) jaxpr, in its sub-jaxprs (loops, branches,
    calls) too."""
    return (eqn for eqn in equations(jaxpr) if eqn.primitive.name in names)


def test_ac_step_factorises_nothing_and_loops_a_fixed_count():
    """The AC tasks' default step (reactive limits enforced, `physics.chord_q_limits`) traces no factorisation
    or solve (a TPU runs a batched LU per env worst: 6,300 env-steps/s on tso-case14-ac with full Newton)
    and no data-dependent loop, only fixed-count ones; full Newton, still the reference, has both. The
    fixed-count loops gather and scatter nothing (a TPU runs a scatter at bus indices as a loop over them:
    with the updates at the pq and pvpq indices, 8 of the 12 largest ops of tso-case118-ac's step)."""
    factorisations, loops = ("lu", "triangular_solve", "custom_linear_solve", "cholesky"), ("while",)
    for method in (None, "newton"):
        env, params = make("tso-case14-ac", ac_method=method)
        obs, state = env.reset(jax.random.key(0), params)
        step = jax.make_jaxpr(lambda s, a: env.step(jax.random.key(1), s, a, params))(state, jnp.zeros(env.action_space(params).shape))
        found = {eqn.primitive.name for eqn in _matrix_products(step, factorisations + loops)}
        assert (found == set()) if method is None else {"lu", "while"} <= found, (method, found)
        if method is None:
            scans = list(_matrix_products(step, ("scan",)))
            picks = {eqn.primitive.name for scan in scans for eqn in equations(scan.params["jaxpr"])}
            assert scans and not picks & {"gather", "scatter", "scatter-add"}, picks


@pytest.mark.slow
def test_random_set_points_leave_few_ac_steps_unsolved():
    """tso-case118-ac under random actions (64 envs x 48 steps, seeded): random voltage set-points push many units
    to their reactive limits. The chord method's minimal-residual steps alone stalled there (the switched units'
    Q off their limits with the network's equations solved) and left 525 of the 3,072 steps unsolved; with GMRES
    on the switched block 279 (8 steps an iteration) or 301 (6, `Q_SWEEPS`; full Newton: 141)."""
    from evogrid.rollout import make_random_rollout

    env, params = make("tso-case118-ac")
    info = make_random_rollout(env, params, 64, 48)(jax.random.key(0))[3]
    unsolved = int(np.sum(np.asarray(info["converged"]) < 0.5))
    assert unsolved < 400, unsolved


def test_physics_runs_at_full_float32_precision(task, monkeypatch):
    """Every matrix product of a reset and a step (the safety layer's too, where the task has one) asks for
    HIGHEST precision: a GPU's TF32 default would leave the power flows short of their tolerance. The
    policy's products, outside the env, keep the default. One exception, by design: the AC chord method's
    corrections (`physics.ac.CORRECTION_PRECISION`, the matrix unit's one bfloat16 pass; its residual stays
    at full precision): the AC step has such products, and none is left once they too ask for HIGHEST."""
    from evogrid.physics import ac
    from evogrid.safety import shield

    name, env, params, n_act, *_ = task
    envs = [env] + ([shield(env, params)] if name in ("tso-case5", "tso-case14-ac", "dso-case33bw") else [])

    def loose_products(e):
        obs, state = e.reset(jax.random.key(0), params)
        programs = [jax.make_jaxpr(lambda k: e.reset(k, params))(jax.random.key(0)),
                    jax.make_jaxpr(lambda s, a: e.step(jax.random.key(1), s, a, params))(state, jnp.zeros(n_act))]
        products = [eqn for p in programs for eqn in _matrix_products(p)]
        assert products or name.startswith("dcmg"), name   # dcmg has no network
        return obs, [eqn for eqn in products if eqn.params["precision"] != (jax.lax.Precision.HIGHEST,) * 2]

    chord = getattr(params, "ac_chord", None) is not None and getattr(params, "q_min", None) is not None
    for e in envs:
        obs, loose = loose_products(e)
        assert bool(loose) == chord, (name, type(e).__name__, len(loose))
    monkeypatch.setattr(ac, "CORRECTION_PRECISION", jax.lax.Precision.HIGHEST)
    for e in envs:
        obs, loose = loose_products(e)
        assert not loose, (name, type(e).__name__, len(loose))
    policy = jax.make_jaxpr(lambda x, w: jnp.tanh(x @ w))(obs, jnp.ones((obs.shape[0], 2)))
    assert all(eqn.params["precision"] is None for eqn in _matrix_products(policy))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tso-case9", "tso-case30", "tso-case57", "tso-case118"])
def test_every_transmission_case_steps_under_jit(name):
    env, params = make(name, max_steps=4, n_days=2)
    obs, state = env.reset(jax.random.key(0), params)
    out = jax.jit(env.step)(jax.random.key(1), state, jnp.zeros(env.action_space(params).shape), params)
    assert out[0].shape == env.observation_space(params).shape and np.isfinite(float(out[2]))


@pytest.mark.parametrize("name", ["tso-case57", "tso-case118", "tso-case1354pegase"])
def test_every_day_starts_within_the_line_ratings(name):
    """The start-of-day dispatch is the cheapest within the ratings: the economic dispatch where it meets them
    (tso-case118's every day), else the first interval's DC-OPF (tso-case57's derived ratings, which its
    economic dispatch broke by up to 17 MW on every day; pglib-opf's real ratings on tso-case1354pegase)."""
    env, params = make(name, n_days=8)
    g = lambda x: np.asarray(x, np.float64)  # noqa: E731
    inj = g(params.init.pg) @ g(params.gen_incidence) - g(params.load_p)[:, 0]      # [days, n_bus]
    flows = inj @ g(params.dc.ptdf).T + g(params.dc.flow0)
    assert np.all(np.abs(flows) <= g(params.rate) * (1 + 1e-5) + 1e-3), np.max(np.abs(flows) - g(params.rate))
    np.testing.assert_allclose(g(params.init.pg).sum(1), g(params.load_p)[:, 0].sum(1) + g(params.dc.gs_total), rtol=1e-5)


def test_registry():
    assert {"tso-case5", "tso-case14", "tso-case118-ac", "tso-case118-n1", "dso-case33bw"} <= set(list_tasks())
    assert "n1_thermal" in make("tso-case14-n1", n_days=2)[0].constraint_names(make("tso-case14-n1", n_days=2)[1])
    with pytest.raises(ValueError, match="unknown task 'dso-case33bw-n1'"):
        make("dso-case33bw-n1")
    with pytest.raises(ValueError, match=r"unknown task 'tso-case7'.*tso-case14"):
        make("tso-case7")
    with pytest.raises(ValueError, match="unknown task 'dso-case14'"):
        make("dso-case14")


def _one_step(params, action, day=0):
    env = TransGridEnv()
    state = jax.tree_util.tree_map(lambda x: x[day], params.init)
    return state, env.step_env(jax.random.key(0), state, action, params)


def test_dc_dispatch_balance_ramp_and_costs():
    """Case5 in DC: action mapping, ramp clipping, load following (AGC) and the cost channels by hand."""
    with jax.enable_x64(True):
        case = load_case("5")
        params = make_trans_params(case, max_steps=4, n_days=2, default_ramp_per_hour=0.5)
        action = jnp.array([1.0, -1.0, 0.0, 1.0, 0.3])
        state, (obs, new, reward, costs, done, info) = _one_step(params, action)
        load = np.asarray(params.load_p[0, 0])
        pg = np.asarray(new.pg)
        # lossless DC: generation equals load (case5 has no shunts)
        np.testing.assert_allclose(pg.sum(), load.sum(), rtol=1e-12)
        # set-points: [-1, 1] onto the ramp window, [Pmin, Pmax] within a ramp (0.5 * Pmax/h * 0.5 h) of the last output
        prev, pmin, pmax = np.asarray(state.pg), case.gen[:, PMIN], case.gen[:, PMAX]
        lo, hi = np.maximum(pmin, prev - 0.25 * pmax), np.minimum(pmax, prev + 0.25 * pmax)
        setpoint = lo + 0.5 * (np.asarray(action) + 1.0) * (hi - lo)
        # the load the set-points miss is shared in proportion to each unit's room in the needed direction
        miss = load.sum() - setpoint.sum()
        room = hi - setpoint if miss > 0 else setpoint - lo
        assert abs(miss) > 1.0 and abs(miss) < room.sum()  # the case this test is about: AGC covers it all
        np.testing.assert_allclose(pg, setpoint + miss * room / room.sum(), rtol=1e-12, atol=1e-9)
        slack = int(np.argmax(np.asarray(params.slack)))
        assert case.gen_bus[slack] == case.ref_bus
        # cost: linear gencost c1 * P for every unit at its actual output (the slack too, whatever its sign), over 0.5 h, x 1e-3
        c1 = case.gencost[:, 4]
        paid = pg
        np.testing.assert_allclose(float(info["gen_cost"]), np.sum(c1 * paid) * 0.5, rtol=1e-12)
        np.testing.assert_allclose(float(reward), -np.sum(c1 * paid) * 0.5 * 1e-3, rtol=1e-12)
        flow = np.asarray(new.flow)
        over = np.maximum(np.abs(flow) - case.rate_a, 0.0).sum() / 100.0
        np.testing.assert_allclose(float(costs[0]), over, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(float(info["peak_loading"]), np.max(np.abs(flow) / case.rate_a), rtol=1e-12)
        ps = pg[slack]
        np.testing.assert_allclose(float(costs[1]), max(ps - 200.0, 0) / 100 + max(-ps, 0) / 100, atol=1e-12)
        ramp_s = 0.25 * 200.0
        np.testing.assert_allclose(float(costs[2]), max(abs(ps - prev[slack]) - ramp_s, 0) / 100, atol=1e-12)


def test_load_following_leaves_the_rest_to_the_slack():
    """When the units' room cannot cover the load the set-points miss, every unit goes to its limit and the
    slack takes the remainder, beyond its ramp (the `ramp` channel); set-points that meet the load stay."""
    with jax.enable_x64(True):
        params = make_trans_params("5", max_steps=4, n_days=1, default_ramp_per_hour=0.1)
        state = jax.tree_util.tree_map(lambda x: x[0], params.init)
        state = state.replace(pg=0.6 * state.pg)  # far below the load: more than every unit's ramp can make up
        new, costs = TransGridEnv().step_env(jax.random.key(0), state, -jnp.ones(5), params)[1:4:2]
        prev, ramp = np.asarray(state.pg), np.asarray(params.ramp)
        slack = int(np.argmax(np.asarray(params.slack)))
        others = np.arange(5) != slack
        np.testing.assert_allclose(np.asarray(new.pg)[others], (prev + ramp)[others], rtol=1e-12)
        beyond = abs(float(new.pg[slack]) - prev[slack]) - ramp[slack]
        assert beyond > 1.0
        np.testing.assert_allclose(float(costs[2]), beyond / 100.0, rtol=1e-9)
        # a balanced dispatch within every limit is taken as it is
        start = np.asarray(params.init.pg[0])
        pg = start * float(np.sum(params.load_p[0, 0])) / start.sum()
        _, (_, kept, _, _, _, _) = _one_step(params, dispatch_action(params, jnp.asarray(pg), jnp.asarray(start)))
        np.testing.assert_allclose(np.asarray(kept.pg), pg, rtol=1e-12)


@pytest.mark.parametrize("task", ["tso-case5", "tso-case14-ac"])
def test_setpoint_output_asks_for_the_set_point_from_the_observed_output(task):
    """policy_output="setpoint": outputs on [Pmin, Pmax] asked for from the last output the observation shows,
    clipped to the ramp window; voltage set-points pass as they are; `setpoint_output` gives back the output
    of any action."""
    with jax.enable_x64(True):
        env, params = make(task, max_steps=4, n_days=1)
        n_act, n = env.action_space(params).shape[0], params.pmax.shape[0]
        obs, state = env.reset_to_day(0, params)
        obs, state = env.step_env(jax.random.key(0), state, jnp.linspace(-0.9, 0.7, n_act), params)[:2]  # off the start
        out = jax.random.uniform(jax.random.key(1), (64, n_act), minval=-1.0, maxval=1.0)
        action = setpoint_output_action(out, obs, params)
        lo, hi = ramp_window(state.pg, params)
        wanted = params.pmin + 0.5 * (out[:, :n] + 1.0) * (params.pmax - params.pmin)
        np.testing.assert_allclose(asked_dispatch(action[:, :n], state.pg, params)[0], jnp.clip(wanted, lo, hi),
                                   rtol=1e-12, atol=1e-9)
        np.testing.assert_array_equal(action[:, n:], out[:, n:])
        assert np.mean(np.abs(action[:, :n]) == 1.0) > 0.3   # the case the clipping is about: far set-points
        actions = jax.random.uniform(jax.random.key(2), (64, n_act), minval=-1.0, maxval=1.0)
        np.testing.assert_allclose(setpoint_output_action(setpoint_output(actions, obs, params), obs, params), actions,
                                   rtol=1e-9, atol=1e-9)


def test_thermal_cost_is_positive_when_a_line_overloads():
    """Case5 at 1.2 x its own loads (1200 MW): the units at buses 3 and 5 at full output (1120 MW) push more
    than the 240 MW line 4-5 carries; the other three share the remaining 80 MW: the env applies the
    set-points as asked (the security redispatch is a safety layer, tests/test_safety.py)."""
    with jax.enable_x64(True):
        load = np.broadcast_to(1.2 * load_case("5").bus[:, PD], (1, 4, 5))
        params = make_trans_params("5", max_steps=4, n_days=1, default_ramp_per_hour=100.0, load_p=load)
        _, (_, new, _, costs, _, _) = _one_step(params, jnp.array([-1.0, -1.0, 1.0, -1.0, 1.0]))
        flow = np.abs(np.asarray(new.flow))
        assert flow[5] > 240.0 and flow[0] < 400.0  # only line 4-5 (rated 240 MW) is over its rating
        np.testing.assert_allclose(float(costs[0]), (flow[5] - 240.0) / 100.0, rtol=1e-12)


def _ppc_at_setpoints(case, params, vset):
    """The case as PYPOWER's input with every unit's voltage set-point (VG) at `vset` [n_vbus] of its bus."""
    ppc = ppc_of(case)
    vbus = list(np.argmax(np.asarray(params.vbus_incidence), axis=1))
    ppc["gen"][:, VG] = np.asarray(vset)[[vbus.index(b) for b in case.gen_bus]]
    return ppc


@pytest.mark.slow
@pytest.mark.parametrize("method, iters", [("chord", 25), ("newton", 6)])
def test_ac_mode_matches_pypower_for_the_env_dispatch(method, iters):
    """The AC env's solved state equals PYPOWER's runpf for the same dispatch, voltage set-points (the
    policy's, mapped onto each bus's band) and loads, with both solvers; `info` reports the set-points."""
    from pypower.api import runpf

    with jax.enable_x64(True):
        case = load_case("14")
        params = make_trans_params(case, max_steps=4, n_days=2, ac=True, ac_method=method, ac_iters=iters)
        action = jnp.array([0.0, 0.5, -0.5, 0.2, 0.9, 0.3, -0.2, 0.6, 0.1, -0.4])
        _, (_, new, _, costs, _, info) = _one_step(params, action, day=1)
        assert float(info["converged"]) == 1.0 and float(costs[-1]) == 0.0
        vset = np.asarray(info["voltage_setpoints"])
        np.testing.assert_allclose(vset, 0.94 + 0.5 * (np.asarray(action[5:]) + 1.0) * 0.12, atol=1e-12)
        ppc = _ppc_at_setpoints(case, params, vset)
        ppc["bus"][:, PD] = np.asarray(params.load_p[1, 0])
        ppc["bus"][:, QD] = np.asarray(params.load_q[1, 0])
        ppc["gen"][:, PG] = np.asarray(new.pg)
        ref, ok = runpf(ppc, pypower_opts())
        assert ok
        np.testing.assert_allclose(np.asarray(new.vm), ref["bus"][:, VM], atol=1e-6)
        np.testing.assert_allclose(np.rad2deg(np.asarray(new.va)), ref["bus"][:, VA], atol=1e-5)
        # the slack unit's output is PYPOWER's, losses included
        np.testing.assert_allclose(np.asarray(new.pg), ref["gen"][:, PG], atol=1e-5)
        np.testing.assert_allclose(float(info["losses_mw"]), ref["gen"][:, PG].sum() - ref["bus"][:, PD].sum(), atol=1e-5)
        # each voltage-controlled bus's reactive output (MVAr; the observation's p.u.) is PYPOWER's
        q_ref = np.zeros(case.n_bus)
        np.add.at(q_ref, case.gen_bus, ref["gen"][:, QG])
        vbus = np.flatnonzero(np.asarray(params.vbus_incidence).sum(0))
        np.testing.assert_allclose(np.asarray(new.qg), q_ref[vbus], atol=1e-5)
        np.testing.assert_allclose(np.asarray(TransGridEnv()._obs(new, params))[-vbus.size:], q_ref[vbus] / case.base_mva, atol=1e-7)


@pytest.mark.slow
def test_ac_env_with_q_limits_matches_pandapower():
    """enforce_q_limits=True on case14 with loads at 1.6x (three units reach their limits): the env's step (the
    default chord solver, `physics.chord_q_limits`) solves as pandapower's runpp(enforce_q_lims=True) does for
    the same dispatch and loads (1e-6 p.u., 1e-5 degrees) and as the full Newton reference does (1e-8), and
    the limits change the answer (the plain AC env's voltages differ)."""
    import pandapower as pp
    import pandapower.networks as pn

    with jax.enable_x64(True):
        case = load_case("14")
        load_p = np.broadcast_to(1.6 * case.bus[:, PD], (1, 2, case.n_bus))
        load_q = np.broadcast_to(1.6 * case.bus[:, QD], (1, 2, case.n_bus))
        action = jnp.array([0.0, 0.8, 0.5, 0.2, 0.9])
        params = make_trans_params(case, max_steps=2, ac=True, enforce_q_limits=True, load_p=load_p, load_q=load_q,
                                   voltage_control=False)
        _, (_, new, _, _, _, info) = _one_step(params, action)
        plain = make_trans_params(case, max_steps=2, ac=True, ac_method="newton", load_p=load_p, load_q=load_q,
                                  voltage_control=False)
        _, (_, new_plain, *_) = _one_step(plain, action)
        newton = make_trans_params(case, max_steps=2, ac=True, ac_method="newton", enforce_q_limits=True, load_p=load_p,
                                   load_q=load_q, voltage_control=False)
        _, (_, new_newton, _, _, _, info_newton) = _one_step(newton, action)
    assert float(info["converged"]) == 1.0 == float(info_newton["converged"])
    net = pn.case14()  # its buses, loads and units in the MATPOWER file's order (0-based)
    net.load.p_mw, net.load.q_mvar = load_p[0, 0][net.load.bus.values], load_q[0, 0][net.load.bus.values]
    unit_of_bus = {int(b): i for i, b in enumerate(case.gen_bus)}
    net.gen.p_mw = np.asarray(new.pg)[[unit_of_bus[int(b)] for b in net.gen.bus.values]]
    net.gen.vm_pu = setpoints_in_band(case).gen[[unit_of_bus[int(b)] for b in net.gen.bus.values], VG]
    pp.runpp(net, tolerance_mva=1e-9, init="flat", numba=False, enforce_q_lims=True)
    np.testing.assert_allclose(np.asarray(new.vm), net.res_bus.vm_pu.values, atol=1e-6)
    np.testing.assert_allclose(np.rad2deg(np.asarray(new.va)), net.res_bus.va_degree.values, atol=1e-5)
    assert np.max(np.abs(np.asarray(new.vm) - np.asarray(new_plain.vm))) > 1e-3
    for x, y in ((new.vm, new_newton.vm), (new.va, new_newton.va), (new.pg, new_newton.pg)):   # the reference solver's
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-8)
    with pytest.raises(ValueError, match="enforce_q_limits needs the AC model"):
        make_trans_params(case, max_steps=2, enforce_q_limits=True)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["14", "57", "118"])
def test_ac_env_converges_wherever_pypower_does_on_random_actions(name):
    """AC mode (chord, float64) with random active and voltage set-points (12 steps): every step PYPOWER
    solves at the applied set-points is reported converged, at PYPOWER's state to 1e-6 p.u. / 1e-5 degrees."""
    from pypower.api import runpf

    with jax.enable_x64(True):
        case = load_case(name)
        params = make_trans_params(case, max_steps=12, n_days=1, ac=True)
        env, step = TransGridEnv(), jax.jit(TransGridEnv().step_env)
        state = jax.tree_util.tree_map(lambda x: x[0], params.init)
        n_act = env.action_space(params).shape[0]
        actions = jax.random.uniform(jax.random.key(int(name)), (12, n_act), minval=-1, maxval=1)
        for t in range(12):
            _, state, _, costs, _, info = step(jax.random.key(t), state, actions[t], params)
            ppc = _ppc_at_setpoints(setpoints_in_band(case), params, info["voltage_setpoints"])
            ppc["bus"][:, PD], ppc["bus"][:, QD] = np.asarray(params.load_p[0, t]), np.asarray(params.load_q[0, t])
            ppc["gen"][:, PG] = np.asarray(state.pg)
            ref, ok = runpf(ppc, pypower_opts())
            assert bool(ok) == (float(info["converged"]) == 1.0) == (float(costs[-1]) == 0.0), (t, ok)
            np.testing.assert_allclose(np.asarray(state.vm), ref["bus"][:, VM], atol=1e-6)
            np.testing.assert_allclose(np.rad2deg(np.asarray(state.va)), ref["bus"][:, VA], atol=1e-5)
        del env


@pytest.mark.slow
@pytest.mark.parametrize("task", ["tso-case14-ac", "dso-case33bw"])
def test_a_step_without_power_flow_solution_leaves_later_outputs_finite(task):
    """One day with ten times the load at step 2 has no AC solution: that step is flagged, and it and every
    later step return finite rewards, costs and observations (before: NaN from then on)."""
    env, params = make(task, max_steps=6, n_days=1)
    load = np.asarray(params.load_p).copy()
    load[:, 2] *= 10.0
    if task.startswith("tso"):
        params = make_trans_params("14", max_steps=6, n_days=1, ac=True, load_p=load, load_q=np.asarray(params.load_q) * np.where(np.arange(6)[:, None] == 2, 10.0, 1.0))
    else:
        params = params.replace(load_p=jnp.asarray(load, params.load_p.dtype), load_q=params.load_q.at[:, 2].multiply(10.0))
    obs, state = env.reset(jax.random.key(0), params)
    out = jax.jit(lambda s, a: scan_rollout(env, jax.random.key(1), s, params, a))(state, jnp.zeros((6, env.action_space(params).shape[0])))
    _, obs_t, rew, costs, done, info = out
    diverged = np.asarray(costs[:, env.constraint_names(params).index("ac_diverged")])
    assert diverged[2] == 1.0 and diverged[[0, 1, 3, 4, 5]].sum() == 0.0
    for x in (obs_t, rew, costs):
        assert np.all(np.isfinite(np.asarray(x)))


def test_load_profiles_are_seeded_double_peak():
    p1 = make_trans_params("14", n_days=3, seed=1)
    p2 = make_trans_params("14", n_days=3, seed=1)
    p3 = make_trans_params("14", n_days=3, seed=2)
    np.testing.assert_array_equal(p1.load_p, p2.load_p)
    assert not np.array_equal(p1.load_p, p3.load_p)
    total = np.asarray(p1.load_p).sum(-1).mean(0)  # [48] half-hours
    hours = (np.arange(48) + 0.5) / 2
    morning, evening = total[(hours > 6) & (hours < 12)].max(), total[(hours > 16) & (hours < 22)].max()
    assert total[(hours > 12) & (hours < 15)].min() < min(morning, evening)  # a midday dip between peaks
    assert total[hours < 5].max() < 0.75 * evening  # night trough
    assert np.asarray(p1.load_p).max() <= load_case("14").bus[:, PD].max() * 1.2


def test_bad_params():
    with pytest.raises(ValueError, match=r"load_p and load_q must have shape \[n_days, 48, 14\]"):
        make_trans_params("14", load_p=np.ones((2, 10, 14)))
    with pytest.raises(ValueError, match="max_steps must be an integer >= 1"):
        make_trans_params("14", max_steps=0)
    with pytest.raises(ValueError, match="ac_method must be 'chord' or 'newton'"):
        make_trans_params("14", ac=True, ac_method="gauss")


@pytest.mark.slow
def test_scan_rollout_equals_python_loop_of_step_auto_reset(task):
    """scan_rollout hoists each step's key split out of the loop: same keys, so the same resets (days)
    and done flags; floats agree to round-off (two compiled programs may fuse sums differently)."""
    _, env, params, n_act, _, step, reset = task
    key = jax.random.key(11)
    obs, state = reset(jax.random.key(12), params)
    actions = jax.random.uniform(jax.random.key(13), (2 * HORIZON, n_act), minval=-1, maxval=1)
    final, obs_traj, rew_traj, cost_traj, done_traj, _ = jax.jit(lambda k, s, a: scan_rollout(env, k, s, params, a))(key, state, actions)
    auto_reset = jax.jit(env.step_auto_reset)
    for t, k in enumerate(jax.random.split(key, actions.shape[0])):
        obs, state, reward, costs, done, _ = auto_reset(k, state, actions[t], params)
        np.testing.assert_allclose(obs, obs_traj[t], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(reward, rew_traj[t], rtol=1e-6)
        np.testing.assert_allclose(costs, cost_traj[t], rtol=1e-5, atol=1e-6)
        assert bool(done) == bool(done_traj[t])
    assert int(state.day) == int(final.day) and int(state.time_step) == int(final.time_step)
    for a, b in zip(jax.tree_util.tree_leaves(state), jax.tree_util.tree_leaves(final)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_legacy_prngkey_works_like_typed_key(task):
    """Both jax.random.key and legacy uint32 PRNGKey keys drive reset/step (the same bits give the same day)."""
    _, env, params, n_act, _, step, reset = task
    obs_new, state_new = reset(jax.random.key(5), params)
    obs_old, state_old = reset(jax.random.PRNGKey(5), params)
    assert int(state_new.day) == int(state_old.day)
    np.testing.assert_array_equal(obs_new, obs_old)
    out = step(jax.random.PRNGKey(6), state_old, jnp.zeros(n_act), params)
    assert np.isfinite(float(out[2]))


def test_load_following_without_room_has_a_finite_derivative():
    """Every unit at its floor and the demand below their total: nothing can move, and the derivative through
    the load following stays finite (a policy trained by gradients through the env meets this state)."""
    lo, hi = jnp.array([10.0, 20.0]), jnp.array([30.0, 50.0])
    np.testing.assert_array_equal(follow_load(lo, lo, hi, 25.0), lo)
    g = jax.grad(lambda pg: jnp.sum(follow_load(pg, lo, hi, 25.0) * jnp.array([1.0, 2.0])))(lo)
    assert np.all(np.isfinite(np.asarray(g))), g
