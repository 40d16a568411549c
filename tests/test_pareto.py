"""NSGA-II: ranks and crowding against a plain-Python reference (Deb et al. 2002's fast non-dominated sort
with constrained domination), survival, a front on a small transmission task, bad configs."""
import jax.numpy as jnp
import numpy as np
import pytest

from evogrid.algorithms import NSGA2
from evogrid.algorithms.nsga2 import crowding_distance, nondominated_ranks
from evogrid.envs import make
from evogrid.workflows import build

TOL = 1e-6


def _dominates(a, b, va, vb):
    if va <= TOL and vb <= TOL:
        return all(x <= y for x, y in zip(a, b)) and any(x < y for x, y in zip(a, b))
    if va <= TOL:
        return True
    return vb > TOL and va < vb


def _reference_ranks(obj, viol):
    """Deb's fast non-dominated sort, written out with lists."""
    n = len(obj)
    dominated_by = [[j for j in range(n) if _dominates(obj[i], obj[j], viol[i], viol[j])] for i in range(n)]
    count = [sum(_dominates(obj[j], obj[i], viol[j], viol[i]) for j in range(n)) for i in range(n)]
    rank, front, r = [None] * n, [i for i in range(n) if count[i] == 0], 0
    while front:
        nxt = []
        for i in front:
            rank[i] = r
            for j in dominated_by[i]:
                count[j] -= 1
                if count[j] == 0:
                    nxt.append(j)
        front, r = nxt, r + 1
    return rank


def test_ranks_by_hand_and_against_the_reference_sort():
    obj = np.array([[1, 5], [2, 3], [3, 4], [4, 1], [5, 5]], np.float32)
    np.testing.assert_array_equal(np.asarray(nondominated_ranks(jnp.asarray(obj), jnp.zeros(5), TOL)), [0, 0, 1, 0, 2])
    # an infeasible member ranks after every feasible one, whatever its objectives; less violation first
    viol = np.array([0, 0, 0, 0.5, 0.2], np.float32)
    np.testing.assert_array_equal(np.asarray(nondominated_ranks(jnp.asarray(obj), jnp.asarray(viol), TOL)), [0, 0, 1, 3, 2])
    rng = np.random.default_rng(0)
    for k in (2, 3):
        obj = rng.integers(0, 6, (40, k)).astype(np.float32)          # ties included
        viol = np.where(rng.random(40) < 0.3, rng.integers(1, 4, 40), 0).astype(np.float32)
        got = np.asarray(nondominated_ranks(jnp.asarray(obj), jnp.asarray(viol), TOL))
        np.testing.assert_array_equal(got, _reference_ranks(obj.tolist(), viol.tolist()))


def test_crowding_by_hand():
    """One front (0, 2), (1, 1), (2, 0) and a lone member of the next front: the ends and the lone member are
    infinitely far, the middle one (2 - 0) / 2 per objective."""
    obj = jnp.array([[0.0, 2.0], [1.0, 1.0], [2.0, 0.0], [3.0, 3.0]])
    d = np.asarray(crowding_distance(obj, jnp.array([0, 0, 0, 1])))
    assert np.isinf(d[[0, 2, 3]]).all() and d[1] == pytest.approx(2.0)


def test_tell_keeps_the_first_fronts_and_the_spread_of_the_last():
    """Four members, four children: the survivors are the two rank-0 points and, of the rank-1 front of three,
    its two ends (largest crowding)."""
    nsga = NSGA2(pop_size=4, sigma=0.1, n_objectives=2, tol=TOL)
    state = nsga.init(None, jnp.zeros(3))
    params = jnp.arange(8.0)[:, None] * jnp.ones((8, 3))
    obj = jnp.array([[0.0, 3.0], [3.0, 0.0], [1.0, 4.0], [2.5, 3.5], [4.0, 1.0], [9.0, 9.0], [9.0, 9.5], [8.0, 9.9]])
    state = nsga.tell(None, params[:4], state, obj[:4], jnp.zeros(4))
    state = nsga.tell(None, params[4:], state, obj[4:], jnp.zeros(4))
    kept = sorted(np.asarray(state.params[:, 0]).astype(int).tolist())
    assert kept == [0, 1, 2, 4]        # 3 (2.5, 3.5) is the middle of the rank-1 front (1, 4), (2.5, 3.5), (4, 1)
    assert sorted(np.asarray(state.rank).tolist()) == [0, 0, 1, 1]


@pytest.mark.slow
def test_a_front_on_a_small_transmission_task():
    """8 generations of 16 on four 8-step days of tso-case5: the front's members do not dominate each other on
    their training objectives, and it trades cost against line loading (more than one member)."""
    env, params = make("tso-case5", max_steps=8, n_days=4)
    _, wf = build({"algorithm": "nsga2", "task": "tso-case5", "pop_size": 16, "episodes_per_individual": 1,
                   "hidden": (8,), "sigma": 0.1, "safety": "off", "seed": 1}, env, params)
    state, _ = wf.learn(wf.init(), 8, progress=False)
    front = state.es_state
    member = np.asarray(front.rank) == 0
    obj = np.asarray(front.objectives)[member]
    assert member.sum() >= 2
    for a in obj:
        assert not any(np.all(b <= a) and np.any(b < a) for b in obj)
    ev = wf.evaluate(state)
    assert int(ev["front_size"]) == member.sum() and 0 <= int(ev["front_feasible"]) <= member.sum()
    values = np.asarray(ev["front_cost"])[np.asarray(ev["front_member"])]
    assert np.all(np.isfinite(values))


def test_bad_nsga2_configs():
    with pytest.raises(ValueError, match="a multi-objective run needs two or more different objectives, got cost"):
        build({"algorithm": "nsga2", "objectives": ["cost"]})
    with pytest.raises(ValueError, match="unknown objective.s. co3; choose two or more of cost, co2, peak_loading"):
        build({"algorithm": "nsga2", "objectives": ["cost", "co3"]})
    with pytest.raises(ValueError, match="tso-case5 does not report co2; its objectives: cost, peak_loading"):
        build({"algorithm": "nsga2", "task": "tso-case5", "objectives": ["cost", "co2"]})


def test_objectives_from_episode_metrics():
    """cost is minus the mean return; peak_loading the per-step mean over the episodes (its info entry is summed
    over the steps); co2 the mean summed tonnes (dcmg)."""
    env, params = make("tso-case5", max_steps=4, n_days=2)
    _, wf = build({"algorithm": "nsga2", "task": "tso-case5", "pop_size": 4, "hidden": (4,), "safety": "off"}, env, params)
    metrics = {"episode_return": jnp.array([[-10.0, -20.0]]), "peak_loading": jnp.array([[4 * 0.5, 4 * 0.7]])}
    np.testing.assert_allclose(np.asarray(wf.objectives(metrics, 4)), [[15.0, 0.6]], rtol=1e-6)
    env, params = make("dcmg", max_steps=4, n_days=2)
    _, wf = build({"algorithm": "nsga2", "task": "dcmg", "objectives": ["co2", "cost"], "pop_size": 4, "hidden": (4,)},
                  env, params)
    assert wf.info_sums == ("co2_t",)
    metrics = {"episode_return": jnp.array([[-3.0, -5.0]]), "co2_t": jnp.array([[1.0, 2.0]])}
    np.testing.assert_allclose(np.asarray(wf.objectives(metrics, 4)), [[1.5, 4.0]], rtol=1e-6)
