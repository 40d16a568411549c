"""The one constraint mechanism (evogrid.constraints): the PID Lagrangian by hand, the fixed penalty, and its use
through SafeRLWrapper."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from evogrid.constraints import ConstraintConfig, Lagrangian
from evogrid.envs import SafeRLWrapper, make
from evogrid.utils.jax_utils import scan_rollout


def test_multiplier_update_by_hand_on_two_steps():
    """kp = 1, ki = 0.1, budget 0.
    Step 1: episode costs [2, 0, 0.5], return -100: I = [2, 0, 0.5]; lambda = 1 * v + 0.1 * I = [2.2, 0, 0.55];
            S = |return| = 100 (first update); weights = lambda * S = [220, 0, 55].
    Step 2: costs [0.5, 0, 0], return -80: I = [2.5, 0, 0.5]; lambda = [0.5 + 0.25, 0, 0 + 0.05] = [0.75, 0, 0.05];
            S = 0.9 * 100 + 0.1 * 80 = 98; weights = [73.5, 0, 4.9].
    penalise(-10, costs [1, 1, 1]) = (-10 - 78.4) / (1 + 0.8) = -49.11."""
    cfg = ConstraintConfig(constraint="lagrangian", lagrange_kp=1.0, lagrange_ki=0.1)
    lag = Lagrangian.create(3, cfg)
    np.testing.assert_array_equal(np.asarray(lag.weights()), 0.0)
    lag = lag.update(jnp.array([2.0, 0.0, 0.5]), jnp.asarray(-100.0), cfg)
    np.testing.assert_allclose(np.asarray(lag.multiplier), [2.2, 0.0, 0.55], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(lag.weights()), [220.0, 0.0, 55.0], rtol=1e-6)
    lag = lag.update(jnp.array([0.5, 0.0, 0.0]), jnp.asarray(-80.0), cfg)
    np.testing.assert_allclose(np.asarray(lag.multiplier), [0.75, 0.0, 0.05], rtol=1e-6)
    np.testing.assert_allclose(float(lag.scale), 98.0, rtol=1e-6)
    np.testing.assert_allclose(float(lag.penalise(jnp.asarray(-10.0), jnp.ones(3))), -88.4 / 1.8, rtol=1e-6)


def test_fixed_penalty_and_none_do_not_adapt():
    pen = ConstraintConfig(constraint="penalty", penalty=3.0)
    lag = Lagrangian.create(2, pen).update(jnp.array([5.0, 5.0]), jnp.asarray(-1.0), pen)
    np.testing.assert_allclose(np.asarray(lag.weights()), [3.0, 3.0])  # return - 3 * costs, whatever happened
    off = ConstraintConfig(constraint="none")
    assert float(Lagrangian.create(2, off).update(jnp.ones(2), jnp.asarray(-1.0), off).weights().sum()) == 0.0
    with pytest.raises(ValueError, match="constraint must be one of lagrangian, penalty, none, got 'pid'"):
        ConstraintConfig(constraint="pid")
    with pytest.raises(ValueError, match="lagrange_ki must be a finite number, got nan"):
        ConstraintConfig(lagrange_ki=float("nan"))


def test_safe_rl_wrapper_penalises_with_the_lagrangian():
    """The raw env (no safety layer), so that the dispatch below strains the lines too."""
    env, params = make("tso-case14", max_steps=6, n_days=4)
    safe = SafeRLWrapper(env)
    lag = Lagrangian(multiplier=jnp.array([2.0, 1.0, 0.5]), integral=jnp.zeros(3), scale=jnp.asarray(10.0),
                     fixed=jnp.asarray(0.0))
    sp = safe.make_params(params, lagrangian=lag)
    _, state = safe.reset(jax.random.key(4), sp)
    acts = jnp.tile(jnp.array([-1.0, -1.0, -1.0, 1.0, 1.0]), (6, 1))  # a dispatch that strains the slack
    _, _, rew, costs, done, info = jax.jit(lambda k, s: scan_rollout(safe, k, s, sp, acts))(jax.random.key(5), state)
    # weights = multiplier * scale = [20, 10, 5]; normalised by 1 + sum(multiplier) = 4.5
    expected = (info["reward_raw"] - np.asarray(costs) @ np.array([20.0, 10.0, 5.0])) / 4.5
    np.testing.assert_allclose(rew, expected, rtol=1e-5, atol=1e-4)
    total = np.asarray(costs).sum(0)
    assert total.sum() > 0 and bool(done[-1])
    np.testing.assert_allclose(info["episode_cost"][-1], total, rtol=1e-5)
    assert safe.constraint_names(sp) == env.constraint_names(params)


def test_validation_choice_counts_a_day_once_some_policy_met_it():
    """base.Chosen by hand (one cost channel, weight 10): day 2 has not been met by any policy, so its
    violation is weighed against the return (score = return - 10 x cost / days); the days met count first.
    Once a candidate meets day 2 it counts first for every policy, the kept one included. Days missed
    come before the size of the violation."""
    from evogrid.workflows.base import Chosen

    w = jnp.asarray([10.0])
    days = lambda *rows: jnp.asarray(rows)[..., None]  # noqa: E731  [K, n_val, 1]
    chosen = Chosen.create(3, 1)
    # both violate on day 2 only: scores -10 - 10 * 0.5 / 3 = -11.67 and -12 - 10 * 0.1 / 3 = -12.33
    k, chosen = chosen.consider(jnp.asarray([-10.0, -12.0]), days([0.0, 0.0, 0.5], [0.0, 0.0, 0.1]), w)
    assert int(k) == 0 and float(chosen.ret) == -10.0
    np.testing.assert_array_equal(np.asarray(chosen.seen), [True, True, False])
    # with weight 30 the same day-2 violations decide the other way: -15 vs -13
    _, other = Chosen.create(3, 1).consider(jnp.asarray([-10.0, -12.0]), days([0.0, 0.0, 0.5], [0.0, 0.0, 0.1]),
                                            jnp.asarray([30.0]))
    assert float(other.ret) == -12.0
    # a candidate that violates on day 0 (met before) loses to the kept policy however much it earns
    k, chosen = chosen.consider(jnp.asarray([-1.0]), days([0.2, 0.0, 0.7]), w)
    assert int(k) == -1 and float(chosen.ret) == -10.0
    # this one meets day 2, which now counts first: the kept policy's 0.5 there loses to it although it earns less
    k, chosen = chosen.consider(jnp.asarray([-20.0]), days([0.0, 0.0, 0.0]), w)
    assert int(k) == 0 and float(chosen.ret) == -20.0
    np.testing.assert_array_equal(np.asarray(chosen.seen), [True, True, True])
    np.testing.assert_array_equal(np.asarray(chosen.day_cost)[:, 0], [0.0, 0.0, 0.0])
    # with no weight (constraint="none") the days not met do not matter: the higher return wins
    _, free = Chosen.create(2, 1).consider(jnp.asarray([-6.0, -4.0]), days([0.0, 0.1], [0.0, 0.9]), jnp.asarray([0.0]))
    assert float(free.ret) == -4.0
    # days missed come first: two candidates meet every day between them (both miss one; the richer stays) ...
    k, kept = Chosen.create(3, 1).consider(jnp.asarray([-5.0, -6.0]), days([0.0, 0.0, 0.3], [0.3, 0.0, 0.0]), w)
    assert int(k) == 0 and bool(np.all(np.asarray(kept.seen)))
    # ... one that misses two days by 0.01 loses to it, though it violates less in all and earns more ...
    k, kept = kept.consider(jnp.asarray([0.0]), days([0.0, 0.01, 0.01]), w)
    assert int(k) == -1 and float(kept.ret) == -5.0
    # ... and one that misses one day, by less, wins
    k, kept = kept.consider(jnp.asarray([-9.0]), days([0.0, 0.0, 0.05]), w)
    assert int(k) == 0 and float(kept.ret) == -9.0


@pytest.mark.slow
def test_the_policy_can_be_chosen_on_the_training_and_validation_days():
    """select_on="train+val": the choice plays the 40 training and 8 validation days of tso-case5 (sorted),
    never a test day; the default plays the 8 validation days."""
    from evogrid.workflows import ECConfig, ECWorkflow

    small = dict(task="tso-case5", pop_size=4, episodes_per_individual=1, hidden=(4,), select_every=1)
    wf = ECWorkflow(ECConfig(**small, select_on="train+val"))
    state, metrics = wf.step(wf.init())
    assert state.chosen.day_cost.shape[0] == 48 and 0 <= float(metrics["val_counted_days"]) <= 48
    test = np.asarray(make("tso-case5", split="test")[1].load_p)
    chosen_on = np.asarray(wf.split_params(wf.choice_split).load_p)
    assert not any(np.array_equal(d, t) for d in chosen_on for t in test)
    assert ECWorkflow(ECConfig(**small)).new_chosen().day_cost.shape[0] == 8
