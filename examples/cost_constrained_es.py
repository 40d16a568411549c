"""Subclass ECWorkflow to change one hook: a cost-constrained fitness.

Plain ECWorkflow maximises the return penalised by the constraint mechanism
(evogrid.constraints: an adaptive Lagrangian, a fixed penalty, or none). Here any
individual whose summed constraint costs exceed a budget ranks below every feasible
one at once (a "death penalty" ordering), which some CMDP users prefer.

    .venv/bin/python examples/cost_constrained_es.py [--generations 60]
"""
import argparse

import jax.numpy as jnp

from evogrid.workflows import ECConfig, ECWorkflow


class BudgetedES(ECWorkflow):
    budget = 0.05  # p.u. of summed violations per episode

    def fitness(self, returns, costs, lagrangian):
        total = costs.sum(-1)
        feasible = total <= self.budget
        # infeasible members: below the worst feasible return, ordered by how far they overshoot
        floor = jnp.min(jnp.where(feasible, returns, jnp.inf))
        floor = jnp.where(jnp.isfinite(floor), floor, jnp.min(returns))
        return jnp.where(feasible, returns, floor - 1.0 - 100.0 * (total - self.budget))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--generations", type=int, default=60)
    wf = BudgetedES(ECConfig(task="tso-case5", pop_size=32, episodes_per_individual=2, hidden=(16,)))
    state, history = wf.learn(wf.init(), ap.parse_args().generations)
    ev = wf.evaluate(state)
    names = wf.env.constraint_names(wf.env_params)
    print(f"best policy: return {float(ev['return']):.2f}; costs", dict(zip(names, [round(float(c), 4) for c in ev["cost_channels"]])))
