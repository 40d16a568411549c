"""Gaussian mutation of a parameter pytree (any shapes; vmap over a population)."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class GaussianMutation:
    """Each parameter is perturbed with probability `rate` by N(0, scale^2) noise.

    `mutate(key, params)` acts on one individual; `mutate_population(key, pop)`
    vmaps it over the leading population axis with one key per individual.
    """

    rate: float = 0.1
    scale: float = 0.02

    def __post_init__(self):
        if not 0.0 <= self.rate <= 1.0 or self.scale < 0:
            raise ValueError(f"GaussianMutation needs 0 <= rate <= 1 and scale >= 0, got rate={self.rate}, scale={self.scale}")

    def mutate(self, key, params):
        leaves, treedef = jax.tree_util.tree_flatten(params)
        keys = jax.random.split(key, 2 * len(leaves))
        out = []
        for i, leaf in enumerate(leaves):
            mask = jax.random.bernoulli(keys[2 * i], self.rate, leaf.shape)
            noise = self.scale * jax.random.normal(keys[2 * i + 1], leaf.shape, leaf.dtype)
            out.append(leaf + jnp.where(mask, noise, 0.0).astype(leaf.dtype))
        return jax.tree_util.tree_unflatten(treedef, out)

    def mutate_population(self, key, population):
        pop_size = jax.tree_util.tree_leaves(population)[0].shape[0]
        return jax.vmap(self.mutate)(jax.random.split(key, pop_size), population)
