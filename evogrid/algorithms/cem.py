"""Cross-entropy method with a diagonal Gaussian (the distribution of CEM-RL, Pourchot & Sigaud 2019).

`ask` samples pop_size solutions around the mean; `tell` moves the mean to the log-weighted
average of the `elite_frac` best and sets the variance to their weighted spread around the old
mean plus a floor (same interface as `EvosaxStrategy`).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class CEMState:
    mean: jnp.ndarray   # [D]
    var: jnp.ndarray    # [D]


class CEM:
    def __init__(self, pop_size: int, sigma: float, sigma_floor: float, elite_frac: float):
        self.pop_size, self.sigma, self.floor = pop_size, sigma, sigma_floor
        self.n_elite = max(1, int(round(elite_frac * pop_size)))

    def init(self, key, mean):
        return CEMState(mean, jnp.full_like(mean, self.sigma**2))

    def ask(self, key, state: CEMState):
        eps = jax.random.normal(key, (self.pop_size, state.mean.shape[0]), state.mean.dtype)
        return state.mean + jnp.sqrt(state.var) * eps, state

    def tell(self, key, population, fitness, state: CEMState):
        order = jnp.argsort(-fitness)[:self.n_elite]
        w = jnp.log(self.n_elite + 1.0) - jnp.log(jnp.arange(1, self.n_elite + 1, dtype=fitness.dtype))
        w = w / w.sum()
        elites = population[order]
        return CEMState(w @ elites, w @ (elites - state.mean) ** 2 + self.floor**2)

    def center(self, state: CEMState):
        return state.mean
