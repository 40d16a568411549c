"""GridMARLEnv: the dict view round-trips to the flat env and stays jit/vmap/scan compatible."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import marl_scan

from evogrid.envs import GridMARLEnv, make

ENV, PARAMS = make("dso-case33bw", max_steps=4, n_days=2)
MARL = GridMARLEnv(ENV, PARAMS)


def test_agents_and_spaces():
    assert MARL.agents == [f"flex_{i}" for i in range(6)] + [f"pv_{k}" for k in range(4)]
    spaces = MARL.action_spaces(PARAMS)
    assert spaces["flex_0"].shape == (1,) and spaces["pv_0"].shape == (2,)
    assert MARL.observation_spaces(PARAMS)["pv_3"].shape == (6,)  # |V|, load, PV availability, 3 time features


def test_dict_view_round_trips_to_the_flat_env():
    key = jax.random.key(0)
    obs_dict, state = MARL.reset(key, PARAMS)
    flat_obs, flat_state = ENV.reset(key, PARAMS)
    # pv_1 sits on bus 22 (index 21): its first two observations are that bus's |V| and load (p.u.)
    np.testing.assert_allclose(obs_dict["pv_1"][:2], [flat_obs[21], flat_obs[33 + 21]])
    actions = {name: jnp.full(space.shape, 0.1 * (i + 1)) for i, (name, space) in enumerate(MARL.action_spaces(PARAMS).items())}
    flat_action = np.zeros(14)
    for i in range(6):
        flat_action[i] = 0.1 * (i + 1)
    for k in range(4):
        flat_action[6 + k] = flat_action[10 + k] = 0.1 * (7 + k)
    out = jax.jit(MARL.step)(jax.random.key(1), state, actions, PARAMS)
    ref = jax.jit(ENV.step)(jax.random.key(1), flat_state, jnp.asarray(flat_action), PARAMS)
    for name, (_, o) in MARL.specs.items():
        np.testing.assert_array_equal(out[0][name], np.asarray(ref[0])[o])
        assert float(out[2][name]) == float(ref[2])  # shared objective
    np.testing.assert_array_equal(out[4]["costs"], ref[3])
    with pytest.raises(ValueError, match="lacks agents"):
        MARL.step(jax.random.key(1), state, {"flex_0": jnp.zeros(1)}, PARAMS)


def test_scan_and_vmap_over_dict_actions():
    obs, rewards, dones = marl_scan(MARL, PARAMS, n_envs=3, steps=9, agent="pv_0")
    assert rewards.shape == (9, 3) and dones.sum() == 2 * 3  # two 4-step episodes ended per env
    assert obs["flex_0"].shape == (3, 5)
