"""MAP-Elites (Mouret & Clune 2015): an archive of the best policy found in each cell of a grid over
behaviour descriptors, grown by mutating members picked uniformly from the filled cells.

The grid has `bins` cells per descriptor over [lo, hi] (a descriptor outside lands in the edge cell).
Each `ask` draws `pop_size` parent pairs from the filled cells and makes each child by the iso+line
variation of Vassiliades & Mouret (2018): Gaussian mutation of the first parent (`GaussianMutation`,
std `sigma`) plus a step of std `line_sigma` along the line to the second. Until some cell is filled the
parents are the initial mean. `tell` puts each child into its cell when it beats the cell's member
(the best child of a cell when several land in it); non-finite fitness never enters. With `tol` set,
"beats" is feasibility first: a child whose summed cost channels are at most `tol` beats any member
that violates, a violating child beats a member only by violating less, and fitness decides between
two feasible ones (as the workflows choose their reported policy). The same
`init / ask / tell / center` interface as the other strategies, with the children's descriptors (and
their cost channels, kept with each member) passed to `tell`.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import struct

from evogrid.operators import iso_line_variation


@struct.dataclass
class Archive:
    mean: jnp.ndarray        # [D] the parents before any cell is filled
    params: jnp.ndarray      # [cells, D]
    fitness: jnp.ndarray     # [cells], -inf where empty
    descriptor: jnp.ndarray  # [cells, B] the member's descriptors
    costs: jnp.ndarray       # [cells, C] the member's mean cost channels in the episodes that placed it


class MAPElites:
    def __init__(self, pop_size: int, sigma: float, bins: tuple[int, ...], lo, hi, n_costs: int,
                 line_sigma: float = 0.2, tol: float | None = None):
        if any(b < 1 for b in bins):
            raise ValueError(f"bins must be at least 1 per descriptor, got {tuple(bins)}")
        self.pop_size, self.sigma, self.line_sigma = pop_size, sigma, line_sigma
        self.bins, self.n_cells, self.n_costs = tuple(bins), math.prod(bins), n_costs
        self.lo, self.hi = jnp.asarray(lo, jnp.float32), jnp.asarray(hi, jnp.float32)
        self.tol = tol

    def rank(self, fitness, costs):
        """The order `tell` keeps members by (higher is better): the fitness, or with `tol` feasibility
        first (every violating member below every feasible one, ordered by its violation)."""
        if self.tol is None:
            return fitness
        violation = jnp.maximum(costs.sum(-1), 0.0)
        return jnp.where(violation <= self.tol, fitness, jnp.where(jnp.isfinite(fitness), -1e30 * (1.0 + violation), -jnp.inf))

    def init(self, key, mean) -> Archive:
        cells, dtype = self.n_cells, mean.dtype
        return Archive(mean, jnp.zeros((cells, mean.shape[0]), dtype), jnp.full((cells,), -jnp.inf, dtype),
                       jnp.zeros((cells, len(self.bins)), dtype), jnp.zeros((cells, self.n_costs), dtype))

    def cell(self, descriptor):
        """[..., B] descriptors -> [...] flat cell indices."""
        unit = (descriptor - self.lo) / (self.hi - self.lo)
        idx = jnp.clip(jnp.floor(unit * jnp.asarray(self.bins)), 0, jnp.asarray(self.bins) - 1).astype(jnp.int32)
        idx = jnp.where(jnp.isfinite(unit), idx, 0)
        return jnp.ravel_multi_index(tuple(jnp.moveaxis(idx, -1, 0)), self.bins, mode="clip")

    def ask(self, key, state: Archive):
        k_pick, k_mut, k_line = jax.random.split(key, 3)
        filled = jnp.isfinite(state.fitness)
        any_filled = jnp.any(filled)
        p = jnp.where(any_filled, filled / jnp.maximum(filled.sum(), 1), 1.0 / self.n_cells)
        pick = jax.random.choice(k_pick, self.n_cells, (2, self.pop_size), p=p)
        a = jnp.where(any_filled, state.params[pick[0]], state.mean)
        b = jnp.where(any_filled, state.params[pick[1]], state.mean)
        return iso_line_variation(k_mut, k_line, a, b, self.sigma, self.line_sigma), state

    def tell(self, key, population, fitness, state: Archive, descriptor, costs) -> Archive:
        fitness = jnp.where(jnp.isfinite(fitness), fitness, -jnp.inf)
        order = self.rank(fitness, costs)                                           # -inf: never enters
        cell = self.cell(descriptor)
        best = jax.ops.segment_max(order, cell, num_segments=self.n_cells)          # -inf in cells no child hit
        first = jnp.where(order == best[cell], jnp.arange(self.pop_size), self.pop_size)
        winner = jnp.minimum(jax.ops.segment_min(first, cell, num_segments=self.n_cells), self.pop_size - 1)
        better = best > self.rank(state.fitness, state.costs)
        take = lambda new, old: jnp.where(better.reshape((-1,) + (1,) * (old.ndim - 1)), new[winner], old)  # noqa: E731
        return state.replace(params=take(population, state.params), fitness=take(fitness, state.fitness),
                             descriptor=take(descriptor.astype(state.descriptor.dtype), state.descriptor),
                             costs=take(costs.astype(state.costs.dtype), state.costs))

    def center(self, state: Archive):
        """The fittest member (the initial mean while the archive is empty)."""
        return jnp.where(jnp.any(jnp.isfinite(state.fitness)), state.params[jnp.argmax(state.fitness)], state.mean)
