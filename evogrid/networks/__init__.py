"""Policy networks: a flax MLP, populations of MLPs (`make_vmap_mlp`) and running observation statistics,
and behaviour cloning (`imitate`)."""
from evogrid.networks.mlp import MLP, MLPEnsemble, RunningNorm, flat_init, imitate, make_vmap_mlp

__all__ = ["MLP", "MLPEnsemble", "RunningNorm", "flat_init", "imitate", "make_vmap_mlp"]
