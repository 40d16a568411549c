"""Selection and fitness shaping on a fitness vector [pop] (higher is better)."""
from __future__ import annotations

import jax
import jax.numpy as jnp


def tournament_selection(key, fitness, num: int, tournament_size: int = 3):
    """`num` parent indices, each the fittest of `tournament_size` uniformly drawn members."""
    contenders = jax.random.randint(key, (num, tournament_size), 0, fitness.shape[0])
    winner = jnp.argmax(fitness[contenders], axis=1)
    return jnp.take_along_axis(contenders, winner[:, None], axis=1)[:, 0]


def truncation_selection(key, fitness, num: int, top: int):
    """`num` parent indices drawn uniformly from the `top` fittest members."""
    best = elite_indices(fitness, top)
    return best[jax.random.randint(key, (num,), 0, top)]


def elite_indices(fitness, num: int):
    """Indices of the `num` fittest members, best first."""
    return jnp.argsort(-fitness)[:num]


def centered_ranks(fitness):
    """Ranks mapped linearly onto [-0.5, 0.5] (Salimans et al. 2017); the fittest gets 0.5."""
    ranks = jnp.argsort(jnp.argsort(fitness))
    return ranks / (fitness.shape[0] - 1) - 0.5
