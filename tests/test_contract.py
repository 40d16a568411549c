"""One contract over every registered algorithm and every built-in task (small shapes): a workflow's
generation compiles once and is reused (no retrace on the second call), its metrics are finite, and its
evaluation runs; every task (with its safety layer where it has one) resets and steps under jit and vmap."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from evogrid.case import LARGE_CASES
from evogrid.envs import list_tasks, make
from evogrid.envs.registry import parse_task
from evogrid.safety import shield
from evogrid.utils.config import unused_options
from evogrid.workflows.registry import algorithms, build, config_class

SMALL = {"pop_size": 4, "agents": 2, "episodes_per_individual": 1, "episodes": 1, "hidden": (4,), "eval_episodes": 1,
         "num_envs": 2, "rollout_len": 4, "buffer_size": 64, "warmup_steps": 8, "updates_per_iter": 2,
         "batch_size": 8, "minibatches": 1, "epochs": 1, "select_every": 1, "critic_hidden": (4,),
         "safety": "off"}   # the layer's own contract is the task test below (and tests/test_safety.py)
TASK = {"coevo": "gencos-case5", "attack": "tso-case14-n1"}
OWN = {"GA": {"elite": 1}}   # options only one algorithm takes (the others refuse them)


@pytest.mark.slow
@pytest.mark.parametrize("name", algorithms())
def test_every_algorithm_compiles_once_and_steps(name):
    cls = config_class(name)
    fields = {f.name for f in dataclasses.fields(cls)} - set(unused_options(cls, name))   # it refuses other algorithms' options
    task = TASK.get(name, "tso-case5")
    values = {"algorithm": name, "task": task, **{k: v for k, v in SMALL.items() if k in fields}, **OWN.get(name, {})}
    env, params = make(task, max_steps=4, n_days=4)
    _, wf = build(values, env, params)
    state = wf.init()
    state, metrics = wf.step(state)
    compiled = wf.step._cache_size()
    state, metrics = wf.step(state)
    assert wf.step._cache_size() == compiled
    leaves = [np.asarray(x) for x in jax.tree_util.tree_leaves(metrics)]
    assert all(np.all(np.isfinite(x)) for x in leaves if np.issubdtype(x.dtype, np.floating))
    assert jax.tree_util.tree_leaves(wf.evaluate(state))


@pytest.mark.slow
@pytest.mark.parametrize("task", [t for t in list_tasks() if not t.endswith("-real") and parse_task(t).case not in LARGE_CASES])
def test_every_task_steps_under_jit_and_vmap(task):
    """Every task but the grids of real size (tests/test_large_grids.py)."""
    env, params = make(task, max_steps=3, n_days=2)
    env = shield(env, params, "auto")
    n_act = env.action_space(params).shape[0]
    keys = jax.random.split(jax.random.key(0), 2)
    obs, state = jax.vmap(env.reset, in_axes=(0, None))(keys, params)
    step = jax.jit(jax.vmap(env.step, in_axes=(0, 0, 0, None)))
    for t in range(2):
        obs, state, reward, costs, done, _ = step(keys, state, jnp.zeros((2, n_act)), params)
    assert step._cache_size() == 1
    assert obs.shape == (2,) + env.observation_space(params).shape and costs.shape == (2, env.num_constraints(params))
    assert np.all(np.isfinite(np.asarray(reward))) and np.all(np.isfinite(np.asarray(obs)))
