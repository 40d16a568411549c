"""Workflows: `Workflow` base, `ECWorkflow` (evosax strategies and a native GA), `RLWorkflow` (PPO, TD3)."""
from evogrid.workflows.base import Workflow
from evogrid.workflows.ec import ALGORITHMS, ECConfig, ECState, ECWorkflow
from evogrid.workflows.rl import RL_ALGORITHMS, RLConfig, RLState, RLWorkflow

__all__ = ["ALGORITHMS", "ECConfig", "ECState", "ECWorkflow", "RL_ALGORITHMS", "RLConfig", "RLState", "RLWorkflow", "Workflow"]
