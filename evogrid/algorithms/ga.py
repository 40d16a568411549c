"""A native elitist genetic algorithm built from `evogrid.operators` (same interface as `EvosaxStrategy`).

Each generation: the `elite` fittest members are copied unchanged; every other child comes from
two parents picked by tournament (size 3), uniform crossover, and Gaussian mutation of a share
`mutation_rate` of its parameters with std `sigma`. The first `ask` returns the initial
population unchanged so it is evaluated before it reproduces.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from evogrid.operators import (
    GaussianMutation,
    elite_indices,
    tournament_selection,
    uniform_crossover,
)


@struct.dataclass
class GAState:
    population: jnp.ndarray  # [pop, D]
    fitness: jnp.ndarray     # [pop], -inf before the first evaluation


class GeneticAlgorithm:
    def __init__(self, pop_size: int, elite: int, sigma: float, mutation_rate: float):
        if not 0 <= elite < pop_size:
            raise ValueError(f"elite must be in [0, pop_size - 1] = [0, {pop_size - 1}], got {elite}")
        self.pop_size, self.elite = pop_size, elite
        self.mutation = GaussianMutation(rate=mutation_rate, scale=sigma)
        self.sigma = sigma

    def init(self, key, mean):
        pop = mean + self.sigma * jax.random.normal(key, (self.pop_size, mean.shape[0]), mean.dtype)
        return GAState(pop, jnp.full((self.pop_size,), -jnp.inf, mean.dtype))

    def ask(self, key, state: GAState):
        k_sel, k_cross, k_mut = jax.random.split(key, 3)
        n_child = self.pop_size - self.elite
        parents = tournament_selection(k_sel, state.fitness, 2 * n_child).reshape(2, n_child)
        cross_keys = jax.random.split(k_cross, n_child)
        children = jax.vmap(uniform_crossover)(cross_keys, state.population[parents[0]], state.population[parents[1]])
        children = self.mutation.mutate_population(k_mut, children)
        elites = state.population[elite_indices(state.fitness, self.elite)]
        offspring = jnp.concatenate([elites, children])
        first = jnp.all(jnp.isneginf(state.fitness))  # evaluate the initial population as it is
        return jnp.where(first, state.population, offspring), state

    def tell(self, key, population, fitness, state):
        return GAState(population, fitness)

    def center(self, state: GAState):
        return state.population[jnp.argmax(state.fitness)]


def inject(state: GAState, member, member_fitness) -> GAState:
    """Replace the worst member (lowest fitness) by `member` [D] (ERL's injection of the RL actor)."""
    worst = jnp.argmin(state.fitness)
    return GAState(state.population.at[worst].set(member), state.fitness.at[worst].set(member_fitness))
