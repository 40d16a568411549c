"""APGWorkflow: a policy trained by gradients through the env (and its safety layer) learns; its gradient
matches a finite difference of the day's return."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from evogrid.envs import make
from evogrid.rollout import play_days
from evogrid.workflows import APGConfig, APGWorkflow


def _score(wf, state):
    out = wf.evaluate(state)
    return float(out["return"]), float(np.sum(out["cost_channels"]))


@pytest.mark.slow
@pytest.mark.parametrize("task, steps, gain", [("dso-case33bw", 40, 0.15), ("tso-case5", 40, 0.05)])
def test_apg_learns_from_a_random_start(task, steps, gain):
    """Seed 0, the task's default layer, `steps` steps of 8 days: the return rises by `gain` of its size and
    the cost does not. Measured: dso-case33bw -10.80 -> -8.52 (21%), tso-case5 -266.4 -> -240.5 (9.7%),
    costs unchanged (0.088 and 0), no skipped step."""
    wf = APGWorkflow(APGConfig(task=task, seed=0))
    state = wf.init()
    before = _score(wf, state)
    state, _ = wf.step(state)
    compiled = wf.step._cache_size()
    for _ in range(steps - 1):
        state, metrics = wf.step(state)
    assert wf.step._cache_size() == compiled
    assert float(metrics["nonfinite_grad"]) == 0.0
    after = _score(wf, state)
    assert after[0] >= before[0] + gain * abs(before[0]), (before, after)   # returns are negative (costs)
    assert after[1] <= before[1] + 1e-6, (before, after)


# tso-case5 with ramps of a whole range an hour: the set-points a random MLP asks for are within reach (one
# out of reach asks for its window's end, where the derivative is zero)
@pytest.mark.parametrize("task, output, options", [("dso-case33bw", "action", {}),
                                                   ("tso-case5", "setpoint", {"default_ramp_per_hour": 1.0})])
def test_the_gradient_is_the_returns_derivative(task, output, options):
    """The derivative APG follows, through the feeder's power flow and the voltage correction (dso) or the
    set-point head, the DC flows and the security redispatch (tso), against a central difference of the
    day's return along a random direction (float64; the step 1e-4 is well above the feeder's power flow
    convergence tolerance, whose noise dominates the difference below 1e-5)."""
    with jax.enable_x64(True):
        env, params = make(task, split="train", max_steps=6, **options)
        wf = APGWorkflow(APGConfig(task=task, hidden=(8,), policy_output=output), env, params)
        state = wf.state_template()
        flat, norm = state.best_params, state.best_obs_norm

        def ret(f):
            return jnp.mean(play_days(wf.env, params, wf._policy(f, norm), days=jnp.arange(2))["episode_return"])

        direction = jax.random.normal(jax.random.key(3), flat.shape, flat.dtype)
        h = 1e-4
        fd = (ret(flat + h * direction) - ret(flat - h * direction)) / (2 * h)
        assert abs(float(fd)) > 1e-3   # the return moves along the direction
        np.testing.assert_allclose(float(jax.grad(ret)(flat) @ direction), float(fd), rtol=1e-4)


def test_resume_continues_bit_identically(tmp_path):
    """The checkpoint holds the parameters and Adam's moments: 2 steps, then 2 more from the checkpoint, are
    the 4 steps of one run."""
    env, params = make("tso-case5", max_steps=6, n_days=4)
    cfg = APGConfig(task="tso-case5", episodes_per_individual=2, hidden=(8,), safety="off")
    full = APGWorkflow(cfg, env, params)
    s_full, _ = full.learn(full.init(), 4, run_dir=tmp_path / "full", checkpoint_every=2, progress=False)
    part = APGWorkflow(cfg, env, params)
    part.learn(part.init(), 2, run_dir=tmp_path / "part", checkpoint_every=2, progress=False)
    again = APGWorkflow(cfg, env, params)
    s_res, _ = again.learn(None, 4, run_dir=tmp_path / "part", checkpoint_every=2, resume=True, progress=False)
    assert int(s_res.generation) == 4
    for a, b in zip(jax.tree_util.tree_leaves(s_full), jax.tree_util.tree_leaves(s_res)):
        np.testing.assert_array_equal(a, b)


def test_a_step_without_a_finite_gradient_changes_nothing():
    """A NaN in the parameters makes the gradient NaN: that step keeps the parameters and Adam's state as
    they were (a zero gradient would still move them by Adam's moments) and is counted."""
    env, params = make("tso-case5", max_steps=6, n_days=4)
    wf = APGWorkflow(APGConfig(task="tso-case5", episodes_per_individual=2, hidden=(8,), safety="off"), env, params)
    state, metrics = wf.step(wf.init())
    assert float(metrics["nonfinite_grad"]) == 0.0
    poisoned = state.es_state["params"].at[0].set(jnp.nan)
    state = state.replace(es_state={**state.es_state, "params": poisoned})
    after, metrics = wf.step(state)
    assert float(metrics["nonfinite_grad"]) == 1.0
    for a, b in zip(jax.tree_util.tree_leaves(state.es_state), jax.tree_util.tree_leaves(after.es_state)):
        np.testing.assert_array_equal(a, b)
