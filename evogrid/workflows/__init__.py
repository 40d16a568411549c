"""Workflows compose algorithms into runs: `ECWorkflow` (evosax strategies, native GA), `RLWorkflow` (PPO,
TD3, SAC), `ERLWorkflow` (ERL, CEM-RL), `MAPElitesWorkflow` (an archive of diverse policies), `CoevolutionWorkflow` (market co-evolution), `AttackWorkflow`
(operator vs line-tripping attacker), and the registry
(`build`, `config_class`, `algorithms`) that maps algorithm names to (config, workflow)."""
from evogrid.workflows.attack import AttackConfig, AttackWorkflow
from evogrid.workflows.base import EVAL_SEED, Workflow
from evogrid.workflows.coevo import CoevoConfig, CoevolutionWorkflow
from evogrid.workflows.ec import ALGORITHMS, ECConfig, ECState, ECWorkflow
from evogrid.workflows.erl import ERL_ALGORITHMS, ERLConfig, ERLState, ERLWorkflow
from evogrid.workflows.qd import DESCRIPTORS, MAPElitesConfig, MAPElitesWorkflow
from evogrid.workflows.registry import algorithms, build, config_class, register
from evogrid.workflows.rl import RLConfig, RLState, RLWorkflow, rl_config

PPOConfig = config_class("ppo")
TD3Config = config_class("td3")
SACConfig = config_class("sac")

__all__ = [
    "ALGORITHMS", "AttackConfig", "AttackWorkflow", "CoevoConfig", "CoevolutionWorkflow", "ECConfig", "ECState", "ECWorkflow", "ERL_ALGORITHMS",
    "DESCRIPTORS", "ERLConfig", "ERLState", "ERLWorkflow", "EVAL_SEED", "MAPElitesConfig", "MAPElitesWorkflow", "PPOConfig", "RLConfig", "RLState", "RLWorkflow",
    "SACConfig", "TD3Config", "Workflow", "algorithms", "build", "config_class", "register", "rl_config",
]
