"""Co-evolution of market agents: seeded smoke test that profits and prices move the expected way."""
import jax
import numpy as np

from evogrid.envs import make
from evogrid.workflows.coevo import CoevoConfig, CoevolutionWorkflow


def test_coevolved_markups_raise_prices_and_profits_above_the_start():
    """Companies start near a 50% mark-up; each learns against the others. Prices stay above the
    competitive (zero mark-up) level, and the summed profit rises over 30 generations (seed 0)."""
    env, params = make("gencos-case5", clearing="merit", max_steps=24, delta_t_hours=1.0, n_days=4)
    wf = CoevolutionWorkflow(CoevoConfig(pop_size=16, episodes=1), env, params)
    state = wf.init()
    state, first = wf.step(state)
    compiled = wf.step._cache_size()
    for _ in range(29):
        state, metrics = wf.step(state)
    assert wf.step._cache_size() == compiled  # one compiled generation, reused
    competitive = float(wf.competitive_price())
    final = wf.evaluate(state)
    assert float(final["price"]) > competitive + 5.0
    assert float(np.sum(final["profits"])) * float(params.reward_scale) / params.max_steps > 0
    assert float(np.sum(metrics["profit_mean"])) > float(np.sum(first["profit_mean"]))
    # each company moved its own way: mark-ups are not all equal any more
    assert np.ptp(np.asarray(final["markup"])) > 0.3
    assert jax.tree_util.tree_leaves(state.es_state)[0].shape[0] == 5  # one strategy state per company
