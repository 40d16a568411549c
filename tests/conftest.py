"""Shared fixtures and reference-solver helpers (PYPOWER is MATPOWER's direct port)."""
import os
import tempfile
import warnings

# Every program compiled in the suite is kept on disk (JAX's persistent compilation cache), before JAX is
# imported so that the `evogrid` subprocesses the CLI tests start inherit it: a program the suite compiled
# once (the same workflow step in another test, process or earlier run) is loaded instead of compiled again.
# The folder outlives a run on purpose: the suite takes 33 min on 2 cores from a cold cache and about 20 from
# a warm one (measured 2026-12-06). An entry cut short by a killed process does no harm: a read that
# fails is caught (jax._src.compiler._cache_read warns and compiles again).
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(tempfile.gettempdir(), "evogrid-tests-jax-cache"))
os.environ.setdefault("PYTHONFAULTHANDLER", "1")   # a subprocess that crashes prints where (Python's stack)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")   # the small programs too (cli.keep_compiled_programs)
# LLVM's optimisation off for the suite's programs (XLA's own passes still run): its small programs compile
# in less time than the optimiser saves them at run time (about 15% of the suite's wall time on 2 cores).
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_backend_optimization_level=0".strip()
# The reports `evogrid.baselines` caches (oracles, operator's baselines) go to one directory of the suite's,
# not the user's ~/.cache: shared by every test and subprocess that does not ask for an empty one.
os.environ.setdefault("XDG_CACHE_HOME", os.path.join(tempfile.gettempdir(), "evogrid-tests-cache"))

import numpy as np
import pytest

from evogrid.case import LARGE_CASES, list_cases, load_case
from evogrid.case.matpower import PD, PG, QD, QG

ALL_CASES = [c for c in list_cases() if c not in LARGE_CASES]   # the grids of real size: tests/test_large_grids.py


def ppc_of(case):
    """The case as a PYPOWER/MATPOWER dict (only in-service elements, as MATPOWER's ext2int keeps)."""
    ppc = dict(version="2", baseMVA=case.base_mva, bus=case.bus.copy(), gen=case.gen.copy(), branch=case.branch.copy())
    if case.gencost is not None:
        ppc["gencost"] = case.gencost.copy()
    return ppc


def pypower_opts():
    from pypower.api import ppoption

    # 1e-9 p.u. mismatch: case141 has a near-zero-impedance branch (x = 6e-7 p.u.) whose round-off
    # keeps the mismatch just above 1e-10; |V| errors at 1e-9 are far below every test tolerance
    return ppoption(VERBOSE=0, OUT_ALL=0, PF_TOL=1e-9, PF_MAX_IT=20)


def bus_injection_mw(case, pg=None):
    """Net P injection per bus in MW (generation - load) for dispatch `pg` (default: the case's)."""
    p = np.zeros(case.n_bus)
    np.add.at(p, case.gen_bus, case.gen[:, PG] if pg is None else pg)
    return p - case.bus[:, PD]


def bus_injection_pu(case):
    s = np.zeros(case.n_bus, complex)
    np.add.at(s, case.gen_bus, case.gen[:, PG] + 1j * case.gen[:, QG])
    return (s - (case.bus[:, PD] + 1j * case.bus[:, QD])) / case.base_mva


def metrics_rows(path):
    """The rows of a run's metrics.jsonl without the wall-clock column (which differs between identical runs)."""
    import json

    return [{k: v for k, v in json.loads(line).items() if k != "wall_s"} for line in open(path).read().splitlines()]


def assert_resumes_bit_identically(wf, tmp_path, total: int, cut: int, every: int):
    """A run of `total` steps and one stopped at `cut` then resumed to `total` (checkpoints every `every`) end
    in equal states, leaf by leaf, and write the same metrics rows."""
    import jax
    import numpy as np

    full, _ = wf.learn(wf.init(), total, run_dir=tmp_path / "a", checkpoint_every=every, progress=False)
    wf.learn(wf.init(), cut, run_dir=tmp_path / "b", checkpoint_every=every, progress=False)
    resumed, _ = wf.learn(wf.init(), total, run_dir=tmp_path / "b", checkpoint_every=every, resume=True, progress=False)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(full), jax.tree_util.tree_leaves(resumed)):
        assert np.array_equal(np.asarray(a), np.asarray(b)), jax.tree_util.keystr(path)
    assert metrics_rows(tmp_path / "a" / "metrics.jsonl") == metrics_rows(tmp_path / "b" / "metrics.jsonl")


def marl_scan(marl, params, n_envs: int, steps: int, agent: str):
    """Reset `n_envs` copies of a multi-agent view under vmap and scan `steps` zero-action auto-reset
    steps under jit: returns (reset obs_dict, rewards of `agent` [steps, n_envs], dones [steps, n_envs])."""
    import jax
    import jax.numpy as jnp

    obs, states = jax.vmap(marl.reset, in_axes=(0, None))(jax.random.split(jax.random.key(2), n_envs), params)
    acts = {name: jnp.zeros((n_envs, space.shape[0])) for name, space in marl.action_spaces(params).items()}

    def body(states, k):
        _, states, reward, done, _ = jax.vmap(marl.step_auto_reset, in_axes=(0, 0, 0, None))(
            jax.random.split(k, n_envs), states, acts, params)
        return states, (reward[agent], done)

    _, (rewards, dones) = jax.jit(lambda s: jax.lax.scan(body, s, jax.random.split(jax.random.key(3), steps)))(states)
    return obs, np.asarray(rewards), np.asarray(dones)


@pytest.fixture(scope="session")
def cases():
    return {name: load_case(name) for name in ALL_CASES}


@pytest.fixture(autouse=True)
def _quiet_reference_tools():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", category=FutureWarning)
        warnings.filterwarnings("ignore", category=PendingDeprecationWarning)
        yield


@pytest.fixture(autouse=True, scope="module")
def _free_compiled_programs():
    """Drop jax's compiled programs after each test module (tests share them within a module). The whole
    suite in one process crashed inside XLA's CPU compiler (a segfault in backend_compile_and_load) near its
    end, twice at the same test, which passes alone: freeing what no later module uses keeps the process
    from accumulating ~370 modules' executables."""
    yield
    import jax

    jax.clear_caches()


FEEDER_PV_BUSES = (18, 22, 25, 33)   # dso-case33bw's default PV buses (case numbering)


def solved_33bw(load_p, load_q, scale, pv_p, pv_q):
    """pandapower's own case33bw with bus loads `load_p`/`load_q` [33] x `scale` [33] and PV at the default
    buses injecting `pv_p` MW / `pv_q` MVAr [4], solved by runpp (the reference the feeder env is checked against)."""
    import pandapower as pp
    import pandapower.networks as pn

    net = pn.case33bw()
    for i, row in net.load.iterrows():
        net.load.at[i, "p_mw"] = load_p[row.bus] * scale[row.bus]
        net.load.at[i, "q_mvar"] = load_q[row.bus] * scale[row.bus]
    for k, bus in enumerate(FEEDER_PV_BUSES):
        pp.create_sgen(net, bus - 1, p_mw=pv_p[k], q_mvar=pv_q[k])
    pp.runpp(net, tolerance_mva=1e-10, numba=False)
    return net
