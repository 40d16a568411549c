"""MAPElitesWorkflow: a map of diverse dispatch policies on the transmission tasks (`--algorithm map_elites`).

The ECWorkflow loop (one generation per compiled call, the population's episodes vmapped, the policy
chosen on the validation days) with `algorithms.MAPElites` as the strategy: each generation's children
are placed by their behaviour descriptors, computed from the energy each unit produced over the
individual's training episodes (`info["dispatch_mw"]` summed per unit):

    cheap_share   share of the energy from the cheaper half of the fleet (units whose marginal cost at
                  mid output is at most the fleet's median), in [0, 1]
    slack_share   share of the energy from the slack unit, in [0, 1]
    spread        standard deviation over units of their capacity factors (energy / Pmax over the
                  episodes), in [0, 0.5]: how evenly the policy loads the fleet

A planner reads the archive as a set of policies that run the grid differently at known cost. A cell
keeps feasibility first (`MAPElites` with `tol`): a child that met every limit in its episodes beats a
member that did not, and between two that did, the constrained fitness of every EC run decides. The cells are filled on training days; `evaluate`
reports the chosen policy on the test days like every workflow, plus every filled cell's policy
played on the test days: how many cells are filled and how many of them meet every limit on every
test day (`archive_*`), and per cell its descriptors, test return and feasible days (`cells_*`).
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from evogrid.algorithms import MAPElites
from evogrid.utils.config import param
from evogrid.utils.plots import archive_map
from evogrid.workflows.base import FEASIBLE_TOL, met_every_limit
from evogrid.workflows.ec import ECConfig, ECWorkflow

DESCRIPTORS = {   # name -> (lo, hi)
    "cheap_share": (0.0, 1.0),
    "slack_share": (0.0, 1.0),
    "spread": (0.0, 0.5),
}


@dataclasses.dataclass(frozen=True)
class MAPElitesConfig(ECConfig):
    """An ECConfig whose strategy is MAP-Elites (`sigma` is the iso mutation's std). A member is judged once,
    on the episodes that placed it, and never played again: so it plays more episodes than an ES member
    (16 by default) for its cell and its feasibility to hold on days it has not seen."""

    algorithm: str = param("map_elites", "quality-diversity archive", choices=("map_elites",))
    descriptors: tuple[str, ...] = param(("cheap_share", "slack_share"), "behaviour descriptors of the archive "
                                         f"(any of {', '.join(DESCRIPTORS)})")
    bins: int = param(20, "archive cells per descriptor", lo=1)
    episodes_per_individual: int = param(16, "episodes each member plays before it is placed", lo=1, cli="--episodes")
    sigma: float = param(0.1, "std of the iso mutation", lo=0.0, lo_open=True)
    line_sigma: float = param(0.2, "std of the step along the line between two parents (iso+line variation)", lo=0.0)

    def _check(self):
        unknown = [d for d in self.descriptors if d not in DESCRIPTORS]
        if unknown or not self.descriptors:
            raise ValueError(f"unknown descriptor(s) {', '.join(unknown) or '(none given)'}; choose one or more of "
                             f"{', '.join(DESCRIPTORS)}")
        if len(set(self.descriptors)) < len(self.descriptors):
            raise ValueError(f"descriptors must differ, got {', '.join(self.descriptors)}")


class MAPElitesWorkflow(ECWorkflow):
    info_sums = ("dispatch_mw",)

    def __init__(self, config: MAPElitesConfig = MAPElitesConfig(), env=None, env_params=None, mesh=None):
        super().__init__(config, env, env_params, mesh)
        from evogrid.envs.trans import TransParams
        from evogrid.physics import generation_cost

        params = self.env_params
        if not isinstance(params, TransParams):
            raise ValueError(f"map_elites describes dispatch policies: it runs on the transmission tasks (tso-*), "
                             f"not {config.task!r}")
        mid = 0.5 * (params.pmin + params.pmax)
        marginal = np.asarray(jax.grad(lambda p: jnp.sum(generation_cost(params.cost, p)))(mid))
        self._cheap = jnp.asarray(marginal <= np.median(marginal), params.pmax.dtype)
        self._slack, self._pmax = params.slack, params.pmax
        self._steps = config.episodes_per_individual * params.max_steps

    def make_strategy(self, flat):
        c = self.config
        lo, hi = zip(*(DESCRIPTORS[d] for d in c.descriptors))
        return MAPElites(c.pop_size, c.sigma, (c.bins,) * len(c.descriptors), lo, hi, len(self.cost_names), c.line_sigma,
                         tol=FEASIBLE_TOL)

    def describe(self, energy):
        """Descriptors [..., B] from each unit's energy [..., n_units] (MW summed over the steps played)."""
        total = jnp.maximum(energy.sum(-1), 1e-9)
        factors = energy / (self._pmax * self._steps)
        named = {"cheap_share": (energy * self._cheap).sum(-1) / total, "slack_share": (energy * self._slack).sum(-1) / total,
                 "spread": jnp.std(factors, axis=-1)}
        return jnp.stack([named[d] for d in self.config.descriptors], axis=-1)

    def tell(self, key, population, fitness, metrics, archive):
        energy = metrics["dispatch_mw"].sum(-2)                     # [pop, n_units] over the individual's episodes
        costs = metrics["episode_cost"].mean(-2)                    # [pop, C]
        return self.strategy.tell(key, population, fitness, archive, self.describe(energy), costs)

    def _evaluate(self, state):
        out = super()._evaluate(state)
        archive = state.es_state
        filled = jnp.isfinite(archive.fitness)

        played = self.play_members(archive.params, state.obs_norm)
        returns = played["episode_return"].mean(-1)
        feasible_days = met_every_limit(played["episode_cost"]).sum(-1)
        n_days = self.env.num_days(self.split_params("test"))
        met = filled & (feasible_days == n_days)
        return out | {"archive_filled": filled.sum(), "archive_feasible": met.sum(),
                      "archive_cells": jnp.asarray(self.strategy.n_cells), "cells_filled": filled,
                      "cells_descriptor": archive.descriptor, "cells_fitness": archive.fitness,
                      "cells_test_return": jnp.where(filled, returns, jnp.nan),
                      "cells_feasible_days": jnp.where(filled, feasible_days, 0)}

    def plot_evaluation(self, result: dict, run_dir):
        """archive.png: the archive as a map over its descriptors (`utils.plots.archive_map`)."""
        names = self.config.descriptors
        path = archive_map(run_dir / "archive.png", result["cells_test_return"], result["cells_feasible_days"],
                           len(result["day_return"]), self.config.bins, names, [DESCRIPTORS[d] for d in names],
                           f"MAP-Elites archive on {self.config.task} (red: every test day within limits)")
        return [] if path is None else [(f"archive over {', '.join(names)}", path)]
