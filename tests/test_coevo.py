"""Co-evolution of market agents: companies learn mark-ups against each other (seeded)."""
import jax
import numpy as np
import pytest

from evogrid.envs import make
from evogrid.workflows import CoevoConfig, CoevolutionWorkflow


@pytest.mark.slow
def test_coevolved_markups_raise_the_price_above_the_first_generation():
    """Companies start near a 50% mark-up. After 30 generations (seed 0) the mean price their strategies
    clear at is above the first generation's by a clear margin, the summed profit rose, and the companies
    went different ways (one strategy state per company)."""
    env, params = make("gencos-case5", clearing="merit", max_steps=24, delta_t_hours=1.0, n_days=4)
    wf = CoevolutionWorkflow(CoevoConfig(pop_size=16, episodes=1), env, params)
    state = wf.init()
    start = wf.evaluate(state)
    state, first = wf.step(state)
    compiled = wf.step._cache_size()
    for _ in range(29):
        state, metrics = wf.step(state)
    assert wf.step._cache_size() == compiled  # one compiled generation, reused
    final = wf.evaluate(state)
    gain = float(final["price"]) - float(start["price"])
    print("price", float(start["price"]), "->", float(final["price"]), "competitive", float(final["competitive_price"]))
    assert gain > 2.0, gain
    assert float(np.sum(metrics["profit_mean"])) > float(np.sum(first["profit_mean"]))
    assert np.ptp(np.asarray(final["markup"])) > 0.3
    assert jax.tree_util.tree_leaves(state.es_state)[0].shape[0] == 5


def test_coevolution_refuses_a_task_without_companies():
    with pytest.raises(ValueError, match="co-evolution needs a market task"):
        CoevolutionWorkflow(CoevoConfig(task="tso-case5"))
