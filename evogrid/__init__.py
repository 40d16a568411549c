"""evogrid: evolutionary reinforcement learning on JAX-native power-system environments."""
from evogrid.case import list_cases, load_case
from evogrid.envs import make

__version__ = "0.1.0"
__all__ = ["list_cases", "load_case", "make"]
