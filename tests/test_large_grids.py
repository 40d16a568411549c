"""The pglib-opf grids of real size (1,354 to 9,241 buses) as DC dispatch tasks: the case files parse, the DC
power flow agrees with PYPOWER's, and the tasks build and step on the CPU at a small batch (no learning here)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import bus_injection_mw, ppc_of, pypower_opts

from evogrid import physics as ph
from evogrid.case import LARGE_CASES, load_case
from evogrid.case.matpower import PF, VA
from evogrid.envs import list_tasks, make
from evogrid.safety import shield

SIZES = {"1354pegase": (1354, 1991, 260), "2000goc": (2000, 3633, 238), "2869pegase": (2869, 4582, 510),
         "9241pegase": (9241, 16049, 1445)}   # buses, in-service branches, units (pglib-opf v23.07)


@pytest.mark.parametrize("name", LARGE_CASES)
def test_the_cases_parse_with_their_sizes_and_licence(name):
    import gzip
    from pathlib import Path

    import evogrid.case

    text = gzip.open(Path(evogrid.case.__file__).parent / "data" / f"case{name}.m.gz", "rt").read()
    assert "Creative Commons Attribution 4.0" in text and "v23.07" in text   # the file keeps its notice
    case = load_case(name)
    assert (case.n_bus, case.n_branch, case.n_units) == SIZES[name]
    assert f"tso-case{name}" in list_tasks() and f"tso-case{name}-ac" not in list_tasks()


@pytest.mark.parametrize("name", ["1354pegase", "2000goc"])
@pytest.mark.parametrize("dtype, tol_mw", [("float64", 1e-6), ("float32", 2e-3)])
def test_dc_power_flow_at_real_size_matches_pypower(name, dtype, tol_mw):
    """PYPOWER's rundcpf at the case's own dispatch: 1e-6 MW in float64 (measured 4e-10 MW); in float32 the
    round-off of flows up to 5,052 MW is 1.2e-3 MW on 2000goc (2.4e-7 relative)."""
    from pypower.api import rundcpf

    case = load_case(name)
    ref, ok = rundcpf(ppc_of(case), pypower_opts())
    assert ok
    with jax.enable_x64(dtype == "float64"):
        va, flow, _ = ph.dc_power_flow(ph.make_dc_network(case), jnp.asarray(bus_injection_mw(case)))
        assert flow.dtype == jnp.dtype(dtype)
        np.testing.assert_allclose(np.asarray(flow), ref["branch"][:, PF], atol=tol_mw)
        np.testing.assert_allclose(np.asarray(va), ref["bus"][:, VA], atol=tol_mw)


@pytest.mark.slow
def test_the_env_flows_at_real_size_match_pypower():
    """tso-case1354pegase stepped in float64 from a random action: the dispatch it applied, given to PYPOWER's
    rundcpf with the interval's loads, gives its flows to 1e-6 MW (the loads' share of the flows computed on
    the host by sparse solves when the task is made, the units' share one product a step)."""
    from pypower.api import rundcpf

    from evogrid.case.matpower import PD, PG

    case = load_case("1354pegase")
    with jax.enable_x64(True):
        env, params = make("tso-case1354pegase", n_days=2, split="all")
        _, state = env.reset_to_day(1, params)
        action = jax.random.uniform(jax.random.key(0), (case.n_units,), minval=-1, maxval=1)
        _, state, _, _, _, info = jax.jit(env.step_env)(jax.random.key(0), state, action, params)
        ppc = ppc_of(case)
        ppc["bus"][:, PD] = np.asarray(params.load_p[1, 0])
        ppc["gen"][:, PG] = np.asarray(info["dispatch_mw"])
        ref, ok = rundcpf(ppc, pypower_opts())
        assert ok
        np.testing.assert_allclose(np.asarray(state.flow), ref["branch"][:, PF], atol=1e-6)
        np.testing.assert_allclose(np.asarray(state.pg), ref["gen"][:, PG], atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("name, layer", [("2000goc", True), ("9241pegase", False)])
def test_a_grid_of_real_size_builds_and_steps(name, layer):
    """Bare and behind the security redispatch on 2000goc (about 7 s on 2 CPU cores); bare on 9241pegase (about
    11 s, most of it the set-up, and 4 GB; behind the layer it steps too, another 17 s of compiling)."""
    env, params = make(f"tso-case{name}", n_days=2)
    buses, branches, units = SIZES[name]
    assert env.action_space(params).shape == (units,)
    for policy_env in (env, shield(env, params)) if layer else (env,):
        keys = jax.random.split(jax.random.key(0), 2)
        obs, state = jax.vmap(policy_env.reset, in_axes=(0, None))(keys, params)
        step = jax.jit(jax.vmap(policy_env.step, in_axes=(0, 0, 0, None)))
        for _ in range(3):
            obs, state, reward, costs, done, _ = step(keys, state, jnp.zeros((2, units)), params)
        assert np.all(np.isfinite(np.asarray(obs))) and np.all(np.isfinite(np.asarray(reward)))
        assert costs.shape == (2, env.num_constraints(params))


def test_the_ac_and_n1_modes_are_refused_on_a_grid_of_real_size():
    for suffix in ("ac", "n1"):
        with pytest.raises(ValueError, match="are DC dispatch tasks"):
            make(f"tso-case2000goc-{suffix}")


@pytest.mark.slow
def test_the_oracle_solves_a_day_of_a_grid_of_real_size():
    """The multi-period DC-OPF of a test day of tso-case1354pegase (48 steps x 260 units x 1,991 lines): optimal,
    every line within its rating and every ramp kept, with lines and ramps binding (about 4 s by constraint
    generation over the line rows)."""
    from evogrid.baselines.tso import _Problem, dc_opf_oracle

    env, params = make("tso-case1354pegase", split="test", n_days=3)
    day = dc_opf_oracle(params, days=[0])[0]
    assert day.status == "optimal" and day.binding == {"line": True, "ramp": True}
    prob = _Problem(params)
    assert not prob.line_violations(day.pg, prob.load[0]).any()
    steps = np.diff(np.concatenate([prob.start[0][None], day.pg]), axis=0)
    assert np.all(np.abs(steps) <= prob.ramp + 1e-6)
    np.testing.assert_allclose(day.pg.sum(1), prob.load[0].sum(1) + prob.shunt, rtol=1e-7)
