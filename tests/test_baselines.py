"""Optimisation baselines: the DC-OPF oracle replays through the env to its own objective with zero costs, the
one-step problem matches PYPOWER's rundcopf, limits bind on the tasks, infeasible days say so; the day split."""
import json
import os
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import ppc_of

from evogrid import baselines, cli
from evogrid.baselines.tso import dc_opf_oracle, myopic_policy, replay
from evogrid.case import load_case
from evogrid.case.matpower import PD, PG
from evogrid.envs import TransGridEnv, make, make_trans_params
from evogrid.envs.profiles import split_days
from evogrid.rollout import rollout


@pytest.mark.parametrize("task", ["tso-case5", "tso-case14"])
def test_oracle_schedule_replays_to_its_objective_with_zero_costs(task):
    """Float64: the schedule, asked for step by step, gives the env's return = -objective to 1e-6 relative
    (measured ~1e-15) and every cost channel zero (to round-off, 1e-9 p.u.)."""
    with jax.enable_x64(True):
        env, params = make(task, split="test")
        for r in [r for r in dc_opf_oracle(params, days=range(4)) if r.status == "optimal"]:
            ret, costs = replay(env, params, r.day, r.pg)
            np.testing.assert_allclose(ret, -r.cost, rtol=1e-6)
            assert np.all(costs <= 1e-9), costs


@pytest.mark.slow
def test_security_constrained_oracle_replays_secure_through_the_outage_env():
    """tso-case14-n1 (random outages foreseen, N-1 screening): the constraint-generated schedule replays to
    its objective with every channel zero, n1_thermal included (the env screens with its own JAX code, so
    this checks the oracle's numpy rows independently); N-1 rows were needed on some day, and some day has a
    line outage in force; the N-1 secure schedule costs more than the same day's unsecured optimum."""
    with jax.enable_x64(True):
        env, params = make("tso-case14-n1", split="test")
        secure = dc_opf_oracle(params)
        plain = dc_opf_oracle(params.replace(contingencies=None))  # the same problem without N-1 rows
        solved = [r for r in secure if r.status == "optimal"]
        assert len(solved) >= 4 and any(r.n1_rows for r in solved)
        assert np.any(np.asarray(params.outage_schedule) >= 0)
        for r in solved:
            ret, costs = replay(env, params, r.day, r.pg)
            np.testing.assert_allclose(ret, -r.cost, rtol=1e-6)
            assert np.all(costs <= 1e-7), (r.day, costs)
            if r.n1_rows:
                assert r.cost > plain[r.day].cost * (1 + 1e-6)


@pytest.mark.parametrize("name", ["5", "9", "14", "30", "57", "118"])
def test_one_step_dc_opf_matches_pypower_rundcopf(name):
    """The oracle on one step of the case's own loads, with its own ratings and no ramp limit, is PYPOWER's
    DC-OPF: objective to 1e-7 relative, dispatch to 1e-4 MW (PYPOWER's interior-point tolerance)."""
    from pypower.api import ppoption, rundcopf

    case = load_case(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = rundcopf(ppc_of(case), ppoption(VERBOSE=0, OUT_ALL=0))
    with jax.enable_x64(True):
        params = make_trans_params(case, max_steps=1, delta_t_hours=1.0, n_days=1, load_p=case.bus[:, PD][None, None],
                                   ratings="case", default_ramp_per_hour=1e6, reward_scale=1.0)
        day = dc_opf_oracle(params)[0]
    assert ref["success"] and day.status == "optimal"
    np.testing.assert_allclose(day.cost, ref["f"], rtol=1e-7)  # $/h over one hour, constant terms included
    np.testing.assert_allclose(day.pg[0], ref["gen"][:, PG], atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("task, line, ramp, myopic_gap", [("tso-case14", 0.2, 0.9, 0.2), ("tso-case5", 0.9, 0.9, 0.05)])
def test_limits_bind_in_the_oracle_schedule(task, line, ramp, myopic_gap):
    """Lines and ramps bind on the test days (case14: derived ratings, 1.13 x the economic dispatch's flows at
    its own loads, and merit ramp rates, its slack among the slow units; case5: its own ratings), and the
    myopic policy pays more than the oracle and, without foresight, misses limits on some days (its one-step
    dispatch meets a fast load change with the slow units where their ramps cannot follow). Measured: case14
    lines 31% / ramps 100% of the days the oracle solves (all 16), myopic gap 0.30%, feasible on 62% of
    them; case5 lines and ramps 100%, myopic gap 0.10%, feasible on 19%. Every test day has a feasible
    schedule (case14 at 1.10 x its ratings had a test day without any)."""
    s = baselines.baseline(task, refresh=True)["summary"]
    assert s["infeasible_days"] == 0 and s["myopic_feasible_share"] < 1.0
    assert s["binding_share"]["line"] >= line and s["binding_share"]["ramp"] >= ramp
    assert s["myopic_gap_pct"] >= myopic_gap


@pytest.mark.parametrize("task", ["tso-case14", "tso-case14-n1"])
def test_the_line_rows_are_built_from_the_watched_pairs_alone(task):
    """The QP's line rows come from the watched (step, line) pairs only (`tso.step_rows`), not picked from every
    pair's rows (those of 9241pegase, 48 steps x 16,049 lines x 1,445 units, would need 13 GB first: its oracle
    was killed for memory at 24 GB). They are the full problem's rows, in its order, on the intact grid and on
    each step's grid under its outages (-n1); the other rows are untouched."""
    import scipy.sparse as sp

    from evogrid.baselines.tso import _Problem

    _, params = make(task, split="train", n_days=4)
    prob = _Problem(params)
    T = 6
    load, start = prob.load[1][:T], prob.start[1]
    grids = prob.step_grids(1, range(T)) if prob.isf is not None else None
    n_lim = prob.gen_ptdf.shape[0]
    watch = np.random.default_rng(0).random((T, n_lim)) < 0.3
    every = prob.build(load, start, grids=grids)[1]           # every pair's rows, then the watched ones picked
    picked = prob.build(load, start, grids=grids, watch=watch)[1]
    keep = np.flatnonzero(watch.ravel())
    lines = every[T:T + T * n_lim][keep]   # (after the T balance rows)
    np.testing.assert_array_equal(picked[T:T + keep.size].toarray(), lines.toarray())
    np.testing.assert_array_equal(picked[T + keep.size:].toarray(), every[T + T * n_lim:].toarray())
    if grids is None:   # and they are the Kronecker product of the steps and the units' flow sensitivities
        kron = sp.kron(sp.identity(T), sp.csr_matrix(prob.gen_ptdf)).tocsr()[keep]
        np.testing.assert_array_equal(picked[T:T + keep.size].toarray(), kron.toarray())
    assert picked.shape == (every.shape[0] - T * n_lim + keep.size, every.shape[1])


def test_one_watched_line_costs_one_row_of_memory():
    """The memory half of the test above, where it shows (tso-case118, 48 steps): building the day's QP with
    one watched (step, line) pair allocates far less than every pair's rows would take (tracemalloc sees
    NumPy's and SciPy's arrays)."""
    import tracemalloc

    from evogrid.baselines.tso import _Problem

    _, params = make("tso-case118", split="train", n_days=4)
    prob = _Problem(params)
    load, start = prob.load[1], prob.start[1]
    T, n_lim = load.shape[0], prob.gen_ptdf.shape[0]
    one = np.zeros((T, n_lim), bool)
    one[2, 3] = True
    tracemalloc.start()
    A = prob.build(load, start, watch=one)[1]
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    every_row = 12 * T * n_lim * prob.n_units   # bytes of all pairs' rows (a value and a column index an entry)
    assert peak < every_row / 4, peak
    assert A.shape[0] == prob.build(load, start, watch=~np.ones_like(one))[1].shape[0] + 1   # one line row more


def test_an_infeasible_day_is_reported_as_infeasible_not_as_a_number():
    """Loads at 2x the fleet's capacity on one step: no schedule exists."""
    with jax.enable_x64(True):
        case = load_case("5")
        load = make_trans_params(case, max_steps=4, n_days=1).load_p
        load = np.asarray(load).copy()
        load[0, 2] *= 1530.0 / load[0, 2].sum() * 2.0
        params = make_trans_params(case, max_steps=4, n_days=1, load_p=load)
        day = dc_opf_oracle(params)[0]
    assert day.status == "infeasible" and day.cost is None and day.pg is None
    with pytest.raises(ValueError, match="no optimisation baseline for task 'gymnax:CartPole-v1'"):
        baselines.baseline("gymnax:CartPole-v1")


def test_days_split_into_disjoint_seeded_sets():
    parts = {s: split_days(64, s, seed=0) for s in ("train", "val", "test")}
    assert [len(parts[s]) for s in ("train", "val", "test")] == [40, 8, 16]
    assert sorted(np.concatenate(list(parts.values())).tolist()) == list(range(64))  # every day once, none twice
    np.testing.assert_array_equal(split_days(64, "test", seed=0), parts["test"])
    assert not np.array_equal(split_days(64, "test", seed=1), parts["test"])
    np.testing.assert_array_equal(split_days(64, "train+val"), np.sort(np.concatenate([parts["train"], parts["val"]])))
    _, test = make("tso-case5", split="test")
    _, every = make("tso-case5")
    np.testing.assert_array_equal(np.asarray(test.load_p), np.asarray(every.load_p)[parts["test"]])
    with pytest.raises(ValueError, match="split must be one of all, train, val, test"):
        make("tso-case5", split="testing")


def test_evaluation_plays_every_test_day_the_same_way_whatever_the_run():
    """The figures of a policy do not depend on the run's key, generation count or seed."""
    from evogrid.workflows import ECConfig, ECWorkflow

    wf = ECWorkflow(ECConfig(task="tso-case5", pop_size=4, episodes_per_individual=1, hidden=(4,), safety="off"))
    state = wf.init()
    first = wf.evaluate(state)
    later = wf.evaluate(state.replace(key=jnp.asarray(jax.random.key_data(jax.random.key(9))),
                                      generation=jnp.asarray(300, jnp.int32)))
    assert first["day_return"].shape == (16,)
    for k in first:
        np.testing.assert_array_equal(np.asarray(first[k]), np.asarray(later[k]))


@pytest.mark.slow
def test_baseline_command_prints_and_writes_json(tmp_path, capsys):
    # --refresh: computed here (with its progress) even when the suite's cache has it, and cached for the others
    code = cli.main(["baseline", "--task", "tso-case5", "--refresh", "--json", str(tmp_path / "b.json")])
    captured = capsys.readouterr()
    out = captured.out
    assert code == 0 and "days with a binding line limit" in out and "myopic gap to the oracle" in out
    # progress on stderr, a line at each quarter of the days in a log (not a terminal)
    assert "  multi-period DC-OPF: day 4/16\n" in captured.err and "day 3/16" not in captured.err and "  myopic policy: day 16/16\n" in captured.err
    assert "| mpc | on |" in out and "| zero | off |" in out and "  mpc+layer policy: day 16/16\n" in captured.err
    # the myopic DC-OPF without the layer is played once: the operators' row is the reference report's
    assert captured.err.count("  myopic policy: day 16/16\n") == 1 and "  myopic+layer policy: day 16/16\n" in captured.err
    written = json.loads((tmp_path / "b.json").read_text())
    assert written["operators"]["myopic"]["return"] == written["myopic"]["return"] and written["myopic"]["decision_s"] > 0
    cached = Path(os.environ["XDG_CACHE_HOME"]) / "evogrid" / "baselines"
    assert (tmp_path / "b.json").is_file() and list(cached.glob("tso-case5-test-*.json"))
    assert cli.main(["baseline", "--task", "gymnax:CartPole-v1"]) == 2
    assert "no optimisation baseline for task 'gymnax:CartPole-v1'" in capsys.readouterr().err


def test_rolling_horizon_with_a_perfect_forecast_is_the_oracle():
    """Case5 over an 8-interval day whose bus loads keep one pattern (so a forecast of the total is a
    forecast of every bus), the forecast perfect: the rolling-horizon DC-OPF's first solve covers the whole
    day, and each re-solve continues an optimal schedule, so its replay through the env returns minus the
    oracle's objective (1e-6) with every channel zero; its one-step (myopic) version pays more."""
    from evogrid.baselines.tso import rolling_policy

    with jax.enable_x64(True):
        level = np.array([0.7, 0.8, 0.95, 1.0, 0.9, 0.75, 0.7, 0.8])
        load = level[None, :, None] * load_case("5").bus[None, None, :, PD]
        env = TransGridEnv()
        params = make_trans_params("5", max_steps=8, n_days=1, load_p=load, forecast_error=0.0)
        oracle = dc_opf_oracle(params)[0]
        assert oracle.status == "optimal"
        returns, costs, moved, seconds = rolling_policy(env, params, 9)
        np.testing.assert_allclose(returns[0], -oracle.cost, rtol=1e-6)
        assert np.all(costs <= 1e-9) and moved[0] == 0.0 and seconds > 0.0
        myopic, _, _, _ = rolling_policy(env, params, 1)
        assert myopic[0] < returns[0] - 1e-6
        with pytest.raises(ValueError, match=r"horizon must be an integer in \[1, 9\]"):
            rolling_policy(env, params, 10)


def test_myopic_policy_is_feasible_where_one_step_suffices():
    with jax.enable_x64(True):
        env, params = make("tso-case14", split="test")
        returns, costs = myopic_policy(env, params, days=[0])
    assert costs.shape == (1, 3) and np.all(costs <= 1e-6) and returns[0] < 0


def test_dcmg_lp_bound_is_below_every_feasible_day_of_many_policies():
    """The DCMG LP bound (a relaxation of the env's rules) is at most the cost of every feasible day played
    by any policy: 48 random constant-action policies and the zero action on 4 test days (float64); at
    least some of those days are feasible, so the check has teeth; a tighter temperature limit raises the
    bound, and an impossible one is reported infeasible."""
    from evogrid.baselines.dcmg import lp_bound

    with jax.enable_x64(True):
        env, params = make("dcmg", split="test")
        days = range(4)
        bound = lp_bound(params, days=days)
        assert all(r.status == "optimal" for r in bound)
        actions = jnp.concatenate([jnp.zeros((1, 4)), jax.random.uniform(jax.random.key(0), (48, 4), minval=-1, maxval=1)])

        def day_cost(action, day):
            start = env.reset_to_day(day, params)
            m, _ = rollout(env, lambda o: action, jax.random.key(0), params.max_steps, params, obs_moments=False, start=start)
            return -m["episode_return"], m["episode_cost"].sum()

        cost, viol = jax.jit(jax.vmap(jax.vmap(day_cost, in_axes=(None, 0)), in_axes=(0, None)))(actions, jnp.arange(4))
        feasible = np.asarray(viol) <= 1e-9
        assert feasible.sum() >= 4
        lower = np.array([r.cost for r in bound])
        assert np.all(np.asarray(cost)[feasible] >= np.broadcast_to(lower, cost.shape)[feasible] - 1e-9)
        cooler = lp_bound(params.replace(t_limit=params.t_limit - 3.0), days=[0])[0]
        assert cooler.status == "optimal" and cooler.cost > bound[0].cost
        assert lp_bound(params.replace(t_limit=params.t_limit - 30.0), days=[0])[0].status == "infeasible"


def test_gencos_competitive_reference_prices_below_any_markup(capsys):
    """gencos-case5 test days at zero mark-up: consumers pay less and companies earn less than under a
    uniform mark-up of half the maximum, on every day; `evogrid baseline` prints the reference."""
    from evogrid.baselines.market import competitive_days

    env, params = make("gencos-case5", split="test")
    profit, price, payment = competitive_days(env, params)
    n_act = env.action_space(params).shape[0]

    @jax.jit
    def day_with_markup(day):  # a uniform mark-up (action 0 = half the maximum), the same days
        obs, state = env.reset_to_day(day, params)

        def one(carry, key):
            obs, state = carry
            obs, state, reward, _, _, info = env.step_no_reset(key, state, jnp.zeros(n_act), params)
            return (obs, state), (reward, info["consumer_payment"])

        _, (reward, pay) = jax.lax.scan(one, (obs, state), jax.random.split(jax.random.key(0), params.max_steps))
        return reward.sum(), pay.sum()

    m_profit, m_payment = jax.vmap(day_with_markup)(jnp.arange(len(profit), dtype=jnp.int32))
    assert np.all(np.asarray(m_payment) > payment) and np.all(np.asarray(m_profit) > profit)
    assert np.all((price > 10.0) & (price < 100.0))
    assert cli.main(["baseline", "--task", "gencos-case5"]) == 0
    assert "competitive mean price" in capsys.readouterr().out


@pytest.mark.slow
def test_dso_feeder_schedule_is_feasible_and_beats_nearby_actions():
    """dso-case33bw (float64), the test days the LinDistFlow schedule solves: its replay has every channel zero
    and costs what the report says; after the voltage correction the linear |V|^2 agrees with the sweep to
    1e-5; it costs less than no control; and no random nearby action of a step (2,000 of them, +-0.05) is
    feasible and cheaper by more than 0.5% of that step's cost. A day whose evening peak no control can
    hold in the band (even in the optimistic linear model) is reported infeasible."""
    from evogrid.baselines import feeder

    with jax.enable_x64(True):
        env, params = make("dso-case33bw", split="test")
        days = feeder.feeder_oracle(env, params, days=[0, 2])
        solved = days[0]
        assert solved.status == "optimal" and days[1].status == "infeasible"
        play = feeder.replay_fn(env, params)
        ret, costs, _ = play(0, solved.pg)
        np.testing.assert_allclose(-ret, solved.cost, rtol=1e-12)
        assert np.all(costs <= 1e-6) and solved.binding["voltage"]
        assert -play(0, np.zeros_like(solved.pg))[0] > solved.cost * 1.2
        # the correction converged: linear voltages at the schedule match the power flow
        offset = np.zeros(np.asarray(params.load_p).shape[1:])
        for _ in range(feeder.ROUNDS + 2):
            _, actions, u_lin, _ = feeder._day_qp(params, 0, offset)
            offset = offset + play(0, actions)[2] ** 2 - u_lin
        np.testing.assert_allclose(u_lin, play(0, actions)[2] ** 2, atol=1e-5)
        t = 40   # local optimality of an evening step (no PV; voltages at the band's edge)

        def step_cost(a):
            state = env.start_state(jnp.int32(0), params).replace(time_step=jnp.int32(t))
            obs, _, reward, c, _, _ = env.step(jax.random.key(0), state, a, params)
            return -reward, jnp.sum(c)

        base_cost, _ = step_cost(jnp.asarray(solved.pg[t]))
        near = jnp.clip(solved.pg[t] + jax.random.uniform(jax.random.key(1), (2000, solved.pg.shape[1]), minval=-0.05, maxval=0.05), -1, 1)
        cost, viol = jax.jit(jax.vmap(step_cost))(near)
        feasible = np.asarray(viol) <= 1e-9
        assert feasible.sum() > 100   # the check has teeth: many nearby actions keep the band
        better = feasible & (np.asarray(cost) < float(base_cost) * (1 - 5e-3))
        assert not better.any(), f"{better.sum()} nearby actions are feasible and cheaper"


@pytest.mark.slow
def test_dso_rolling_dispatch_matches_the_oracle_where_it_solves():
    """dso-case33bw (float64): the feeder's intervals do not couple and the observation carries each
    interval's loads, so the rolling dispatch (one QP per interval at the observed loads, corrected by its
    own sweep) replays at the oracle's cost (1e-6) within every limit on a day the oracle solves, with and
    without the voltage layer (which then moves nothing); on a day no schedule holds in the band it takes
    the least violating one, and violates less than no control; DERs (batteries) are refused."""
    from evogrid.baselines import feeder
    from evogrid.safety import shield

    with jax.enable_x64(True):
        env, params = make("dso-case33bw", split="test")
        oracle = feeder.feeder_oracle(env, params, days=[0, 2])
        returns, costs, moved, seconds = feeder.rolling_policy(env, params, days=[0, 2])
        np.testing.assert_allclose(-returns[0], oracle[0].cost, rtol=1e-6)
        assert np.all(costs[0] <= 1e-6) and 0.0 < seconds < 1.0 and not moved.any()
        assert oracle[1].status == "infeasible" and costs[1].sum() > 0
        zero = np.zeros((params.max_steps, env.action_space(params).shape[0]))
        assert costs[1].sum() < feeder.replay_fn(env, params)(2, zero)[1].sum()
        shielded = feeder.rolling_policy(shield(env, params), params, days=[0])
        np.testing.assert_allclose(-shielded[0][0], oracle[0].cost, rtol=1e-6)
        assert shielded[2][0] < 1e-6 and np.all(shielded[1][0] <= 1e-6)
        ders, ders_params = make("ders-case141", max_steps=2, n_days=1)
        with pytest.raises(ValueError, match="no plan for batteries"):
            feeder.rolling_policy(ders, ders_params)


def test_perturbed_demonstrations_are_situations_the_env_can_produce_labelled_by_the_mpc():
    """dso (`init_augment`): a perturbed copy of a demonstrated interval changes only the loads and PV power
    (bus loads by their own factors, PV within its rating), is the observation the env gives on a day with those
    loads, and its label is the MPC's decision on that day; seeded. Tasks whose MPC plans over a forecast refuse."""
    from evogrid.baselines import feeder, operators

    env, params = make("dso-case33bw", max_steps=3, n_days=1)
    obs, actions = operators.demonstrations(env, params, augment=2)
    n, n_bus, n_pv = params.max_steps, params.load_p.shape[-1], params.pv_avail.shape[-1]
    real, copies = obs[:n], obs[n:].reshape(2, n, -1)
    assert obs.shape == (3 * n, env.observation_space(params).shape[0]) and actions.shape[0] == 3 * n
    keep = np.r_[0:n_bus, 2 * n_bus + n_pv:obs.shape[1]]
    np.testing.assert_array_equal(copies[..., keep], np.broadcast_to(real[:, keep], copies[..., keep].shape))
    loaded = real[0, n_bus:2 * n_bus] > 0
    ratio = np.log(copies[..., n_bus:2 * n_bus][..., loaded] / real[:, n_bus:2 * n_bus][:, loaded])
    assert 0.05 < ratio.std(-1).mean() < 0.2 and np.all(copies[..., 2 * n_bus:2 * n_bus + n_pv] <= 1.0)
    np.testing.assert_array_equal(feeder.perturbed_demonstrations(params, real, 2)[1], actions[n:])   # seeded
    copy = copies[1, 1]   # the second copy of the second interval (the first's observation is cached in the params)
    loads = params.load_p.at[0, 1].set(copy[n_bus:2 * n_bus] * params.base_mva)
    day = params.replace(load_p=loads, pv_avail=params.pv_avail.at[0, 1].set(copy[2 * n_bus:2 * n_bus + n_pv]))
    record = []
    feeder.rolling_policy(env, day, days=[0], record=record)
    np.testing.assert_allclose(record[1][0], copy, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(record[1][1], actions[2 * n + 1], atol=1e-6)
    tso_env, tso_params = make("tso-case5", max_steps=2, n_days=1)
    with pytest.raises(ValueError, match="init_augment.*one observation alone: dso-case33bw"):
        operators.demonstrations(tso_env, tso_params, augment=1)


def test_demonstrations_are_cached_per_layer_setting(tmp_path, monkeypatch):
    """The MPC's demonstrations played behind the redispatch with another setting (a margin, its iterations)
    are other observations: another cache entry, not the first one's; the same setting reads the cache."""
    from evogrid.baselines import operators
    from evogrid.safety import shield

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    played = []

    def play(env, params, days, *progress):
        played.append(env.layer.line_margin)
        return np.full((1, 2), float(len(played))), np.zeros((1, 2))

    monkeypatch.setattr(operators, "demonstrations", play)
    env, params = make("tso-case5", max_steps=2, n_days=2)
    first = baselines.demonstrations(shield(env, params), params, [0])[0]
    other = baselines.demonstrations(shield(env, params, line_margin=0.02), params, [0])[0]
    again = baselines.demonstrations(shield(env, params), params, [0])[0]
    assert played == [0.0, 0.02] and float(first[0, 0]) == float(again[0, 0]) == 1.0 and float(other[0, 0]) == 2.0


@pytest.mark.slow
def test_ders_schedule_uses_the_batteries_and_replays_feasible():
    """ders-case141 (float64), one test day: the multi-period schedule (batteries, tariff) replays with every
    channel zero (no battery clipping, no end-of-day shortfall), the QP's own objective is within 1% of the
    replayed cost (LinDistFlow's losses), it beats no control and the same schedule with the batteries idle."""
    from evogrid.baselines import feeder

    with jax.enable_x64(True):
        env, params = make("ders-case141", split="test")
        day = feeder.feeder_oracle(env, params, days=[0])[0]
        assert day.status == "optimal" and day.binding["battery"]
        play = feeder.replay_fn(env, params)
        ret, costs, vm = play(0, day.pg)
        assert np.all(costs <= 1e-6)
        n_bat = params.battery_incidence.shape[0]
        assert np.abs(day.pg[:, -n_bat:]).max() > 0.5   # the batteries work
        offset = np.zeros_like(vm)
        for _ in range(feeder.ROUNDS + 1):   # the oracle's own rounds: its last QP gave the schedule
            sol, actions, u_lin, _ = feeder._day_qp(params, 0, offset)
            offset = offset + play(0, actions)[2] ** 2 - u_lin
        np.testing.assert_allclose(actions, day.pg, atol=1e-9)
        assert abs(sol.objective - day.cost) / day.cost < 0.01
        idle = day.pg.copy()
        idle[:, -n_bat:] = 0.0
        assert -play(0, idle)[0] > day.cost and -play(0, np.zeros_like(day.pg))[0] > day.cost


@pytest.mark.slow
def test_ac_opf_reference_replays_within_every_limit():
    """tso-case14-ac, one 8-step test day (float64): the sequential AC-OPF's cost is the case's cost curves at
    its dispatch (reward units), within the units' limits; it moves the generator voltages off the case's
    set-points; replayed through the env (its active and voltage set-points as actions) the day meets every
    limit and costs within 0.1% of the reference. Halving the ratings cannot make it cheaper; a DC task is refused."""
    pytest.importorskip("pypower")
    from evogrid.baselines import ac
    from evogrid.physics import generation_cost, make_gen_cost

    with jax.enable_x64(True):
        case = load_case("14")
        env, params = make("tso-case14-ac", max_steps=8, n_days=4, split="test")
        day = ac.ac_opf_reference(env, params, case, days=[0])[0]
        assert day.status == "optimal" and day.pg.shape == (8, case.n_units) and day.vm.shape == (8, 5)
        curve = np.asarray(jax.vmap(lambda p: generation_cost(make_gen_cost(case), p))(jnp.asarray(day.pg)))
        np.testing.assert_allclose(day.cost, curve.sum() * params.delta_t_hours * float(params.reward_scale), rtol=1e-9)
        assert np.all(day.pg >= np.asarray(params.pmin) - 1e-6) and np.all(day.pg <= np.asarray(params.pmax) + 1e-6)
        assert np.max(np.abs(day.vm - np.asarray(params.v_set))) > 1e-3
        ret, costs = ac.replay_reference(env, params, [day])
        assert np.all(costs[0] == 0.0), costs
        assert abs(-ret[0] - day.cost) / day.cost < 1e-3
        tighter = ac.ac_opf_reference(env, params.replace(rate=params.rate * 0.5), case, days=[0])[0]
        assert tighter.status == "infeasible" or tighter.cost >= day.cost * (1 - 1e-7)   # PIPS tolerance
        with pytest.raises(ValueError, match="the AC-OPF reference is for the AC tasks"):
            ac.ac_opf_reference(*make("tso-case14", max_steps=4, n_days=4, split="test"), case)


def test_gaps_count_the_days_each_reference_solves():
    """A policy's gap to the oracle and to the bound: each over the days that one solves, in % of its cost;
    a report without a bound gives NaN for it."""
    report = {"oracle": {"status": ["optimal", "infeasible", "optimal"], "cost": [100.0, None, 50.0]},
              "bound": {"status": ["optimal", "optimal", "infeasible"], "cost": [90.0, 80.0, None]}}
    returns = [-110.0, -100.0, -60.0]
    assert baselines.gap(report, returns) == (pytest.approx(100 * (170 - 150) / 150), 2)
    assert baselines.gap(report, returns, "bound") == (pytest.approx(100 * (210 - 170) / 170), 2)
    figures = baselines.policy_figures(report, returns, [0.0, 0.0, 0.0])
    assert figures["gap_bound_pct"] == pytest.approx(100 * 40 / 170) and figures["feasible_solved_share"] == 1.0
    assert np.isnan(baselines.policy_figures({"oracle": report["oracle"]}, returns, [0.0] * 3)["gap_bound_pct"])


def test_socp_rows_hold_at_the_env_ac_state_and_the_bound_is_below_a_feasible_day():
    """tso-case14-ac, 8-step test days (float64). The relaxation's rows are the env's physics: at the state
    the env reaches after zero actions (W built from its voltages) every bus balance holds to 1e-9 p.u.,
    each pair's cone is tight (|W|^2 = w_f w_t) and the rows' flows give the env's MVA loadings. The bound
    is below the cost of a day the env plays within every limit (the reference's set-points replayed) and
    within 2% of it; halving the ratings cannot lower it; a DC task and a cubic cost are refused."""
    pytest.importorskip("pypower")
    from evogrid.baselines import ac, ac_bound

    with jax.enable_x64(True):
        env, params = make("tso-case14-ac", max_steps=8, n_days=4, split="test")
        rows = ac_bound.socp_rows(params)
        obs, state = env.reset_to_day(jnp.int32(0), params)
        zero = jnp.zeros(env.action_space(params).shape)
        for _ in range(3):
            obs, state, *_ = env.step_no_reset(jax.random.key(0), state, zero, params)
        v = np.asarray(state.vm) * np.exp(1j * np.asarray(state.va))
        sl, base = rows["slices"], float(params.base_mva)
        x = ac_bound.voltage_products(rows, v)
        x[sl["pg"]] = np.asarray(state.pg) / base
        vbus = np.argmax(np.asarray(params.vbus_incidence), axis=1)
        x[sl["q"]] = np.asarray(state.qg)[[list(vbus).index(b) for b in rows["held"]]] / base
        load = np.concatenate([np.asarray(params.load_p)[0, 2], np.asarray(params.load_q)[0, 2]]) / base
        np.testing.assert_allclose(rows["balance"] @ x, load - rows["fixed_q"], atol=1e-9)
        f, t = rows["pair"].T
        np.testing.assert_allclose(x[sl["a"]] ** 2 + x[sl["b"]] ** 2, x[sl["w"]][f] * x[sl["w"]][t], rtol=1e-12)
        pq = rows["flows"] @ x                                  # [both ends of every rated branch, (P, Q)]
        mva = np.hypot(pq[:, 0], pq[:, 1]).reshape(-1, 2).max(1) * base
        np.testing.assert_allclose(mva, np.asarray(state.flow), rtol=1e-9)   # every branch of the task is rated
        reference = ac.ac_opf_reference(env, params, load_case("14"), days=[0])
        ret, costs = ac.replay_reference(env, params, reference)
        assert np.all(costs[0] == 0.0)
        bound = ac_bound.socp_bound(params, days=[0])[0]
        assert bound.status == "optimal" and 0.98 * -ret[0] < bound.cost <= -ret[0] * (1 + ac_bound.GAP_TOL)
        tighter = ac_bound.socp_bound(params.replace(rate=params.rate * 0.5), days=[0])[0]
        assert tighter.status != "optimal" or tighter.cost >= bound.cost * (1 - 1e-7)
        with pytest.raises(ValueError, match="the SOCP bound is for the AC tasks"):
            ac_bound.socp_rows(make("tso-case14", max_steps=4, n_days=4)[1])
        cubic = params.cost.replace(poly=jnp.concatenate([params.cost.poly, params.cost.poly[:, :1]], axis=1))
        with pytest.raises(ValueError, match="convex quadratic"):
            ac_bound.socp_rows(params.replace(cost=cubic))


@pytest.mark.slow
def test_ac_operator_baselines_with_and_without_the_voltage_schedule():
    """tso-case14-ac, 4 test days of 12 steps (float64): the zero policy, persistence and the rolling DC-OPF
    (its loads raised by the observed losses), each with and without the voltage schedule. Persistence holds
    the start of day's voltages (the case's set-points, at the top of the band), which leaves the band at
    light load; with the layer every day meets every limit, and the MPC's dispatch costs less than holding
    the outputs or the middle of the window. Only the MPC's optimiser decides (a decision time)."""
    from evogrid.baselines.operators import operator_policies

    with jax.enable_x64(True):
        env, params = make("tso-case14-ac", max_steps=12, n_days=4, split="test")
        out = operator_policies(env, params)
    assert sorted(out) == ["mpc", "mpc+layer", "persistence", "persistence+layer", "zero", "zero+layer"]
    assert all((v["decision_s"] is None) == (not k.startswith("mpc")) and len(v["return"]) == params.load_p.shape[0]
               for k, v in out.items())
    assert max(out["persistence"]["violation"]) > 1e-4
    for name in ("zero", "persistence", "mpc"):
        assert max(out[name + "+layer"]["violation"]) <= 1e-6, (name, out[name + "+layer"]["violation"])
    mean = {k: np.mean(v["return"]) for k, v in out.items()}
    assert mean["mpc+layer"] > max(mean["persistence+layer"], mean["zero+layer"]), mean


def test_myopic_policy_recovers_after_a_step_beyond_capacity():
    """A step whose load exceeds the fleet's capacity leaves the slack far above its Pmax (the least violating
    dispatch); the next step starts from there, and the myopic policy brings the slack back to its range
    instead of refusing the day. The replayed day reports the violation in the balance and ramp channels."""
    with jax.enable_x64(True):
        case = load_case("14")
        load = np.stack([case.bus[:, PD] * k for k in (1.0, 3.5, 1.0, 1.0)])[None]  # 3.5 x Pd > the 772 MW fleet
        env = TransGridEnv()
        params = make_trans_params(case, max_steps=4, n_days=1, load_p=load)
        returns, costs = myopic_policy(env, params)
    names = env.constraint_names(params)
    assert np.all(np.isfinite(returns)) and costs[0, names.index("balance")] > 1.0 and costs[0, names.index("ramp")] > 1.0


def test_every_family_registers_its_reference_and_a_new_one_needs_no_branch(tmp_path, monkeypatch):
    """Each built-in family has a reference (the AC one for -ac transmission tasks, the family's for the
    others); one registered for a suffix wins over the family's, and `baseline` builds, caches and
    reads back a report through it alone."""
    from evogrid.baselines import report as ref_mod
    from evogrid.envs.registry import FAMILIES, list_tasks, parse_task

    for family in FAMILIES:
        task = next(t for t in list_tasks() if parse_task(t).family == family)
        assert baselines.reference(task) is not None, task
    assert baselines.reference("tso-case14-ac").words(parse_task("tso-case14-ac")).startswith("reference: the sequential AC-OPF")
    assert baselines.reference("tso-case14").operators and baselines.reference("tso-case14-ac").operators
    assert not baselines.reference("ders-case141").operators
    assert baselines.reference("gymnax:CartPole-v1") is None and not baselines.supported("gymnax:CartPole-v1")

    calls = []

    def build(env, params, task, progress):
        calls.append(task.suffixes)
        return {"days": 2, "oracle_kind": "toy", "oracle": {"status": ["optimal", "infeasible"], "cost": [1.0, None],
                                                            "binding": {}}, "myopic": None, "summary": {}}

    monkeypatch.setitem(ref_mod._REFERENCES, ("tso", "real"), ref_mod.Reference(build, lambda t: "toy", lambda s: []))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    report = baselines.baseline("tso-case5-real", split="val")
    assert calls == [("real",)] and report["oracle_kind"] == "toy" and baselines.solved_days(report) == [0]
    assert baselines.baseline("tso-case5-real", split="val") == report and len(calls) == 1   # cached


@pytest.mark.parametrize("task", ["tso-case118", "tso-case14-n1"])
def test_the_least_violation_step_by_generated_rows_is_the_full_ones(task):
    """Where no dispatch of a step meets every limit (ratings cut to 40%), the least-violation LP solved with its
    line rows added as they are broken (`_Problem.solve(soft_slack=...)`) costs what the LP with every line's
    rows costs, to 1e-7 relative, and its dispatch breaks a line as that one's does."""
    from evogrid.baselines.solvers import solve_qp
    from evogrid.baselines.tso import _Problem

    _, params = make(task, split="train", n_days=4)
    prob = _Problem(params.replace(rate=params.rate * 0.4))
    slack = int(np.argmax(np.asarray(params.slack)))
    load, start = prob.load[1][3:4], prob.start[1]
    grids = prob.step_grids(1, [3]) if prob.isf is not None else None
    assert not prob.solve(load, start, grids)[0].ok   # the hard step has no answer
    full = solve_qp(*prob.build(load, start, soft_slack=slack, grids=grids))
    generated, _ = prob.solve(load, start, grids, soft_slack=slack)
    assert full.ok and generated.ok
    np.testing.assert_allclose(generated.objective, full.objective, rtol=1e-7)
    broken = [prob.line_violations(sol.x[:prob.n_units][None], load, grids).sum() for sol in (full, generated)]
    assert broken[0] > 0 and broken[1] > 0
