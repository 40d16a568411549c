"""NSGA2Workflow: a Pareto front of policies over several objectives (`--algorithm nsga2`).

The ECWorkflow loop (one generation per compiled call, the population's episodes vmapped, the policy
chosen on the validation days) with `algorithms.NSGA2` as the strategy: each generation's children join
the population and the best `pop_size` by constrained non-dominated rank and crowding survive, with
feasibility first (a member within every limit in its training episodes dominates any that is not).
Objectives (`--objectives`, two or more, all minimised; each from the individual's training episodes):

    cost           the task's own cost: minus the episode return (every task)
    co2            tonnes of CO2 per episode (`info["co2_t"]`; dcmg, whose return already prices carbon:
                   the front shows what less carbon costs beyond that price)
    peak_loading   the mean over the steps of the most loaded line's flow over its rating
                   (`info["peak_loading"]`; transmission tasks): the security margin bought by dearer
                   dispatch

The reported policy comes from the front's member best on the first objective (`cost` by default: the
strategy's `center`) and each generation's fittest, chosen on the validation days like every workflow. `evaluate` also plays every member of the front on the test days and reports
how many there are, how many meet every limit on every test day (`front_*`), and per member its
objectives on the test days; `evogrid eval` draws the front (`front.png`).
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from evogrid.algorithms import NSGA2
from evogrid.utils.config import param
from evogrid.workflows.base import FEASIBLE_TOL, met_every_limit
from evogrid.workflows.ec import ECConfig, ECWorkflow

OBJECTIVES = {   # name -> the per-step info entry summed over an episode (None: minus the return)
    "cost": None,
    "co2": "co2_t",
    "peak_loading": "peak_loading",
}
PER_STEP = ("peak_loading",)   # objectives reported as a mean over the steps rather than a sum


@dataclasses.dataclass(frozen=True)
class NSGA2Config(ECConfig):
    """An ECConfig whose strategy is NSGA-II (`sigma` is the mutation's std)."""

    task: str = param("tso-case14", "task name (see `evogrid tasks`)")
    algorithm: str = param("nsga2", "multi-objective front", choices=("nsga2",))
    objectives: tuple[str, ...] = param(("cost", "peak_loading"), "objectives, two or more, all minimised "
                                        f"(any of {', '.join(OBJECTIVES)} the task reports)")
    line_sigma: float = param(0.2, "std of the step along the line between two parents (iso+line variation)", lo=0.0)

    def _check(self):
        unknown = [o for o in self.objectives if o not in OBJECTIVES]
        if unknown:
            raise ValueError(f"unknown objective(s) {', '.join(unknown)}; choose two or more of {', '.join(OBJECTIVES)}")
        if len(set(self.objectives)) < 2:
            raise ValueError(f"a multi-objective run needs two or more different objectives, got {', '.join(self.objectives)}"
                             " (for one, use a single-objective algorithm such as Open_ES)")
        if len(set(self.objectives)) < len(self.objectives):
            raise ValueError(f"objectives must differ, got {', '.join(self.objectives)}")


class NSGA2Workflow(ECWorkflow):
    def __init__(self, config: NSGA2Config = NSGA2Config(), env=None, env_params=None, mesh=None):
        self.info_sums = tuple(OBJECTIVES[o] for o in config.objectives if OBJECTIVES[o] is not None)
        super().__init__(config, env, env_params, mesh)
        key = jax.random.key(0)
        _, state = jax.eval_shape(self.env.reset, key, self.env_params)
        action = jnp.zeros(self.env.action_space(self.env_params).shape)
        reported = jax.eval_shape(self.env.step, key, state, action, self.env_params)[-1]
        missing = [o for o in config.objectives if OBJECTIVES[o] is not None and OBJECTIVES[o] not in reported]
        if missing:
            has = [o for o, k in OBJECTIVES.items() if k is None or k in reported]
            raise ValueError(f"{config.task} does not report {', '.join(missing)}; its objectives: {', '.join(has)}")

    def make_strategy(self, flat):
        c = self.config
        return NSGA2(c.pop_size, c.sigma, len(c.objectives), c.line_sigma, tol=FEASIBLE_TOL)

    def objectives(self, metrics, steps: int):
        """[..., K] minimised objectives from episode metrics with a trailing episode axis [..., E]."""
        out = []
        for name in self.config.objectives:
            key = OBJECTIVES[name]
            value = -metrics["episode_return"] if key is None else metrics[key] / (steps if name in PER_STEP else 1)
            out.append(value.mean(-1))
        return jnp.stack(out, axis=-1)

    def tell(self, key, population, fitness, metrics, front):
        violation = metrics["episode_cost"].mean(-2).sum(-1)            # [pop]
        return self.strategy.tell(key, population, front, self.objectives(metrics, self.env_params.max_steps), violation)

    def _evaluate(self, state):
        out = super()._evaluate(state)
        front = state.es_state
        params = self.split_params("test")
        member = (front.rank == 0) & jnp.isfinite(front.violation)

        played = self.play_members(front.params, state.obs_norm, self.info_sums)     # [N, n_days]: days as episodes
        values = self.objectives(played, params.max_steps)
        feasible_days = met_every_limit(played["episode_cost"]).sum(-1)
        n_days = self.env.num_days(params)
        every_day = member & (feasible_days == n_days)
        per_member = {f"front_{o}": jnp.where(member, values[:, i], jnp.nan) for i, o in enumerate(self.config.objectives)}
        return out | {"front_size": member.sum(), "front_feasible": every_day.sum(), "front_member": member,
                      "front_feasible_days": jnp.where(member, feasible_days, 0), **per_member}

    def plot_evaluation(self, result: dict, run_dir):
        """front.png: the front's members on the test days over the first two objectives."""
        import numpy as np

        from evogrid.utils.plots import pareto_front

        names = self.config.objectives[:2]
        member = np.asarray(result["front_member"], bool)
        x, y = (np.asarray(result[f"front_{o}"], float)[member] for o in names)
        full = np.asarray(result["front_feasible_days"])[member] == len(result["day_return"])
        path = pareto_front(run_dir / "front.png", x, y, full, names, f"NSGA-II front on {self.config.task}")
        return [] if path is None else [(f"front over {', '.join(names)}", path)]
