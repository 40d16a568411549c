"""Line outages (evogrid.physics.security) against PYPOWER's rundcpf with the branches removed.

Tolerances: float64 1e-6 MW for every non-bridge single outage and for outage pairs, as the issue asks
(the two solvers agree to ~1e-10 MW). float32: flows are sums over thousands of MW (round-off ~5e-4 MW,
as for the DC flows), and an LODF divides by 1 - ISF[k, k], as small as 0.053 on case118; the factors are
built in float64 and then rounded, so we test 2e-3 MW (measured worst 1.4e-4 MW on case118).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import bus_injection_mw, ppc_of, pypower_opts
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from evogrid import physics as ph
from evogrid.case import load_case
from evogrid.case.matpower import PF

CASES = ["14", "30", "57", "118"]
TOL = {"float64": 1e-6, "float32": 2e-3}


def _rundcpf_without(case, branches):
    from pypower.api import rundcpf

    ppc = ppc_of(case)
    ppc["branch"] = np.delete(ppc["branch"], branches, axis=0)
    result, ok = rundcpf(ppc, pypower_opts())
    assert ok
    return np.insert(result["branch"][:, PF], [b - i for i, b in enumerate(sorted(branches))], 0.0)


def _islands(case, branches):
    keep = np.setdiff1d(np.arange(case.n_branch), branches)
    graph = coo_matrix((np.ones(keep.size), (case.f_bus[keep], case.t_bus[keep])), shape=(case.n_bus,) * 2)
    return connected_components(graph, directed=False)[0] > 1


@pytest.fixture(params=["float64", "float32"])
def precision(request):
    with jax.enable_x64(request.param == "float64"):
        yield request.param


@pytest.mark.parametrize("name", CASES)
def test_single_outages_match_pypower_and_bridges_are_found(name, precision):
    case = load_case(name)
    model = ph.make_outage_model(case)
    flow, _ = ph.dc_line_flows(ph.make_dc_network(case), jnp.asarray(bus_injection_mw(case)))
    post = np.asarray(jax.jit(ph.n1_flows)(model, flow))
    bridges = [k for k in range(case.n_branch) if _islands(case, [k])]
    assert np.flatnonzero(np.asarray(model.bridge)).tolist() == bridges
    assert np.all(np.isfinite(post)) and np.all(np.isfinite(np.asarray(model.lodf)))
    for k in range(case.n_branch):
        if k not in bridges:
            np.testing.assert_allclose(post[k], _rundcpf_without(case, [k]), atol=TOL[precision], err_msg=f"outage {k}")
            single, islanded = ph.outage_flows(model, flow, jnp.asarray([k, -1]))
            np.testing.assert_allclose(np.asarray(single), post[k], atol=TOL[precision])
            assert not bool(islanded)


@pytest.mark.parametrize("name", ["14", "118"])
def test_outage_pairs_by_the_low_rank_update(name):
    """Two branches out together (the Woodbury form): PYPOWER's flows where the grid stays whole, `islanded`
    exactly where removing both splits it (checked by graph connectivity), finite outputs always."""
    with jax.enable_x64(True):
        case = load_case(name)
        model = ph.make_outage_model(case)
        flow, _ = ph.dc_line_flows(ph.make_dc_network(case), jnp.asarray(bus_injection_mw(case)))
        pairs = np.random.default_rng(0).choice(case.n_branch, size=(40, 2))
        pairs = pairs[pairs[:, 0] != pairs[:, 1]]
        post, islanded = jax.jit(jax.vmap(ph.outage_flows, in_axes=(None, None, 0)))(model, flow, jnp.asarray(pairs))
        # every branch into a degree-2 bus: a pair that islands that bus without either being a bridge
        deg = np.bincount(np.r_[case.f_bus, case.t_bus], minlength=case.n_bus)
        bus = np.flatnonzero(deg == 2)[0]
        cut = np.flatnonzero((case.f_bus == bus) | (case.t_bus == bus))
        cut_post, cut_islanded = ph.outage_flows(model, flow, jnp.asarray(cut))
    assert bool(cut_islanded) and np.all(np.isfinite(np.asarray(cut_post))) and np.all(np.asarray(cut_post)[cut] == 0)
    for pair, p, isl in zip(pairs, np.asarray(post), np.asarray(islanded)):
        assert isl == _islands(case, pair), pair
        assert np.all(np.isfinite(p)) and np.all(p[pair] == 0)
        if not isl:
            np.testing.assert_allclose(p, _rundcpf_without(case, list(pair)), atol=1e-6, err_msg=str(pair))


def test_unused_and_repeated_slots_change_nothing():
    with jax.enable_x64(True):
        case = load_case("14")
        model = ph.make_outage_model(case)
        flow, _ = ph.dc_line_flows(ph.make_dc_network(case), jnp.asarray(bus_injection_mw(case)))
        none, isl = ph.outage_flows(model, flow, jnp.full((3,), -1))
        np.testing.assert_array_equal(np.asarray(none), np.asarray(flow))
        once, _ = ph.outage_flows(model, flow, jnp.asarray([2, -1, -1]))
        twice, isl2 = ph.outage_flows(model, flow, jnp.asarray([2, 2, -1]))
    assert not bool(isl) and not bool(isl2)
    np.testing.assert_allclose(np.asarray(twice), np.asarray(once), atol=1e-12)
