"""Workflows compose algorithms into runs: `ECWorkflow` (evosax strategies, native GA), `APGWorkflow` (gradients through the task), `RLWorkflow` (PPO,
TD3, SAC), `PBTWorkflow` (population-based training), `ERLWorkflow` (ERL, CEM-RL), `MAPElitesWorkflow` (an archive of diverse policies), `NSGA2Workflow` (a Pareto front), `CoevolutionWorkflow` (market co-evolution), `AttackWorkflow`
(operator vs line-tripping attacker), and the registry
(`build`, `config_class`, `algorithms`) that maps algorithm names to (config, workflow)."""
from evogrid.workflows.apg import APGConfig, APGWorkflow
from evogrid.workflows.attack import AttackConfig, AttackWorkflow
from evogrid.workflows.base import EVAL_SEED, Workflow
from evogrid.workflows.coevo import CoevoConfig, CoevolutionWorkflow
from evogrid.workflows.ec import ALGORITHMS, ECConfig, ECState, ECWorkflow
from evogrid.workflows.erl import ERL_ALGORITHMS, ERLConfig, ERLState, ERLWorkflow
from evogrid.workflows.pareto import OBJECTIVES, NSGA2Config, NSGA2Workflow
from evogrid.workflows.pbt import PBTWorkflow, pbt_config
from evogrid.workflows.qd import DESCRIPTORS, MAPElitesConfig, MAPElitesWorkflow
from evogrid.workflows.registry import algorithms, build, config_class, register
from evogrid.workflows.rl import RLConfig, RLState, RLWorkflow, rl_config

PPOConfig = config_class("ppo")
TD3Config = config_class("td3")
SACConfig = config_class("sac")
PPOPBTConfig = config_class("pbt")
TD3PBTConfig = config_class("pbt_td3")

__all__ = [
    "ALGORITHMS", "APGConfig", "APGWorkflow", "AttackConfig", "AttackWorkflow", "CoevoConfig", "CoevolutionWorkflow", "ECConfig", "ECState", "ECWorkflow", "ERL_ALGORITHMS",
    "DESCRIPTORS", "ERLConfig", "ERLState", "ERLWorkflow", "EVAL_SEED", "MAPElitesConfig", "MAPElitesWorkflow", "NSGA2Config", "NSGA2Workflow", "OBJECTIVES", "PBTWorkflow", "PPOConfig", "PPOPBTConfig", "RLConfig", "RLState", "RLWorkflow",
    "SACConfig", "TD3Config", "TD3PBTConfig", "Workflow", "algorithms", "build", "config_class", "register", "rl_config", "pbt_config",
]
