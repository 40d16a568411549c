"""evogrid: evolutionary reinforcement learning on JAX-native power-system environments."""
from evogrid.case import list_cases, load_case
from evogrid.envs import make

__version__ = "0.1.0"
__all__ = ["list_cases", "load", "load_case", "make"]


def load(run_dir):
    """(workflow, state, step) of a run directory (`evogrid.workflows.registry.load`)."""
    from evogrid.workflows.registry import load as load_run

    return load_run(run_dir)
