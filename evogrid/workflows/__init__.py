"""Workflows: `Workflow` base, `ECWorkflow` (evosax strategies and a native GA), `RLWorkflow` (PPO, TD3), `ERLWorkflow` (ERL, CEM-RL)."""
from evogrid.workflows.base import Workflow
from evogrid.workflows.ec import ALGORITHMS, ECConfig, ECState, ECWorkflow
from evogrid.workflows.erl import ERL_ALGORITHMS, ERLConfig, ERLState, ERLWorkflow
from evogrid.workflows.rl import RL_ALGORITHMS, RLConfig, RLState, RLWorkflow

__all__ = ["ERL_ALGORITHMS", "ERLConfig", "ERLState", "ERLWorkflow", "ALGORITHMS", "ECConfig", "ECState", "ECWorkflow", "RL_ALGORITHMS", "RLConfig", "RLState", "RLWorkflow", "Workflow"]
