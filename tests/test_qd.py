"""MAP-Elites: the archive keeps the fittest child per cell and nothing non-finite; the workflow fills cells
whose descriptors are the ones its members showed; eval prints and plots the archive; bad names refused."""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from evogrid import cli
from evogrid.algorithms import MAPElites
from evogrid.envs import make
from evogrid.workflows import MAPElitesConfig, MAPElitesWorkflow


def test_archive_keeps_the_fittest_child_of_each_cell():
    me = MAPElites(pop_size=5, sigma=0.1, bins=(2, 2), lo=(0.0, 0.0), hi=(1.0, 1.0), n_costs=1)
    archive = me.init(jax.random.key(0), jnp.zeros(3))
    pop = jnp.arange(15.0).reshape(5, 3)
    desc = jnp.array([[0.1, 0.1], [0.2, 0.3], [0.9, 0.1], [0.6, 0.9], [0.4, 0.4]])   # cells 0, 0, 2, 3, 0
    fitness = jnp.array([1.0, 3.0, jnp.nan, 2.0, 3.0])
    archive = me.tell(None, pop, fitness, archive, desc, jnp.zeros((5, 1)))
    np.testing.assert_array_equal(np.asarray(me.cell(desc)), [0, 0, 2, 3, 0])
    # cell 0: the first of the two children with fitness 3; cell 2: a NaN child never enters; cell 3: filled
    assert np.isneginf(archive.fitness[1]) and np.isneginf(archive.fitness[2])
    np.testing.assert_array_equal(archive.params[0], pop[1])
    np.testing.assert_array_equal(archive.params[3], pop[3])
    np.testing.assert_array_equal(archive.descriptor[0], desc[1])
    # a worse child leaves the member; a better one replaces it; descriptors outside [lo, hi] land in the edge cells
    me2 = MAPElites(pop_size=2, sigma=0.1, bins=(2, 2), lo=(0.0, 0.0), hi=(1.0, 1.0), n_costs=1, line_sigma=0.0)
    after = me2.tell(None, pop[:2] + 100, jnp.array([2.0, 5.0]), archive, jnp.array([[0.0, 0.0], [-3.0, 7.0]]),
                     jnp.ones((2, 1)))
    assert after.fitness[0] == 3.0 and after.fitness[1] == 5.0 and after.costs[1, 0] == 1.0
    # feasibility first: a violating child never displaces a feasible member, less violation displaces more
    ff = MAPElites(pop_size=1, sigma=0.1, bins=(2, 2), lo=(0.0, 0.0), hi=(1.0, 1.0), n_costs=1, tol=1e-6)
    one = lambda a, f, c: ff.tell(None, jnp.full((1, 3), f), jnp.array([f]), a, jnp.zeros((1, 2)), jnp.array([[c]]))  # noqa: E731
    kept = one(one(ff.init(None, jnp.zeros(3)), 1.0, 0.0), 10.0, 0.5)
    assert kept.fitness[0] == 1.0
    worse = one(one(ff.init(None, jnp.zeros(3)), 10.0, 0.5), 2.0, 0.1)
    assert worse.fitness[0] == 2.0 and one(worse, 3.0, 0.2).fitness[0] == 2.0 and one(worse, -5.0, 0.0).fitness[0] == -5.0
    # ask: children of filled cells only (iso steps of std 0.1 around them; no line step here)
    kids, _ = me2.ask(jax.random.key(1), after)
    parents = np.asarray(after.params)[np.isfinite(np.asarray(after.fitness))]
    near = np.min(np.abs(np.asarray(kids)[:, None, :] - parents[None]).max(-1), axis=1)
    assert kids.shape == (2, 3) and np.all(near < 1.0)


def test_workflow_fills_cells_with_the_behaviour_its_members_showed():
    env, params = make("tso-case5", n_days=4)
    cfg = MAPElitesConfig(task="tso-case5", pop_size=8, episodes_per_individual=1, hidden=(4,), sigma=0.5,
                          safety="off", bins=4, descriptors=("cheap_share", "spread"))
    wf = MAPElitesWorkflow(cfg, env, params)
    state = wf.init()
    for _ in range(3):
        state, metrics = wf.step(state)
    compiled = wf.step._cache_size()
    state, _ = wf.step(state)
    assert wf.step._cache_size() == compiled
    archive = state.es_state
    filled = np.isfinite(np.asarray(archive.fitness))
    assert filled.sum() >= 3
    # each member sits in the cell of its own descriptors, and those are shares in [0, 1]
    desc = np.asarray(archive.descriptor)[filled]
    np.testing.assert_array_equal(np.asarray(wf.strategy.cell(jnp.asarray(desc))), np.nonzero(filled)[0])
    assert np.all((desc >= 0) & (desc <= 1))
    # a fleet run at Pmax throughout: every capacity factor 1 (no spread), the cheap units' share of capacity
    energy = jnp.asarray(params.pmax)[None] * params.max_steps
    cheap, spread = np.asarray(wf.describe(energy)[0])
    assert spread == pytest.approx(0.0, abs=1e-6)
    assert cheap == pytest.approx(float((params.pmax * wf._cheap).sum() / params.pmax.sum()), rel=1e-6)


@pytest.mark.parametrize("values, message", [
    ({"descriptors": ("cheap_share", "fuel_mix")}, r"unknown descriptor\(s\) fuel_mix; choose one or more of cheap_share"),
    ({"descriptors": ()}, r"unknown descriptor\(s\) \(none given\)"),
    ({"descriptors": ("spread", "spread")}, "descriptors must differ"),
    ({"bins": 0}, r"bins must be in \[1, inf\]"),
])
def test_bad_archive_configs_are_named(values, message):
    with pytest.raises(ValueError, match=message):
        MAPElitesConfig(task="tso-case5", **values)


def test_map_elites_needs_a_transmission_task():
    with pytest.raises(ValueError, match="runs on the transmission tasks"):
        MAPElitesWorkflow(MAPElitesConfig(task="dcmg", pop_size=4, safety="off"))


@pytest.mark.slow
def test_eval_prints_and_plots_the_archive(tmp_path, capsys):
    run = tmp_path / "run"
    assert cli.main(["train", "--algorithm", "map_elites", "--task", "tso-case5", "--pop", "8", "--episodes", "1",
                     "--hidden", "4", "--bins", "4", "--generations", "2", "--safety", "off", "--out", str(run)]) == 0
    capsys.readouterr()
    assert cli.main(["eval", str(run)]) == 0
    out = capsys.readouterr().out
    assert "archive_filled" in out and "archive_feasible" in out and "archive over cheap_share, slack_share" in out
    result = json.loads((run / "eval.json").read_text())
    assert len(result["cells_fitness"]) == 16 and result["archive_filled"] == sum(result["cells_filled"])
    assert (run / "archive.png").stat().st_size > 1000
