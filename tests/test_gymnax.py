"""gymnax adapter: contract and a seeded CMA_ES learning check on CartPole-v1."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("gymnax")

from evogrid.envs import make  # noqa: E402
from evogrid.utils.jax_utils import scan_rollout  # noqa: E402
from evogrid.workflows import ECConfig, ECWorkflow  # noqa: E402


def test_cartpole_contract():
    env, params = make("gymnax:CartPole-v1")
    assert params.max_steps == 500 and env.action_space(params).shape == (2,) and env.constraint_names(params) == ()
    obs, state = env.reset(jax.random.key(0), params)
    acts = jnp.tile(jnp.array([1.0, -1.0]), (60, 1))  # always push left: the pole falls within a few dozen steps
    final, obs_t, rew, costs, done, info = jax.jit(lambda k, s: scan_rollout(env, k, s, params, acts))(jax.random.key(1), state)
    assert costs.shape == (60, 0) and np.asarray(done).any()
    last_done = int(np.flatnonzero(np.asarray(done))[-1])
    assert int(final.time_step) == 60 - last_done - 1  # each fall auto-reset the episode and its step count
    with pytest.raises(ValueError, match="unknown gymnax environment 'CartPole-v9'"):
        make("gymnax:CartPole-v9")
    with pytest.raises(ValueError, match=r"gymnax tasks take only max_steps \(and split, which they ignore\), got n_days"):
        make("gymnax:CartPole-v1", n_days=3)
    short_env, short = make("gymnax:CartPole-v1", max_steps=20)
    assert short.max_steps == 20 and short.inner.max_steps_in_episode == 20


def test_rollouts_stop_once_every_episode_has_ended():
    """CartPole episodes end early: `rollout` stops its loop when all have (fewer policy calls than the
    horizon), with the same metrics as the full-length loop (kept trajectories force the full loop)."""
    from evogrid.envs.wrappers import TrainingWrapper
    from evogrid.rollout import rollout

    env, params = make("gymnax:CartPole-v1")
    batch = TrainingWrapper(env, 4)
    calls = []

    def policy(obs):
        jax.debug.callback(lambda: calls.append(1))
        return jnp.broadcast_to(jnp.array([1.0, -1.0]), obs.shape[:-1] + (2,))  # always push left

    early, _ = jax.jit(lambda k: rollout(batch, policy, k, 500, params))(jax.random.key(0))
    n_early = len(calls)
    full, traj = jax.jit(lambda k: rollout(batch, policy, k, 500, params, keep_trajectory=True))(jax.random.key(0))
    assert n_early < 100 and len(calls) - n_early == 500 and traj is not None
    for k in ("episode_return", "episode_length", "obs_mean", "obs_var", "obs_count"):
        np.testing.assert_allclose(np.asarray(early[k]), np.asarray(full[k]), rtol=1e-6, err_msg=k)
    assert np.all(np.asarray(early["episode_length"]) < 100)


def test_pendulum_actions_map_onto_the_torque_box():
    env, params = make("gymnax:Pendulum-v1")
    obs, state = env.reset(jax.random.key(0), params)
    _, s_hi, *_ = env.step(jax.random.key(1), state, jnp.array([1.0]), params)
    _, s_lo, *_ = env.step(jax.random.key(1), state, jnp.array([-1.0]), params)
    assert float(s_hi.inner.theta_dot) > float(s_lo.inner.theta_dot)  # +2 N m vs -2 N m


@pytest.mark.slow
def test_cma_es_learns_cartpole():
    """Random MLPs balance ~20 steps; seeded CMA_ES reaches a population mean above 400 within 15 generations."""
    cfg = ECConfig(task="gymnax:CartPole-v1", algorithm="CMA_ES", pop_size=32, episodes_per_individual=2,
                   hidden=(16,), sigma=0.1, seed=0)
    wf = ECWorkflow(cfg)
    state, history = wf.learn(wf.init(), 15, progress=False)
    assert history[0]["fitness_mean"] < 100
    assert max(h["fitness_mean"] for h in history) > 400, [round(h["fitness_mean"]) for h in history]
