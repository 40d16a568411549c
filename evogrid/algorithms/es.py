"""Evolution strategies from evosax 0.3 behind one small interface (flat [D] solutions, fitness maximised).

    strategy = EvosaxStrategy("Open_ES", pop_size, template, sigma, learning_rate)
    state = strategy.init(key, mean)
    population, state = strategy.ask(key, state)          # [pop, D]
    state = strategy.tell(key, population, fitness, state)  # fitness [pop], higher is better
    strategy.center(state)                                  # the distribution mean / best member

evosax minimises; the sign flip lives here, in `tell`, and nowhere else.
"""
from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import optax

from evogrid.utils.jax_utils import strong_types

EVOSAX_ALGORITHMS = ("Open_ES", "CMA_ES", "Sep_CMA_ES", "SNES", "xNES", "PGPE", "ARS", "SimpleGA")
ANTITHETIC = ("Open_ES", "PGPE", "ARS")          # sample mirrored pairs: need an even population
OPTIMISED = ("Open_ES", "SNES", "xNES", "PGPE", "ARS")   # step their mean with an optimiser (`learning_rate`)
FULL_COVARIANCE = ("CMA_ES", "xNES")             # O(D^2) memory and O(D^2..D^3) time per generation


class EvosaxStrategy:
    """Adapter over an evosax 0.3 algorithm chosen by name."""

    def __init__(self, name: str, pop_size: int, template, sigma: float, learning_rate: float):
        # imported here: importing evosax.algorithms creates arrays, which would start the XLA backend
        # before `evogrid train --distributed` can call jax.distributed.initialize
        import evosax.algorithms as ea

        cls = getattr(ea, name)
        accepted = inspect.signature(cls.__init__).parameters
        kwargs = {}
        if "optimizer" in accepted:
            kwargs["optimizer"] = optax.adam(learning_rate)
        if "std_schedule" in accepted:
            kwargs["std_schedule"] = optax.constant_schedule(sigma)
        self.es = cls(population_size=pop_size, solution=template, **kwargs)
        params = self.es.default_params
        if hasattr(params, "std_init"):
            params = params.replace(std_init=jnp.asarray(sigma, template.dtype))
        self.params = params
        self.population_based = isinstance(self.es, ea.population_based.base.PopulationBasedAlgorithm)
        self.sigma = sigma

    def init(self, key, mean):
        if self.population_based:
            k1, k2 = jax.random.split(key)
            pop = mean + self.sigma * jax.random.normal(k1, (self.es.population_size, mean.shape[0]), mean.dtype)
            return strong_types(self.es.init(k2, pop, jnp.full((self.es.population_size,), jnp.inf, mean.dtype), self.params))
        return strong_types(self.es.init(key, mean, self.params))

    def ask(self, key, state):
        population, new = self.es.ask(key, state, self.params)
        return population, strong_types(new, like=state)

    def tell(self, key, population, fitness, state):
        new, _ = self.es.tell(key, population, -fitness, state, self.params)  # the one sign flip: evosax minimises
        # evosax returns some fields weak-typed (e.g. a schedule's std); keep the input's exact
        # types so a jitted step does not retrace at generation 2
        return strong_types(new, like=state)

    def center(self, state):
        return state.best_solution if self.population_based else state.mean
