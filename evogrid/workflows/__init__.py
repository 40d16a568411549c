"""Workflows: `Workflow` base, `ECWorkflow` (evosax strategies and a native GA)."""
from evogrid.workflows.base import Workflow
from evogrid.workflows.ec import ALGORITHMS, ECConfig, ECState, ECWorkflow

__all__ = ["ALGORITHMS", "ECConfig", "ECState", "ECWorkflow", "Workflow"]
