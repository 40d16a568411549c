"""Vmapped evolutionary operators on populations of parameter pytrees (leaves [pop, ...]).

Fitness is maximised here (higher is better); the sign flip for evosax lives in
`evogrid.workflows.ec`.
"""
from evogrid.operators.crossover import iso_line_variation, one_point_crossover, uniform_crossover
from evogrid.operators.mutation import GaussianMutation
from evogrid.operators.selection import (
    centered_ranks,
    elite_indices,
    tournament_selection,
    truncation_selection,
)

__all__ = [
    "GaussianMutation", "centered_ranks", "iso_line_variation", "elite_indices", "one_point_crossover", "tournament_selection",
    "truncation_selection", "uniform_crossover",
]
