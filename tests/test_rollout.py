"""The one rollout path: `collect` reports truncation, termination and the true final observation; auto-resets
match `env.step`; `track_episodes` sums finished episodes."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from evogrid.envs import TrainingWrapper, make
from evogrid.rollout import EpisodeStats, collect, scan_rollout, scan_steps, track_episodes

ENV, PARAMS = make("tso-case5", max_steps=3, n_days=4)


def test_truncation_final_obs_and_resets_match_env_step():
    key = jax.random.key(0)
    obs, state = ENV.reset(jax.random.key(1), PARAMS)
    zero = lambda k, o: (jnp.zeros(5), None)  # noqa: E731
    final_state, final_obs, tr, _ = jax.jit(lambda s, o: collect(ENV, PARAMS, zero, key, s, o, 7))(state, obs)
    np.testing.assert_array_equal(np.asarray(tr.truncated), [0, 0, 1, 0, 0, 1, 0])  # the 3-step time limit
    assert not np.asarray(tr.terminated).any()
    # replay with env.step: the same keys give the same resets; next_obs is the pre-reset observation
    s, o = state, obs
    for t, k in enumerate(jax.random.split(key, 7)):
        k_step, _ = jax.random.split(k)
        true_next = ENV.step_no_reset(k_step, s, jnp.zeros(5), PARAMS)[0]
        o, s, r, c, d, _ = ENV.step(k, s, jnp.zeros(5), PARAMS)
        np.testing.assert_allclose(np.asarray(tr.next_obs[t]), np.asarray(true_next), rtol=1e-5)  # float32, jit vs eager
        np.testing.assert_allclose(float(tr.reward[t]), float(r), rtol=1e-6)
        if t < 6:
            np.testing.assert_allclose(np.asarray(tr.obs[t + 1]), np.asarray(o), rtol=1e-5)  # the carried (reset) obs
    np.testing.assert_allclose(np.asarray(final_obs), np.asarray(o), rtol=1e-5)  # measured 1.1e-6 on a |flow| / rating entry
    assert int(final_state.time_step) == int(s.time_step) == 1
    assert not np.allclose(np.asarray(tr.next_obs[2]), np.asarray(tr.obs[3]))  # end of day != next day's start


def test_blocks_of_steps_give_the_same_rollout():
    """Steps run in blocks of an iteration of the loop (the accelerator's default) give `collect` and
    `scan_rollout` the same trajectory as one step an iteration: the same keys, actions, resets and
    outputs, to float rounding."""
    obs, state = ENV.reset(jax.random.key(1), PARAMS)
    acts = jax.random.uniform(jax.random.key(2), (12, 5), minval=-1.0, maxval=1.0)
    play = lambda k, o, a: (a, None)  # noqa: E731
    runs = {}
    for block in (1, 4, 12):
        def run(s, o, block=block):
            traj = collect(ENV, PARAMS, play, jax.random.key(3), s, o, 12, inputs=acts, block=block)[2]
            return traj, scan_rollout(ENV, jax.random.key(3), s, PARAMS, acts, block)[1:]
        runs[block] = jax.jit(run)(state, obs)
    assert int(np.asarray(runs[1][0].done).sum()) == 4   # four 3-step days: the blocks straddle the resets
    for block in (4, 12):
        for a, b in zip(jax.tree.leaves(runs[1]), jax.tree.leaves(runs[block])):
            np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="block must be a positive divisor of the 12 steps, got 5"):
        scan_steps(lambda c, x: (c, x), 0, jnp.zeros(12), 12, 5)


def test_termination_is_not_truncation():
    pytest.importorskip("gymnax")
    env, params = make("gymnax:CartPole-v1")
    obs, state = env.reset(jax.random.key(0), params)
    push = lambda k, o: (jnp.array([1.0, -1.0]), None)  # noqa: E731  always push right: the pole falls early
    _, _, tr, _ = jax.jit(lambda s, o: collect(env, params, push, jax.random.key(1), s, o, 60))(state, obs)
    first = int(np.argmax(np.asarray(tr.done)))
    assert 0 < first < 50 and bool(tr.terminated[first]) and not np.asarray(tr.truncated).any()


def test_track_episodes_sums_finished_episodes():
    env = TrainingWrapper(ENV, 2)
    obs, state = env.reset(jax.random.key(2), PARAMS)
    zero = lambda k, o: (jnp.zeros((2, 5)), None)  # noqa: E731
    stats0 = EpisodeStats.create(2, 3)
    _, _, tr, stats = collect(env, PARAMS, zero, jax.random.key(3), state, obs, 5, fold=track_episodes, acc=stats0)
    reward, costs = np.asarray(tr.reward), np.asarray(tr.costs)
    # episodes end at step 3 (index 2); the latest finished ones are those two, then 2 steps are running
    np.testing.assert_allclose(float(stats.last_return), reward[:3].sum(0).mean(), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(stats.last_cost), costs[:3].sum(0).mean(0), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(np.asarray(stats.running_return), reward[3:].sum(0), rtol=1e-5)
