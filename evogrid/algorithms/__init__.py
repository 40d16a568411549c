"""Algorithms: pure functions over their own flax.struct states, one algorithm per module.

Population strategies (flat [D] solutions, fitness maximised; `init`, `ask`, `tell`, `center`):
  es.EvosaxStrategy (evosax 0.3 by name), ga.GeneticAlgorithm (native GA), cem.CEM (diagonal CEM),
  map_elites.MAPElites (an archive over behaviour descriptors; its `tell` also takes them), nsga2.NSGA2
  (a front over several objectives; its `tell` takes them and the violations).
Gradient learners (`init`, `explore`, `act`, `learn` over `evogrid.rollout.collect` transitions):
  ppo.PPO (on-policy), td3.TD3 and sac.SAC (off-policy, replay buffer in the state).
Workflows (evogrid.workflows) compose them; nothing here knows about workflows.
"""
from evogrid.algorithms.cem import CEM, CEMState
from evogrid.algorithms.es import EVOSAX_ALGORITHMS, EvosaxStrategy
from evogrid.algorithms.ga import GAState, GeneticAlgorithm, inject
from evogrid.algorithms.map_elites import Archive, MAPElites
from evogrid.algorithms.nsga2 import NSGA2, Front
from evogrid.algorithms.ppo import PPO, PPOHyperparams, PPOState, gae
from evogrid.algorithms.sac import SAC, SACHyperparams, SACState
from evogrid.algorithms.td3 import TD3, TD3Hyperparams, TD3State

__all__ = [
    "CEM", "CEMState", "Archive", "MAPElites", "EVOSAX_ALGORITHMS", "EvosaxStrategy", "Front", "GAState", "GeneticAlgorithm", "NSGA2", "PPO",
    "PPOHyperparams", "PPOState", "SAC", "SACHyperparams", "SACState", "TD3", "TD3Hyperparams", "TD3State", "gae", "inject",
]
