"""Crossover of two parents' parameter pytrees (vmap over pairs for a population)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from evogrid.operators.mutation import GaussianMutation


def uniform_crossover(key, parent_a, parent_b, swap_prob: float = 0.5):
    """Each parameter comes from parent_b with probability `swap_prob`, else from parent_a."""
    leaves_a, treedef = jax.tree_util.tree_flatten(parent_a)
    leaves_b = jax.tree_util.tree_leaves(parent_b)
    keys = jax.random.split(key, len(leaves_a))
    child = [jnp.where(jax.random.bernoulli(k, swap_prob, a.shape), b, a) for k, a, b in zip(keys, leaves_a, leaves_b)]
    return jax.tree_util.tree_unflatten(treedef, child)


def one_point_crossover(key, parent_a, parent_b):
    """Cut the flattened parameter vector at one random point: a's head, b's tail."""
    flat_a, unravel = ravel_pytree(parent_a)
    flat_b, _ = ravel_pytree(parent_b)
    cut = jax.random.randint(key, (), 1, flat_a.shape[0])
    return unravel(jnp.where(jnp.arange(flat_a.shape[0]) < cut, flat_a, flat_b))


def iso_line_variation(k_iso, k_line, a, b, sigma: float, line_sigma: float):
    """Children of flat parent pairs a, b [pop, D] by the iso+line variation of Vassiliades & Mouret (2018):
    a + N(0, sigma^2 I) + N(0, line_sigma^2) (b - a), one line step per child."""
    line = line_sigma * jax.random.normal(k_line, (a.shape[0], 1), a.dtype) * (b - a)
    return GaussianMutation(rate=1.0, scale=sigma).mutate_population(k_iso, a) + line
