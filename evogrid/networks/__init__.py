"""Policy networks: a flax MLP, populations of MLPs (`make_vmap_mlp`) and running observation statistics."""
from evogrid.networks.mlp import MLP, MLPEnsemble, RunningNorm, flat_init, make_vmap_mlp

__all__ = ["MLP", "MLPEnsemble", "RunningNorm", "flat_init", "make_vmap_mlp"]
