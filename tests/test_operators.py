"""Operators: what they do to the numbers."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from evogrid.operators import (
    GaussianMutation,
    centered_ranks,
    elite_indices,
    one_point_crossover,
    tournament_selection,
    truncation_selection,
    uniform_crossover,
)


def test_mutation_rate_and_scale():
    pop = {"w": jnp.zeros((64, 50, 20)), "b": jnp.zeros((64, 20))}
    out = GaussianMutation(rate=0.25, scale=0.1).mutate_population(jax.random.key(0), pop)
    w = np.asarray(out["w"])
    changed = w != 0
    assert abs(changed.mean() - 0.25) < 0.01                     # 64,000 draws: 4 sigma ~ 0.007
    assert abs(w[changed].std() - 0.1) < 0.005                   # N(0, 0.1^2) on the mutated entries
    assert not np.array_equal(w[0], w[1])                        # one key per individual
    none = GaussianMutation(rate=0.0, scale=0.1).mutate_population(jax.random.key(0), pop)
    assert not np.any(np.asarray(none["w"]))
    with pytest.raises(ValueError, match="rate <= 1"):
        GaussianMutation(rate=1.5)


def test_uniform_crossover_takes_each_gene_from_one_parent():
    a, b = {"x": jnp.zeros(1000)}, {"x": jnp.ones(1000)}
    child = np.asarray(uniform_crossover(jax.random.key(1), a, b, swap_prob=0.3)["x"])
    assert set(np.unique(child)) <= {0.0, 1.0} and abs(child.mean() - 0.3) < 0.05


def test_one_point_crossover_is_head_of_a_tail_of_b():
    a = {"p": jnp.zeros((3, 4)), "q": jnp.zeros(5)}
    b = {"p": jnp.ones((3, 4)), "q": jnp.ones(5)}
    child = one_point_crossover(jax.random.key(2), a, b)
    flat = np.concatenate([np.asarray(child["p"]).ravel(), np.asarray(child["q"])])
    cut = int(np.argmax(flat))  # first 1
    assert 1 <= cut < 17 and np.all(flat[:cut] == 0) and np.all(flat[cut:] == 1)


def test_selection():
    fitness = jnp.array([3.0, -1.0, 7.0, 0.0, 5.0])
    np.testing.assert_array_equal(elite_indices(fitness, 3), [2, 4, 0])
    picks = np.asarray(truncation_selection(jax.random.key(3), fitness, 200, top=2))
    assert set(picks) == {2, 4}
    # tournaments of the whole population always return the best; of size 1 they are uniform
    assert set(np.asarray(tournament_selection(jax.random.key(4), fitness, 50, tournament_size=20)).tolist()) == {2}
    uniform = np.asarray(tournament_selection(jax.random.key(5), fitness, 5000, tournament_size=1))
    assert np.all(np.bincount(uniform, minlength=5) > 800)
    # by hand: size-2 tournaments pick the worst member (index 1) only when both draws are it: 1/25
    worst = np.mean(np.asarray(tournament_selection(jax.random.key(6), fitness, 20000, tournament_size=2)) == 1)
    assert abs(worst - 1 / 25) < 0.006


def test_centered_ranks():
    np.testing.assert_allclose(centered_ranks(jnp.array([10.0, -3.0, 4.0])), [0.5, -0.5, 0.0])
